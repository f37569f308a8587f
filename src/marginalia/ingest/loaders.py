"""Loading documents (PDF, markdown, plain text, HTML) into markdown ``Document`` records, one file or many."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from ..errors import BadInput, IngestError, MissingDependency
from ..options import IngestOptions
from ..records import Document
from .base import Loader, content_id
from .text import decode_text

log = logging.getLogger(__name__)

_LOADERS: dict[str, Loader] = {}


def register_loader(loader: Loader) -> None:
    """Make ``load_document`` use ``loader`` for its suffixes (a later registration wins)."""
    for suffix in loader.suffixes:
        _LOADERS[suffix.lower()] = loader


def _registry() -> dict[str, Loader]:
    if not _LOADERS:
        # the built-ins register the way a third-party loader would; pdf.py imports pymupdf only when used
        from .html import HtmlLoader
        from .pdf import PdfLoader
        from .text import MarkdownLoader, TextLoader

        for loader in (TextLoader(), MarkdownLoader(), HtmlLoader(), PdfLoader()):
            register_loader(loader)
    return _LOADERS


def supported_suffixes() -> list[str]:
    """The file suffixes ``load_document`` reads (``""`` stands for no suffix: plain text)."""
    return sorted(_registry())


def _looks_like_pdf(data: bytes) -> bool:
    # only a file that starts like a PDF: a text about PDFs may well quote "%PDF-1.7" near its top
    return data[:1024].lstrip().startswith(b"%PDF-")


def _looks_like_html(data: bytes) -> bool:
    head = data[:512].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return head.startswith((b"<!doctype html", b"<html"))


def loader_for(path: str | Path, data: bytes) -> Loader:
    """The loader for a file: PDFs by their content, then by suffix; a file without suffix may be HTML.

    Raises:
        BadInput: the suffix is not one marginalia reads.
    """
    registry = _registry()
    suffix = Path(path).suffix.lower()
    if _looks_like_pdf(data) and ".pdf" in registry:
        return registry[".pdf"]
    if suffix == "" and _looks_like_html(data) and ".html" in registry:
        return registry[".html"]
    if suffix not in registry:
        known = ", ".join(s for s in supported_suffixes() if s)
        raise BadInput(
            f"{path}: unsupported file type '{suffix}'; marginalia reads {known} and files without a suffix "
            "(as plain text); convert it to one of those first",
            path=str(path),
        )
    return registry[suffix]


def load_document(path: str | Path, notes: list[str] | None = None, source: str | None = None,
                  limits: IngestOptions | None = None) -> Document:
    """Load one file as a markdown ``Document``, choosing the loader by content and suffix.

    PDFs become markdown with headings (pymupdf4llm; the ``pdf`` extra), HTML is converted
    to markdown, markdown stays as it is, and plain text stays plain (it has no headings).

    Args:
        path: the file.
        notes: when given, warnings about a file that loaded only in part are appended here;
            otherwise they are logged.
        source: the name the document is known by, in its record and in every message, and whose suffix
            chooses its loader (default: the path). An uploaded file saved under a name of our own keeps
            its own name this way, and its saved copy's path is never shown.
        limits: the bounds on converting a PDF (default: `IngestOptions`' defaults).

    Returns:
        The document: its markdown text, content-hash id, format, title and page offsets (PDF).

    Raises:
        BadInput: missing, a folder, unreadable, unsupported, empty, binary, not UTF-8, or a PDF
            that is damaged, encrypted or has no text layer.
        MissingDependency: a PDF, without the ``pdf`` extra installed.
        IngestError: the converter failed on the file.
        DocumentTooLarge: converting a PDF ran past one of ``limits`` (it is an `IngestError`).
    """
    source = str(path) if source is None else source
    p = Path(path).expanduser()
    if not p.exists():
        raise BadInput(f"no such file: {source}; check the path", path=source)
    if p.is_dir():
        raise BadInput(f"{source} is a directory; give one document file (text, markdown, HTML or PDF)",
                       path=source)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise BadInput(f"cannot read {source}: {exc.strerror}; check its permissions", path=source) from exc
    doc, file_notes = loader_for(source, data).load(data, source, limits)
    if notes is not None:
        notes.extend(file_notes)
    else:  # nobody asked for them: do not let them pass unseen
        for note in file_notes:
            log.warning("%s", note)
    return doc


@dataclass(frozen=True)
class Skipped:
    """A file that was not loaded, and why (the reason says what to do)."""

    path: str
    reason: str


@dataclass(frozen=True)
class Note:
    """A warning about a file that did load, but not completely."""

    path: str
    message: str


@dataclass(frozen=True)
class LoadReport:
    """What ``load_paths`` loaded, skipped and noted, in a deterministic order."""

    documents: tuple[Document, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    notes: tuple[Note, ...] = ()


def _walk(folder: Path, recursive: bool, visited: set[str] | None = None) -> Iterable[Path]:
    # hidden files and folders (.git, .DS_Store) are not documents; sorted names keep the order stable
    visited = set() if visited is None else visited
    visited.add(os.path.realpath(folder))
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            if recursive and os.path.realpath(entry) not in visited:  # a link back up would loop forever
                yield from _walk(entry, recursive, visited)
        elif entry.is_file():
            yield entry


def document_name(file: Path, given: Path) -> str:
    """The name a document found at ``file`` is known by, without the file system around what was indexed:
    a file given by itself, its file name; a file found in a folder given, its path from that folder's
    name down (``papers/2024/x.pdf``)."""
    if file == given:
        return file.name
    return Path(os.path.relpath(file, given.absolute().parent)).as_posix()


def names_for(path: str) -> frozenset[str]:
    """Every name `document_name` may have given the file at ``path`` (a path as a person gives it), whatever
    was indexed: the path as given and each of its trailing parts (``/home/me/papers/x.md``: ``x.md``,
    ``papers/x.md``, ``me/papers/x.md``, ...)."""
    parts = [part for part in PurePosixPath(path.replace("\\", "/")).parts if part != "/"]
    return frozenset({path, *("/".join(parts[i:]) for i in range(len(parts)))})


def best_name(given: str, names: Iterable[str]) -> str | None:
    """Which of ``names`` (documents' names) ``given`` (a name, or a path as a person gives it) names: itself,
    else the longest of its trailing parts (`names_for`) that is one of them; None when none is."""
    known = set(names)
    if given in known:
        return given
    found = [name for name in names_for(given) if name in known]
    return max(found, key=len) if found else None


def load_paths(
    paths: Iterable[str | Path],
    recursive: bool = True,
    progress: Callable[[int, int, str], None] | None = None,
    limits: IngestOptions | None = None,
) -> LoadReport:
    """Load files and folders, skipping (with the reason) whatever cannot be read.

    Folders are walked in name order (into subfolders when ``recursive``), leaving out hidden
    entries; inside a folder a file of an unsupported type is skipped, not fatal. Each file is
    loaded once even when named twice, and a file whose text equals an earlier one's is skipped.
    Each document is named by `document_name` (never by where the files lie); the skipped files and
    the notes name their paths.

    Args:
        paths: files and folders, in the order to load them.
        recursive: walk subfolders too.
        progress: called after each file with (files done, files in all, path) — e.g. to draw a bar.
        limits: the bounds on converting each PDF; one over them is skipped with the reason.

    Returns:
        The documents, the skipped files with their reasons, and notes on files loaded in part.
    """
    files: list[tuple[Path, str]] = []
    skipped: list[Skipped] = []
    seen: set[str] = set()
    for given in paths:
        p = Path(given).expanduser()
        candidates = list(_walk(p, recursive)) if p.is_dir() else [p]
        for candidate in candidates:
            key = os.path.realpath(candidate)
            if key not in seen:
                seen.add(key)
                files.append((candidate, document_name(candidate, p)))

    documents: list[Document] = []
    notes: list[Note] = []
    by_id: dict[str, str] = {}
    for done, (file, name) in enumerate(files, 1):
        source = str(file)  # what the person who indexed is shown; the document is known by ``name``
        file_notes: list[str] = []
        try:
            doc = load_document(file, notes=file_notes, source=name, limits=limits)
        except (IngestError, MissingDependency) as exc:
            skipped.append(Skipped(source, str(exc)))
        else:
            if doc.doc_id in by_id:
                skipped.append(Skipped(source, f"same text as {by_id[doc.doc_id]}"))
            else:
                by_id[doc.doc_id] = source
                documents.append(doc)
                notes.extend(Note(source, note) for note in file_notes)
        if progress is not None:
            progress(done, len(files), source)
    return LoadReport(tuple(documents), tuple(skipped), tuple(notes))


def read_document(path: str | Path, stdin: BinaryIO | None = None) -> Document:
    """Read a document: any format ``load_document`` reads, or ``-`` for standard input (plain text).

    Raises:
        BadInput: missing, a directory, empty, binary, not UTF-8, or an unusable PDF.
        MissingDependency: a PDF, without the ``pdf`` extra installed.
    """
    if str(path) == "-":
        stream = stdin if stdin is not None else sys.stdin.buffer
        text = decode_text(stream.read(), "standard input")
        return Document("<stdin>", text, content_id(text), format="text")
    return load_document(path)
