"""Frozen records that flow between stages: documents, sections, chunks, segments, margins, answers, events."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

#: the version of an answer's JSON document (`Answer.to_dict`, docs/answer.schema.json): raised when a key is
#: renamed or removed, or changes its meaning
ANSWER_SCHEMA = 1


@dataclass(frozen=True)
class Document:
    """A loaded source in its structured form (markdown), and where it came from.

    ``page_starts[i]`` is the character offset in ``text`` where page ``i + 1`` begins;
    it is empty when the format has no pages (markdown, text, html).
    """

    source: str  # the path or name as given
    text: str  # markdown
    doc_id: str  # content hash of ``text`` (hex): the same text always gets the same id
    format: str = "text"  # pdf | markdown | text | html
    title: str = ""
    page_starts: tuple[int, ...] = ()

    def page_at(self, offset: int) -> int | None:
        """The 1-based page holding character ``offset``, or None when pages are unknown."""
        if not self.page_starts:
            return None
        page = 0
        for i, start in enumerate(self.page_starts):
            if start <= offset:
                page = i
            else:
                break
        return page + 1


@dataclass(frozen=True)
class Section:
    """A heading and what it owns in a document's text (character offsets into ``Document.text``).

    ``start``/``end`` span the heading line, its own text and all subsections;
    ``body_start``/``body_end`` span only its own text (after the heading, before the first subsection).
    The root section (level 0, index 0) stands for the whole document and the text before the first heading.
    """

    doc_id: str
    index: int
    level: int  # 0 for the root, 1 for '#', 2 for '##', ...
    title: str
    path: tuple[str, ...]  # titles from the top-level section down to this one (the root's is empty)
    start: int
    end: int
    body_start: int
    body_end: int
    parent: int | None = None
    children: tuple[int, ...] = ()


@dataclass(frozen=True)
class Chunk:
    """A retrieval unit: a run of paragraphs inside one section (character span into ``Document.text``)."""

    doc_id: str
    section_index: int
    index: int  # position among the document's chunks
    start: int
    end: int
    text: str
    section_path: tuple[str, ...] = ()
    n_tokens: int = 0
    page: int | None = None


@dataclass(frozen=True)
class Segment:
    """A slice of a context, cut on the model's own tokens.

    ``start``/``end`` are character offsets into the context; ``token_ids`` is the
    slice of the whole context's tokenization, so segments concatenate back to it.
    """

    index: int
    start: int
    end: int
    text: str
    token_ids: tuple[int, ...]

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class Margin:
    """A note written for one segment, and the verdict on whether it is relevant."""

    segment_index: int
    text: str
    relevant: bool
    mode: str
    score: float | None = None
    reason: str = ""
    evidence: tuple[int, int] | None = None  # char span in the context that supports it
    read_to: int | None = None  # char offset in the context where its segment ends: the text read when written


def ends_reading(relevant: bool, score: float | None, threshold: float | None) -> bool:
    """Whether a judged margin stops reading under the options' ``stop_at_score``: kept, and scored at
    least ``threshold`` (no threshold: reading goes on to the end)."""
    return threshold is not None and relevant and (score or 0.0) >= threshold


@dataclass(frozen=True)
class Reference:
    """Where in the source an answer draws from (character span into the context)."""

    source: str
    start: int
    end: int
    text: str
    segment_index: int | None = None
    score: float | None = None
    section_path: tuple[str, ...] = ()
    page: int | None = None


@dataclass(frozen=True)
class Stats:
    """Token counts and timings of one run (seconds, tokens)."""

    context_tokens: int = 0
    #: context tokens the backend evaluated (by its own account: what it passed to prefill, or over HTTP
    #: what the server reports it did not take from its cache), repeats included; None when a server's
    #: reply did not say (`prompt_cache_unreported`)
    prefilled_context_tokens: int | None = 0
    #: of those, evaluations of a context token evaluated before in the same reading (0 when each is read
    #: once; None when unknown, as above)
    reprefilled_context_tokens: int | None = 0
    #: context tokens taken from a cache of the document instead of prefilled (WiM): a kept or stored reading,
    #: or a server's prefix cache (by the backend's account where it gives one)
    cached_context_tokens: int = 0
    #: context tokens dropped from the cache to make room for the rest of a long document (WiM)
    dropped_context_tokens: int = 0
    #: the most tokens the cache held at once: the document part, a prompt and what it generated (WiM)
    peak_cache_tokens: int = 0
    #: prompt tokens evaluated that are not context (instructions, questions, margin prompts; None: unknown)
    prefilled_other_tokens: int | None = 0
    generated_margin_tokens: int = 0
    generated_answer_tokens: int = 0
    generated_other_tokens: int = 0
    prefill_seconds: float = 0.0
    margin_seconds: float = 0.0
    retrieval_seconds: float = 0.0
    answer_seconds: float = 0.0
    total_seconds: float = 0.0
    time_to_first_margin: float | None = None
    time_to_first_answer_token: float | None = None
    #: over HTTP: prompt tokens sent, and those the server reported taking from its cache (None when a
    #: reply did not say)
    prompt_tokens_sent: int = 0
    prompt_tokens_cached: int | None = 0
    #: requests whose server did not say what its prompt cache saved; while above 0, the counts that rest
    #: on it (prefilled, re-prefilled, cached prompt tokens) are None: unknown, not guessed
    prompt_cache_unreported: int = 0


@dataclass(frozen=True)
class Route:
    """Which reading answered a routed question (pattern ``auto``), and why.

    ``taken`` is ``rag`` (its answer stood), or ``wim`` or ``lc`` (the second reading, `AutoOptions.escalate`,
    read after RAG, or at once for a question that gathers over the whole document); ``signals`` are the
    measures the decision read (support and topicality of the RAG answer in its passages, and the best
    retrieval score), None where not measured.
    """

    taken: str
    reason: str
    signals: dict[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    """The end of every pattern run."""

    question: str
    text: str
    pattern: str
    model: str
    references: tuple[Reference, ...] = ()
    margins: tuple[Margin, ...] = ()
    stats: Stats = field(default_factory=Stats)
    segments_read: int = 0
    segments_total: int = 0
    stopped_early: bool = False
    #: why reading stopped before the end: "asked" (the reader said stop) or "found" (a margin met the
    #: options' stop_at_score); empty when every segment was read
    stop_reason: str = ""
    #: for questions over a collection: how the retrieval policy decided —
    #: "direct" (a question-bank answer), "none" (nothing relevant found) or "references"
    retrieval: str = ""
    #: pattern ``auto``: the route taken and why (None for the other patterns)
    route: Route | None = None

    def to_dict(self, quote_chars: int | None = None) -> dict[str, Any]:
        """The answer as a JSON-ready document: the one shape an answer has wherever it leaves the program
        (``ask --json``, the HTTP answer and its ``done`` event, the docqa and OpenAI routes' extensions, the
        benchmark results), described by `Answer.json_schema` (docs/answer.schema.json). Its keys are the
        record's fields, recursively, and ``schema`` (`ANSWER_SCHEMA`).

        Args:
            quote_chars: cut each reference's ``text`` to this many characters, the last an ellipsis (a
                reference may be a whole section; a reply over the network stays small); None: whole.
        """
        data: dict[str, Any] = {"schema": ANSWER_SCHEMA, **to_json(self)}
        if quote_chars is not None:
            for ref in data["references"]:
                if len(ref["text"]) > quote_chars:
                    ref["text"] = ref["text"][:max(quote_chars - 1, 0)] + "\u2026"
        return data

    @staticmethod
    def json_schema() -> dict[str, Any]:
        """The JSON Schema of `to_dict`'s document: every key is always there (null where it says so), and
        there are no others."""
        schema: dict[str, Any] = _adapter(Answer).json_schema(mode="serialization")
        for part in [schema, *schema.get("$defs", {}).values()]:
            if part.get("type") == "object" and "properties" in part:
                part.update(required=list(part["properties"]), additionalProperties=False)
        schema["properties"] = {
            "schema": {"const": ANSWER_SCHEMA, "type": "integer", "title": "Schema",
                       "description": "the version of this document's shape"}, **schema["properties"]}
        schema["required"] = list(schema["properties"])
        return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


_ADAPTERS: dict[type, Any] = {}


def _adapter(kind: type) -> Any:
    """pydantic's serialiser and schema of a record class, made once (pydantic is imported here, so that
    importing the records stays light)."""
    if kind not in _ADAPTERS:
        from pydantic import TypeAdapter

        _ADAPTERS[kind] = TypeAdapter(kind)
    return _ADAPTERS[kind]


def to_json(record: Any) -> dict[str, Any]:
    """A record (a Margin, a Route, an Answer's parts) as JSON-ready data: its fields by name, tuples as lists."""
    data: dict[str, Any] = _adapter(type(record)).dump_python(record, mode="json")
    return data


# Events: what a pattern yields while it reads. Each carries a `kind` for JSON consumers.


@dataclass(frozen=True)
class Started:
    pattern: str
    segments_total: int
    context_tokens: int
    kind: Literal["started"] = "started"


@dataclass(frozen=True)
class Retrieved:
    """A collection was searched: what the retrieval policy decided, and the references it gathered."""

    outcome: str  # direct | none | references
    best_similarity: float
    references: tuple[Reference, ...]
    elapsed: float
    kind: Literal["retrieved"] = "retrieved"


@dataclass(frozen=True)
class Routed:
    """A routed question (pattern ``auto``) chose its reading: sent before WiM reads, or before RAG's answer
    when it stands."""

    route: Route
    elapsed: float
    kind: Literal["routed"] = "routed"


@dataclass(frozen=True)
class SegmentRead:
    segment: Segment
    total: int
    elapsed: float
    cached: bool = False  # taken from a kept or stored cache of the document, not prefilled now
    kind: Literal["segment_read"] = "segment_read"


@dataclass(frozen=True)
class SegmentsDropped:
    """Segments ``[first, last)`` left the cache to make room (a document longer than the window); their
    margins judged relevant are still carried to the answer."""

    first: int
    last: int
    tokens: int
    cache_tokens: int  # what the cache holds after the drop
    kind: Literal["segments_dropped"] = "segments_dropped"


@dataclass(frozen=True)
class ReadingStopped:
    """Reading ended before the last segment: ``after`` is the last segment read (its index)."""

    after: int
    reason: str  # "asked" or "found"
    elapsed: float
    kind: Literal["reading_stopped"] = "reading_stopped"


@dataclass(frozen=True)
class MarginWritten:
    segment_index: int
    text: str
    elapsed: float
    kind: Literal["margin_written"] = "margin_written"


@dataclass(frozen=True)
class MarginJudged:
    margin: Margin
    elapsed: float
    kind: Literal["margin_judged"] = "margin_judged"


@dataclass(frozen=True)
class AnswerDelta:
    text: str
    kind: Literal["answer_delta"] = "answer_delta"


@dataclass(frozen=True)
class Done:
    answer: Answer
    kind: Literal["done"] = "done"


Event = (Started | Retrieved | Routed | SegmentRead | SegmentsDropped | MarginWritten | MarginJudged | ReadingStopped
         | AnswerDelta | Done)


def event_to_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready dict of an event (segments lose their token ids: they are bulky)."""
    data = asdict(event)
    if isinstance(event, SegmentRead):
        data["segment"].pop("token_ids", None)
    return data
