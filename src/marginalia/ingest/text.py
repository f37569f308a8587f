"""Loading plain-text and markdown documents, with clear errors for unusable files."""

from __future__ import annotations

from ..errors import BadInput, EmptyDocument
from .base import Converted, Loader
from .sections import first_heading

TEXT_SUFFIXES = {".txt", ".md", ".markdown", ".text", ".rst", ""}


def decode_text(data: bytes, source: str) -> str:
    """Decode bytes as UTF-8 text, refusing binary data and other encodings."""
    if b"\x00" in data[:8192]:
        raise BadInput(
            f"{source} looks binary (it contains NUL bytes); give a text, markdown, HTML or PDF file",
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
        raise EmptyDocument(f"{source} is empty; give a document with some text", path=source)
    return text.replace("\r\n", "\n").replace("\r", "\n")


class TextLoader(Loader):
    """Plain text stays plain: it is kept as it is and has no headings."""

    format = "text"
    suffixes = (".txt", ".text", ".rst", "")

    def convert(self, data: bytes, source: str) -> Converted:
        return Converted(decode_text(data, source))


class MarkdownLoader(Loader):
    """Markdown is taken as it is; its title is its first heading."""

    format = "markdown"
    suffixes = (".md", ".markdown")

    def convert(self, data: bytes, source: str) -> Converted:
        text = decode_text(data, source)
        return Converted(text, title=first_heading(text))
