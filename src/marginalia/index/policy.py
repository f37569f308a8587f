"""The retrieval policy: answer from the question bank, refuse, or gather references to read.

Three outcomes, decided on the cosine similarity of the question to the best hits:

- ``direct``: a question-bank entry at or above ``certain`` — its stored answer is the answer;
- ``none``: nothing at or above ``uncertain`` — "no relevant references found", never a made-up answer;
- ``references``: otherwise, the hits become references (whole sections, chunks or whole documents)
  and a reading pattern answers from them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from ..errors import UserError
from ..ingest.sections import section_at
from ..records import Document, Section
from .schema import Hit

SCOPES = ("sections", "chunks", "documents")
Outcome = Literal["direct", "none", "references"]


class Searchable(Protocol):
    def search(self, query: str, k: int = 5, mode: str = "hybrid",
               kinds: Sequence[str] = ("chunk",)) -> Sequence[Hit]: ...

    def document(self, doc_id: str) -> Document: ...

    def sections(self, doc_id: str) -> list[Section]: ...


@dataclass(frozen=True)
class RetrievalPolicy:
    """Thresholds (cosine similarity, -1..1) and what becomes a reference.

    Args:
        certain: a question-bank hit this similar answers directly.
        uncertain: below this, for every hit, the answer is that nothing relevant was found.
        k: how many hits to consider.
        scope: what a hit brings into the context: its whole section, just its chunk, or its document.
        max_context_tokens: the most tokens the gathered references may take (lower-ranked ones are
            dropped first); None for no limit.
        mode: hybrid, dense or bm25 search.
        use_questions: consult the question bank at all.
    """

    certain: float = 0.9
    uncertain: float = 0.3
    k: int = 5
    scope: str = "sections"
    max_context_tokens: int | None = None
    mode: str = "hybrid"
    use_questions: bool = True

    def __post_init__(self) -> None:
        if not -1.0 <= self.uncertain <= self.certain <= 1.0:
            raise UserError(
                f"thresholds must satisfy -1 <= uncertain <= certain <= 1, got uncertain={self.uncertain} "
                f"and certain={self.certain}"
            )
        if self.k <= 0:
            raise UserError(f"k must be positive, got {self.k}")
        if self.scope not in SCOPES:
            raise UserError(f"unknown scope {self.scope!r}; choose one of {', '.join(SCOPES)}")


@dataclass(frozen=True)
class Piece:
    """A reference brought into the context: a span of one document."""

    doc_id: str
    source: str
    section_path: tuple[str, ...]
    start: int
    end: int
    text: str
    page: int | None = None
    score: float | None = None


@dataclass(frozen=True)
class Retrieval:
    """What the policy decided for one question."""

    outcome: Outcome
    question: str
    best_similarity: float
    pieces: tuple[Piece, ...] = ()
    direct: Hit | None = None
    hits: tuple[Hit, ...] = ()


def retrieve(collection: Searchable, question: str, policy: RetrievalPolicy,
             count_tokens: Callable[[str], int] | None = None,
             piece_overhead: Callable[[Piece], int] | None = None) -> Retrieval:
    """Apply the policy to ``question`` over ``collection``.

    ``count_tokens`` measures the pieces for ``policy.max_context_tokens``; ``piece_overhead`` adds the
    tokens each piece costs beyond its text where it is read (e.g. its `piece_header`).
    """
    kinds = ("chunk", "question") if policy.use_questions else ("chunk",)
    hits = list(collection.search(question, k=policy.k, mode=policy.mode, kinds=kinds))
    best = max((h.similarity for h in hits), default=-1.0)
    questions = [h for h in hits if h.kind == "question"]
    if questions:
        top = max(questions, key=lambda h: h.similarity)
        if top.similarity >= policy.certain:
            return Retrieval("direct", question, best, direct=top, hits=tuple(hits),
                             pieces=(Piece(top.doc_id, top.source, top.section_path, top.start, top.end,
                                           _span_text(collection, top), top.page, top.similarity),))
    if best < policy.uncertain:
        return Retrieval("none", question, best, hits=tuple(hits))
    relevant = [h for h in hits if h.similarity >= policy.uncertain]
    pieces = _expand(collection, relevant, policy.scope)
    if policy.max_context_tokens is not None and count_tokens is not None:
        pieces = _within(pieces, policy.max_context_tokens, count_tokens, piece_overhead or (lambda p: 0))
    return Retrieval("references", question, best, pieces=tuple(_in_document_order(pieces)), hits=tuple(hits))


def _span_text(collection: Searchable, hit: Hit) -> str:
    if hit.kind == "chunk":
        return hit.text
    return collection.document(hit.doc_id).text[hit.start:hit.end]


def _expand(collection: Searchable, hits: Sequence[Hit], scope: str) -> list[Piece]:
    """Turn ranked hits into pieces (best first), merging those that land in the same place."""
    pieces: list[Piece] = []
    for hit in hits:
        if scope == "chunks":  # a chunk hit brings its chunk; a question entry, its supporting sentence
            key = (hit.doc_id, hit.start, hit.end)
            piece = Piece(hit.doc_id, hit.source, hit.section_path, hit.start, hit.end, _span_text(collection, hit),
                          hit.page, hit.similarity)
        elif scope == "documents":
            doc = collection.document(hit.doc_id)
            key = (hit.doc_id, 0, len(doc.text))
            piece = Piece(hit.doc_id, hit.source, (), 0, len(doc.text), doc.text, None, hit.similarity)
        else:
            doc = collection.document(hit.doc_id)
            section = section_at(collection.sections(hit.doc_id), hit.start)
            start, end = (section.start, section.end) if section else (hit.start, hit.end)
            key = (hit.doc_id, start, end)
            piece = Piece(hit.doc_id, hit.source, section.path if section else hit.section_path, start, end,
                          doc.text[start:end], doc.page_at(start), hit.similarity)
        if any(_inside(key, (p.doc_id, p.start, p.end)) for p in pieces):
            continue  # the same place, or inside a wider piece already taken
        # a wider piece swallows narrower ones already taken
        pieces = [p for p in pieces if not _inside((p.doc_id, p.start, p.end), key)]
        pieces.append(piece)
    return pieces


def _inside(inner: tuple[str, int, int], outer: tuple[str, int, int]) -> bool:
    return inner[0] == outer[0] and outer[1] <= inner[1] and inner[2] <= outer[2]


def piece_header(piece: Piece, first: bool = False) -> str:
    """The line that names a piece's document and section above its text in an assembled context."""
    label = " > ".join((piece.source, *piece.section_path))
    return ("" if first else "\n\n") + f"[{label}]\n"


def _within(pieces: list[Piece], budget: int, count_tokens: Callable[[str], int],
            overhead: Callable[[Piece], int]) -> list[Piece]:
    """The best pieces that fit ``budget`` tokens, each with its overhead."""
    kept: list[Piece] = []
    used = 0
    for piece in pieces:  # best first
        size = overhead(piece) + count_tokens(piece.text)
        if used + size <= budget:
            kept.append(piece)
            used += size
    if not kept and pieces:  # the best piece alone is too long: keep its start
        piece = pieces[0]
        words = piece.text.split(" ")
        room = budget - overhead(piece)
        while words and count_tokens(" ".join(words)) > room:
            words = words[: max(1, len(words) * 3 // 4)] if len(words) > 1 else []
        text = " ".join(words)
        kept = [Piece(piece.doc_id, piece.source, piece.section_path, piece.start, piece.start + len(text), text,
                      piece.page, piece.score)]
    return kept


def _in_document_order(pieces: list[Piece]) -> list[Piece]:
    first_seen: dict[str, int] = {}
    for i, piece in enumerate(pieces):
        first_seen.setdefault(piece.doc_id, i)
    return sorted(pieces, key=lambda p: (first_seen[p.doc_id], p.start))
