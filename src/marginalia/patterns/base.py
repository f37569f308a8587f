"""What every reading pattern shares: the Run (events + early stop) and prompt framing.

A pattern reads a context for a question and yields typed events, ending in `Done`
with the `Answer`. Patterns never import a backend: they talk to the Generator seam,
and check the capabilities they need when they are built.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Generator as PyGenerator
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ..errors import UserError
from ..models.base import Clock, GenerationParams, Generator, StopScanner, Usage, close_stream
from ..models.ledger import PrefillLedger
from ..options import PatternOptions, RunSettings
from ..prompts import render
from ..records import Answer, AnswerDelta, Done, Event, Stats

#: the words that open an English question answered with yes or no ("Were they of the same nationality?")
_YES_NO_OPENERS = frozenset(
    "is are was were am do does did can could will would shall should may might must has have had".split())


_WH = frozenset("what which who whom whose when where why how".split())


def is_yes_no_question(question: str) -> bool:
    """Whether an English question asks for yes or no: it opens with an auxiliary verb, or, after a phrase that
    sets the scene and is not a wh-word ("After the report of October 22, did TechCrunch ...?"), a clause
    behind a comma does."""
    clauses = [c.split(maxsplit=1) for c in question.strip().split(",")]
    firsts = [words[0].lower().strip("\"'(") for words in clauses if words]
    if not firsts or firsts[0] in _WH:
        return False
    return firsts[0] in _YES_NO_OPENERS or any(w in _YES_NO_OPENERS for w in firsts[1:])


class Run:
    """One pattern run: iterate it for events; `stop()` ends reading early.

    After `stop()`, the pattern finishes the step in progress, reads nothing more,
    and answers from what it has read so far; iteration still ends with `Done`.
    ``settings`` are this run's own (`RunSettings`).
    """

    def __init__(self, pattern: Pattern, context: str, question: str, source: str,
                 settings: RunSettings | None = None) -> None:
        self.stop_requested = False
        self.settings = settings or RunSettings()
        self._answer: Answer | None = None
        self._events = pattern._events(self, context, question, source)

    def stop(self) -> None:
        self.stop_requested = True

    def params(self, base: GenerationParams) -> GenerationParams:
        """``base`` (a pattern's own decoding) with this run's settings laid over it."""
        changes = self.settings.model_dump(exclude_none=True)
        return replace(base, **changes) if changes else base

    def __iter__(self) -> Iterator[Event]:
        for event in self._events:
            if isinstance(event, Done):
                self._answer = event.answer
            yield event

    def answer(self) -> Answer:
        """Consume the remaining events and return the answer."""
        for _ in self:
            pass
        if self._answer is None:  # pragma: no cover - every pattern ends with Done
            raise RuntimeError("the pattern ended without an answer")
        return self._answer


@dataclass(frozen=True)
class Framing:
    """Token ids of the fixed prompt pieces around a context, for one generator."""

    head: list[int]   # system turn + start of the user turn + the intro line
    tail: list[int]   # end of the user turn + the assistant's generation prompt

    @classmethod
    def build(cls, generator: Generator, intro: str = "document_intro") -> Framing:
        frame = generator.chat_frame(render("system").strip())
        tok = generator.tokenizer
        return cls(
            head=tok.encode(frame.head, allow_special=True) + tok.encode(render(intro)),
            tail=tok.encode(frame.tail, allow_special=True),
        )

    def suffix(self, generator: Generator, template: str, **values: str) -> list[int]:
        """A user-text suffix closed by the turn's end and the generation prompt."""
        return generator.tokenizer.encode(render(template, **values)) + self.tail


OptionsT = TypeVar("OptionsT", bound=PatternOptions)


def resolve_options(cls: type[OptionsT], options: OptionsT | None, values: dict[str, Any]) -> OptionsT:
    """``options`` with ``values`` laid over it, validated (a record of ``cls`` built from ``values`` alone
    when ``options`` is None)."""
    base = options.model_dump() if options is not None else {}
    built: OptionsT = cls.build(**{**base, **values})
    return built


class Pattern(ABC):
    """A way of reading a context to answer a question; ``options`` is its validated options record.

    A built pattern is not changed by reading: what may differ from one run to the next is given to `run`
    (`RunSettings`).
    """

    name: str = "pattern"  # subclasses set their own; a collection reader takes its inner pattern's

    def __init__(self, generator: Generator, options: PatternOptions) -> None:
        self.generator = generator
        self.options = options
        # "=====" opens our prompts' question block: a model that writes one is inventing the next turn
        self.answer_params = GenerationParams(max_new_tokens=options.max_new_tokens, stop=("=====",))

    @staticmethod
    def answer_template(question: str, name: str = "answer") -> str:
        """The prompt template that asks for the answer (``answer`` or ``answer_margins``): one short sentence,
        which opens with yes or no for a question that asks for one ("Were they ...?")."""
        return f"{name}_yesno" if is_yes_no_question(question) else name

    def run(self, context: str, question: str, source: str = "context",
            settings: RunSettings | None = None) -> Run:
        """Start reading; iterate the returned `Run` for events. ``settings``: this run's own."""
        question = check_question(question)
        check_context(context)
        return Run(self, context, question, source, settings)

    def answer(self, context: str, question: str, source: str = "context",
               settings: RunSettings | None = None) -> Answer:
        """Read to the end and return the answer (the non-streaming call)."""
        return self.run(context, question, source, settings).answer()

    @abstractmethod
    def _events(self, run: Run, context: str, question: str, source: str) -> Iterator[Event]:
        """Yield the run's events, ending with `Done` (the answer decoded with ``run.settings``)."""


_FRAME = re.compile(r"\s*(question|answer)\s*:", re.IGNORECASE)
#: the start of a frame's word, not yet complete
_PARTIAL = re.compile(r"q(u(e(s(t(i(o(n\s*)?)?)?)?)?)?)?|a(n(s(w(e(r\s*)?)?)?)?)?", re.IGNORECASE)
#: a run-on frame after the answer: the model goes on to invent the next question
RUN_ON = ("\nQuestion:", " Question:", "\nquestion:", "\nQUESTION:")


class AnswerFrame:
    """Takes the prompt's frame off an answer as it streams: a leading "Question: ... Answer:" (the model
    repeating the question it was asked) is dropped, and a later line that opens "Question:" ends the answer
    (the model running on into invented pairs). Feed it deltas; it returns what may be shown."""

    def __init__(self) -> None:
        self.head = ""  # held while it may still be a frame
        self.body = StopScanner(RUN_ON)
        self.in_body = False
        self.text = ""  # the answer so far, without the frame

    @property
    def ended(self) -> bool:
        """Whether a run-on frame came: the rest of the stream is not the answer."""
        return self.body.stopped

    def feed(self, delta: str) -> str:
        if self.in_body:
            return self._out(self.body.feed(self.body.text + delta))
        self.head += delta
        while True:
            rest = self.head.lstrip()
            match = _FRAME.match(rest)
            if match is None:
                if not rest or _PARTIAL.fullmatch(rest):
                    return ""  # too short to tell
                self.in_body = True
                return self._out(self.body.feed(rest))
            after = rest[match.end():]
            if match.group(1).lower() == "answer":
                self.head = after
                continue
            # the repeated question runs to "Answer:" or the line's end
            answer = re.search(r"answer\s*:", after, re.IGNORECASE)
            newline = after.find("\n")
            if answer is not None and (newline == -1 or answer.start() < newline):
                self.head = after[answer.end():]
            elif newline != -1:
                self.head = after[newline + 1:]
            else:
                return ""  # the question is still being repeated

    def finish(self) -> str:
        """What was held back when the stream ended (a frame with no answer after it gives nothing)."""
        if self.in_body:
            return self._out(self.body.flush())
        rest = self.head.strip()
        return self._out(rest) if rest and _FRAME.match(rest) is None else ""

    def _out(self, delta: str) -> str:
        self.text += delta
        return delta


def relay_answer(
    deltas: Iterator[str], clock: Clock
) -> PyGenerator[AnswerDelta, None, tuple[str, float | None]]:
    """Yield each text delta as an event, without the prompt's frame (`AnswerFrame`); return the whole text
    and when the model began it. A run-on frame ends the stream there."""
    frame = AnswerFrame()
    first: float | None = None
    for delta in deltas:
        if first is None:
            first = clock()
        shown = frame.feed(delta)
        if shown:
            yield AnswerDelta(shown)
        if frame.ended:
            close_stream(deltas)
            break
    tail = frame.finish()
    if tail:
        yield AnswerDelta(tail)
    return frame.text, first


@contextmanager
def attached(generator: Generator, ledger: PrefillLedger) -> Iterator[PrefillLedger]:
    """``ledger`` attached to ``generator``'s usage account while the block runs (the one before, after)."""
    before, generator.usage.ledger = generator.usage.ledger, ledger
    try:
        yield ledger
    finally:
        generator.usage.ledger = before


def ledger_for(generator: Generator, reference: Sequence[int],
               context: Sequence[tuple[int, int]]) -> AbstractContextManager[PrefillLedger]:
    """A `PrefillLedger` of ``reference`` attached to ``generator``'s usage account while the block runs."""
    return attached(generator, PrefillLedger(reference, context))


def check_context(context: str) -> None:
    if not context.strip():
        raise UserError("the context is empty; give a document with some text")


def check_question(question: str) -> str:
    question = question.strip()
    if not question:
        raise UserError("the question is empty; ask something about the document")
    return question


def make_stats(
    clock: Clock,
    used: Usage,
    context_tokens: int,
    prefilled_context: int,
    margin_tokens: int = 0,
    answer_tokens: int = 0,
    reprefilled_context: int = 0,
    **timings: float | None,
) -> Stats:
    """Stats from the generator's usage over a run (``used``: its counters' delta; ``prefilled_context`` and
    ``reprefilled_context`` from the backend's `PrefillLedger`). When a server did not say what it took
    from its cache for some request of the run, the counts that rest on it are None."""
    known = not used.cache_unreported
    return Stats(
        context_tokens=context_tokens,
        prefilled_context_tokens=prefilled_context if known else None,
        reprefilled_context_tokens=reprefilled_context if known else None,
        prefilled_other_tokens=used.prefilled_tokens - prefilled_context if known else None,
        generated_margin_tokens=margin_tokens,
        generated_answer_tokens=answer_tokens,
        generated_other_tokens=used.generated_tokens - margin_tokens - answer_tokens,
        prefill_seconds=round(used.prefill_seconds, 4),
        prompt_tokens_sent=used.prompt_tokens_sent,
        prompt_tokens_cached=used.prompt_tokens_cached if known else None,
        prompt_cache_unreported=used.cache_unreported,
        total_seconds=round(clock(), 4),
        **{k: (round(v, 4) if v is not None else None) for k, v in timings.items()},  # type: ignore[arg-type]
    )
