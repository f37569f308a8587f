"""Routing: answer at the cost each question needs. RAG reads first; WiM reads when RAG's answer does not stand.

A RAG answer stands when one sentence of the passages it read (or, with ``support_sentences`` 2, two together:
a multi-hop answer joins two facts) supports it (`signals.measure`, at least ``support_threshold``), and those
sentences hold enough of the
question (``question_threshold``: a sentence copied from a passage about something else does not). It does not
when it is empty or says the passages do not tell, or when what it says is not in them. A question that gathers
over the whole document ("the most common words", "list every …") goes to the second reading at once: a few
retrieved chunks cannot answer it. The second reading is WiM, long context, or none (``escalate``: wim, lc,
or rag: RAG's answer is given).

The decision is an event (`Routed`) sent before the second reading; the answer carries it (`Answer.route`), and
its stats count both readings. RAG's answer is held back until it is known to stand, so a reader never sees an
answer that is then replaced.

Its options record (`AutoOptions`), its reader of a collection (`CollectionRouter`) and its registration
(`SPEC`) are here too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from ..models.base import CachingGenerator, Clock, Generator
from ..options import SUPPORT_THRESHOLD, CollectionOptions, EscalateTo, RunSettings
from ..records import Answer, AnswerDelta, Done, Event, Route, Routed, Stats
from .base import Pattern, Run, resolve_options
from .collection import CollectionReader, _FromCollection
from .grounding import find_evidence
from .long_context import LcOptions, LongContext
from .rag import RAG, RagOptions
from .registry import PatternSpec, collection_reader
from .signals import measure
from .wim import WiM, WimOptions

if TYPE_CHECKING:
    from ..index.store import Collection
    from ..models.snapshots import SnapshotStore


class AutoOptions(RagOptions, WimOptions):
    """Routing: read with RAG; where its answer does not stand on the passages it read, or the question
    gathers over the whole document, read with WiM. Takes rag's and wim's options for the two readings."""

    pattern: ClassVar[str] = "auto"
    support_threshold: float = Field(
        default=SUPPORT_THRESHOLD, ge=0.0, le=1.0,
        description="auto: the least support for RAG's answer: the share of its new words, by rarity, that one "
                    "sentence of the retrieved passages (or two together, with support_sentences 2) hold for it "
                    "to stand; below it, the second reading reads (0: RAG's answer always stands, unless the "
                    "question gathers over the whole document)")
    support_sentences: Literal[1, 2] = Field(
        default=1,
        description="auto: sentences that may hold RAG's answer; 2 lets a multi-hop answer stand on "
                    "two facts, and a wrong answer pieced from two sentences too (bench calibrate chooses it per "
                    "collection)")
    question_threshold: float = Field(
        default=0.0, ge=0.0, le=1.0,
        description="auto: the least share of the question held: the share of the question's words, by rarity, "
                    "that the sentences supporting RAG's answer, and the sentence before each, must hold for it "
                    "to stand; a sentence copied from a passage about something else holds few of them (0: not "
                    "asked)")
    escalate: EscalateTo = Field(
        default="wim",
        description="auto: what reads where RAG's answer fails: wim; lc (the whole text, or a collection's "
                    "retrieved sections, in one prompt); or rag (no second reading: RAG's answer is given)")

    def rag_options(self) -> RagOptions:
        """The first reading's record."""
        return RagOptions(**self.model_dump(include=set(RagOptions.model_fields)))

    def wim_options(self) -> WimOptions:
        """The second reading's record."""
        return WimOptions(**self.model_dump(include=set(WimOptions.model_fields)))

    def lc_options(self) -> LcOptions:
        """The second reading's record where it is long context."""
        return LcOptions(max_new_tokens=self.max_new_tokens)

#: a question that gathers over the whole text: counts, frequencies, every instance
_GATHERS = re.compile(
    r"\b(?:most|least)\s+(?:common|frequent(?:ly)?|often|used|mentioned)\b"
    r"|\bhow\s+(?:many|often)\s+times\b"
    r"|\b(?:list|name|give|enumerate)\s+(?:all|every|each)\b"
    r"|\b(?:all|every)\s+(?:the\s+)?(?:times?|instances?|occurrences?|mentions?)\b"
    r"|\bhow\s+many\s+(?:different|distinct|separate)\b"
    r"|\bwhich\s+\w+\s+(?:appears?|occurs?)\s+most\b",
    re.IGNORECASE,
)

#: an answer that says the passages do not tell
_ABSTAINS = re.compile(
    r"\b(?:not|no|never)\s+(?:\w+\s+){0,3}(?:mention(?:ed)?|provided?|given|specified|stated|found|available|"
    r"information|say|says|state|states|contain|contains|include|includes)\b"
    r"|\b(?:cannot|can't|can not|unable to)\s+(?:be\s+)?(?:determine|answer|find|tell|say)"
    r"|\b(?:unknown|unclear|unanswerable)\b",
    re.IGNORECASE,
)


def gathers_whole(question: str) -> bool:
    """Whether ``question`` gathers over the whole text (frequencies, counts, every instance): what no handful
    of retrieved chunks answers."""
    return bool(_GATHERS.search(question))


def abstains(answer: str) -> bool:
    """Whether ``answer`` is empty or says the text does not tell."""
    return not answer.strip() or bool(_ABSTAINS.search(answer))


def answer_support(question: str, answer: str, passages: list[str]) -> tuple[float, float]:
    """(support, topicality) of ``answer`` in the best sentence of ``passages``: the rarity-weighted share of
    the answer's words beyond the question's that the sentence holds (1.0: copied), and how much of the
    question is around it. (0, 0) when no sentence holds any of it; (1, 1) when the answer adds nothing to the
    question's words (a yes or no)."""
    text = "\n\n".join(passages)
    if not text.strip():
        return 0.0, 0.0
    evidence = find_evidence(question, answer, text, min_support=0.0)
    if evidence is None:
        says = set(re.findall(r"\w+", answer.lower())) - set(re.findall(r"\w+", question.lower()))
        return (1.0, 1.0) if not says - {"yes", "no", "the", "a", "an", "is", "was", "are", "were"} else (0.0, 0.0)
    return round(evidence.support, 4), round(evidence.topic, 4)


def answer_signals(question: str, answer: Answer) -> dict[str, float | None]:
    """What the router reads on a RAG answer (`Auto.decide`): support from one or two sentences, the
    question's share around them, its names in their passages, the best retrieval score, and 1.0 or 0.0 for
    whether the answer abstains and whether the question gathers over the whole document. A benchmark run keeps
    them with each RAG answer, so that auto's thresholds can be chosen from the run (`bench calibrate`)."""
    measured = measure(question, answer.text, [r.text for r in answer.references])
    return {**measured.signals(),
            "retrieval": max((r.score for r in answer.references if r.score is not None), default=None),
            "abstains": float(abstains(answer.text)), "gathers": float(gathers_whole(question))}


def combined(first: Stats, second: Stats) -> Stats:
    """Stats of two readings one after the other: counts and seconds added; the context is the larger; times to
    a first margin or answer token counted from the first reading's start."""
    values: dict[str, Any] = {}
    for f in fields(Stats):
        a, b = getattr(first, f.name), getattr(second, f.name)
        if f.name in ("time_to_first_margin", "time_to_first_answer_token"):
            values[f.name] = None if b is None else round(first.total_seconds + b, 4)
        elif f.name in ("context_tokens", "peak_cache_tokens"):
            values[f.name] = max(a, b) if a is not None and b is not None else a if b is None else b
        else:
            values[f.name] = None if a is None or b is None else (round(a + b, 4) if isinstance(a, float) else a + b)
    return Stats(**values)


class Auto(Pattern):
    """RAG first, WiM where RAG's answer does not stand (see `AutoOptions`).

    Args:
        generator: the model (WiM needs a KV cache it can roll back: a question that escalates on a model
            without one is answered by RAG, and the route says so).
        options: the options record (or give its fields as keyword arguments).
        embedder: RAG's embedder (default: the embedded MiniLM, loaded on first use).
        first, second: the two readings (default: `RAG`, and `WiM` or `LongContext` as the record's
            ``escalate`` says); a collection gives readers of its own (`CollectionReader`).
        note: said at the end of every route's reason (where the options came from: a collection's profile).
    """

    name = "auto"

    def __init__(self, generator: Generator, options: AutoOptions | None = None, *, embedder: Any = None,
                 first: Pattern | None = None, second: Pattern | None = None, note: str | None = None,
                 **values: Any) -> None:
        opts = resolve_options(AutoOptions, options, values)
        super().__init__(generator, opts)
        self.support_threshold = opts.support_threshold
        self.support_sentences = opts.support_sentences
        self.question_threshold = opts.question_threshold
        self.escalate = opts.escalate
        self.note = note
        if first is None:
            first = RAG(generator, opts.rag_options(), embedder=embedder)
        if second is None and opts.escalate == "lc":
            second = LongContext(generator, opts.lc_options())
        elif second is None and opts.escalate == "wim" and isinstance(generator, CachingGenerator):
            second = WiM(generator, opts.wim_options())
        self.first = first
        self.second = second

    def decide(self, question: str, answer: Answer) -> Route:
        """The route for ``question`` after RAG answered it with ``answer``."""
        signals = answer_signals(question, answer)
        support = (signals["support"] if self.support_sentences == 2 else signals["single_support"]) or 0.0
        topic = signals["topic"] or 0.0
        signals = {k: v for k, v in signals.items() if k not in ("abstains", "gathers")}
        given = "; it is given all the same (escalate rag)" if self.escalate == "rag" else ""
        if abstains(answer.text):
            return Route(self.escalate, "the retrieved passages do not answer it, by RAG's own answer" + given,
                         signals)
        if support < self.support_threshold:
            return Route(self.escalate, f"RAG's answer is not in the retrieved passages (support {support:.2f} below "
                                        f"{self.support_threshold:g})" + given, signals)
        if topic < self.question_threshold:
            return Route(self.escalate, f"the passages supporting RAG's answer are not on the question (question "
                                        f"share {topic:.2f} below {self.question_threshold:g})" + given, signals)
        return Route("rag", f"RAG's answer stands on the retrieved passages (support {support:.2f})", signals)

    def _events(self, run: Run, context: str, question: str, source: str) -> Iterator[Event]:
        clock = Clock()
        first: Answer | None = None
        escalate = self.escalate
        if gathers_whole(question) and escalate != "rag":
            route = Route(escalate, "the question gathers over the whole document", {})
        else:
            held: list[AnswerDelta] = []  # RAG's answer waits for the decision
            for event in self.first._events(run, context, question, source):
                if isinstance(event, AnswerDelta):
                    held.append(event)
                elif isinstance(event, Done):
                    first = event.answer
                else:
                    yield event
            assert first is not None  # every pattern ends with Done
            route = self.decide(question, first)
            if route.taken == "rag" or run.stop_requested:
                route = self._noted(route)
                yield Routed(route, clock())
                yield from held
                yield Done(self._answer(first, route, first.stats))
                return
        if self.second is None:
            route = Route("rag", route.reason + f"; {self.generator.name} cannot read with WiM (no KV cache it "
                                                "can roll back)", route.signals)
            if first is None:
                first = self.first.answer(context, question, source, run.settings)
            route = self._noted(route)
            yield Routed(route, clock())
            yield AnswerDelta(first.text)
            yield Done(self._answer(first, route, first.stats))
            return
        route = self._noted(route)
        yield Routed(route, clock())
        for event in self.second._events(run, context, question, source):
            if isinstance(event, Done):
                stats = event.answer.stats if first is None else combined(first.stats, event.answer.stats)
                yield Done(self._answer(event.answer, route, stats))
            else:
                yield event

    def _noted(self, route: Route) -> Route:
        return route if not self.note else replace(route, reason=f"{route.reason}; {self.note}")

    def _answer(self, answer: Answer, route: Route, stats: Stats) -> Answer:
        return replace(answer, pattern=self.name, route=route, stats=stats)


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


def _read_text(generator: Generator, options: AutoOptions, text: str, question: str, *, source: str,
               embedder: Any, cache: SnapshotStore, settings: RunSettings | None) -> Run:
    """RAG, then WiM from a stored reading of ``text`` where there is one (a model with a KV cache, and WiM the
    second reading); another second reading reads anew."""
    second = (WiM(generator, options.wim_options()).reader(text, source, store=cache).pattern()
              if options.escalate == "wim" and isinstance(generator, CachingGenerator) else None)
    return Auto(generator, options, embedder=embedder, second=second).run(text, question, source=source,
                                                                         settings=settings)


def _read_collection(store: Collection, options: AutoOptions, reading: CollectionOptions, generator: Generator,
                     scope: str, note: str | None = None) -> CollectionRouter:
    """rag's reader of the collection, then the second reading's (wim's, where the model has a KV cache, or
    lc's) where rag's answer does not stand."""
    second = (collection_reader(store, options.lc_options(), reading, generator) if options.escalate == "lc" else
              collection_reader(store, options.wim_options(), reading, generator)
              if options.escalate == "wim" and isinstance(generator, CachingGenerator) else None)
    return CollectionRouter(generator, options, second=second, note=note,
                            first=collection_reader(store, options.rag_options(), reading, generator))


SPEC = PatternSpec(
    name="auto", options=AutoOptions, pattern=Auto, title="routing", needs_embedder=True,
    description="RAG, then WiM where RAG's answer does not stand on its passages",
    reads="chunks", read_text=_read_text, read_collection=_read_collection)
