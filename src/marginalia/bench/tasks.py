"""Task builders: benchmark items whose contexts have a target length in the model's own tokens, gold at a depth.

**Length.** ``target_tokens`` counts the context alone (the runner adds the prompt around it), measured with the
model's tokenizer on the final context. A built context never exceeds its target and holds at least 98% of it
(16 tokens below it for targets under 800; if the window cannot be hit, the fullest context under the target):
passages are counted once each (cached), whole distractors are added while they fit, the last one is cut at a
sentence end (or, when that would lose too much, a word boundary), and the assembled context is measured and
the cut moved until it lands in the window (concatenations tokenize slightly differently from their parts).

**Depth.** The share of the distractor tokens that come before the gold: 0.0 puts the gold first, 1.0 last.
Multi-gold examples (HotpotQA, MultiHop-RAG) keep their gold passages together, in file order, so the depth
is where that block starts. Distractors keep their shuffled order on each side of the gold; which side each
takes is chosen (largest first) to bring the share before the gold nearest the requested depth, so the miss
is about half a small distractor. ``meta["measured_depth"]`` holds the depth measured on the final tokens.

**Distractors.** The example's own (HotpotQA's eight, NQ's retrieved ctxs), then other examples' passages,
then the task's ``pool`` texts (cut into paragraph-sized chunks), each group shuffled by the seed and the
example id. Borrowed passages never share a title with a gold passage (for SQuAD: never the same article)
and never hold a gold answer as whole words (yes/no answers excepted); the example's own distractors are kept as
the dataset gives them. A distractor longer than a fifth of the target is cut to that size. Contexts for one
example draw on one distractor order at every length and depth (a longer context takes more of it), so a
depth sweep only moves the gold. A size sweep (``spec.distractor_fractions``) fills that share of the budget
left after the gold, with the gold at the first of ``spec.depths``.

Passages are joined with a blank line; for datasets whose titles name their passages (HotpotQA, NQ,
MultiHop-RAG) a passage starts with a ``Title: ...`` line (``options={"titles": False}`` turns it off; SQuAD
has it off by default because its article titles would point at the gold).
"""

from __future__ import annotations

import bisect
import difflib
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..app import Tokenizer
from ..errors import MarginaliaError, UserError
from .datasets import FORMATS, LOADERS, load_pool, select
from .fitting import TokenCache, cut_text, example_rng, label, window
from .items import Example, Item, Passage, TaskSpec
from .metrics import normalize_answer
from .synthetic import BUILDERS

SEP = "\n\n"


TITLED = frozenset({"hotpotqa", "nq", "multihop"})
_MIN_PARTIAL = 4  # tokens: a shorter cut distractor is dropped instead
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+")


def chunk_passage(passage: Passage, words: int = 120) -> list[Passage]:
    """Split a long text into passages of about ``words`` words at sentence ends (same title)."""
    sentences = [s for s in _SENTENCE_SPLIT.split(passage.text) if s.strip()]
    out: list[Passage] = []
    current: list[str] = []
    size = 0
    for sentence in sentences:
        n = len(sentence.split())
        if current and size + n > words:
            out.append(Passage(text=" ".join(current), title=passage.title))
            current, size = [], 0
        if n > 2 * words:  # no sentence ends for a long stretch: cut by words
            tokens = sentence.split()
            for i in range(0, len(tokens), words):
                out.append(Passage(text=" ".join(tokens[i:i + words]), title=passage.title))
            continue
        current.append(sentence.strip())
        size += n
    if current:
        out.append(Passage(text=" ".join(current), title=passage.title))
    return out


def render(passage: Passage, titles: bool) -> str:
    """A passage as it appears in a context: its text, under a ``Title:`` line when ``titles`` and it has one."""
    return f"Title: {passage.title}\n{passage.text}" if titles and passage.title else passage.text


# -- candidates -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A distractor for one example: its rendered text, where it came from, and its place in the order."""

    text: str
    source: str  # own | dataset | pool
    key: float  # contexts arrange their distractors by this key


class _AnswerFilter:
    """Whether a passage holds one of the gold answers as whole words (normalised, SQuAD style)."""

    def __init__(self) -> None:
        self._norm: dict[str, str] = {}

    def holds(self, text: str, answers: Sequence[str]) -> bool:
        if not answers:
            return False
        norm = self._norm.get(text)
        if norm is None:
            norm = self._norm[text] = f" {normalize_answer(text)} "
        return any(f" {a} " in norm for a in answers)


class Candidates:
    """The distractor sequence of one example, produced lazily and kept, so every length reads one list."""

    def __init__(self, source: Iterator[Candidate]) -> None:
        self._source = source
        self._seen: list[Candidate] = []

    def has(self, index: int) -> bool:
        """Whether the sequence has an ``index``-th candidate (producing it if needed)."""
        while len(self._seen) <= index:
            nxt = next(self._source, None)
            if nxt is None:
                return False
            self._seen.append(nxt)
        return True

    def __getitem__(self, index: int) -> Candidate:
        if not self.has(index):
            raise IndexError(index)
        return self._seen[index]


class _Capped:
    """The candidates with any longer than ``cap`` tokens cut to that size (at a sentence end when one is near):
    no single distractor may take a big share of a context, or the gold could only sit on either side of it."""

    def __init__(self, base: Candidates, cache: TokenCache, cap: int) -> None:
        self.base, self.cache, self.cap = base, cache, cap
        self._cut: dict[int, Candidate] = {}

    def has(self, index: int) -> bool:
        return self.base.has(index)

    def __getitem__(self, index: int) -> Candidate:
        cand = self.base[index]
        if self.cache.count(cand.text) <= self.cap:
            return cand
        cut = self._cut.get(index)
        if cut is None:
            text, _ = cut_text(cand.text, self.cache.offsets(cand.text), self.cap, self.cap // 4)
            cut = self._cut[index] = Candidate(text, cand.source, cand.key)
        return cut


def distractor_candidates(example: Example, dataset_passages: Sequence[Passage], pool: Sequence[Passage],
                          rng: random.Random, titles: bool, answer_filter: _AnswerFilter) -> Iterator[Candidate]:
    """The example's distractors in the order they are used: its own, then other examples', then the pool's."""
    gold = [p for p in example.passages if p.gold]
    gold_titles = {p.title for p in gold if p.title}
    seen = {p.text for p in example.passages}
    answers = [a for a in (normalize_answer(x) for x in example.answers) if a and a not in ("yes", "no")]
    own = [p for p in example.passages if not p.gold]
    rng.shuffle(own)
    for p in own:
        yield Candidate(render(p, titles), "own", rng.random())
    for group, name in ((dataset_passages, "dataset"), (pool, "pool")):
        order = list(range(len(group)))
        rng.shuffle(order)
        for i in order:
            p = group[i]
            if p.text in seen or (p.title and p.title in gold_titles) or answer_filter.holds(p.text, answers):
                continue
            seen.add(p.text)
            yield Candidate(render(p, titles), name, rng.random())


# -- fitting a context -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Built:
    """An assembled context with its measurements."""

    context: str
    tokens: int
    passage_spans: tuple[tuple[int, int], ...]
    gold_spans: tuple[tuple[int, int], ...]
    measured_depth: float | None
    gold_tokens: int
    sources: dict[str, int]
    partial_tokens: int


def split_at_depth(weights: Sequence[float], depth: float) -> tuple[list[int], list[int]]:
    """Indices of the passages (each side in order) to put before and after the gold so that the share of
    weight before it comes near ``depth``.

    Largest first, a passage goes before while that brings the share closer, so the smaller ones left
    fine-tune it: the miss is about half a small passage, not half a big one.
    """
    target = depth * sum(weights)
    chosen = set()
    filled = 0.0
    for i in sorted(range(len(weights)), key=lambda i: -weights[i]):
        w = weights[i]
        if w and filled + w / 2 <= target:
            chosen.add(i)
            filled += w
    before = [i for i in range(len(weights)) if i in chosen]
    return before, [i for i in range(len(weights)) if i not in chosen]


def fit_context(golds: Sequence[str], candidates: Candidates, cache: TokenCache, high: int, low: int,
                depth: float, what: str = "the context", max_share: float = 0.2) -> Built:
    """Assemble gold passages and distractors into a context of ``low``..``high`` tokens, gold at ``depth``.

    Args:
        golds: the rendered gold passages (kept together, in order); may be empty.
        candidates: the distractors, in the order they are taken.
        cache: token counts under the model's tokenizer.
        high: the most tokens the context may hold.
        low: the fewest it should hold (0: no distractors at all).
        depth: the share of distractor tokens before the gold, 0..1.
        what: names the context in errors.
        max_share: distractors longer than this share of ``high`` are passed over.

    Raises:
        UserError: the gold alone exceeds ``high``, or there is not enough distractor text to reach ``low``.
    """
    view = _Capped(candidates, cache, max(int(max_share * high), 32))
    sep0 = cache.count(SEP)
    sep = sep0 + cache.boundary_extra  # what a boundary costs in a joined context
    gold_total = sum(cache.count(g) for g in golds) + sep * max(len(golds) - 1, 0)
    if gold_total > high:
        raise UserError(f"{what}: the gold passages alone take {round(gold_total)} tokens, more than the target "
                        f"{high}; use a longer target length")
    slack = max(1, (high - low) // 2)  # a cut may end at a sentence when it loses at most this many tokens
    aim = high - (high - low) // 4
    # the state: candidates [0, p) go in whole, candidate p cut to `keep` tokens
    p, keep = 0, 0.0
    if low > 0:
        room = aim - gold_total + (0 if golds else sep)
        while view.has(p) and cache.count(view[p].text) + sep <= room:
            room -= cache.count(view[p].text) + sep
            p += 1
        keep = room - sep
    best: tuple[int, tuple[str, list[tuple[int, int]], list[str], int, int, list[tuple[Candidate, str, int]]]] \
        | None = None
    for _attempt in range(40):
        if not view.has(p) or keep < _MIN_PARTIAL:
            keep = 0.0
        parts = [(view[i], view[i].text, cache.count(view[i].text)) for i in range(p)]
        kept = 0
        if keep:
            cand = view[p]
            text, kept = cut_text(cand.text, cache.offsets(cand.text), int(keep), slack)
            if text:
                parts.append((cand, text, kept))
        parts.sort(key=lambda part: part[0].key)
        before, after = split_at_depth([n + sep for _, _, n in parts], depth)
        parts = [parts[i] for i in before] + [parts[i] for i in after]
        at = len(before)
        texts = [t for _, t, _ in parts[:at]] + list(golds) + [t for _, t, _ in parts[at:]]
        context = SEP.join(texts)
        spans = cache.measure(context)
        total = len(spans)
        if total <= high and (best is None or total > best[0]):
            best = (total, (context, spans, texts, at, len(golds), parts))
        boundaries = len(texts) - 1
        if boundaries > 0:  # learn how far the sum of the parts misses the whole, per boundary
            estimate = sum(n for _, _, n in parts) + sum(cache.count(g) for g in golds) + sep0 * boundaries
            cache.learn_boundary((total - estimate) / boundaries)
        if low <= total <= high:
            return _finish(context, spans, texts, at, len(golds), parts)
        if total < low and not view.has(p):
            raise UserError(f"{what}: only {total} tokens of text are available, fewer than the {low} needed; "
                            "add distractor text with a pool (a JSONL of texts, e.g. wikitext articles or "
                            "essays) or use shorter target lengths")
        keep = kept + aim - total
        while view.has(p) and keep >= cache.count(view[p].text):
            keep -= cache.count(view[p].text) + sep
            p += 1
        while keep < 0 and p > 0:
            p -= 1
            keep += cache.count(view[p].text) + sep
    if best is not None:  # the window was never hit exactly: the fullest context under the target
        return _finish(*best[1])
    raise MarginaliaError(f"{what}: could not fit the context under {high} tokens; "
                          "this is a bug in the task builder, please report it")


def _finish(context: str, spans: list[tuple[int, int]], texts: list[str], at: int, n_gold: int,
            parts: list[tuple[Candidate, str, int]]) -> Built:
    passage_spans = []
    pos = 0
    for t in texts:
        passage_spans.append((pos, pos + len(t)))
        pos += len(t) + len(SEP)
    gold_spans = tuple(passage_spans[at:at + n_gold])
    total = len(spans)
    measured: float | None = None
    gold_tokens = 0
    if gold_spans:
        starts = [s for s, _ in spans]
        first = bisect.bisect_left(starts, gold_spans[0][0])
        last = bisect.bisect_left(starts, gold_spans[-1][1])
        gold_tokens = last - first
        if total - gold_tokens > 0:
            measured = first / (total - gold_tokens)
    sources: dict[str, int] = {}
    partial_tokens = 0
    for c, t, n in parts:
        sources[c.source] = sources.get(c.source, 0) + 1
        if t != c.text:
            partial_tokens = n
    return Built(context=context, tokens=total, passage_spans=tuple(passage_spans), gold_spans=gold_spans,
                 measured_depth=measured, gold_tokens=gold_tokens, sources=sources, partial_tokens=partial_tokens)


# -- building items -----------------------------------------------------------------------------------------------


def check_spec(spec: TaskSpec) -> None:
    """Raise `UserError` for a spec no items can be built from (an unknown dataset, bad sizes), before any
    model is loaded."""
    known = sorted({*LOADERS, *BUILDERS})
    if spec.dataset not in known:
        close = difflib.get_close_matches(spec.dataset, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
        raise UserError(f"unknown dataset {spec.dataset!r}{hint}")
    if spec.limit <= 0:
        raise UserError(f"task {spec.name or spec.dataset}: limit must be positive, not {spec.limit}")
    if not spec.lengths or any(n <= 0 for n in spec.lengths):
        raise UserError(f"task {spec.name or spec.dataset}: lengths must be positive token counts, "
                        f"not {spec.lengths}")
    if not spec.depths and not spec.distractor_fractions:
        raise UserError(f"task {spec.name or spec.dataset}: give at least one depth (or distractor fraction)")
    for what, values in (("depths", spec.depths), ("distractor_fractions", spec.distractor_fractions)):
        if any(not 0.0 <= v <= 1.0 for v in values):
            raise UserError(f"task {spec.name or spec.dataset}: {what} must lie in 0..1, not {values}")


def build_items(spec: TaskSpec, tokenizer: Tokenizer) -> list[Item]:
    """Build the items of one task: every selected example at every target length x depth (or fraction);
    with the task option ``rotate_depths``, each example at one depth, the depths taken in turn.

    Args:
        spec: the task (dataset, files, lengths, depths or distractor fractions, seed, options).
        tokenizer: the model's own tokenizer; lengths are counted in its tokens.

    Returns:
        Items ordered by example, then length, then depth (or fraction). The same spec and tokenizer
        always give the same items.

    Raises:
        UserError: an unknown dataset, a missing or malformed file, a bad spec value, or too little text to
        reach a target length.
    """
    check_spec(spec)
    spec = replace(spec, lengths=tuple(dict.fromkeys(spec.lengths)), depths=tuple(dict.fromkeys(spec.depths)),
                   distractor_fractions=tuple(dict.fromkeys(spec.distractor_fractions)))
    if spec.dataset in BUILDERS:
        return BUILDERS[spec.dataset](spec, tokenizer)
    if spec.path is None:
        what = FORMATS.get(spec.dataset, "the dataset file")
        raise UserError(f"task {spec.name or spec.dataset}: give path = {what}")
    examples = LOADERS[spec.dataset](Path(spec.path))
    chosen = select(examples, spec.dataset, spec.limit)
    pool = load_pool_chunks(spec.pool, int(spec.options.get("pool_chunk_words", 120))) if spec.pool else []
    return build_from_examples(spec, tokenizer, chosen, examples, pool)


def load_pool_chunks(path: str | Path, words: int = 120) -> list[Passage]:
    """A pool JSONL as paragraph-sized distractor passages."""
    return [chunk for passage in load_pool(path) for chunk in chunk_passage(passage, words)]


def build_from_examples(spec: TaskSpec, tokenizer: Tokenizer, chosen: Sequence[Example],
                        everything: Sequence[Example] | None = None, pool: Sequence[Passage] = ()) -> list[Item]:
    """Items for ``chosen`` examples, borrowing distractors from ``everything`` (default: ``chosen``) and ``pool``.

    The lower-level entry for callers that load examples themselves (e.g. the ``own`` dataset).
    """
    task = spec.name or spec.dataset
    everything = chosen if everything is None else everything
    titles = bool(spec.options.get("titles", spec.dataset in TITLED))
    cache = TokenCache(tokenizer)
    answer_filter = _AnswerFilter()
    dataset_passages = list({p.text: p for ex in everything for p in ex.passages}.values())
    sweep = tuple(spec.distractor_fractions)
    sweep_depth = spec.depths[0] if spec.depths else 0.5
    items: list[Item] = []
    for number, ex in enumerate(chosen):
        if ex.context is not None:
            items.append(_ready_item(task, ex, cache))
            continue
        golds = [render(p, titles) for p in ex.passages if p.gold]
        candidates = Candidates(distractor_candidates(ex, dataset_passages, pool, example_rng(spec.seed, ex.id),
                                                      titles, answer_filter))
        gold_only = cache.count(SEP.join(golds)) if golds else 0
        for length in spec.lengths:
            plans: list[tuple[float | None, float | None]] = (
                [(sweep_depth if golds else None, f) for f in sweep] if sweep
                else ([(d, None) for d in spec.depths_of(number)] if golds else [(None, None)]))
            for depth, fraction in plans:
                high, low = window(length)
                if fraction is not None:
                    high, low = window(min(length, gold_only + round(fraction * max(length - gold_only, 0))))
                    low = 0 if fraction == 0 else low
                item_id = "/".join([task, ex.id, str(length)]
                                   + ([f"d{label(depth)}"] if depth is not None and fraction is None else [])
                                   + ([f"f{label(fraction)}"] if fraction is not None else [])
                                   + [f"s{spec.seed}"])
                built = fit_context(golds, candidates, cache, high, low, depth or 0.0, what=item_id)
                meta: dict[str, Any] = {
                    "dataset": ex.dataset, "measured_depth": built.measured_depth,
                    "gold_tokens": built.gold_tokens, "distractor_sources": built.sources,
                    "partial_tokens": built.partial_tokens, "example": dict(ex.meta),
                }
                if fraction is not None:
                    budget = max(length - gold_only, 1)
                    meta["measured_fraction"] = max(built.tokens - gold_only, 0) / budget
                items.append(Item(
                    id=item_id, task=task, example_id=ex.id, question=ex.question, answers=ex.answers,
                    context=built.context, context_tokens=built.tokens, target_tokens=length, depth=depth,
                    distractor_fraction=fraction, gold_spans=built.gold_spans, passage_spans=built.passage_spans,
                    scoring="qa", meta=meta,
                ))
    return items


def _ready_item(task: str, ex: Example, cache: TokenCache) -> Item:
    context = ex.context or ""
    return Item(
        id=f"{task}/{ex.id}", task=task, example_id=ex.id, question=ex.question, answers=ex.answers,
        context=context, context_tokens=len(cache.measure(context)), target_tokens=None, depth=None,
        passage_spans=((0, len(context)),), scoring="qa",
        meta={"dataset": ex.dataset, "measured_depth": None, "example": dict(ex.meta)},
    )


__all__ = [
    "SEP",
    "Built",
    "Candidate",
    "Candidates",
    "TokenCache",
    "build_from_examples",
    "build_items",
    "check_spec",
    "chunk_passage",
    "cut_text",
    "distractor_candidates",
    "example_rng",
    "fit_context",
    "label",
    "load_pool_chunks",
    "render",
]
