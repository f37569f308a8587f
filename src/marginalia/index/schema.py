"""What a collection stores: its records, Arrow table schemas, content-hash keys and the schema version."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from ..records import Chunk, Document, Section

#: bump when a table's columns or a key's recipe change; a collection of another version is refused
SCHEMA_VERSION = 1
META_FILE = "collection.json"
LOCK_FILE = "write.lock"
DB_DIR = "db"
ENTRIES = "entries"
DOCUMENTS = "documents"
FTS_COLUMN = "search_text"
KINDS = ("chunk", "question")
#: how the embedder and BM25 see a chunk: its section path as context, then its text
CHUNK_TEMPLATE = "{path}\n\n{text}"


@dataclass(frozen=True)
class QuestionEntry:
    """A generated question-answer pair stored beside the chunks, pointing at its evidence in a document."""

    question: str
    answer: str
    doc_id: str
    source: str = ""  # filled from the collection when read back
    section_path: tuple[str, ...] = ()
    start: int = 0  # character span of the evidence in Document.text
    end: int = 0
    long_answer: str = ""
    page: int | None = None
    section_index: int | None = None


@dataclass(frozen=True)
class Hit:
    """One search result: a chunk entry or a question entry, with its place in the source."""

    kind: str  # "chunk" | "question"
    id: str
    doc_id: str
    source: str
    text: str  # a question entry's text is the question
    section_path: tuple[str, ...]
    section_index: int | None
    start: int
    end: int
    page: int | None
    score: float  # the mode's ranking score: cosine (dense), BM25 (bm25), reciprocal-rank sum (hybrid)
    similarity: float  # cosine of the query and this entry's vector; NaN only for bm25 without a loaded embedder
    answer: str = ""
    long_answer: str = ""
    chunk_index: int | None = None


@dataclass(frozen=True)
class AddResult:
    """What ``Collection.add_document`` did.

    ``status`` is ``added``, ``replaced`` (the same source held other content or another
    chunking), ``unchanged`` (identical content and chunking: nothing embedded) or
    ``duplicate`` (the same content is already indexed under ``source``, another path).
    """

    status: Literal["added", "replaced", "unchanged", "duplicate"]
    doc_id: str
    source: str
    n_chunks: int
    n_embedded: int  # chunks embedded by this call: fewer than n_chunks when a killed run is resumed
    replaced: tuple[str, ...] = ()  # doc_ids of the versions it replaced
    seconds: float = 0.0


@dataclass(frozen=True)
class DocumentInfo:
    """One document of a collection, as listed."""

    doc_id: str
    source: str
    title: str
    format: str
    n_chunks: int
    n_questions: int
    indexed_at: str  # ISO 8601, UTC


@dataclass(frozen=True)
class CollectionInfo:
    """One collection, as listed."""

    name: str
    path: str
    schema_version: int
    embedder: str
    dim: int
    created_at: str
    n_documents: int | None  # None when this marginalia cannot read the collection's schema version
    n_chunks: int | None
    n_questions: int | None


@dataclass(frozen=True)
class LiveDocument:
    """The light columns of one committed ``documents`` row: what decides which entries are visible."""

    doc_id: str
    source: str
    gen: str
    title: str
    format: str
    n_chunks: int
    indexed_at: str


LIVE_COLUMNS = ["doc_id", "source", "gen", "title", "format", "n_chunks", "indexed_at"]
HIT_COLUMNS = ["id", "kind", "doc_id", "gen", "text", "section_path", "section_index", "chunk_index",
               "start", "end", "page", "answer", "long_answer", "vector"]


def visible(live: dict[str, LiveDocument], kind: str, doc_id: str, gen: str) -> bool:
    """Whether an entry belongs to a committed document (a chunk: to its current chunking)."""
    doc = live.get(doc_id)
    return doc is not None and (kind != "chunk" or doc.gen == gen)


def content_hash(*parts: object) -> str:
    """A 128-bit hex key over the ``repr`` of each part."""
    h = hashlib.sha256()
    for part in parts:
        h.update(repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def sql_str(value: str) -> str:
    """A SQL string literal for LanceDB filters."""
    return "'" + value.replace("'", "''") + "'"


def sql_list(values: Iterable[str]) -> str:
    return "(" + ", ".join(sql_str(v) for v in values) + ")"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def chunk_search_text(section_path: Sequence[str], text: str) -> str:
    """What the embedder and BM25 read for a chunk: ``"A > B\\n\\ntext"``, or the text alone at the root."""
    if not section_path:
        return text
    return CHUNK_TEMPLATE.format(path=" > ".join(section_path), text=text)


def chunking_hash(doc: Document, sections: Sequence[Section], chunks: Sequence[Chunk]) -> str:
    """The key of one indexing of a document: changes when its text, metadata, sections or chunks do."""
    return content_hash("chunking", CHUNK_TEMPLATE, doc.doc_id, doc.title, doc.format, doc.page_starts,
                        [asdict(s) for s in sections], [asdict(c) for c in chunks])


def chunk_records(doc: Document, gen: str, chunks: Sequence[Chunk]) -> list[dict[str, Any]]:
    """The ``entries`` rows (without vectors) of a document's chunks."""
    return [{
        "id": content_hash("chunk", gen, c.index, c.start, c.end), "kind": "chunk", "doc_id": doc.doc_id,
        "gen": gen, "text": c.text, FTS_COLUMN: chunk_search_text(c.section_path, c.text),
        "section_path": list(c.section_path), "section_index": c.section_index, "chunk_index": c.index,
        "start": c.start, "end": c.end, "page": c.page if c.page is not None else doc.page_at(c.start),
        "answer": "", "long_answer": "",
    } for c in chunks]


def question_record(e: QuestionEntry, doc_id: str) -> dict[str, Any]:
    """The ``entries`` row (without its vector) of a question entry; its key hashes its content."""
    key = content_hash("question", doc_id, e.question, e.answer, e.long_answer, e.start, e.end,
                       tuple(e.section_path))
    return {
        "id": key, "kind": "question", "doc_id": doc_id, "gen": "", "text": e.question, FTS_COLUMN: e.question,
        "section_path": list(e.section_path), "section_index": e.section_index, "chunk_index": None,
        "start": e.start, "end": e.end, "page": e.page, "answer": e.answer, "long_answer": e.long_answer,
    }


def sections_to_json(sections: Sequence[Section]) -> str:
    return json.dumps([asdict(s) for s in sections])


def sections_from_json(text: str) -> list[Section]:
    return [Section(**{**s, "path": tuple(s["path"]), "children": tuple(s["children"])}) for s in json.loads(text)]


def entries_schema(dim: int) -> Any:
    """The ``entries`` table: one row per chunk or question entry."""
    import pyarrow as pa

    return pa.schema([
        ("id", pa.string()),  # content hash key
        ("kind", pa.string()),  # chunk | question
        ("doc_id", pa.string()),
        ("gen", pa.string()),  # chunks: the document's chunking hash; questions: ""
        ("text", pa.string()),
        (FTS_COLUMN, pa.string()),  # what BM25 and the embedder read
        ("section_path", pa.list_(pa.string())),
        ("section_index", pa.int32()),
        ("chunk_index", pa.int32()),
        ("start", pa.int64()),
        ("end", pa.int64()),
        ("page", pa.int32()),
        ("answer", pa.string()),
        ("long_answer", pa.string()),
        ("vector", pa.list_(pa.float32(), dim)),  # L2-normalised
    ])


def documents_schema() -> Any:
    """The ``documents`` table: one row per document, written after its entries (the commit marker)."""
    import pyarrow as pa

    return pa.schema([
        ("doc_id", pa.string()),
        ("source", pa.string()),
        ("gen", pa.string()),  # chunking_hash() of the indexing whose chunk entries are live
        ("title", pa.string()),
        ("format", pa.string()),
        ("text", pa.large_string()),
        ("page_starts", pa.list_(pa.int64())),
        ("sections", pa.large_string()),  # JSON list of Section fields
        ("n_chunks", pa.int32()),
        ("indexed_at", pa.string()),
    ])
