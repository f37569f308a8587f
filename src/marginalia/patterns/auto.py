"""Routing: answer at the cost each question needs. RAG reads first; WiM reads when RAG's answer does not stand.

A RAG answer stands when one sentence of the passages it read, or two together (a multi-hop answer joins two
facts), support it (`signals.measure`, at least ``support_threshold``), and those sentences hold enough of the
question (``question_threshold``: a sentence copied from a passage about something else does not). It does not
when it is empty or says the passages do not tell, or when what it says is not in them. A question that gathers
over the whole document ("the most common words", "list every …") goes to the second reading at once: a few
retrieved chunks cannot answer it. The second reading is WiM, long context, or none (``escalate``: wim, lc,
or rag: RAG's answer is given).

The decision is an event (`Routed`) sent before the second reading; the answer carries it (`Answer.route`), and
its stats count both readings. RAG's answer is held back until it is known to stand, so a reader never sees an
answer that is then replaced.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import fields, replace
from typing import Any

from ..models.base import CachingGenerator, Clock, Generator
from ..options import AutoOptions
from ..records import Answer, AnswerDelta, Done, Event, Route, Routed, Stats
from .base import Pattern, Run, resolve_options
from .grounding import find_evidence
from .signals import measure

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
        self.question_threshold = opts.question_threshold
        self.escalate = opts.escalate
        self.note = note
        if first is None:
            from .rag import RAG

            first = RAG(generator, opts.rag_options(), embedder=embedder)
        if second is None and opts.escalate == "lc":
            from .long_context import LongContext

            second = LongContext(generator, opts.lc_options())
        elif second is None and opts.escalate == "wim" and isinstance(generator, CachingGenerator):
            from .wim import WiM

            second = WiM(generator, opts.wim_options())
        self.first = first
        self.second = second

    def decide(self, question: str, answer: Answer) -> Route:
        """The route for ``question`` after RAG answered it with ``answer``."""
        signals = answer_signals(question, answer)
        support, topic = signals["support"] or 0.0, signals["topic"] or 0.0
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
