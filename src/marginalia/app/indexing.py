"""Collections: create, open, list and delete them, index files and folders into them, and write and export
their question banks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BadInput, NotFound, UserError
from ..models.base import Generator
from ..options import ChunkingOptions, IngestOptions
from ..records import Chunk, Document, Section
from .loading import DEFAULT_EMBEDDER, load_embedder

if TYPE_CHECKING:
    from ..index.embedders import Embedder
    from ..index.question_bank import BankReport
    from ..index.schema import AddResult, CollectionInfo
    from ..index.store import Collection
    from ..ingest.loaders import LoadReport, Note, Skipped

#: ``(done, total)`` of a long step
Progress = Callable[[int, int], None]


def collection_exists(name: str, *, home: str | Path | None = None) -> bool:
    """Whether a collection by this name exists (a name no collection may have names none, and is never
    taken as a path)."""
    from ..index.schema import META_FILE
    from ..index.store import collections_dir, is_collection_name

    return is_collection_name(name) and (collections_dir(home) / name / META_FILE).is_file()


def list_collections(home: str | Path | None = None) -> list[CollectionInfo]:
    """Every collection under the home directory, with its counts."""
    from ..index.store import list_collections as listing

    return listing(home)


def open_collection(name: str, *, home: str | Path | None = None, embedder: Embedder | None = None) -> Collection:
    """An existing collection (a `UserError` naming the known ones when there is none by that name); with
    ``embedder``, searched and added to with that one (it must be the collection's own)."""
    from ..index.store import Collection

    return Collection.open(name, home=home, embedder=embedder)


def create_collection(name: str, *, home: str | Path | None = None,
                      embedder: str | Embedder = DEFAULT_EMBEDDER) -> Collection:
    """A new collection, or the existing one of that name (which keeps its own embedder).

    Raises:
        UserError: a bad name.
    """
    from ..index.store import Collection

    loaded = load_embedder(embedder) if isinstance(embedder, str) else embedder
    return Collection.open(name, home=home, create=True, embedder=loaded)


def delete_collection(name: str, *, home: str | Path | None = None) -> None:
    """Delete a collection and everything in it (waits for its writer to finish first).

    Raises:
        UserError: there is no collection by that name.
    """
    from ..index.store import delete_collection as delete

    delete(name, home=home)


def section_outline(sections: Sequence[Section], doc: Document) -> str:
    """A document's section tree as indented text, one section a line."""
    from ..ingest.sections import format_tree

    return format_tree(list(sections), doc)


def upload_suffix(name: str, data: bytes) -> str:
    """Check an uploaded document by its content, not only its name; return the suffix a copy of it is
    saved under (which says how to read it).

    Raises:
        BadInput: a type marginalia does not read, a '.pdf' that is not a PDF, a text that is binary or not
            UTF-8.
        EmptyDocument: a text with nothing but whitespace in it.
    """
    from ..ingest.loaders import loader_for
    from ..ingest.text import decode_text

    by_name = loader_for(name, data)
    by_content = loader_for("upload", data)  # no suffix: what the bytes look like (PDF, HTML, text)
    if by_content.format == "pdf":
        return ".pdf"
    if by_name.format == "pdf":
        raise BadInput(f"{name} is named as a PDF but its content is not one; send the real file")
    decode_text(data, name)
    return Path(name).suffix.lower()


def chunk_document(doc: Document, count_tokens: Callable[[str], int],
                   chunking: ChunkingOptions | None = None) -> tuple[list[Section], list[Chunk]]:
    """A document's section tree and its section-bounded chunks (sizes counted by ``count_tokens``)."""
    from ..ingest.chunking import chunk_sections
    from ..ingest.sections import parse_sections

    chunking = chunking or ChunkingOptions()
    sections = parse_sections(doc)
    chunks = chunk_sections(doc, sections, count_tokens, min_tokens=chunking.min_tokens,
                            max_tokens=chunking.max_tokens, overlap_tokens=chunking.overlap_tokens)
    return sections, chunks


@dataclass(frozen=True)
class Indexed:
    """One document's outcome in `index_paths`."""

    document: Document
    sections: tuple[Section, ...]
    result: AddResult


@dataclass
class IndexReport:
    """What `index_paths` did: per document, what could not be read, and notes from the loaders."""

    collection: str
    indexed: list[Indexed] = field(default_factory=list)
    skipped: tuple[Skipped, ...] = ()
    notes: tuple[Note, ...] = ()

    def counts(self) -> dict[str, int]:
        """How many documents ended in each status (added, replaced, unchanged, duplicate, skipped)."""
        out: dict[str, int] = {}
        for item in self.indexed:
            out[item.result.status] = out.get(item.result.status, 0) + 1
        if self.skipped:
            out["skipped"] = len(self.skipped)
        return out


def check_paths(paths: Sequence[str | Path]) -> None:
    """Refuse a path that does not exist (before anything slow is loaded)."""
    if not paths:
        raise UserError("give at least one file or folder to index")
    for given in paths:
        if not Path(given).expanduser().exists():
            raise UserError(f"no file or folder at {given}")


def index_paths(
    paths: Sequence[str | Path],
    collection: str | Collection,
    *,
    count_tokens: Callable[[str], int],
    home: str | Path | None = None,
    embedder: str | Embedder = DEFAULT_EMBEDDER,
    chunking: ChunkingOptions | None = None,
    ingest: IngestOptions | None = None,
    recursive: bool = True,
    source: str | None = None,
    on_file: Callable[[int, int, str], None] | None = None,
    on_document: Callable[[Document, int], Progress | None] | None = None,
    on_indexed: Callable[[Indexed], None] | None = None,
    write_lock: AbstractContextManager[object] | None = None,
) -> IndexReport:
    """Load files and folders, cut each document into sections and chunks, add them to a collection.

    The collection is created when missing (with ``embedder``; an existing one keeps its own). Re-indexing
    unchanged files does nothing; a changed file replaces its old version; each document is committed as
    it is added, so an interrupted run keeps what was indexed before it.

    Args:
        paths: files and folders (folders are walked; into subfolders when ``recursive``).
        collection: the collection's name, or an open collection (used as it is, with its embedder).
        count_tokens: the model tokenizer's count, for chunk sizes.
        home: marginalia's home directory.
        embedder: a spec or an embedder, for a new collection.
        chunking: chunk sizes.
        ingest: the bounds on converting each PDF (pages, inflated size, time, memory); a file over them is
            skipped with the reason (with ``source``, it raises).
        source: the name to index the one file in ``paths`` under, instead of its path (an uploaded file's
            own name, not its saved copy's); that file then raises when it cannot be read, where files
            given by path are skipped with the reason.
        on_file: ``(done, total, path)`` as files are loaded.
        on_document: called with each document and its chunk count before it is added; may return a
            ``(done, total)`` callback for the chunks embedded.
        on_indexed: called with each document's outcome.
        write_lock: held while the loaded documents are added to the collection, not while they are loaded
            (so that several callers may convert at once and add one after another).

    Raises:
        UserError: a path that does not exist, a bad collection name, bad chunk sizes, a ``source`` given
            with other than one file.
        IngestError: with ``source``, the file cannot be read or is over a bound of ``ingest`` (the message
            names ``source``, not the path).
    """
    from ..index.store import Collection, collections_dir
    from ..ingest.loaders import load_paths

    check_paths(paths)
    chunking = chunking or ChunkingOptions()
    if isinstance(collection, str):
        loaded_embedder = None
        if not (collections_dir(home) / collection).exists():
            loaded_embedder = load_embedder(embedder) if isinstance(embedder, str) else embedder
        store = Collection.open(collection, home=home, create=True, embedder=loaded_embedder)
    else:
        store = collection
    if source is None:
        loaded = load_paths(paths, recursive=recursive, progress=on_file, limits=ingest)
    else:
        loaded = _load_as(paths, source, on_file, ingest)
    report = IndexReport(store.name, skipped=loaded.skipped, notes=loaded.notes)
    with write_lock or nullcontext():
        _add_documents(store, loaded.documents, report, count_tokens, chunking, on_document, on_indexed)
    return report


def _add_documents(store: Collection, documents: Sequence[Document], report: IndexReport,
                   count_tokens: Callable[[str], int], chunking: ChunkingOptions,
                   on_document: Callable[[Document, int], Progress | None] | None,
                   on_indexed: Callable[[Indexed], None] | None) -> None:
    for doc in documents:
        sections, chunks = chunk_document(doc, count_tokens, chunking)
        progress = on_document(doc, len(chunks)) if on_document else None
        result = store.add_document(doc, sections, chunks, progress=progress)
        item = Indexed(doc, tuple(sections), result)
        report.indexed.append(item)
        if on_indexed:
            on_indexed(item)
    if any(i.result.status in ("added", "replaced") for i in report.indexed):
        store.optimize()  # fold the new rows into the BM25 (and vector) indices


def _load_as(paths: Sequence[str | Path], source: str, on_file: Callable[[int, int, str], None] | None,
             ingest: IngestOptions | None) -> LoadReport:
    """The one file in ``paths``, loaded as the document ``source``."""
    from ..ingest.loaders import LoadReport, Note, load_document

    if len(paths) != 1 or not Path(paths[0]).expanduser().is_file():
        raise UserError(f"a source name ({source!r}) names one document: give exactly one file with it, "
                        f"not {', '.join(str(p) for p in paths)}")
    notes: list[str] = []
    doc = load_document(paths[0], notes, source=source, limits=ingest)
    if on_file:
        on_file(1, 1, source)
    return LoadReport((doc,), notes=tuple(Note(source, note) for note in notes))


@dataclass(frozen=True)
class DocumentQuestions:
    """The question pairs written for one document, and how many of them were new to the collection."""

    source: str
    report: BankReport
    new: int


def generate_questions(
    collection: Collection | str,
    generator: Generator,
    *,
    home: str | Path | None = None,
    density: str = "sparse",
    long_answers: bool = False,
    retries: int = 2,
    documents: Sequence[str] | None = None,
    on_document: Callable[[str], Progress | None] | None = None,
    on_written: Callable[[DocumentQuestions], None] | None = None,
) -> list[DocumentQuestions]:
    """Write question-answer pairs for a collection's documents and store them in its question bank.

    Args:
        collection: the collection or its name.
        generator: the model that writes the pairs.
        density: ``sparse`` (about one pair per paragraph of each top-level section) or ``dense`` (one per
            chunk, as indexed).
        long_answers: also ask for a one-to-two-sentence answer.
        retries: tries after a malformed reply.
        documents: only these documents (paths or ids).
        on_document: called with each document's source; may return a ``(done, total)`` request callback.
        on_written: called with each document's outcome, once stored.

    Raises:
        UserError: an unknown document, or an empty collection.
    """
    from ..index.question_bank import BankReport, QuestionWriter

    store = open_collection(collection, home=home) if isinstance(collection, str) else collection
    infos = store.documents()
    if documents:
        from ..ingest.loaders import best_name

        by_id = {d.doc_id: d for d in infos}
        by_source = {d.source: d for d in infos}
        chosen: set[str] = set()
        for name in documents:  # an id, a source, or the path of the file indexed
            found = by_id.get(name) or by_source.get(best_name(name, by_source) or "")
            if found is None:
                raise NotFound(f"collection {store.name!r} has no document {name!r}", "document", name)
            chosen.add(found.doc_id)
        infos = [d for d in infos if d.doc_id in chosen]
    if not infos:
        raise UserError(f"collection {store.name!r} holds no documents; index some first")
    writer = QuestionWriter(generator, retries=retries, long_answers=long_answers)
    out = []
    for info in infos:
        doc = store.document(info.doc_id)
        progress = on_document(info.source) if on_document else None
        report = writer.write(doc, store.sections(info.doc_id), store.chunks(info.doc_id), density=density,
                              progress=progress, report=BankReport())
        written = DocumentQuestions(info.source, report, store.add_questions(report.pairs))
        out.append(written)
        if on_written:
            on_written(written)
    return out


def export_questions(collection: Collection | str, *, home: str | Path | None = None, system: str | None = None,
                     long: bool = False) -> list[str]:
    """A collection's question bank as chat-format fine-tuning JSONL, one line per pair: ``{"messages":
    [system, user question, assistant answer]}`` (``system``: marginalia's reader prompt by default, ``""``
    for none; ``long``: the long answers where there are some).

    Raises:
        UserError: the collection has no questions yet.
    """
    from ..index.question_bank import to_chat_jsonl

    store = open_collection(collection, home=home) if isinstance(collection, str) else collection
    entries = store.questions()
    if not entries:
        raise UserError(f"collection {store.name!r} has no questions yet; "
                        f"run 'marginalia questions generate --collection {store.name}' first")
    return list(to_chat_jsonl(entries, system=system, long=long))

