"""Loading plain-text and markdown documents, with clear errors for unusable files."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import BadInput

TEXT_SUFFIXES = {".txt", ".md", ".markdown", ".text", ".rst", ""}


@dataclass(frozen=True)
class Document:
    """A document's text and where it came from."""

    source: str
    text: str


def decode_text(data: bytes, source: str) -> str:
    """Decode bytes as UTF-8 text, refusing binary data and other encodings."""
    if b"\x00" in data[:8192]:
        raise BadInput(
            f"{source} looks binary (it contains NUL bytes); give a text or markdown file "
            "(PDF support comes with marginalia's document loaders)",
            path=source,
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadInput(
            f"{source} is not valid UTF-8 (byte {exc.start}: {data[exc.start:exc.start + 1]!r}); "
            f"convert it first, e.g. iconv -f latin1 -t utf-8 {source} > converted.txt",
            path=source,
        ) from exc
    if not text.strip():
        raise BadInput(f"{source} is empty; give a document with some text", path=source)
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_document(path: str | Path, stdin: BinaryIO | None = None) -> Document:
    """Read a text or markdown file (``-`` reads standard input).

    Raises:
        BadInput: missing, a directory, empty, binary or not UTF-8.
    """
    source = str(path)
    if source == "-":
        stream = stdin if stdin is not None else sys.stdin.buffer
        return Document("<stdin>", decode_text(stream.read(), "standard input"))
    p = Path(path).expanduser()
    if not p.exists():
        raise BadInput(f"no such file: {source}; check the path", path=source)
    if p.is_dir():
        raise BadInput(f"{source} is a directory; give one text or markdown file", path=source)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise BadInput(f"cannot read {source}: {exc.strerror}", path=source) from exc
    if p.suffix.lower() == ".pdf":
        raise BadInput(
            f"{source} is a PDF; this version reads text and markdown files only "
            "(convert it to text first, e.g. pdftotext)",
            path=source,
        )
    return Document(source, decode_text(data, source))
