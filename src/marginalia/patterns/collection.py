"""Reading a collection: the retrieval policy gathers references, then a pattern reads them.

``rag`` answers from the retrieved chunks; ``lc`` and ``wim`` read the retrieved sections (or whole
documents) as their context; ``auto`` answers with rag's reader, then wim's where that answer does not
stand. Either way the answer's references point into the documents (source, section path, character
span), not into the assembled context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from ..index.policy import Piece, Retrieval, piece_header
from ..models.base import Clock, Generator
from ..options import AutoOptions, RunSettings
from ..records import Answer, AnswerDelta, Done, Event, Reference, Retrieved, Route, Started, Stats
from .auto import Auto
from .base import Pattern, Run, check_question

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


class CollectionRouter(Auto, _FromCollection):
    """Routing over a collection (see `Auto`): ``first`` is rag's `CollectionReader` (the retrieved chunks),
    ``second`` wim's or lc's (the retrieved sections), or None where the model cannot read with WiM or the
    options escalate to nothing.

    A question the retrieval policy answers from the question bank (``direct``) or finds nothing for
    (``none``) is not read again: the same search would decide the same for WiM's reader.
    """

    def __init__(self, generator: Generator, options: AutoOptions, *, first: CollectionReader,
                 second: CollectionReader | None, note: str | None = None) -> None:
        super().__init__(generator, options, first=first, second=second, note=note)
        self.second = second  # not a WiM of Auto's own: it would read the caller's context, which is empty

    def decide(self, question: str, answer: Answer) -> Route:
        best = max((r.score for r in answer.references if r.score is not None), default=None)
        if answer.retrieval == "direct":
            return Route("rag", "a stored question of the collection matches it: its answer stands",
                         {"retrieval": best})
        if answer.retrieval == "none":
            return Route("rag", "nothing in the collection is relevant to it: WiM would find nothing to read",
                         {"retrieval": best})
        return super().decide(question, answer)
