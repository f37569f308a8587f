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
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import measurement, show  # noqa: E402


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


if __name__ == "__main__":
    main()
