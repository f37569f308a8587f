"""The persistent hybrid index: named LanceDB collections of chunk and question entries, searched dense, BM25 or hybrid.

Layout of one collection, under ``<home>/collections/<name>/``::

    collection.json       schema version, embedder name and dimension, creation time (written last, atomically)
    write.lock            the writer lock (filelock), held by one writer at a time
    write.lock.pid        the pid of the writer that holds it, named when another writer has to wait
    db/entries.lance      one row per chunk or question entry: text, offsets, vector; native BM25 index on
                          ``search_text``; an IVF-PQ vector index once the table is large
    db/documents.lance    one row per document: markdown text, section tree, chunking hash

Crash safety: Lance commits each write atomically, and a document becomes visible only
when its ``documents`` row is committed, after all its entries. Entries whose document
row is missing (or names another chunking) are orphans: searches skip them, a rerun of
the same document reuses them instead of embedding again, and :meth:`Collection.optimize`
deletes the rest.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..errors import MissingDependency, UserError
from ..files import atomic_rename, atomic_write_json
from ..home import resolve_home
from ..records import Chunk, Document, Section
from .embedders import Embedder, load_embedder
from .hybrid import ranked, similarities
from .locking import CollectionBusy, WriterLock
from .schema import (
    CHUNK_TEMPLATE,
    DB_DIR,
    DOCUMENTS,
    ENTRIES,
    FTS_COLUMN,
    HIT_COLUMNS,
    KINDS,
    LIVE_COLUMNS,
    LOCK_FILE,
    META_FILE,
    SCHEMA_VERSION,
    AddResult,
    CollectionInfo,
    DocumentInfo,
    Hit,
    LiveDocument,
    QuestionEntry,
    chunk_records,
    chunking_hash,
    documents_schema,
    entries_schema,
    now_iso,
    question_record,
    sections_from_json,
    sections_to_json,
    sql_list,
    sql_str,
    visible,
)

__all__ = [
    "SCHEMA_VERSION", "AddResult", "Collection", "CollectionBusy", "CollectionInfo", "DocumentInfo", "Hit",
    "QuestionEntry", "collections_dir", "delete_collection", "is_collection_name", "list_collections",
]

INDEX_INSTALL = "pip install 'marginalia[index]'"
MODES = ("hybrid", "dense", "bm25")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

#: rows per embed-and-write step of one document: each step is one Lance commit, and what a rerun can reuse
WRITE_BATCH = 256
#: below this many entries a dense search is an exact scan (quick enough there, and it misses nothing); at or
#: above it optimize() builds an IVF-PQ index
VECTOR_INDEX_MIN_ROWS = 50_000
#: an add runs optimize() once this many rows, and this fraction of the indexed ones, wait outside the BM25
#: index (they are still found, by a slower flat scan). LanceDB's optimize also compacts, which rewrites the
#: whole table while it is under a million rows, so a fixed step would cost quadratic time in a bulk load;
#: a geometric one keeps the total rewriting linear. Call optimize() after a batch of adds to fold in the rest.
AUTO_OPTIMIZE_UNINDEXED = 2_000
AUTO_OPTIMIZE_FRACTION = 0.25
#: old table versions are kept this long (so a reader in the middle of a query keeps its files); older ones
#: are deleted by optimize(), or a bulk load would keep every rewrite of the table on disk
KEEP_VERSIONS = timedelta(minutes=1)


# -- helpers ---------------------------------------------------------------------


def _lancedb() -> Any:
    try:
        import lancedb
        import pyarrow  # noqa: F401
    except ImportError as exc:
        raise MissingDependency("LanceDB (the persistent index)", INDEX_INSTALL) from exc
    return lancedb


def collections_dir(home: str | os.PathLike[str] | None = None) -> Path:
    """``<home>/collections``, where every collection lives."""
    return resolve_home(home) / "collections"


def is_collection_name(name: object) -> bool:
    """Whether ``name`` may name a collection (1-64 letters, digits, '.', '_' or '-', starting with a letter
    or digit); any other name names none, and is never a path."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def _check_name(name: str) -> None:
    if not is_collection_name(name):
        raise UserError(
            f"bad collection name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter "
            "or digit (e.g. 'papers' or 'notes-2024')"
        )


def _existing(home: str | os.PathLike[str] | None) -> list[str]:
    root = collections_dir(home)
    if not root.is_dir():
        return []
    # hidden names are collections being deleted (see delete_collection)
    return sorted(p.name for p in root.iterdir() if _NAME.fullmatch(p.name) and (p / META_FILE).is_file())


def _read_meta(path: Path, name: str) -> dict[str, Any]:
    try:
        meta: dict[str, Any] = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"collection {name!r} at {path} has an unreadable {META_FILE} ({exc}); "
                        f"delete the collection and index its documents again") from exc
    return meta


def _check_version(meta: dict[str, Any], name: str) -> None:
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION:
        raise UserError(
            f"collection {name!r} has schema version {version!r}, but this marginalia reads version "
            f"{SCHEMA_VERSION}; use the marginalia that wrote it, or delete the collection and index its "
            "documents again"
        )


# -- collections -------------------------------------------------------------------


def list_collections(home: str | os.PathLike[str] | None = None) -> list[CollectionInfo]:
    """Every collection under the home directory, with its size (sorted by name)."""
    out = []
    for name in _existing(home):
        path = collections_dir(home) / name
        meta = _read_meta(path, name)
        counts: tuple[int | None, ...] = (None, None, None)
        if meta.get("schema_version") == SCHEMA_VERSION:
            col = Collection.open(name, home=home)
            counts = (len(col._live()), col._count("chunk"), col._count("question"))
        out.append(CollectionInfo(
            name=name, path=str(path), schema_version=int(meta.get("schema_version", 0)),
            embedder=str(meta.get("embedder", "")), dim=int(meta.get("dim", 0)),
            created_at=str(meta.get("created_at", "")),
            n_documents=counts[0], n_chunks=counts[1], n_questions=counts[2],
        ))
    return out


def delete_collection(name: str, home: str | os.PathLike[str] | None = None, *, lock_timeout: float = 60.0) -> None:
    """Delete a collection and everything in it (waits for its writer to finish first)."""
    _check_name(name)
    path = collections_dir(home) / name
    if not (path / META_FILE).is_file():
        raise UserError(f"no collection named {name!r}; existing: {', '.join(_existing(home)) or 'none'}")
    with WriterLock(path / LOCK_FILE, name, lock_timeout):
        # rename first, so the name is free at once and a crash mid-delete leaves no half collection
        trash = path.with_name(f".{name}.deleted-{os.getpid()}-{time.monotonic_ns()}")
        atomic_rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


class Collection:
    """A named, persistent collection of documents, their chunk entries and question entries.

    Open one with :meth:`Collection.open`. Reading (listing, BM25 search) needs no
    embedder; adding and dense or hybrid search use the one the collection was built
    with, loaded on first use unless one is given.
    """

    def __init__(self, name: str, path: Path, meta: dict[str, Any], db: Any, embedder: Embedder | None,
                 lock_timeout: float) -> None:
        self.name = name
        self.path = path
        self.meta = meta
        self.lock_timeout = lock_timeout
        self.write_batch = WRITE_BATCH
        self._db = db
        self._embedder = embedder
        self._entries = db.open_table(ENTRIES)
        self._documents = db.open_table(DOCUMENTS)
        self._live_cache: tuple[int, dict[str, LiveDocument]] | None = None
        self._hidden_cache: tuple[dict[str, LiveDocument], int, _Hidden] | None = None

    # -- opening ---------------------------------------------------------------

    @classmethod
    def open(cls, name: str, *, home: str | os.PathLike[str] | None = None, embedder: Embedder | None = None,
             create: bool = False, lock_timeout: float = 60.0) -> Collection:
        """Open the collection ``name`` under the home directory.

        Args:
            name: 1-64 letters, digits, '.', '_' or '-'.
            home: The home directory (default: ``$MARGINALIA_HOME``, then the user data directory).
            embedder: The embedder to add and search with; it must be the one the collection was
                built with. None: load that one (by its name) when first needed; a new collection
                then gets the embedded MiniLM.
            create: Create the collection when it does not exist.
            lock_timeout: Seconds a write waits for another writer before raising :class:`CollectionBusy`.

        Raises:
            UserError: a bad name, an unknown collection (without ``create``), an unknown schema
                version, or an embedder other than the one the collection was built with.
            MissingDependency: LanceDB is not installed.
        """
        _check_name(name)
        lancedb = _lancedb()
        path = collections_dir(home) / name
        if not (path / META_FILE).is_file():
            if not create:
                existing = ", ".join(_existing(home)) or "none"
                raise UserError(f"no collection named {name!r}; existing: {existing}. "
                                f"Index documents into it first (marginalia index add --collection {name} PATH...; "
                                "in Python, open it with create=True)")
            embedder = embedder if embedder is not None else load_embedder("minilm")
            cls._create(path, name, embedder, lock_timeout)
        meta = _read_meta(path, name)
        _check_version(meta, name)
        if embedder is not None and embedder.name != meta["embedder"]:
            raise UserError(
                f"collection {name!r} was built with the embedder {meta['embedder']!r} ({meta['dim']} dimensions), "
                f"not {embedder.name!r}; open it with that embedder (or none: it is then loaded by name), "
                "or index into a new collection"
            )
        dim = getattr(embedder, "dim", None)
        if embedder is not None and isinstance(dim, int) and dim != meta["dim"]:
            raise UserError(f"collection {name!r} holds {meta['dim']}-dimensional vectors but this "
                            f"{embedder.name!r} embedder makes {dim}; open it with the one it was built with")
        db = lancedb.connect(str(path / DB_DIR), read_consistency_interval=timedelta(0))
        return cls(name, path, meta, db, embedder, lock_timeout)

    @staticmethod
    def _create(path: Path, name: str, embedder: Embedder, lock_timeout: float) -> None:
        from lancedb.index import FTS

        path.mkdir(parents=True, exist_ok=True)
        with WriterLock(path / LOCK_FILE, name, lock_timeout):
            if (path / META_FILE).is_file():  # another process created it while we waited
                return
            # a directory without collection.json is a creation that died: start it over
            shutil.rmtree(path / DB_DIR, ignore_errors=True)
            known = getattr(embedder, "dim", None)
            dim = known if isinstance(known, int) else int(embedder.embed_query("dimension probe").shape[0])
            db = _lancedb().connect(str(path / DB_DIR))
            entries = db.create_table(ENTRIES, schema=entries_schema(dim))
            entries.create_index(FTS_COLUMN, config=FTS(with_position=False))
            db.create_table(DOCUMENTS, schema=documents_schema())
            atomic_write_json(path / META_FILE, {
                "schema_version": SCHEMA_VERSION, "name": name, "embedder": embedder.name, "dim": dim,
                "created_at": now_iso(), "chunk_template": CHUNK_TEMPLATE,
            })

    # -- properties and small queries -----------------------------------------------

    @property
    def dim(self) -> int:
        """The dimension of the stored vectors."""
        return int(self.meta["dim"])

    @property
    def embedder_name(self) -> str:
        """The name of the embedder the collection was built with."""
        return str(self.meta["embedder"])

    def __repr__(self) -> str:
        return f"Collection({self.name!r}, embedder={self.embedder_name!r}, path={str(self.path)!r})"

    def _lock(self) -> WriterLock:
        return WriterLock(self.path / LOCK_FILE, self.name, self.lock_timeout)

    def _count(self, kind: str) -> int:
        live = self._live()
        rows = self._scan(self._entries, ["doc_id", "gen"], f"kind = {sql_str(kind)}")
        return sum(1 for d, g in zip(rows["doc_id"], rows["gen"], strict=True) if visible(live, kind, d, g))

    @staticmethod
    def _scan(table: Any, columns: list[str], where: str | None = None) -> dict[str, list[Any]]:
        query = table.search().select(columns).limit(None)
        if where:
            query = query.where(where)
        return query.to_arrow().to_pydict()  # type: ignore[no-any-return]

    def _live(self) -> dict[str, LiveDocument]:
        """doc_id -> its committed row (light columns), cached per version of the documents table."""
        version = self._documents.version
        if self._live_cache is None or self._live_cache[0] != version:
            cols = self._scan(self._documents, LIVE_COLUMNS)
            live = {}
            for i in range(len(cols["doc_id"])):
                row = LiveDocument(**{c: cols[c][i] for c in LIVE_COLUMNS})
                live[row.doc_id] = row
            self._live_cache = (version, live)
        return self._live_cache[1]

    def _resolve(self, doc_id_or_source: str) -> LiveDocument | None:
        live = self._live()
        if doc_id_or_source in live:
            return live[doc_id_or_source]
        # a source, or the path of the file indexed (documents are named from the folder indexed down)
        from ..ingest.loaders import best_name

        by_source = {d.source: d for d in live.values()}
        name = best_name(doc_id_or_source, by_source)
        return by_source[name] if name is not None else None

    def _need(self, doc_id_or_source: str) -> LiveDocument:
        doc = self._resolve(doc_id_or_source)
        if doc is None:
            raise UserError(f"no document {doc_id_or_source!r} in collection {self.name!r}; "
                            "documents() lists those it holds (by doc_id and source)")
        return doc

    # -- embedding ---------------------------------------------------------------

    def _get_embedder(self) -> Embedder:
        if self._embedder is None:
            try:
                self._embedder = load_embedder(self.embedder_name)
            except MissingDependency:
                raise
            except UserError as exc:
                raise UserError(f"collection {self.name!r} was built with the embedder {self.embedder_name!r}, "
                                "which cannot be loaded by name; pass it to Collection.open(embedder=...)") from exc
        return self._embedder

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = self._get_embedder().embed_documents(texts)
        self._check_dim(vectors.shape[1])
        return vectors

    def _embed_query(self, text: str) -> np.ndarray:
        vector = self._get_embedder().embed_query(text)
        self._check_dim(vector.shape[0])
        return vector

    def _check_dim(self, dim: int) -> None:
        if dim != self.dim:
            raise UserError(f"the embedder {self.embedder_name!r} made {dim}-dimensional vectors but collection "
                            f"{self.name!r} holds {self.dim}-dimensional ones; open it with the embedder it was "
                            "built with")

    def _rows(self, records: list[dict[str, Any]], vectors: np.ndarray) -> Any:
        import pyarrow as pa

        schema = entries_schema(self.dim)
        columns: dict[str, Any] = {f.name: [r[f.name] for r in records] for f in schema if f.name != "vector"}
        flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).ravel(), type=pa.float32())
        columns["vector"] = pa.FixedSizeListArray.from_arrays(flat, self.dim)
        return pa.table(columns, schema=schema)

    # -- writing -------------------------------------------------------------------

    def add_document(self, doc: Document, sections: Sequence[Section], chunks: Sequence[Chunk],
                     progress: Callable[[int, int], None] | None = None) -> AddResult:
        """Index one document: its text and section tree, and an embedded entry per chunk.

        Idempotent: the same document with the same chunks is ``unchanged`` and embeds
        nothing; another version from the same ``source`` replaces the old one (whose
        question entries go with it: their offsets point into the old text). A run that
        was killed midway leaves the collection at its last good state, and calling this
        again reuses the chunks it had already embedded.

        Args:
            doc: The document.
            sections: Its section tree (kept so a hit can be widened to its section).
            chunks: Its chunks, all with ``doc_id == doc.doc_id``.
            progress: Called with (chunks done, chunks in all) after each batch.

        Raises:
            UserError: chunks or sections of another document, or offsets outside the text.
            CollectionBusy: another writer held the collection past ``lock_timeout``.
        """
        started = time.perf_counter()
        self._check_document(doc, sections, chunks)
        gen = chunking_hash(doc, sections, chunks)
        with self._lock():
            live = self._live()
            current = live.get(doc.doc_id)
            if current is not None and current.source != doc.source:
                return AddResult("duplicate", doc.doc_id, current.source, current.n_chunks, 0,
                                 seconds=time.perf_counter() - started)
            if current is not None and current.gen == gen:
                return AddResult("unchanged", doc.doc_id, doc.source, len(chunks), 0,
                                 seconds=time.perf_counter() - started)
            old = [d.doc_id for d in live.values() if d.source == doc.source and d.doc_id != doc.doc_id]
            n_embedded = self._write_chunks(doc, gen, chunks, progress)
            self._commit_document(doc, gen, sections, len(chunks))
            # the new version is visible now; what follows only removes rows no search can see
            stale = f"(doc_id = {sql_str(doc.doc_id)} AND kind = 'chunk' AND gen != {sql_str(gen)})"
            if old:
                stale += f" OR doc_id IN {sql_list(old)}"
            if old or current is not None:
                self._entries.delete(stale)
            self._maybe_optimize()
        status: Literal["added", "replaced"] = "replaced" if (old or current is not None) else "added"
        return AddResult(status, doc.doc_id, doc.source, len(chunks), n_embedded, tuple(old),
                         time.perf_counter() - started)

    @staticmethod
    def _check_document(doc: Document, sections: Sequence[Section], chunks: Sequence[Chunk]) -> None:
        n = len(doc.text)
        for c in chunks:
            if c.doc_id != doc.doc_id:
                raise UserError(f"chunk {c.index} belongs to document {c.doc_id!r}, not {doc.doc_id!r} "
                                f"({doc.source}); pass each document with its own chunks")
            if not 0 <= c.start <= c.end <= n:
                raise UserError(f"chunk {c.index} spans {c.start}..{c.end}, outside the {n} characters of "
                                f"{doc.source}; chunk the document's own text")
        for s in sections:
            if s.doc_id != doc.doc_id:
                raise UserError(f"section {s.index} belongs to document {s.doc_id!r}, not {doc.doc_id!r} "
                                f"({doc.source}); pass each document with its own sections")

    def _write_chunks(self, doc: Document, gen: str, chunks: Sequence[Chunk],
                      progress: Callable[[int, int], None] | None) -> int:
        records = chunk_records(doc, gen, chunks)
        # rows of this exact chunking left by a killed run: keep them, embed only the rest
        done = set(self._scan(self._entries, ["id"], f"doc_id = {sql_str(doc.doc_id)} AND gen = {sql_str(gen)}")["id"])
        todo = [r for r in records if r["id"] not in done]
        total = len(records)
        if progress:
            progress(total - len(todo), total)
        for i in range(0, len(todo), self.write_batch):
            batch = todo[i:i + self.write_batch]
            vectors = self._embed([r[FTS_COLUMN] for r in batch])
            self._entries.add(self._rows(batch, vectors))
            if progress:
                progress(total - len(todo) + i + len(batch), total)
        return len(todo)

    def _commit_document(self, doc: Document, gen: str, sections: Sequence[Section], n_chunks: int) -> None:
        import pyarrow as pa

        row = pa.table({
            "doc_id": [doc.doc_id], "source": [doc.source], "gen": [gen], "title": [doc.title],
            "format": [doc.format], "text": [doc.text], "page_starts": [list(doc.page_starts)],
            "sections": [sections_to_json(sections)], "n_chunks": [n_chunks],
            "indexed_at": [now_iso()],
        }, schema=documents_schema())
        # one commit swaps the old version of this source (if any) for the new one
        (self._documents.merge_insert("source").when_matched_update_all().when_not_matched_insert_all()
         .execute(row))

    def add_questions(self, entries: Sequence[QuestionEntry]) -> int:
        """Store question entries beside the chunks (embedded like chunks); returns how many were new.

        Idempotent: an entry's key is the hash of its content, so adding it again adds nothing.

        Raises:
            UserError: an entry names a document that is not in the collection.
        """
        with self._lock():
            live = self._live()
            records: dict[str, dict[str, Any]] = {}
            for e in entries:
                doc = live.get(e.doc_id) or self._resolve(e.source)
                if doc is None or (e.doc_id and doc.doc_id != e.doc_id):
                    raise UserError(f"question {e.question!r} is for document {e.doc_id!r}, which collection "
                                    f"{self.name!r} does not hold; add the document first")
                record = question_record(e, doc.doc_id)
                records[record["id"]] = record
            if not records:
                return 0
            have = set()
            keys = list(records)
            for i in range(0, len(keys), 500):
                have |= set(self._scan(self._entries, ["id"], f"id IN {sql_list(keys[i:i + 500])}")["id"])
            todo = [r for k, r in records.items() if k not in have]
            for i in range(0, len(todo), self.write_batch):
                batch = todo[i:i + self.write_batch]
                self._entries.add(self._rows(batch, self._embed([r[FTS_COLUMN] for r in batch])))
            if todo:
                self._maybe_optimize()
            return len(todo)

    def delete_document(self, doc_id_or_source: str) -> bool:
        """Remove a document, its chunks and its questions; False when there was no such document."""
        with self._lock():
            doc = self._resolve(doc_id_or_source)
            if doc is None:
                return False
            # the documents row goes first: from that commit on, no search sees the entries
            self._documents.delete(f"doc_id = {sql_str(doc.doc_id)}")
            self._entries.delete(f"doc_id = {sql_str(doc.doc_id)}")
            return True

    def optimize(self) -> dict[str, int]:
        """Delete orphan entries, compact the tables, fold new rows into the indices, and build the
        vector index once the collection is large; returns what it did (counts)."""
        with self._lock():
            return self._optimize()

    def _maybe_optimize(self) -> None:
        stats = self._entries.index_stats(f"{FTS_COLUMN}_idx")
        if stats is None:
            return
        if stats.num_unindexed_rows >= max(AUTO_OPTIMIZE_UNINDEXED, AUTO_OPTIMIZE_FRACTION * stats.num_indexed_rows):
            self._optimize()

    def _optimize(self) -> dict[str, int]:
        live = self._live()
        rows = self._scan(self._entries, ["id", "kind", "doc_id", "gen"])
        orphans = [i for i, k, d, g in zip(rows["id"], rows["kind"], rows["doc_id"], rows["gen"], strict=True)
                   if not visible(live, k, d, g)]
        for i in range(0, len(orphans), 500):
            self._entries.delete(f"id IN {sql_list(orphans[i:i + 500])}")
        n_rows = len(rows["id"]) - len(orphans)
        built = 0
        if n_rows >= VECTOR_INDEX_MIN_ROWS and not self._has_vector_index():
            self._build_vector_index()
            built = 1
        self._entries.optimize(cleanup_older_than=KEEP_VERSIONS)
        self._documents.optimize(cleanup_older_than=KEEP_VERSIONS)
        return {"orphans_deleted": len(orphans), "rows": n_rows, "vector_index_built": built}

    def _has_vector_index(self) -> bool:
        return any("vector" in ix.columns and ix.index_type != "FTS" for ix in self._entries.list_indices())

    def _build_vector_index(self) -> None:
        from lancedb.index import IvfPq

        # LanceDB's own partition and sub-vector counts; searches win back recall with the probes and
        # refinement of hybrid.py
        self._entries.create_index("vector", replace=True, config=IvfPq(distance_type="cosine"))

    # -- reading ---------------------------------------------------------------------

    def documents(self) -> list[DocumentInfo]:
        """The documents in the collection, sorted by source."""
        live = self._live()
        rows = self._scan(self._entries, ["doc_id"], "kind = 'question'")
        questions = Counter(rows["doc_id"])
        return sorted((DocumentInfo(d.doc_id, d.source, d.title, d.format, d.n_chunks, questions[d.doc_id],
                                    d.indexed_at) for d in live.values()), key=lambda d: (d.source, d.doc_id))

    def _document_row(self, doc_id_or_source: str, columns: list[str]) -> dict[str, Any]:
        doc = self._need(doc_id_or_source)
        rows = self._scan(self._documents, columns, f"doc_id = {sql_str(doc.doc_id)}")
        return {c: rows[c][0] for c in columns}

    def document(self, doc_id_or_source: str) -> Document:
        """The stored document (its markdown text and metadata), by doc_id or source."""
        row = self._document_row(doc_id_or_source, ["doc_id", "source", "text", "format", "title", "page_starts"])
        return Document(source=row["source"], text=row["text"], doc_id=row["doc_id"], format=row["format"],
                        title=row["title"], page_starts=tuple(row["page_starts"] or ()))

    def sections(self, doc_id_or_source: str) -> list[Section]:
        """The document's section tree as it was indexed, by doc_id or source."""
        return sections_from_json(self._document_row(doc_id_or_source, ["sections"])["sections"])

    def chunks(self, doc_id_or_source: str) -> list[Chunk]:
        """The document's chunks as it was last indexed (its chunk sizes), in order."""
        doc = self._need(doc_id_or_source)
        columns = ["section_index", "chunk_index", "start", "end", "text", "section_path", "page"]
        rows = self._scan(self._entries, columns, f"kind = 'chunk' AND doc_id = {sql_str(doc.doc_id)} "
                                                  f"AND gen = {sql_str(doc.gen)}")
        return sorted((Chunk(doc.doc_id, si, ci, start, end, text, tuple(path), page=page)
                       for si, ci, start, end, text, path, page in zip(*(rows[c] for c in columns), strict=True)),
                      key=lambda c: c.index)

    def questions(self, doc_id: str | None = None) -> list[QuestionEntry]:
        """The question entries of one document (doc_id or source), or of all; by document, then offset."""
        live = self._live()
        where = "kind = 'question'"
        if doc_id is not None:
            where += f" AND doc_id = {sql_str(self._need(doc_id).doc_id)}"
        cols = ["doc_id", "text", "answer", "long_answer", "section_path", "section_index", "start", "end", "page"]
        rows = self._scan(self._entries, cols, where)
        out = []
        for i in range(len(rows["doc_id"])):
            doc = live.get(rows["doc_id"][i])
            if doc is None:
                continue
            out.append(QuestionEntry(
                question=rows["text"][i], answer=rows["answer"][i], doc_id=doc.doc_id, source=doc.source,
                section_path=tuple(rows["section_path"][i] or ()), start=rows["start"][i], end=rows["end"][i],
                long_answer=rows["long_answer"][i], page=rows["page"][i], section_index=rows["section_index"][i],
            ))
        return sorted(out, key=lambda q: (q.source, q.doc_id, q.start, q.end, q.question))

    # -- search ---------------------------------------------------------------------

    def search(self, query: str, k: int = 5, mode: str = "hybrid",
               kinds: Sequence[str] = ("chunk",)) -> list[Hit]:
        """The ``k`` entries that best match ``query``.

        Args:
            query: Free text.
            k: How many hits.
            mode: ``hybrid`` (BM25 and dense, each ``max(3k, 30)`` deep, fused by reciprocal rank
                with k=60: LanceDB's hybrid query and ``RRFReranker``), ``dense`` (cosine) or
                ``bm25`` (LanceDB's native full-text index).
            kinds: Entry kinds to search: ``chunk`` and/or ``question``.

        Returns:
            Hits, best first. ``similarity`` is always the cosine of the query and the entry
            (in bm25 mode only when an embedder is loaded; NaN otherwise). Only entries of
            committed documents are searched (a chunk: of its document's current chunking),
            so rows a killed or unfinished run left behind take no rank.

        Raises:
            UserError: an empty query, k < 1, or an unknown mode or kind.
        """
        if not query or not query.strip():
            raise UserError("the search query is empty; ask something")
        if mode not in MODES:
            raise UserError(f"unknown search mode {mode!r}; use one of {', '.join(MODES)}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise UserError(f"k must be a positive whole number, not {k!r}")
        kinds = tuple(kinds)
        if not kinds or any(kind not in KINDS for kind in kinds):
            raise UserError(f"unknown entry kinds {kinds!r}; use 'chunk' and/or 'question'")
        live = self._live()
        if not live:
            return []
        qvec = self._embed_query(query) if mode != "bm25" or self._embedder is not None else None
        # hybrid fuses rankings deeper than k: an entry ranked well by both can beat one ranked first by one
        limit = max(3 * k, 30) if mode == "hybrid" else k
        where, version = self._visible_where(live, kinds)
        rows = ranked(self._entries, mode, query, qvec, where, limit)
        if version is not None and self._entries.version != version:
            # a write landed after the hidden rows were listed: rows it added may have slipped through
            rows = ranked(self._entries, mode, query, qvec, _live_where(live, kinds), limit)
        rows = rows.slice(0, k)
        score_column = {"hybrid": "_relevance_score", "bm25": "_score", "dense": None}[mode]
        sims = similarities(rows, qvec)
        scores = rows[score_column].to_pylist() if score_column else sims
        columns = [c for c in HIT_COLUMNS if c != "vector"]
        values = {c: rows[c].to_pylist() for c in columns}
        return [self._hit({c: values[c][i] for c in columns}, scores[i], sims[i], live) for i in range(rows.num_rows)]

    def _visible_where(self, live: dict[str, LiveDocument], kinds: tuple[str, ...]) -> tuple[str, int | None]:
        """A SQL prefilter that keeps the entries of ``kinds`` that :func:`visible` accepts under ``live``,
        and the entries version it is exact for (None: every version).

        Listing what is hidden (usually nothing: rows of a run in progress or killed, until
        optimize() deletes them) keeps the filter short; listing what is live is exact whatever
        is written meanwhile, but grows with the number of documents. The shorter list is used.
        """
        version = self._entries.version
        cache = self._hidden_cache
        if cache is None or cache[0] is not live or cache[1] != version:
            cache = self._hidden_cache = (live, version, self._hidden(live))
        hidden = cache[2]
        if len(hidden.gens) + len(hidden.doc_ids) > len(live):
            return _live_where(live, kinds), None
        parts = []
        if "chunk" in kinds:
            parts.append(f"(kind = 'chunk' AND gen NOT IN {sql_list(hidden.gens)})" if hidden.gens
                         else "kind = 'chunk'")
        if "question" in kinds:
            parts.append(f"(kind = 'question' AND doc_id NOT IN {sql_list(hidden.doc_ids)})" if hidden.doc_ids
                         else "kind = 'question'")
        return " OR ".join(parts), version

    def _hidden(self, live: dict[str, LiveDocument]) -> _Hidden:
        """The chunking keys of chunk entries, and the documents of question entries, that no search may see."""
        rows = self._scan(self._entries, ["kind", "doc_id", "gen"], f"NOT ({_live_where(live, KINDS)})")
        gens, doc_ids = set(), set()
        for kind, doc_id, gen in zip(rows["kind"], rows["doc_id"], rows["gen"], strict=True):
            if kind == "chunk":
                gens.add(gen)
            else:
                doc_ids.add(doc_id)
        return _Hidden(tuple(sorted(gens)), tuple(sorted(doc_ids)))

    @staticmethod
    def _hit(row: dict[str, Any], score: float, similarity: float, live: dict[str, LiveDocument]) -> Hit:
        return Hit(
            kind=row["kind"], id=row["id"], doc_id=row["doc_id"], source=live[row["doc_id"]].source,
            text=row["text"], section_path=tuple(row["section_path"] or ()), section_index=row["section_index"],
            start=row["start"], end=row["end"], page=row["page"], score=float(score),
            similarity=similarity, answer=row["answer"] or "", long_answer=row["long_answer"] or "",
            chunk_index=row["chunk_index"],
        )


@dataclass(frozen=True)
class _Hidden:
    """Entries no search may see: chunks by their chunking key, questions by their document."""

    gens: tuple[str, ...]
    doc_ids: tuple[str, ...]


def _live_where(live: dict[str, LiveDocument], kinds: Sequence[str]) -> str:
    """A SQL filter for the entries of ``kinds`` that :func:`visible` accepts under ``live`` (not empty).

    A chunk is matched by its chunking key alone: the key hashes the doc_id, so it names one document.
    """
    parts = []
    if "chunk" in kinds:
        parts.append(f"(kind = 'chunk' AND gen IN {sql_list(sorted({d.gen for d in live.values()}))})")
    if "question" in kinds:
        parts.append(f"(kind = 'question' AND doc_id IN {sql_list(sorted(live))})")
    return " OR ".join(parts)
