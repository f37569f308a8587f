"""What every loader shares: the document id of a text, and the Loader base that checks a conversion."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..errors import EmptyDocument
from ..records import Document

#: characters of the sha256 hex digest kept as a document id (80 bits: collisions are not a concern)
DOC_ID_CHARS = 20


def content_id(text: str) -> str:
    """The document id of a text: the first hex digits of its UTF-8 sha256."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:DOC_ID_CHARS]


@dataclass(frozen=True)
class Converted:
    """What a loader makes of one file, before the shared fields (id, title fallback) are added."""

    text: str  # markdown
    title: str = ""
    page_starts: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()  # warnings worth showing: the file loaded, but not all of it


class Loader(ABC):
    """Turns the bytes of one file into markdown; the base checks the result and builds the ``Document``."""

    format: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]]  # lower case, with the dot

    @abstractmethod
    def convert(self, data: bytes, source: str) -> Converted:
        """Convert a file's bytes (``source`` names it in messages); raise ``IngestError`` when unusable."""

    def load(self, data: bytes, source: str) -> tuple[Document, tuple[str, ...]]:
        """The document and the loader's notes about it.

        Raises:
            EmptyDocument: the file converts to no text at all.
        """
        converted = self.convert(data, source)
        if not converted.text.strip():
            raise EmptyDocument(f"{source} has no text; give a document with some text", path=source)
        doc = Document(
            source=source, text=converted.text, doc_id=content_id(converted.text), format=self.format,
            title=converted.title or Path(source).stem, page_starts=converted.page_starts,
        )
        return doc, converted.notes
