"""Reading documents: clear BadInput errors for unusable files, normalised text otherwise."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from marginalia.errors import BadInput
from marginalia.ingest.loaders import read_document

BAD_FILES = {
    "empty": b"",
    "whitespace": b"  \n\t\r\n   \n",
    "binary": b"PK\x03\x04\x00\x00binary\x00stuff",
    "latin1": "Caf\u00e9 cr\u00e8me, na\u00efve r\u00e9sum\u00e9.\n".encode("latin-1"),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_unusable_file_raises_bad_input(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.txt"
    path.write_bytes(BAD_FILES[kind])
    with pytest.raises(BadInput) as info:
        read_document(path)
    assert info.value.exit_code == 2
    assert info.value.path == str(path)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.md"
    with pytest.raises(BadInput) as info:
        read_document(path)
    assert info.value.exit_code == 2
    assert str(path) in str(info.value)
    assert "no such file" in str(info.value)


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as info:
        read_document(tmp_path)
    assert info.value.exit_code == 2
    assert str(tmp_path) in str(info.value)
    assert "directory" in str(info.value)


def test_latin1_message_points_at_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "l.txt"
    path.write_bytes(b"abc\xe9def")
    with pytest.raises(BadInput) as info:
        read_document(path)
    assert "byte 3" in str(info.value) and "iconv" in str(info.value)


def test_crlf_and_cr_are_normalised(tmp_path: Path) -> None:
    path = tmp_path / "crlf.txt"
    path.write_bytes(b"line one\r\nline two\r\n\r\nold mac\rend")
    doc = read_document(path)
    assert doc.text == "line one\nline two\n\nold mac\nend"
    assert doc.source == str(path)


def test_bom_is_stripped(tmp_path: Path) -> None:
    path = tmp_path / "bom.md"
    path.write_bytes(b"\xef\xbb\xbf" + "# Title\n\u00fc".encode("utf-8"))
    doc = read_document(path)
    assert doc.text == "# Title\n\u00fc"
    assert not doc.text.startswith("\ufeff")


def test_utf8_text_round_trips(tmp_path: Path) -> None:
    text = "Gr\u00fc\u00dfe \u2014 \u6f22\u5b57 \U0001f600\n\nsecond paragraph\n"
    path = tmp_path / "u.txt"
    path.write_text(text, encoding="utf-8")
    assert read_document(path).text == text


def test_stdin() -> None:
    doc = read_document("-", stdin=io.BytesIO(b"from stdin\r\n"))
    assert (doc.source, doc.text) == ("<stdin>", "from stdin\n")
    with pytest.raises(BadInput):
        read_document("-", stdin=io.BytesIO(b"   "))


def test_pdf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "paper.pdf"
    path.write_bytes(b"%PDF-1.7 some text")
    with pytest.raises(BadInput) as info:
        read_document(path)
    assert str(path) in str(info.value) and "PDF" in str(info.value)


@pytest.mark.parametrize("data", [b"\xef\xbb\xbf", b"\xef\xbb\xbf \n\n"])
def test_bom_only_file_is_empty(tmp_path: Path, data: bytes) -> None:
    """A BOM is not text: emptiness is judged after decoding (Notepad saves empty files so)."""
    path = tmp_path / "bom-only.txt"
    path.write_bytes(data)
    with pytest.raises(BadInput) as info:
        read_document(path)
    assert str(path) in str(info.value)
