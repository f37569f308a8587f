"""The grounded relevance check's time per segment as the text read grows, punctuated and not.

A WiM reading on the scripted model (`marginalia.models.fake.ScriptedGenerator`, so only the judge costs time) of
generated text at each size: paragraphs of sentences, or one run of words without a full stop or a line break;
two words in five are function words, the rest made-up words drawn by Zipf's law. Each margin copies a sentence
of the segment just read (a run of words where there are no sentences), every other one with a word left out,
so that both the verbatim and the word-by-word paths are judged. Only the judge's calls are timed. Goal: flat,
the median time per segment at the largest size within 1.5x the smallest's, both kinds of text. Sizes are
counted in the scripted model's tokens (words, spaces and marks). Stores benchmarks/measurements/judge_speed.json
(see benchmarks/report.py).

    python benchmarks/judge_speed.py [--sizes 8192,16384,32768,65536] [--kinds punctuated,unpunctuated]
                                     [--segment-tokens 512] [--rounds 2] [--no-write]
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import statistics
import sys
import time
from typing import Any

from _common import BENCHMARKS, Benchmark, load_note, measurement, show
from _markdown import Record, made_by, num, table, tokens

from marginalia.models.fake import Request, ScriptedGenerator
from marginalia.patterns.judges import MarginJudge, Verdict
from marginalia.patterns.wim import WiM
from marginalia.records import Segment

KINDS = ("punctuated", "unpunctuated")
#: the most the time per segment may grow from the smallest size to the largest
FLAT = 1.5
_SYLLABLES = ("ka", "lo", "mi", "ren", "tas", "vo", "bri", "del", "fen", "gor", "hul", "ist", "jun", "kel", "mar",
              "nor", "pel", "quo", "sar", "tin")
#: English function words: some two fifths of running text, none of it compared (the judge drops stopwords)
_FUNCTION = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have "
             "an they you were her she there been one all we their has would when if so no will can").split()


def words(count: int, seed: int = 0) -> list[str]:
    """``count`` words as prose spreads them: two in five function words, the rest made-up content words drawn
    by Zipf's law from a vocabulary of twenty thousand (the commonest some 1% of them, as in English prose)."""
    rng = random.Random(seed)
    vocabulary = sorted({"".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 5))) for _ in range(25_000)})
    rng.shuffle(vocabulary)
    content = rng.choices(vocabulary, [1 / (k + 10) for k in range(len(vocabulary))], k=count)
    return [rng.choice(_FUNCTION) if rng.random() < 0.4 else word for word in content]


def text(kind: str, tokens: int, seed: int = 0) -> str:
    """A text of ``kind`` and ``tokens`` scripted tokens: paragraphs of five sentences of 8 to 25 words, or (for
    "unpunctuated") the same words in one run."""
    rng = random.Random(seed)
    pool = words(tokens, seed)  # more words than fit: a word is at least one token, and a space another
    if kind == "unpunctuated":
        out = " ".join(pool)
    else:
        sentences, at = [], 0
        while at < len(pool):
            n = rng.randint(8, 25)
            sentences.append(" ".join(pool[at:at + n]).capitalize() + ".")
            at += n
        out = "\n\n".join(" ".join(sentences[k:k + 5]) for k in range(0, len(sentences), 5))
    _, offsets = ScriptedGenerator().tokenizer.encode_with_offsets(out)
    return out[:offsets[min(tokens, len(offsets)) - 1][1]]


def margin(segment_text: str, index: int) -> str:
    """A sentence of the segment (its middle one), or twelve words of it where it has no full stop; for an odd
    ``index``, with its second word left out."""
    sentences = [s.strip() for s in segment_text.split(". ") if len(s.split()) >= 6]
    picked = sentences[len(sentences) // 2].split() if sentences else segment_text.split()[-20:-8]
    return " ".join(picked[:1] + picked[2:] if index % 2 else picked)


def question(context: str) -> str:
    """A question on the text's commonest content words, so that some margins are on it and kept."""
    counts = collections.Counter(w for w in context.lower().replace(".", " ").split() if w not in _FUNCTION)
    return "Which " + " ".join(w for w, _ in counts.most_common(4)) + "?"


class TimedJudge(MarginJudge):
    """A judge that times another one's calls."""

    def __init__(self, inner: MarginJudge) -> None:
        self.inner = inner
        self.mode = inner.mode  # type: ignore[misc]
        self.seconds: list[float] = []
        self.kept = 0

    def judge(self, question: str, margin: str, segment: Segment, read: str,
              document: str | None = None) -> Verdict:
        t0 = time.perf_counter()
        verdict = self.inner.judge(question, margin, segment, read, document)
        self.seconds.append(time.perf_counter() - t0)
        self.kept += verdict.relevant
        return verdict


def reading(kind: str, tokens: int, segment_tokens: int, seed: int) -> tuple[list[float], int, int]:
    """One WiM reading of a new text of ``kind`` and ``tokens``: the judge's seconds for each segment, the
    context's tokens as WiM counted them, and how many margins it kept."""
    context = text(kind, tokens, seed)
    current: list[int] = [0]

    def respond(request: Request) -> str:
        if "Answer the question" in request.suffix:
            return "I do not know."
        current[0] += 1
        return margin(request.prefix[-4 * segment_tokens:], current[0])

    gen = ScriptedGenerator(respond)
    wim = WiM(gen, segment_tokens=segment_tokens, judge="grounded")
    timed = TimedJudge(wim.judge)
    wim.judge = timed
    answer = wim.answer(context, question(context))
    return timed.seconds, answer.stats.context_tokens, timed.kept


def row(kind: str, readings: list[tuple[list[float], int, int]]) -> dict[str, Any]:
    """The judge's ms per segment over ``readings`` (`reading`'s results) of one kind and size."""
    ms = [1000 * s for seconds, _, _ in readings for s in seconds]
    tails = [1000 * s for seconds, _, _ in readings for s in seconds[-max(1, len(seconds) // 10):]]
    n = len(readings)
    return {"kind": kind, "tokens": readings[0][1], "segments": len(ms) // n, "rounds": n,
            "median_ms": statistics.median(ms), "mean_ms": statistics.fmean(ms),
            "last_tenth_ms": statistics.fmean(tails), "max_ms": max(ms), "judge_s": sum(ms) / 1000 / n,
            "kept": sum(kept for _, _, kept in readings) / n}


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind of text, the median time per segment at the largest size over the smallest, and whether that is
    flat (the median: a shared machine's noise moves the mean more)."""
    out: dict[str, Any] = {}
    for kind in sorted({r["kind"] for r in rows}):
        mine = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["tokens"])
        growth = mine[-1]["median_ms"] / mine[0]["median_ms"]
        out[kind] = {"growth": growth, "flat": growth <= FLAT}
    return out


def measure(sizes: list[int], kinds: list[str], segment_tokens: int, rounds: int) -> dict[str, Any]:
    """At least ``rounds`` readings of each kind and size, more of the smaller sizes (as many segments as the
    largest size's readings), the sizes taken in turn so that a change in the machine's load falls on all."""
    reading(kinds[0], 256, min(segment_tokens, 128), seed=1)  # imports and first calls, not measured
    before = os.getloadavg()[0]
    plan = {size: max(rounds, max(sizes) // size) for size in sizes}
    done: dict[tuple[str, int], list[tuple[list[float], int, int]]] = {(k, s): [] for k in kinds for s in sizes}
    for k in range(max(plan.values())):
        for kind in kinds:
            for size in sizes:
                if k < plan[size]:  # each text new: one extending another would find its sentences indexed
                    done[kind, size].append(reading(kind, size, segment_tokens, seed=1000 * size + k))
    rows = [row(kind, done[kind, size]) for kind in kinds for size in sizes]
    for r in rows:
        print(f"{r['kind']:>12} {r['tokens']:>7} tokens: {r['rounds']} x {r['segments']:>4} segments, judge "
              f"{r['median_ms']:.1f} ms per segment (mean {r['mean_ms']:.1f}, last tenth {r['last_tenth_ms']:.1f})",
              file=sys.stderr)
    return {"segment_tokens": segment_tokens, "rounds": rounds, "flat": FLAT, "rows": rows, "goal": verdict(rows),
            "load": load_note(before, os.getloadavg()[0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8192,16384,32768,65536", help="text sizes in scripted tokens, comma-separated")
    ap.add_argument("--kinds", default=",".join(KINDS), help="kinds of text, comma-separated")
    ap.add_argument("--segment-tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=2,
                    help="readings of new texts at the largest size (more at the smaller ones)")
    ap.add_argument("--no-write", action="store_true", help="print the section, store nothing")
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        ap.error(f"unknown kind {unknown[0]!r}; choose from {', '.join(KINDS)}")
    numbers = measure([int(s) for s in args.sizes.split(",")], kinds, args.segment_tokens, args.rounds)
    show(measurement("judge_speed", numbers), write=not args.no_write)
    if not all(g["flat"] for g in numbers["goal"].values()):
        sys.exit(1)


def summary(m: Record) -> list[list[str]]:
    n = m["numbers"]
    rows = sorted(n["rows"], key=lambda r: r["tokens"])
    kinds = ", ".join(f"{kind} {num(mine[0]['median_ms'])} → {num(mine[-1]['median_ms'])}"
                      for kind in n["goal"] if (mine := [r for r in rows if r["kind"] == kind]))
    flat = all(g["flat"] for g in n["goal"].values())
    return [[f"Grounded judge ms/segment, {tokens([rows[0]['tokens']])} → {tokens([rows[-1]['tokens']])} tokens",
             f"{kinds} ({'flat' if flat else 'not flat'}: ≤{n['flat']:g}x)", made_by(m)]]


def section(m: Record) -> list[str]:
    n = m["numbers"]
    sizes = sorted({r["tokens"] for r in n["rows"]})
    cell = {(r["kind"], r["tokens"]): num(r["median_ms"]) for r in n["rows"]}
    return [f"Median ms per segment; scripted WiM, {n['segment_tokens']}-token segments.", "",
            *table(["tokens", *n["goal"]], [[tokens([x]), *(cell.get((k, x), "–") for k in n["goal"])] for x in sizes])]


BENCHMARKS["judge_speed"] = Benchmark("The grounded judge's speed", section, summary)


if __name__ == "__main__":
    main()
