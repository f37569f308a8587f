"""Reading a collection: the retrieval policy gathers references, then a pattern reads them.

Each pattern's registration says how it reads a collection (`registry.collection_reader`): ``rag`` answers
from the retrieved chunks; ``lc`` and ``wim`` read the retrieved sections (or whole documents) as their
context; ``auto`` answers with rag's reader, then wim's where that answer does not stand. Either way the
answer's references point into the documents (source, section path, character span), not into the assembled
context. `searching` is a reader's retrieval step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..index.policy import Piece, Retrieval, RetrievalPolicy, piece_header, retrieve
from ..models.base import Clock, Generator
from ..options import CollectionOptions, RunSettings
from ..records import Answer, AnswerDelta, Done, Event, Reference, Retrieved, Started, Stats
from .base import Pattern, Run, check_question

if TYPE_CHECKING:
    from ..index.store import Collection

NO_REFERENCES = "No relevant references found in the collection, so there is no answer to give."


@dataclass(frozen=True)
class Assembled:
    """A context built from pieces, and where each piece's text sits in it."""

    text: str
    spans: tuple[tuple[int, int], ...]  # (start, end) of each piece's text in ``text``
    pieces: tuple[Piece, ...]


def assemble(pieces: Sequence[Piece]) -> Assembled:
    """Join pieces into one context, each under a line naming its document and section."""
    parts: list[str] = []
    spans: list[tuple[int, int]] = []
    at = 0
    for i, piece in enumerate(pieces):
        header = piece_header(piece, first=not i)
        at += len(header)
        parts.append(header + piece.text)
        spans.append((at, at + len(piece.text)))
        at += len(piece.text)
    return Assembled("".join(parts), tuple(spans), tuple(pieces))


def piece_reference(piece: Piece, segment_index: int | None = None) -> Reference:
    return Reference(piece.source, piece.start, piece.end, piece.text, segment_index, piece.score,
                     piece.section_path, piece.page)


def map_reference(ref: Reference, context: Assembled) -> list[Reference]:
    """Translate a reference into the assembled context back into document coordinates.

    A reference that spans several pieces (long context's "the whole context") becomes one per piece.
    """
    out: list[Reference] = []
    for (start, end), piece in zip(context.spans, context.pieces, strict=True):
        lo, hi = max(ref.start, start), min(ref.end, end)
        if lo >= hi:
            continue
        whole = lo == start and hi == end
        if whole:
            out.append(replace(piece_reference(piece, ref.segment_index), score=ref.score or piece.score))
        else:
            s, e = piece.start + (lo - start), piece.start + (hi - start)
            out.append(Reference(piece.source, s, e, piece.text[lo - start:hi - start], ref.segment_index,
                                 ref.score, piece.section_path, piece.page))
    return out


class _FromCollection(Pattern):
    """A pattern whose context comes from a collection, not from the caller."""

    def ask(self, question: str, source: str = "collection", settings: RunSettings | None = None) -> Run:
        """Start a run for ``question`` (the context comes from the collection); ``settings``: its own."""
        return self.run("", question, source, settings)

    def run(self, context: str, question: str, source: str = "collection",
            settings: RunSettings | None = None) -> Run:
        check_question(question)
        return Run(self, context, question, source, settings)


class CollectionReader(_FromCollection):
    """Answer from a collection: ``retrieve`` applies the policy, ``inner`` reads what it gathered.

    Args:
        inner: the pattern that reads the assembled references.
        retrieve: the question -> Retrieval step (see `index.policy.retrieve`).
        name: the pattern name reported in answers (defaults to the inner pattern's).
    """

    def __init__(self, inner: Pattern, retrieve: Callable[[str], Retrieval], name: str | None = None) -> None:
        super().__init__(inner.generator, inner.options)
        self.inner = inner
        self.retrieve = retrieve
        self.name = name or inner.name

    def _events(self, run: Run, context: str, question: str, source: str) -> Iterator[Event]:
        clock = Clock()
        retrieval = self.retrieve(question)
        seconds = clock()
        references = tuple(piece_reference(p) for p in retrieval.pieces)
        yield Retrieved(retrieval.outcome, retrieval.best_similarity, references, seconds)
        gen = self.generator
        if retrieval.outcome != "references":
            text = retrieval.direct.answer if retrieval.outcome == "direct" and retrieval.direct else NO_REFERENCES
            yield AnswerDelta(text)
            yield Done(Answer(
                question=question, text=text, pattern=self.name, model=gen.name, references=references,
                stats=Stats(retrieval_seconds=seconds, total_seconds=clock()), retrieval=retrieval.outcome,
            ))
            return
        assembled = assemble(retrieval.pieces)
        for event in self.inner._events(run, assembled.text, question, source):
            if isinstance(event, Done):
                answer = event.answer
                mapped = tuple(r for ref in answer.references for r in map_reference(ref, assembled))
                stats = replace(answer.stats, retrieval_seconds=answer.stats.retrieval_seconds + seconds,
                                total_seconds=answer.stats.total_seconds + seconds)
                yield Done(replace(answer, pattern=self.name, references=mapped or references, stats=stats,
                                   retrieval="references"))
            elif isinstance(event, Started):
                yield replace(event, pattern=self.name)
            else:
                yield event


def searching(store: Collection, reading: CollectionOptions, generator: Generator, *, scope: str, k: int,
              room: Callable[[str], int] | None = None) -> Callable[[str], Retrieval]:
    """A reader's question -> Retrieval step: ``reading``'s policy, ``k`` hits read as ``scope``.

    ``room(question)``: the most tokens of references the reader has room for (a reader that answers in one
    prompt: what fits the window); None: ``reading.max_context_tokens`` alone bounds them.
    """
    policy = RetrievalPolicy(
        certain=reading.certain, uncertain=reading.uncertain, k=k, scope=scope,
        max_context_tokens=reading.max_context_tokens, mode=reading.search, use_questions=reading.use_questions)
    count = generator.tokenizer.count

    def header(piece: Piece) -> int:  # each piece is read under a line naming it
        return count(piece_header(piece))

    def gather(question: str) -> Retrieval:
        if room is None:
            return retrieve(store, question, policy, count, header)
        space = room(question)
        budget = min(policy.max_context_tokens or space, space)
        return retrieve(store, question, replace(policy, max_context_tokens=budget), count, header)

    return gather
