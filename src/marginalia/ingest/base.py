"""What every loader shares: the document id of a text, and the Loader base that runs and checks a conversion."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..errors import EmptyDocument
from ..options import IngestOptions
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
    """Turns the bytes of one file into markdown; the base checks the result and builds the ``Document``.

    An ``isolated`` loader, one whose cost may far exceed its file's size (a PDF's compressed streams), is
    always run in a child process bounded by `IngestOptions` (see `isolated`): there its class is built as
    ``cls(limits)``, `prepare` loads its libraries, and `convert` runs under the memory bound. The others
    convert in-process, in time and memory that grow with their file's size.
    """

    format: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]]  # lower case, with the dot
    isolated: ClassVar[bool] = False

    @abstractmethod
    def convert(self, data: bytes, source: str) -> Converted:
        """Convert a file's bytes (``source`` names it in messages); raise ``IngestError`` when unusable."""

    def prepare(self) -> None:
        """Load what converting needs (an isolated loader's child calls this before its memory bound applies)."""
        return None  # most loaders need nothing loaded first

    def load(self, data: bytes, source: str,
             limits: IngestOptions | None = None) -> tuple[Document, tuple[str, ...]]:
        """The document and the loader's notes about it.

        Args:
            limits: the bounds on an isolated loader's conversion (default: `IngestOptions`' defaults).

        Raises:
            EmptyDocument: the file converts to no text at all.
            DocumentTooLarge: an isolated loader's conversion ran past one of ``limits``.
        """
        if self.isolated:
            from .isolated import convert_isolated

            fields = convert_isolated(type(self), data, source, limits or IngestOptions())
            converted = Converted(fields["text"], fields["title"], tuple(fields["page_starts"]),
                                  tuple(fields["notes"]))
        else:
            converted = self.convert(data, source)
        if not converted.text.strip():
            raise EmptyDocument(f"{source} has no text; give a document with some text", path=source)
        doc = Document(
            source=source, text=converted.text, doc_id=content_id(converted.text), format=self.format,
            title=converted.title or Path(source).stem, page_starts=converted.page_starts,
        )
        return doc, converted.notes
