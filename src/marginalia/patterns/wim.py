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
still extends the prompt before it. Not on a server that keeps a prompt per slot
(``shares_prefixes`` false): side by side, the requests would land on slots that hold
another segment's prefix and read the difference again.

Its options record (`WimOptions`) and its registration (`SPEC`) are here too.
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from pydantic import Field

from ..errors import UserError
from ..ingest.segment import segments_from_tokens
from ..models.base import CacheSnapshot, CachingGenerator, Clock, GenerationParams, Generator, Usage, close_stream
from ..models.ledger import PrefillLedger
from ..models.snapshots import SnapshotStore, snapshot_key
from ..options import MAX_TOKENS, TOPIC_THRESHOLD, JudgeMode, PatternOptions, RunSettings
from ..records import (
    Answer,
    Done,
    Event,
    Margin,
    MarginJudged,
    MarginWritten,
    ReadingStopped,
    Reference,
    Segment,
    SegmentRead,
    SegmentsDropped,
    Started,
    ends_reading,
)
from .base import (
    Framing,
    Pattern,
    Run,
    attached,
    check_context,
    check_question,
    make_stats,
    relay_answer,
    resolve_options,
)
from .grounding import items_found, list_items
from .judges import LIST_SHARE, SeparateJudge, Verdict, make_judge
from .long_context import LongContext
from .registry import PatternSpec

log = logging.getLogger(__name__)


class WimOptions(PatternOptions):
    """Writing in the Margins: segment by segment through one KV cache, a margin after each."""

    pattern: ClassVar[str] = "wim"
    segment_tokens: int = Field(default=512, gt=0, le=MAX_TOKENS, description="wim: model tokens per segment")
    judge: JudgeMode = Field(
        default="grounded",
        description="wim: how a margin is judged relevant: grounded, when the text read supports it and is on the "
                    "question; or separate, the model classifies it in a request of its own beside the reading "
                    "(the WiM paper's method)")
    margin_tokens: int = Field(default=48, gt=0, le=MAX_TOKENS, description="wim: the most tokens per margin")
    grounding_threshold: float = Field(
        default=0.5, ge=0.0, le=1.0,
        description="wim, grounded judge: share of a margin's new words (by rarity) one sentence read must "
                    "hold; a margin copied from the text holds them all")
    topic_threshold: float = Field(
        default=TOPIC_THRESHOLD, ge=0.0, le=1.0,
        description="wim, grounded judge: share of the question's words (by rarity) the sentence supporting "
                    "a margin must hold (0: any supported margin is on topic)")
    batch_margins: bool = Field(
        default=False,
        description="wim: write margins side by side as segments are read (in process): faster where a "
                    "decode step costs less per token with more tokens in it (a GPU); a greedy margin may differ "
                    "where two tokens nearly tie")
    stop_at_score: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="wim: stop at the first relevant margin of this score (or more; grounded: "
                    "its support times its topicality; separate: 1); off when not given")

#: puts the worker's cache at a segment's end; True when it came from a kept copy, not a prefill
Place = Callable[[Segment], bool]
NOTES_RESERVED = 4  # margins' worth of window kept free for the notes in the answer prompt


#: why a relevant margin is dropped when a kept one already cites the same evidence
REPEAT_REASON = "repeats an earlier note"


@dataclass(frozen=True)
class _Written:
    """A margin as its request returned it, before judging."""

    segment: Segment
    raw: str
    seconds: float
    tokens: int


_CUT_WORD = re.compile(r"[\s,;:(\[\"'‘“-]*[^\W_]+$")


def without_cut_word(margin: str) -> str:
    """A margin the token budget ended, less its last word when it ends inside one ("... from 196" of "from
    1961"): a piece of a word or number is not in the text, and a judge would take it for the model's own. A
    margin that ends with punctuation, or is one word, is left as it is."""
    cut = _CUT_WORD.search(margin)
    return margin[: cut.start()] if cut and cut.start() > 0 else margin


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
        if opts.judge == "separate" and generator.remote:
            log.warning("the separate judge sends a request of its own after each margin: a server with one "
                        "cache slot (llama-cpp-python's) then reads the document again for every margin; "
                        "servers with a block prefix cache (vLLM, SGLang, llama-server with slots) keep both")
        self.cache_gen: CachingGenerator = generator
        self.segment_tokens = opts.segment_tokens
        self.stop_at_score = opts.stop_at_score
        self.batch_margins = opts.batch_margins
        #: a list margin the part does not hold is written again by copy decoding (`needs_copy`; where the
        #: model cannot copy, margins stay as written)
        self.copy_lists = generator.supports_copy
        self.judge = make_judge(opts.judge, generator, opts.grounding_threshold, opts.topic_threshold)
        self.margin_params = GenerationParams(max_new_tokens=opts.margin_tokens, stop=("\n\n",))

    def framing(self) -> Framing:
        """The prompt around the document: its intro says what to write after each part (said once, not per
        margin: each margin prompt is then only the question)."""
        return Framing.build(self.generator, intro="wim_intro")

    def copy_params(self, segment: Segment) -> GenerationParams:
        """`margin_params`, each piece copied from the segment's text (or NONE)."""
        return replace(self.margin_params, copy_from=segment.text, copy_also=("NONE",))

    def needs_copy(self, margin: str, segment: Segment) -> bool:
        """Whether a freely written margin is written again by copy decoding: it is a list
        (`grounding.list_items`) of which the part holds fewer items than the judge asks of a list
        (`judges.LIST_SHARE`). A small model asked for the items a part adds to an aggregate (the words
        frequent in it, the names it mentions) often writes a plausible list the part does not hold; copied,
        the list is the part's own."""
        if not self.copy_lists:
            return False
        items = list_items(margin)
        return bool(items) and len(items_found(items, segment.text)) < LIST_SHARE * len(items)

    def segments(self, context: str) -> list[Segment]:
        ids, offsets = self.generator.tokenizer.encode_with_offsets(context)
        return segments_from_tokens(context, ids, offsets, self.segment_tokens)

    def reader(self, context: str, source: str = "context", store: SnapshotStore | None = None) -> WimReader:
        """A document read once for many questions: see `WimReader`."""
        return WimReader(self, context, source, store)

    def _events(self, run: Run, context: str, question: str, source: str) -> Iterator[Event]:
        yield from WimReader(self, context, source)._events(run, question)

    def _sequential(self, run: Run, worker: CachingGenerator, segments: list[Segment], total: int, place: Place,
                    suffix: list[int], clock: Clock) -> Iterator[SegmentRead | _Written]:
        """Put the cache at a segment's end (prefill it, or restore it), write its margin, roll back;
        then the next segment."""
        for segment in segments:
            if run.stop_requested:
                break
            cached = place(segment)
            yield SegmentRead(segment, total, clock(), cached)
            t0 = time.perf_counter()
            generated = worker.usage.generated_tokens
            raw = self.judge.read(worker.generate_from_cache(suffix, self.margin_params))
            if self.needs_copy(raw, segment):  # the cache is back at the segment's end: write it again
                generated = worker.usage.generated_tokens
                raw = self.judge.read(worker.generate_from_cache(suffix, self.copy_params(segment)))
            yield _Written(segment, raw, time.perf_counter() - t0, worker.usage.generated_tokens - generated)

    def _batched(self, run: Run, worker: CachingGenerator, segments: list[Segment], total: int, ends: list[int],
                 suffix: list[int], clock: Clock, just_read: bool = False) -> Iterator[SegmentRead | _Written]:
        """Margins for segments whose reading the worker's cache holds (to ``ends[-1]``), written as
        branches decoded side by side, as many at a time as the backend takes. Segments of a kept reading are
        announced as read from the cache; ``just_read``: this run has just read them (and said so), and
        writes all their margins even when asked to stop (it was asked while reading)."""
        size = self.cache_gen.max_branches
        for at in range(0, len(segments), size):
            if run.stop_requested and not just_read:
                break
            group = segments[at:at + size]
            t0 = time.perf_counter()
            written = worker.branches([ends[s.index] for s in group], suffix, self.margin_params)
            seconds = (time.perf_counter() - t0) / len(group)
            for segment, (text, tokens) in zip(group, written, strict=True):
                if not just_read:
                    yield SegmentRead(segment, total, clock(), True)
                yield _Written(segment, text.strip(), seconds, tokens)

    def _pipelined(self, run: Run, worker: CachingGenerator, segments: list[Segment], total: int, place: Place,
                   suffix: list[int], clock: Clock) -> Iterator[SegmentRead | _Written]:
        """Margin requests in flight side by side, yielded in segment order.

        Each request runs on a fork holding the prefix up to its segment, with its own
        usage account (added to the generator's when its margin is yielded). After a segment
        read now, the next request is sent once this one's first text arrives: the server has
        then read this prompt, and a prefix cache can serve it to the next, longer one. After
        a segment of a kept reading, whose prefix the server has read before, the next is
        sent at once, so that a later question's margins are decoded side by side from the start.
        """
        limit = self.cache_gen.concurrency
        pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="wim-margin")
        pending: deque[tuple[Segment, CachingGenerator, Future[tuple[str, float]]]] = deque()
        try:
            for segment in segments:
                if run.stop_requested:
                    break
                cached = place(segment)
                yield SegmentRead(segment, total, clock(), cached)
                fork = worker.fork(keep_cache=True)
                fork.usage = Usage(ledger=worker.usage.ledger)
                taken_in = threading.Event()
                future = pool.submit(self._margin_on, fork, suffix, taken_in)
                pending.append((segment, fork, future))
                while not cached and not taken_in.wait(0.02) and not future.done():
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


class WimReader:
    """A document read once, asked many questions.

    WiM's cache holds the intro and the segments, none of which depends on the question (the question
    enters only in each margin prompt, which is rolled back). The first question reads the document
    as `WiM.run` does; once every segment is in the cache, a copy of it is kept (and stored in
    ``store`` when one is given, for a later process). A later question restores that copy and, for
    each segment, rolls it back to the segment's end and writes that question's margin there: no
    document token is prefilled again. A reading stopped early is continued by the next question.

    Args:
        wim: the pattern (its model, options and judge).
        context: the document's text.
        source: the name references give the document.
        store: where full readings are kept across processes (see `SnapshotStore`).
    """

    def __init__(self, wim: WiM, context: str, source: str = "context", store: SnapshotStore | None = None) -> None:
        check_context(context)
        self.wim = wim
        self.context = context
        self.source = source
        self.store = store
        gen = wim.cache_gen
        self.framing = wim.framing()
        self.segments = wim.segments(context)
        ends, at = [], len(self.framing.head)
        for segment in self.segments:
            at += segment.n_tokens
            ends.append(at)
        self.ends = ends  # the cache's length once each segment is read
        self.worker = gen.fork(keep_cache=False)
        self.read = 0  # segments the worker's cache (or `full`) holds
        self.dropped = 0  # segments dropped from the front of the cache to make room (a long document)
        self.dropped_tokens = 0
        self._drops: list[SegmentsDropped] = []  # drops not yet reported
        self._reserve = 0  # what the prompts after a segment need (set per question)
        self.full: CacheSnapshot | None = None  # a copy of the cache holding every segment read
        self.key = snapshot_key(gen, self.framing.head, self.segments) if store is not None else ""
        self.ledger = self._new_ledger()

    def _new_ledger(self) -> PrefillLedger:
        """What the backend evaluated of this reading (the intro, then the segments), for the stats."""
        head = len(self.framing.head)
        reference = list(self.framing.head)
        for segment in self.segments:
            reference += segment.token_ids
        return PrefillLedger(reference, [(head, len(reference))], blocks=[head, *self.ends])

    def ask(self, question: str, settings: RunSettings | None = None) -> Run:
        """Start answering ``question``; iterate the `Run` for events (`Run.stop()` stops early).
        ``settings``: this run's own."""
        return Run(self.pattern(), self.context, check_question(question), self.source, settings)

    def pattern(self) -> Pattern:
        """A pattern whose runs answer from this reading, as `ask` does: the context a run is given is not
        read, this reading's is (auto's WiM reading of a stored document)."""
        return _ReaderPattern(self)

    def answer(self, question: str, settings: RunSettings | None = None) -> Answer:
        return self.ask(question, settings).answer()

    def ask_whole(self, question: str, lc: LongContext, settings: RunSettings | None = None) -> Run:
        """Answer ``question`` as long context does, from this reading: the intro and every segment in the
        cache (the segments not read yet are read now, without margins), then long context's answer prompt.

        This is how a benchmark lets one prefill of a context serve both lc and wim: the answer is
        ``lc``'s (its name and answer settings, under this run's ``settings``), but the prompt it reads opens
        with WiM's intro, not long context's own.
        """
        return Run(_WholePattern(self, lc), self.context, check_question(question), self.source, settings)

    def _load(self) -> None:
        """Take a stored full reading, when the store has one for this model and document."""
        if self.full is not None or self.store is None:
            return
        snapshot = self.store.get(self.key, self.wim.cache_gen)
        if snapshot is not None and len(snapshot.ids) == self.ends[-1]:
            self.full, self.read = snapshot, len(self.segments)

    def _place(self, segment: Segment) -> bool:
        """Make the worker's cache end at ``segment``'s end: roll the kept copy back to it, or prefill the
        segment. True when it came from the kept copy.

        The worker's cache always holds a prefix of one sequence (the intro, then the segments in order),
        so its length says what it holds.
        """
        worker, k = self.worker, segment.index
        if k < self.read and self.full is not None:
            if worker.length < self.ends[k]:
                worker.restore(self.full)
            worker.rollback(self.ends[k])
            return True
        start = self.ends[k] - segment.n_tokens - self.dropped_tokens
        if worker.length < start and self.full is not None:
            worker.restore(self.full)
        if worker.length > start:
            worker.rollback(start)
        self._make_room(segment)
        worker.prefill(segment.token_ids)
        self.read = k + 1
        return False

    def _make_room(self, segment: Segment) -> None:
        """Drop the oldest segments still cached until ``segment`` and the prompts after it fit the window
        (the intro stays; their margins judged relevant are carried to the answer all the same)."""
        worker, head = self.worker, len(self.framing.head)
        window = self.wim.cache_gen.context_window
        first, tokens = self.dropped, 0
        while worker.length - tokens + segment.n_tokens + self._reserve > window and self.dropped < segment.index:
            tokens += self.segments[self.dropped].n_tokens
            self.dropped += 1
        if self.dropped == first:
            return
        self.ledger.shift(head, head + tokens)  # first: a backend that drops by prefilling again is caught
        worker.drop(head, head + tokens)
        self.dropped_tokens += tokens
        self.full = None  # the kept copy no longer holds the whole reading
        self._drops.append(SegmentsDropped(first, self.dropped, tokens, worker.length))

    def _read_anew(self) -> None:
        """Forget a reading whose cache lost its first segments: the next one starts after the intro."""
        self.worker.rollback(len(self.framing.head))
        self.read = self.dropped = self.dropped_tokens = 0
        self.ledger = self._new_ledger()

    def _read_then_batch(self, run: Run, suffix: list[int], clock: Clock) -> Iterator[SegmentRead | _Written]:
        """A first reading with ``batch_margins``: every segment read first (a stop asked for ends the reading),
        then the margins of those read written as branches side by side. They arrive after the reading, not
        as it goes; each still reads only up to its segment's end."""
        segments = self.segments
        for segment in segments:
            if run.stop_requested:
                break
            cached = self._place(segment)
            yield SegmentRead(segment, len(segments), clock(), cached)
        yield from self.wim._batched(run, self.worker, segments[:self.read], len(segments), self.ends, suffix,
                                     clock, just_read=True)

    def _events(self, run: Run, question: str) -> Iterator[Event]:
        wim, gen, framing, segments = self.wim, self.wim.cache_gen, self.framing, self.segments
        clock = Clock()
        n_context = sum(s.n_tokens for s in segments)
        margin_suffix = framing.suffix(gen, "margin", question=question)
        answer_base = len(framing.suffix(gen, wim.answer_template(question, "answer_margins"),
                                         question=question, margins=""))
        # room for the margin prompt, or for the answer prompt with a few notes
        reserve = max(len(margin_suffix) + wim.margin_params.max_new_tokens,
                      answer_base + NOTES_RESERVED * wim.margin_params.max_new_tokens
                      + wim.answer_params.max_new_tokens)
        longest = max(s.n_tokens for s in segments)
        gen.check_fits(len(framing.head) + longest + reserve,
                       what="the intro, a segment and WiM's prompts and answer")
        self._reserve = reserve
        if self.dropped:  # a long document is read anew for each question: its cache holds only the end
            self._read_anew()
        with attached(gen, self.ledger):
            yield from self._read(run, question, clock, n_context, margin_suffix, answer_base)

    def _whole_events(self, run: Run, question: str, lc: LongContext) -> Iterator[Event]:
        gen, framing, segments = self.wim.cache_gen, self.framing, self.segments
        clock = Clock()
        name, params = lc.name, run.params(lc.answer_params)
        n_context = sum(s.n_tokens for s in segments)
        suffix = framing.suffix(gen, lc.answer_template(question), question=question)
        gen.check_fits(len(framing.head) + n_context + len(suffix) + params.max_new_tokens,
                       what="the document, the question and the answer")
        self._reserve = len(suffix) + params.max_new_tokens
        if self.dropped:  # wim's prompts needed more room than this answer: its cache lost the start
            self._read_anew()
        with attached(gen, self.ledger):
            before = gen.usage.snapshot()
            ledger_before = (self.ledger.evaluated, self.ledger.repeated)
            self._load()
            yield Started(name, 1, n_context)
            held = sum(s.n_tokens for s in segments[:self.read])  # in the kept reading: not read by this run
            worker, end = self.worker, self.ends[-1]
            if self.read < len(segments):  # read the rest (a reading stopped early), then keep it
                if worker.length == 0 and self.full is None:
                    worker.prefill(framing.head)
                for segment in segments[self.read:]:
                    self._place(segment)
                self.full = worker.snapshot()
            elif self.full is not None:
                # from the kept copy: another request may have used the model's cache since
                worker.restore(self.full)
            worker.rollback(end)
            text, first = yield from relay_answer(worker.generate_from_cache(suffix, params), clock)
            used = gen.usage.since(before)
            prefilled = self.ledger.evaluated - ledger_before[0]
            stats = make_stats(clock, used, n_context, prefilled,
                               reprefilled_context=self.ledger.repeated - ledger_before[1],
                               answer_tokens=used.generated_tokens, answer_seconds=used.decode_seconds,
                               time_to_first_answer_token=first)
        # the backend's account where it has one (a server may have lost part of what we kept), else ours
        cached = n_context - stats.prefilled_context_tokens if stats.prefilled_context_tokens is not None else held
        stats = replace(stats, cached_context_tokens=cached,
                        peak_cache_tokens=min(end + len(suffix) + stats.generated_answer_tokens, gen.context_window))
        yield Done(Answer(
            question=question, text=text.strip(), pattern=name, model=gen.name,
            references=(Reference(self.source, 0, len(self.context), "(the whole document)"),),
            stats=stats, segments_read=1, segments_total=1,
        ))

    def _read(self, run: Run, question: str, clock: Clock, n_context: int, margin_suffix: list[int],
              answer_base: int) -> Iterator[Event]:
        wim, gen, framing, segments = self.wim, self.wim.cache_gen, self.framing, self.segments
        before = gen.usage.snapshot()
        ledger_before = (self.ledger.evaluated, self.ledger.repeated)
        self._load()
        yield Started(wim.name, len(segments), n_context)
        worker = self.worker
        if worker.length == 0 and self.full is None:
            worker.prefill(framing.head)
        peak = worker.length
        held_before = self.read  # segments in the kept copy: their margins come from it
        found = False  # reading was stopped by a margin that met stop_at_score
        judge = wim.judge
        overlap: ThreadPoolExecutor | None = None
        judging: deque[tuple[Segment, str, Any]] = deque()
        if judge.mode == "separate":  # classify on a fork of its own, beside the reading
            judge_gen = gen.fork(keep_cache=False)
            judge_gen.usage = Usage()
            judge = SeparateJudge(judge_gen)
            overlap = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wim-judge")

        def settle(segment: Segment, raw: str, verdict: Verdict | Future[Verdict]) -> Iterator[Event]:
            nonlocal found
            if isinstance(verdict, Future):
                verdict = verdict.result()
            relevant, reason = verdict.relevant, verdict.reason
            if relevant and verdict.evidence is not None and verdict.evidence in cited:
                relevant, reason = False, REPEAT_REASON
            if relevant and verdict.evidence is not None:
                cited.add(verdict.evidence)
            margin = Margin(segment.index, verdict.text, relevant, judge.mode, verdict.score, reason,
                            verdict.evidence, segment.end)
            margins.append(margin)
            yield MarginJudged(margin, clock())
            if ends_reading(margin.relevant, margin.score, wim.stop_at_score) and not run.stop_requested:
                run.stop()
                found = True
        margins: list[Margin] = []
        cited: set[tuple[int, int]] = set()
        margin_tokens = 0
        written = 0
        cached_tokens = 0
        placed_tokens = 0  # context tokens of the segments this run placed in the cache, from a kept copy or not
        first_margin: float | None = None
        margin_seconds = 0.0
        # side by side only where each request still finds the one before it in the server's prefix cache
        write = wim._pipelined if gen.concurrency > 1 and gen.shares_prefixes else wim._sequential
        steps: Iterator[SegmentRead | _Written]
        batched = wim.batch_margins and gen.max_branches > 1  # batched margins stay as written (no copy)
        if batched and held_before and self.full is not None:
            # the kept reading's margins as batched branches, then read on as usual
            if worker.length < len(self.full.ids):
                worker.restore(self.full)
            steps = itertools.chain(
                wim._batched(run, worker, segments[:held_before], len(segments), self.ends, margin_suffix, clock),
                write(run, worker, segments[held_before:], len(segments), self._place, margin_suffix, clock))
        elif batched and not held_before and wim.stop_at_score is None \
                and self.ends[-1] + self._reserve <= gen.context_window:
            # a first reading of a document that fits: read it all, then write its margins side by side
            steps = self._read_then_batch(run, margin_suffix, clock)
        else:
            steps = write(run, worker, segments, len(segments), self._place, margin_suffix, clock)
        for item in steps:
            if isinstance(item, SegmentRead):
                yield from self._drops
                self._drops.clear()
                cached_tokens += item.segment.n_tokens if item.cached else 0
                placed_tokens += item.segment.n_tokens
                peak = max(peak, worker.length + len(margin_suffix) + wim.margin_params.max_new_tokens)
                yield item
                continue
            segment, raw = item.segment, item.raw
            if item.tokens >= wim.margin_params.max_new_tokens:
                raw = without_cut_word(raw)
            written += 1
            margin_tokens += item.tokens
            margin_seconds += item.seconds
            if first_margin is None:
                first_margin = clock()
            yield MarginWritten(segment.index, raw, clock())
            if overlap is None:
                yield from settle(segment, raw, judge.judge(question, raw, segment, self.context[:segment.end],
                                                            self.context))
                continue
            # the separate judge's request for this margin runs while the next segment is read
            while judging:
                yield from settle(*judging.popleft())
            judging.append((segment, raw, overlap.submit(judge.judge, question, raw, segment,
                                                         self.context[:segment.end])))
        while judging:
            yield from settle(*judging.popleft())
        if overlap is not None:
            overlap.shutdown()
            gen.usage.add(judge_gen.usage)

        stop_reason = "" if written >= len(segments) else "found" if found else "asked"
        if stop_reason:
            last = margins[-1].segment_index if margins else -1
            yield ReadingStopped(last, stop_reason, clock())
        # the answer reads everything read so far: the kept copy, and what this run read after it
        target = (self.ends[self.read - 1] if self.read else len(framing.head)) - self.dropped_tokens
        if worker.length < target and self.full is not None:
            worker.restore(self.full)
        if self.read > held_before and not self.dropped:
            self.full = worker.snapshot()
            if self.store is not None and self.read == len(segments):
                self.store.put(self.key, self.full, gen)
        kept = [m for m in margins if m.relevant]
        params = run.params(wim.answer_params)
        room = gen.context_window - worker.length - answer_base - params.max_new_tokens
        notes = fit_notes([m.text for m in kept], room, gen.tokenizer.count)
        t_answer = clock()
        generated = gen.usage.generated_tokens
        text, first_token = yield from relay_answer(worker.generate_from_cache(
            framing.suffix(gen, wim.answer_template(question, "answer_margins"), question=question,
                           margins=notes),
            params,
        ), clock)
        answer_tokens = gen.usage.generated_tokens - generated
        used = gen.usage.since(before)
        # what the backend evaluated of the document during this run, by its own account
        prefilled_context = self.ledger.evaluated - ledger_before[0]
        stats = make_stats(
            clock, used, n_context, prefilled_context,
            reprefilled_context=self.ledger.repeated - ledger_before[1],
            margin_tokens=margin_tokens, answer_tokens=answer_tokens,
            margin_seconds=margin_seconds, answer_seconds=clock() - t_answer,
            time_to_first_margin=first_margin, time_to_first_answer_token=first_token,
        )
        peak = max(peak, worker.length + answer_base + len(gen.tokenizer.encode(notes)) + answer_tokens)
        if stats.prefilled_context_tokens is not None and stats.reprefilled_context_tokens is not None:
            # the backend's account: a server's prefix cache may have served what this run did not keep
            distinct = stats.prefilled_context_tokens - stats.reprefilled_context_tokens
            cached_tokens = max(0, placed_tokens - distinct)
        stats = replace(stats, cached_context_tokens=cached_tokens, dropped_context_tokens=self.dropped_tokens,
                        peak_cache_tokens=min(peak, gen.context_window))
        yield Done(Answer(
            question=question, text=text.strip(), pattern=wim.name, model=gen.name,
            references=tuple(cite(m, segments, self.context, self.source) for m in kept),
            margins=tuple(margins), stats=stats, segments_read=self.read,
            segments_total=len(segments), stopped_early=written < len(segments), stop_reason=stop_reason,
        ))


class _WholePattern(Pattern):
    """Adapts `WimReader.ask_whole` to `Run`: the reader's whole cache, answered as ``lc`` answers."""

    def __init__(self, reader: WimReader, lc: LongContext) -> None:
        super().__init__(reader.wim.generator, lc.options)
        self.name = lc.name
        self.reader, self.lc = reader, lc

    def _events(self, run: Run, context: str, question: str, source: str) -> Iterator[Event]:
        return self.reader._whole_events(run, question, self.lc)


class _ReaderPattern(Pattern):
    """Adapts a `WimReader` to `Run`, which drives a pattern's events."""

    def __init__(self, reader: WimReader) -> None:
        super().__init__(reader.wim.generator, reader.wim.options)
        self.name = reader.wim.name
        self.reader = reader

    def _events(self, run: Run, context: str, question: str, source: str) -> Iterator[Event]:
        return self.reader._events(run, question)


class SharedReading:
    """One WiM pattern's reading of the latest context, shared by the patterns that answer from it: the WiM
    pattern itself and long-context patterns that answer from its cache (`WimReader.ask_whole`), so that the
    context is prefilled once for all of them. Only the latest context's reading is kept.

    Args:
        wim: the pattern whose reading is shared.
    """

    def __init__(self, wim: WiM) -> None:
        self.wim = wim
        self._held: tuple[tuple[str, str], WimReader] | None = None

    def reader(self, context: str, source: str = "context") -> WimReader:
        """The reading of ``context``: the one held when it is the same context, else a new one."""
        key = (source, context)
        if self._held is None or self._held[0] != key:
            self._held = (key, self.wim.reader(context, source))
        return self._held[1]

    def answering(self, lc: LongContext | None = None) -> Pattern:
        """A pattern whose runs read through this shared reading: WiM's own answer, or with ``lc``, long
        context's answer from the whole cache (its name and answer settings)."""
        return _OnShared(self, lc)


class _OnShared(Pattern):
    """A run of WiM, or of ``lc`` from WiM's cache, on a `SharedReading` of each context."""

    def __init__(self, shared: SharedReading, lc: LongContext | None) -> None:
        inner: Pattern = lc if lc is not None else shared.wim
        super().__init__(inner.generator, inner.options)
        self.name = inner.name
        self.answer_params = inner.answer_params
        self.shared, self.lc = shared, lc

    def _events(self, run: Run, context: str, question: str, source: str) -> Iterator[Event]:
        reader = self.shared.reader(context, source)
        if self.lc is None:
            yield from reader._events(run, question)
        else:
            yield from reader._whole_events(run, question, self.lc)


def tally_notes(texts: list[str]) -> str:
    """The items named by the notes written as lists (`grounding.list_items`), each with the number of notes
    naming it, most named first (ties in order of first mention), as one line; '' when fewer than two notes
    are lists. A list note is a partial aggregate of its part (the words frequent there, the names it
    mentions): the tally is their sum."""
    lists = [items for items in map(list_items, texts) if items]
    if len(lists) < 2:
        return ""
    counts: Counter[str] = Counter()
    spelled: dict[str, str] = {}
    for items in lists:
        keys = [" ".join(item.casefold().split()) for item in items]
        for key, item in zip(keys, items, strict=True):
            spelled.setdefault(key, item)
        counts.update(list(dict.fromkeys(keys)))  # a note names an item once, case aside
    named = ", ".join(f"{spelled[key]} ({n})" for key, n in counts.most_common())  # first-seen order in ties
    return f"- Named in the {len(lists)} list notes (how many), most named first: {named}"


def fit_notes(texts: list[str], room: int, count: Callable[[str], int]) -> str:
    """The notes as a bullet list, keeping the latest ones that fit ``room`` tokens. Where two or more notes
    are lists, their `tally_notes` line stands for them: the answer then combines counts it need not make
    itself. The tally goes last, nearest the question, and first into the room (cut at a comma if it alone
    is longer)."""
    lines: list[str] = []
    summary = tally_notes(texts)
    if summary:
        texts = [text for text in texts if not list_items(text)]
    while summary and count(summary) > room:
        summary = summary.rsplit(", ", 1)[0] if ", " in summary.split(": ", 1)[-1] else ""
    if summary:
        room -= count(summary + "\n")
    for text in reversed(texts):
        candidate = [f"- {text}", *lines]
        if count("\n".join(candidate)) > room:
            break
        lines = candidate
    if summary:
        lines.append(summary)
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


def _read_text(generator: Generator, options: WimOptions, text: str, question: str, *, source: str,
               embedder: Any, cache: SnapshotStore, settings: RunSettings | None) -> Run:
    """From a stored reading of ``text`` where there is one; the whole reading is stored once it is read."""
    return WiM(generator, options).reader(text, source, store=cache).ask(question, settings)


SPEC = PatternSpec(
    name="wim", options=WimOptions, pattern=WiM, title="WiM",
    description="Writing in the Margins: segment by segment through one KV cache, a margin for the question "
                "after each, then the answer from the relevant margins",
    reads="sections", read_text=_read_text)
