"""WiM's overhead against long context on one >= 6k-token document and one question.

Each pattern runs in its own child process (so peak memory is its own) on the embedded
model: tokens prefilled (context vs instructions/margins), tokens generated, wall time,
time to first margin, peak resident memory. The context tokens prefilled are the backend's own
count (what it passed to prefill, position by position: `marginalia.models.ledger`), not the
segments' lengths added up. Fails (exit 1) when WiM prefilled any context token twice, or more
context tokens than LC. Stores benchmarks/measurements/wim_overhead.json (see benchmarks/report.py).

    python benchmarks/wim_overhead.py [--model smollm2] [--segment-tokens 512] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from _common import BENCHMARKS, Benchmark, measurement, show
from _markdown import Record, made_by, num, ratio, table


def child(pattern: str, model: str, segment_tokens: int, question_no: int) -> None:
    import psutil

    from marginalia.app import demo as demo_files
    from marginalia.models import load_generator
    from marginalia.patterns import make_pattern

    text, questions = demo_files()
    item = questions[question_no]
    gen = load_generator(model)
    rss_loaded = psutil.Process().memory_info().rss
    opts = {"segment_tokens": segment_tokens} if pattern == "wim" else {}
    p = make_pattern(pattern, gen, **opts)
    t0 = time.perf_counter()
    answer = p.answer(text, item["question"])
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    s = answer.stats
    print(json.dumps({
        "pattern": pattern, "wall_s": wall, "context_tokens": s.context_tokens,
        "prefilled_context": s.prefilled_context_tokens, "reprefilled_context": s.reprefilled_context_tokens,
        "prefilled_other": s.prefilled_other_tokens,
        "generated": s.generated_margin_tokens + s.generated_answer_tokens + s.generated_other_tokens,
        "margin_tokens": s.generated_margin_tokens, "prefill_s": s.prefill_seconds,
        "first_margin_s": s.time_to_first_margin, "first_answer_token_s": s.time_to_first_answer_token,
        "rss_after_load_mb": rss_loaded / 2**20, "peak_rss_mb": peak / 2**20,
        "segments": answer.segments_total, "correct": item["answer"].lower() in answer.text.lower(),
        "answer": answer.text, "question": item["question"],
    }))


def problems(lc: dict, wim: dict) -> list[str]:
    """Why WiM's prefill misses the goal (each context token prefilled once, as LC does); empty when it meets it."""
    out = []
    if wim["reprefilled_context"]:
        out.append(f"WiM prefilled {wim['reprefilled_context']} context tokens more than once")
    if lc["reprefilled_context"]:
        out.append(f"LC prefilled {lc['reprefilled_context']} context tokens more than once")
    if wim["prefilled_context"] > lc["prefilled_context"]:
        out.append(f"WiM prefilled {wim['prefilled_context']} context tokens, LC {lc['prefilled_context']}")
    if lc["prefilled_context"] != lc["context_tokens"]:
        out.append(f"LC prefilled {lc['prefilled_context']} of {lc['context_tokens']} context tokens")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--segment-tokens", type=int, default=512)
    ap.add_argument("--question", type=int, default=0, help="index into the demo questions")
    ap.add_argument("--no-write", action="store_true", help="print the section, store nothing")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.model, args.segment_tokens, args.question)
        return
    rows = {}
    for pattern in ("lc", "wim"):
        out = subprocess.run([sys.executable, __file__, "--child", pattern, "--model", args.model,
                              "--segment-tokens", str(args.segment_tokens),
                              "--question", str(args.question)],
                             capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"{pattern} failed:\n{out.stderr}")
        rows[pattern] = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(rows[pattern]), flush=True)
    failed = problems(rows["lc"], rows["wim"])
    numbers = {"model": args.model, "segment_tokens": args.segment_tokens, "lc": rows["lc"], "wim": rows["wim"],
               "problems": failed}
    show(measurement("wim_overhead", numbers), write=not args.no_write)
    if failed:
        sys.exit(1)


def summary(m: Record) -> list[list[str]]:
    n = m["numbers"]
    lc, wim = n["lc"], n["wim"]
    return [[f"WiM vs long context, one question ({num(lc['context_tokens'], 0)}-token report)",
             f"wall time {ratio(wim['wall_s'], lc['wall_s'])}; context tokens prefilled "
             f"{ratio(wim['prefilled_context'], lc['prefilled_context'], 3)}, none twice"
             if not n["problems"] else "; ".join(n["problems"]), made_by(m)]]


def section(m: Record) -> list[str]:
    n = m["numbers"]
    lc, wim = n["lc"], n["wim"]

    def row(label: str, key: str, digits: int = 1) -> list[str]:
        return [label, num(lc.get(key), digits), num(wim.get(key), digits)]

    return [f"The demo report and its first question; model `{n['model']}`; WiM with {wim.get('segments') or '?'} "
            f"segments of at most {n['segment_tokens']} tokens; each pattern in a process of its own.", "",
            *table(["", "long context", "WiM"], [
                row("context tokens prefilled (the backend's count)", "prefilled_context", 0),
                row("other tokens prefilled (instructions, margin prompts)", "prefilled_other", 0),
                [*row("tokens generated", "generated", 0)[:2], f"{num(wim['generated'], 0)} "
                 f"({num(wim['margin_tokens'], 0)} in margins)"],
                row("wall time (s)", "wall_s"),
                row("time to the first margin (s)", "first_margin_s"),
                row("time to the first answer token (s)", "first_answer_token_s"),
                row("peak RSS (MiB)", "peak_rss_mb", 0),
                ["answer holds the gold", "yes" if lc["correct"] else "no", "yes" if wim["correct"] else "no"]]),
            "",
            f"WiM prefilled {ratio(wim['prefilled_context'], lc['prefilled_context'], 3)} long context's context "
            "tokens (goal: none twice, none more than long context: "
            + ("met" if not n["problems"] else "not met: " + "; ".join(n["problems"])) + ")."]


BENCHMARKS["wim_overhead"] = Benchmark("WiM's overhead against long context", section, summary)


if __name__ == "__main__":
    main()
