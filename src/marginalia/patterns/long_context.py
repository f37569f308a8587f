"""Long context: the whole document, then the question, in one prompt; its options record and its
registration."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from ..models.base import Clock, Generator
from ..options import CollectionOptions, PatternOptions
from ..records import Answer, Done, Event, Reference, Started
from .base import Framing, Pattern, Run, ledger_for, make_stats, relay_answer, resolve_options
from .collection import CollectionReader, searching
from .registry import PatternSpec

if TYPE_CHECKING:
    from ..index.store import Collection


class LcOptions(PatternOptions):
    """Long context: the whole document, then the question, in one prompt."""

    pattern: ClassVar[str] = "lc"


class LongContext(Pattern):
    """The baseline: read everything at once.

    Raises `ContextOverflow` (with both numbers) when the document, the instructions
    and the answer budget do not fit the model's window.
    """

    name = "lc"

    def __init__(self, generator: Generator, options: LcOptions | None = None, *, intro: str = "document_intro",
                 **values: Any) -> None:
        super().__init__(generator, resolve_options(LcOptions, options, values))
        self.intro = intro  # the prompt that introduces the context (a document, or retrieved passages)

    def prompt_overhead(self, question: str) -> int:
        """Tokens of the prompt around a context for ``question``, and of the answer it may write."""
        gen = self.generator
        framing = Framing.build(gen, intro=self.intro)
        suffix = framing.suffix(gen, self.answer_template(question), question=question)
        return (len(framing.head) + len(suffix)
                + self.answer_params.max_new_tokens)

    def _events(self, run: Run, context: str, question: str, source: str) -> Iterator[Event]:
        clock = Clock()
        gen = self.generator
        params = run.params(self.answer_params)
        framing = Framing.build(gen, intro=self.intro)
        context_ids = gen.tokenizer.encode(context)
        suffix = framing.suffix(gen, self.answer_template(question), question=question)
        prompt = framing.head + context_ids + suffix
        gen.check_fits(len(prompt) + params.max_new_tokens,
                       what="the document, the question and the answer")
        before = gen.usage.snapshot()
        yield Started(self.name, 1, len(context_ids))
        head = len(framing.head)
        with ledger_for(gen, prompt[:head + len(context_ids)], [(head, head + len(context_ids))]) as ledger:
            text, first = yield from relay_answer(gen.stream_prompt(prompt, params), clock)
        used = gen.usage.since(before)
        stats = make_stats(
            clock, used, len(context_ids), ledger.evaluated, reprefilled_context=ledger.repeated,
            answer_tokens=used.generated_tokens,
            answer_seconds=used.decode_seconds, time_to_first_answer_token=first,
        )
        yield Done(Answer(
            question=question, text=text.strip(), pattern=self.name, model=gen.name,
            references=(Reference(source, 0, len(context), "(the whole document)"),),
            stats=stats, segments_read=1, segments_total=1,
        ))


def one_prompt_reader(store: Collection, options: PatternOptions, reading: CollectionOptions,
                      generator: Generator, *, scope: str, k: int, intro: str, name: str) -> CollectionReader:
    """A reader of a collection that answers in one prompt from the references it gathers (``k`` hits of
    ``scope``), cut to what fits the model's window beside the prompt and the answer."""
    lc = LongContext(generator, LcOptions(max_new_tokens=options.max_new_tokens), intro=intro)

    def room(question: str) -> int:
        return generator.context_window - lc.prompt_overhead(question)

    return CollectionReader(lc, searching(store, reading, generator, scope=scope, k=k, room=room), name=name)


def _read_collection(store: Collection, options: PatternOptions, reading: CollectionOptions, generator: Generator,
                     scope: str) -> CollectionReader:
    return one_prompt_reader(store, options, reading, generator, scope=scope, k=reading.hits,
                             intro="document_intro", name="lc")


SPEC = PatternSpec(
    name="lc", options=LcOptions, pattern=LongContext, title="long context",
    description="long context: the whole document, then the question, in one prompt",
    reads="sections", read_collection=_read_collection)
