"""Writing in the Margins: read segment by segment through one KV cache, take notes.

Instructions are prefilled once, including what to write after each part. For
each segment: prefill it, write a margin for the question from the partially filled
cache (the margin's prompt is the question alone; its own tokens are never
committed: the cache is rolled back to exactly the segment's end), judge the margin.
The answer is generated on the full cache with the relevant margins and the
question appended. Every context token is prefilled once.

A generator that allows several requests in flight (``concurrency`` > 1: a server
that batches) gets the margins pipelined: segment k+1's margin request is sent once
segment k's has been taken in, so margins decode side by side while each request
still extends the prompt before it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..errors import UserError
from ..ingest.segment import segments_from_tokens
from ..models.base import CachingGenerator, Clock, GenerationParams, Generator, Usage, close_stream
from ..options import WimOptions
from ..records import (
    Answer,
    Done,
    Event,
    Margin,
    MarginJudged,
    MarginWritten,
    Reference,
    Segment,
    SegmentRead,
    Started,
)
from .base import Framing, Pattern, Run, make_stats, relay_answer, resolve_options
from .judges import make_judge

NOTES_RESERVED = 4  # margins' worth of window kept free for the notes in the answer prompt


@dataclass(frozen=True)
class _Written:
    """A margin as its request returned it, before judging."""

    segment: Segment
    raw: str
    seconds: float
    tokens: int


class WiM(Pattern):
    """Writing in the Margins over a `CachingGenerator` (see `WimOptions` for the options).

    Args:
        generator: must be a `CachingGenerator` (it owns the KV cache).
        options: the options record (or give its fields as keyword arguments).
    """

    name = "wim"

    def __init__(self, generator: Generator, options: WimOptions | None = None, **values: Any) -> None:
        opts = resolve_options(WimOptions, options, values)
        super().__init__(generator, opts)
        if not isinstance(generator, CachingGenerator):
            raise UserError(
                f"the wim pattern needs a model whose KV cache it can roll back; "
                f"{generator.name} does not offer one (read with lc or rag instead)"
            )
        if opts.segment_tokens >= generator.context_window:
            raise UserError(
                f"segment size {opts.segment_tokens} does not fit the model's window of "
                f"{generator.context_window} tokens; use smaller segments"
            )
        self.cache_gen: CachingGenerator = generator
        self.segment_tokens = opts.segment_tokens
        self.judge = make_judge(opts.judge, generator, opts.grounding_threshold)
        self.margin_params = GenerationParams(
            max_new_tokens=opts.margin_tokens, stop=() if opts.judge == "fused" else ("\n\n",),
            first_choices=getattr(self.judge, "choices", ()),
        )

    def framing(self) -> Framing:
        """The prompt around the document: its intro says what to write after each part."""
        return Framing.build(self.generator, intro=self.judge.intro_template)

    def segments(self, context: str) -> list[Segment]:
        ids, offsets = self.generator.tokenizer.encode_with_offsets(context)
        return segments_from_tokens(context, ids, offsets, self.segment_tokens)

    def _events(self, run: Run, context: str, question: str, source: str) -> Iterator[Event]:
        clock = Clock()
        gen = self.cache_gen
        # The question sits in each margin prompt, not before the document: the document's prefix is
        # then the same for every question, and small models wrote better margins this way (measured).
        framing = self.framing()
        segments = self.segments(context)
        n_context = sum(s.n_tokens for s in segments)
        margin_suffix = framing.suffix(gen, self.judge.margin_template, question=question)
        answer_base = len(framing.suffix(gen, "answer_margins", question=question, margins=""))
        # room for the margin prompt, or for the answer prompt with a few notes
        reserve = max(len(margin_suffix) + self.margin_params.max_new_tokens,
                      answer_base + NOTES_RESERVED * self.margin_params.max_new_tokens
                      + self.answer_params.max_new_tokens)
        gen.check_fits(len(framing.head) + n_context + reserve,
                       what="the document with WiM's prompts and answer")

        worker = gen.fork(keep_cache=False)
        before = gen.usage.snapshot()
        yield Started(self.name, len(segments), n_context)
        worker.prefill(framing.head)
        margins: list[Margin] = []
        cited: set[tuple[int, int]] = set()
        margin_tokens = 0
        read = 0
        first_margin: float | None = None
        margin_seconds = 0.0
        write = self._pipelined if gen.concurrency > 1 else self._sequential
        for item in write(run, worker, segments, margin_suffix, clock):
            if isinstance(item, SegmentRead):
                read += 1
                yield item
                continue
            segment, raw = item.segment, item.raw
            margin_tokens += item.tokens
            margin_seconds += item.seconds
            if first_margin is None:
                first_margin = clock()
            yield MarginWritten(segment.index, raw, clock())
            verdict = self.judge.judge(question, raw, segment, context[:segment.end])
            relevant, reason = verdict.relevant, verdict.reason
            if relevant and verdict.evidence is not None and verdict.evidence in cited:
                relevant, reason = False, "repeats an earlier note"
            if relevant and verdict.evidence is not None:
                cited.add(verdict.evidence)
            margin = Margin(segment.index, verdict.text, relevant, self.judge.mode,
                            verdict.score, reason, verdict.evidence)
            margins.append(margin)
            yield MarginJudged(margin, clock())

        kept = [m for m in margins if m.relevant]
        room = gen.context_window - worker.length - answer_base - self.answer_params.max_new_tokens
        notes = fit_notes([m.text for m in kept], room, gen.tokenizer.count)
        t_answer = clock()
        generated = gen.usage.generated_tokens
        text, first_token = yield from relay_answer(worker.generate_from_cache(
            framing.suffix(gen, "answer_margins", question=question, margins=notes),
            self.answer_params,
        ), clock)
        answer_tokens = gen.usage.generated_tokens - generated
        used = gen.usage.since(before)
        stats = make_stats(
            clock, used, n_context, sum(s.n_tokens for s in segments[:read]),
            margin_tokens=margin_tokens, answer_tokens=answer_tokens,
            margin_seconds=margin_seconds, answer_seconds=clock() - t_answer,
            time_to_first_margin=first_margin, time_to_first_answer_token=first_token,
        )
        yield Done(Answer(
            question=question, text=text.strip(), pattern=self.name, model=gen.name,
            references=tuple(cite(m, segments, context, source) for m in kept),
            margins=tuple(margins), stats=stats, segments_read=read,
            segments_total=len(segments), stopped_early=read < len(segments),
        ))

    def _sequential(self, run: Run, worker: CachingGenerator, segments: list[Segment],
                    suffix: list[int], clock: Clock) -> Iterator[SegmentRead | _Written]:
        """Prefill a segment, write its margin, roll back; then the next segment."""
        for segment in segments:
            if run.stop_requested:
                break
            worker.prefill(segment.token_ids)
            yield SegmentRead(segment, len(segments), clock())
            t0 = time.perf_counter()
            generated = worker.usage.generated_tokens
            raw = self.judge.read(worker.generate_from_cache(suffix, self.margin_params))
            yield _Written(segment, raw, time.perf_counter() - t0, worker.usage.generated_tokens - generated)

    def _pipelined(self, run: Run, worker: CachingGenerator, segments: list[Segment],
                   suffix: list[int], clock: Clock) -> Iterator[SegmentRead | _Written]:
        """Margin requests in flight side by side, yielded in segment order.

        Each request runs on a fork holding the prefix up to its segment, with its own
        usage account (added to the generator's when its margin is yielded). The next
        request is sent once this one's first text arrives: the server has then read
        this prompt, and a prefix cache can serve it to the next, longer one.
        """
        limit = self.cache_gen.concurrency
        pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="wim-margin")
        pending: deque[tuple[Segment, CachingGenerator, Future[tuple[str, float]]]] = deque()
        try:
            for segment in segments:
                if run.stop_requested:
                    break
                worker.prefill(segment.token_ids)
                yield SegmentRead(segment, len(segments), clock())
                fork = worker.fork(keep_cache=True)
                fork.usage = Usage()
                taken_in = threading.Event()
                future = pool.submit(self._margin_on, fork, suffix, taken_in)
                pending.append((segment, fork, future))
                while not taken_in.wait(0.02) and not future.done():
                    pass
                while pending and (pending[0][2].done() or len(pending) >= limit):
                    yield self._collect(*pending.popleft())
            while pending:
                yield self._collect(*pending.popleft())
        finally:
            for _, _, future in pending:
                future.cancel()
            pool.shutdown(wait=False, cancel_futures=True)

    def _margin_on(self, fork: CachingGenerator, suffix: list[int],
                   taken_in: threading.Event) -> tuple[str, float]:
        t0 = time.perf_counter()
        stream = fork.generate_from_cache(suffix, self.margin_params)

        def marked() -> Iterator[str]:
            try:
                for delta in stream:
                    taken_in.set()
                    yield delta
            finally:
                taken_in.set()
                close_stream(stream)  # rolls the fork back

        return self.judge.read(marked()), time.perf_counter() - t0

    def _collect(self, segment: Segment, fork: CachingGenerator,
                 future: Future[tuple[str, float]]) -> _Written:
        raw, seconds = future.result()  # a failed request raises here, after the margins before it
        self.cache_gen.usage.add(fork.usage)
        return _Written(segment, raw, seconds, fork.usage.generated_tokens)


def fit_notes(texts: list[str], room: int, count: Callable[[str], int]) -> str:
    """The notes as a bullet list, keeping the latest ones that fit ``room`` tokens."""
    lines: list[str] = []
    for text in reversed(texts):
        candidate = [f"- {text}", *lines]
        if count("\n".join(candidate)) > room:
            break
        lines = candidate
    return "\n".join(lines) or "- (no notes)"


def cite(margin: Margin, segments: list[Segment], context: str, source: str) -> Reference:
    """A reference for a kept margin: the sentence that supports it when the judge
    found one (it may lie in an earlier segment), else the margin's own segment."""
    if margin.evidence is not None:
        start, end = margin.evidence
        where = next(s.index for s in segments if s.start <= start < s.end)
        return Reference(source, start, end, context[start:end].strip(), where, margin.score)
    segment = segments[margin.segment_index]
    return Reference(source, segment.start, segment.end, margin.text, segment.index, margin.score)
