"""Synthetic tasks: a needle in a haystack, and common-words extraction (CWE) over a numbered word list.

**Needle in a haystack** (``dataset = "niah"``): the filler is the texts of a haystack JSONL (``spec.path``,
e.g. essays) in file order, each example starting at a different text. A needle sentence of our own making
(a made-up fact about an invented place with a random seven-digit value) goes in at a sentence start, at
``depth`` = the share of filler tokens before it; the question asks for the value. Several templates take
turns across examples.

**Common-words extraction** (``dataset = "cwe"``): a numbered list of words from the ``wonderwords`` word lists
(offline; nouns, adjectives and verbs, profanity removed) in which ``freq_words`` words (default 10) appear
``freq_count`` times (default 30) and as many other words as the target length allows appear ``rare_count``
times (default 3). The question asks for the ``freq_words`` most common words; scoring is set F1. At short
lengths ``freq_count`` shrinks so the frequent words take at most half the list (always above ``rare_count``).

Both fill the target length like the QA tasks: never over it, at least 98% of it, measured on the final text.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from ..app import Tokenizer
from ..errors import MissingDependency, UserError
from .datasets import load_pool
from .fitting import TokenCache, cut_text, example_rng, label, window
from .items import Item, TaskSpec

# -- needle in a haystack ---------------------------------------------------------------------------------------

#: (needle, question) templates; {place} is an invented name, {value} the answer.
NEEDLES: tuple[tuple[str, str], ...] = (
    ("The combination of the old {thing} safe in {place} is {value}.",
     "What is the combination of the old {thing} safe in {place}?"),
    ("The harbour master of {place} logged exactly {value} crates of {goods} last winter.",
     "How many crates of {goods} did the harbour master of {place} log last winter?"),
    ("The {colour} tram of {place} carries the registration number {value}.",
     "What registration number does the {colour} tram of {place} carry?"),
    ("Visitors to the {place} observatory must give the pass number {value} at the gate.",
     "What pass number must visitors to the {place} observatory give at the gate?"),
)
_HEADS = ("Vel", "Mor", "Quin", "Dar", "Bel", "Tor", "Ull", "Nes", "Kar", "Fen", "Oss", "Yar")
_TAILS = ("andra", "ivik", "oria", "enholm", "amar", "usk", "ethra", "owen", "idge", "avel")
_THINGS = ("brass", "iron", "oak", "copper", "marble", "walnut")
_GOODS = ("saffron", "lamp oil", "tin buttons", "sea salt", "walnuts", "indigo")
_COLOURS = ("green", "ochre", "violet", "crimson", "teal", "amber")
_SENTENCE_START = re.compile(r"(?:[.!?][\"')\]\u201d\u2019]*\s+|\n\n+)")
_SENTENCE_END_AT_END = re.compile(r"[.!?][\"')\]\u201d\u2019]*$")


def make_needle(rng: random.Random, template: int, avoid: str = "") -> tuple[str, str, str]:
    """(needle sentence, question, value) from one template; the value and place never occur in ``avoid``."""
    needle_t, question_t = NEEDLES[template % len(NEEDLES)]
    while True:
        fill = {"place": rng.choice(_HEADS) + rng.choice(_TAILS), "thing": rng.choice(_THINGS),
                "goods": rng.choice(_GOODS), "colour": rng.choice(_COLOURS),
                "value": str(rng.randint(1_000_000, 9_999_999))}
        if fill["value"] not in avoid and fill["place"] not in avoid:
            return needle_t.format(**fill), question_t.format(**fill), fill["value"]


def _haystack(texts: list[str], start: int, tokens: int, cache: TokenCache) -> str:
    """The filler texts from ``start`` on (wrapping once, never repeating), enough for ``tokens`` tokens."""
    order = texts[start:] + texts[:start]
    chars = max(tokens * 6, 1000)
    while True:
        out, size = [], 0
        for t in order:
            out.append(t)
            size += len(t) + 2
            if size >= chars:
                break
        stream = "\n\n".join(out)
        if len(cache.offsets(stream)) > tokens or len(out) == len(order):
            return stream
        chars *= 2


def build_niah(spec: TaskSpec, tokenizer: Tokenizer) -> list[Item]:
    """Needle-in-a-haystack items: ``spec.limit`` needles x lengths x depths over the haystack ``spec.path``
    (with the option ``rotate_depths``, each needle at one depth, the depths taken in turn)."""
    task = spec.name or spec.dataset
    if spec.distractor_fractions:
        raise UserError(f"task {task}: niah has no distractor sweep; give depths instead of distractor_fractions")
    if spec.path is None:
        raise UserError(f"task {task}: niah needs path = a haystack JSONL of texts (e.g. essays) as filler")
    texts = [p.text for p in load_pool(spec.path)]
    cache = TokenCache(tokenizer)
    items = []
    for i in range(spec.limit):
        start = i % len(texts)
        stream = _haystack(texts, start, max(spec.lengths) + 64, cache)
        spans = cache.offsets(stream)
        starts = [0] + [m.end() for m in _SENTENCE_START.finditer(stream)]
        example_id = f"needle-{i:03d}"
        needle, question, value = make_needle(example_rng(spec.seed, example_id), i, avoid=stream)
        needle_tokens = cache.count(needle) + 1
        for length in spec.lengths:
            for depth in spec.depths_of(i):
                item_id = f"{task}/{example_id}/{length}/d{label(depth)}/s{spec.seed}"
                context, pos, context_spans, filler_tokens = _place_needle(
                    stream, spans, starts, needle, needle_tokens, length, depth, cache, item_id)
                total = len(context_spans)
                before = sum(1 for s, _ in context_spans if s < pos)
                inside = sum(1 for s, _ in context_spans if pos <= s < pos + len(needle))
                measured = before / (total - inside) if total > inside else None
                passage_spans = tuple((a, b) for a, b in (
                    (0, len(context[:pos].rstrip())), (pos, pos + len(needle)),
                    (min(pos + len(needle) + 1, len(context)), len(context))) if b > a)
                items.append(Item(
                    id=item_id, task=task, example_id=example_id, question=question, answers=(value,),
                    context=context, context_tokens=total, target_tokens=length, depth=depth,
                    gold_spans=((pos, pos + len(needle)),), passage_spans=passage_spans, scoring="qa",
                    meta={"dataset": "niah", "measured_depth": measured, "needle": needle,
                          "template": i % len(NEEDLES), "filler_start": start, "filler_tokens": filler_tokens},
                ))
    return items


def _place_needle(stream: str, spans: list[tuple[int, int]], starts: list[int], needle: str, needle_tokens: int,
                  length: int, depth: float, cache: TokenCache,
                  what: str) -> tuple[str, int, list[tuple[int, int]], int]:
    """(context, needle position, context token spans, filler tokens) for one length and depth."""
    high, low = window(length)
    aim = high - (high - low) // 4
    slack = max(1, (high - low) * 3 // 4 - 1)  # prefer a filler that ends a sentence, within the window
    keep = aim - needle_tokens
    if len(spans) < low - needle_tokens:
        raise UserError(f"{what}: the haystack holds {len(spans)} tokens, fewer than the {low} needed; "
                        "give a bigger haystack file or shorter lengths")
    best: tuple[str, int, list[tuple[int, int]], int] | None = None
    for _attempt in range(40):
        filler, kept = cut_text(stream, spans, max(keep, 0), slack)
        at = spans[min(int(round(depth * kept)), kept - 1)][0] if 0 < depth < 1 and kept else \
            (0 if depth <= 0 else len(filler))
        # sentence starts; the end of the filler counts only when the filler ends a sentence
        places = [s for s in starts if s < len(filler)]
        if not filler or _SENTENCE_END_AT_END.search(filler):
            places.append(len(filler))
        pos = min(places, key=lambda s: (abs(s - at), s))
        if pos >= len(filler):
            context, pos = (filler + " " if filler else "") + needle, len(filler) + (1 if filler else 0)
        else:
            context = filler[:pos] + needle + " " + filler[pos:]
        context_spans = cache.measure(context)
        total = len(context_spans)
        if low <= total <= high:
            return context, pos, context_spans, kept
        if total <= high and (best is None or total > len(best[2])):
            best = (context, pos, context_spans, kept)
        keep = kept + aim - total
    if best is not None:  # the window was never hit exactly: the fullest haystack under the target
        return best
    raise UserError(f"{what}: could not fit the haystack between {low} and {high} tokens; "
                    "use a longer target length")


# -- common-words extraction ---------------------------------------------------------------------------------------

_WORD = re.compile(r"[a-z]{3,10}")


@lru_cache(maxsize=1)
def word_list() -> tuple[str, ...]:
    """The wonderwords nouns, adjectives and verbs: lower-case, 3-10 letters, no profanity, sorted."""
    try:
        import wonderwords
    except ImportError as exc:
        raise MissingDependency("the word lists for common-words extraction (wonderwords)",
                                "pip install 'marginalia[bench]'") from exc
    from importlib.resources import files

    words: set[str] = set()
    for name in ("nounlist.txt", "adjectivelist.txt", "verblist.txt"):
        for word in files("wonderwords.assets").joinpath(name).read_text(encoding="utf-8").split():
            word = word.strip().lower()
            if _WORD.fullmatch(word) and not wonderwords.is_profanity(word):
                words.add(word)
    return tuple(sorted(words))


def word_list_text(words: list[str]) -> str:
    """A numbered list, one word a line: ``1. apple``."""
    return "\n".join(f"{k}. {w}" for k, w in enumerate(words, start=1))


def _cwe_list(frequent: list[str], rare: list[str], freq_count: int, rare_count: int,
              rng: random.Random) -> list[str]:
    words = frequent * freq_count + rare * rare_count
    rng.shuffle(words)
    return words


def build_cwe(spec: TaskSpec, tokenizer: Tokenizer) -> list[Item]:
    """Common-words extraction items: ``spec.limit`` word lists x lengths (``spec.depths`` do not apply).

    Options: ``freq_words`` (10), ``freq_count`` (30), ``rare_count`` (3).
    """
    task = spec.name or spec.dataset
    if spec.distractor_fractions:
        raise UserError(f"task {task}: cwe has no distractor sweep; give lengths only")
    n_freq = int(spec.options.get("freq_words", 10))
    freq_count0 = int(spec.options.get("freq_count", 30))
    rare_count = int(spec.options.get("rare_count", 3))
    if n_freq <= 0 or rare_count <= 0 or freq_count0 <= rare_count:
        raise UserError(f"task {task}: cwe needs freq_words > 0, rare_count > 0 and freq_count > rare_count "
                        f"(got {n_freq}, {rare_count}, {freq_count0})")
    vocabulary = list(word_list())
    cache = TokenCache(tokenizer)
    items = []
    for i in range(spec.limit):
        example_id = f"list-{i:03d}"
        rng = example_rng(spec.seed, example_id)
        words = vocabulary[:]
        rng.shuffle(words)
        frequent, others = words[:n_freq], words[n_freq:]
        for length in spec.lengths:
            item_id = f"{task}/{example_id}/{length}/s{spec.seed}"
            context, total, freq_count, n_rare = _fit_cwe(frequent, others, freq_count0, rare_count, length,
                                                          cache, spec.seed, item_id)
            question = (f"The context is a numbered list of words, some of which repeat. What are the {n_freq} "
                        f"most common words in the list? Answer with the {n_freq} words only, separated by commas.")
            meta: dict[str, Any] = {"dataset": "cwe", "measured_depth": None, "freq_count": freq_count,
                                    "rare_count": rare_count, "rare_words": n_rare,
                                    "entries": n_freq * freq_count + n_rare * rare_count}
            items.append(Item(
                id=item_id, task=task, example_id=example_id, question=question, answers=tuple(frequent),
                context=context, context_tokens=total, target_tokens=length, depth=None,
                passage_spans=((0, len(context)),), scoring="set", meta=meta,
            ))
    return items


def _fit_cwe(frequent: list[str], others: list[str], freq_count: int, rare_count: int, length: int,
             cache: TokenCache, seed: int, what: str) -> tuple[str, int, int, int]:
    """(context, tokens, freq_count, rare words) of a list that fills ``length`` tokens within the tolerance."""
    high, low = window(length)
    aim = high - (high - low) // 4

    def make(n_rare: int, count: int) -> tuple[str, int]:
        rng = random.Random(f"{seed}/{what}/{n_rare}/{count}")
        text = word_list_text(_cwe_list(frequent, others[:n_rare], count, rare_count, rng))
        return text, len(cache.measure(text))

    text, base = make(0, freq_count)
    if base > high // 2:  # the frequent words take at most half the list
        freq_count = max(rare_count + 1, freq_count * (high // 2) // base)
        text, base = make(0, freq_count)
    if base > high:
        raise UserError(f"{what}: {len(frequent)} words x {freq_count} already take {base} tokens, more than "
                        f"{length}; use a longer length or fewer freq_words")
    per_entry = base / (len(frequent) * freq_count)
    per_rare = max(per_entry * rare_count, 1.0)
    n_rare = max(0, int((aim - base) / per_rare))
    best: tuple[str, int, int] | None = (text, base, 0) if base >= low else None
    for _attempt in range(30):
        if n_rare > len(others):
            raise UserError(f"{what}: the word lists hold too few words for {length} tokens; use shorter lengths")
        text, total = make(n_rare, freq_count)
        if low <= total <= high:
            return text, total, freq_count, n_rare
        if total <= high and (best is None or total > best[1]):
            best = (text, total, n_rare)
        if n_rare:
            per_rare = max((total - base) / n_rare, 1.0)
        step = round((aim - total) / per_rare)
        n_rare = max(0, n_rare + (step if step else (1 if total < low else -1)))
    if best is None:
        raise UserError(f"{what}: could not fit the word list under {high} tokens; use a longer length")
    return best[0], best[1], freq_count, best[2]


BUILDERS: dict[str, Callable[[TaskSpec, Tokenizer], list[Item]]] = {"niah": build_niah, "cwe": build_cwe}

__all__ = ["BUILDERS", "NEEDLES", "build_cwe", "build_niah", "make_needle", "word_list", "word_list_text"]
