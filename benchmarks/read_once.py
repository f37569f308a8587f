"""Read once, ask many: a second question over the bundled report, on llama.cpp (or transformers) in process.

A reader reads the report for a first question, then answers a second one from its kept cache: document
tokens prefilled and wall time against the first question's (goals: at most 0.05x the document and 0.25x
the first question's time). The second question's margins are written one after another from the kept
cache (the default: the same margins as a fresh reading) and, with ``batch_margins``, as branches decoded
side by side; goal: the batched margin phase at most 0.5x the sequential one, and how many margins came
out the same. Then a fresh process answers the second question from the reading stored on disk, batched. Long
context (no reading kept, a stateless prompt) is asked the same two questions for comparison: on llama.cpp its
scratch context keeps the last prompt, so the second question re-evaluates only from the document's last batch
boundary. Stores benchmarks/measurements/read_once.json (read_once_<backend> for another backend).

    python benchmarks/read_once.py [--segment-tokens 512] [--questions 0 1] [--rounds 3] [--backend transformers]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import BENCHMARKS, Benchmark, measurement, show
from _markdown import Record, made_by, num, ratio, table


def load(branches: int, backend: str = "llamacpp") -> Any:
    """SmolLM2 on ``backend``; on llama.cpp, a context that decodes ``branches`` side by side (transformers
    always can)."""
    if backend == "transformers":
        from marginalia.models import load_generator

        return load_generator("smollm2", backend="transformers")
    from marginalia.models.llamacpp.backend import LlamaCppGenerator
    from marginalia.models.weights import embedded_gguf

    return LlamaCppGenerator(embedded_gguf(), "smollm2", n_branches=branches)


def measure(answer: Any, wall: float) -> dict[str, Any]:
    s = answer.stats
    return {"wall_s": wall, "context_tokens": s.context_tokens, "prefilled_context": s.prefilled_context_tokens,
            "cached_context": s.cached_context_tokens, "prefilled_other": s.prefilled_other_tokens,
            "margin_s": s.margin_seconds, "margin_tokens": s.generated_margin_tokens,
            "margins": [m.text for m in answer.margins], "answer": answer.text}


def timed(reader: Any, question: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    answer = reader.answer(question)
    return measure(answer, time.perf_counter() - t0)


def child(store_dir: str, segment_tokens: int, question: str, backend: str) -> None:
    """A fresh process: load the model, answer from the stored reading."""
    from marginalia.app import demo
    from marginalia.models.snapshots import SnapshotStore
    from marginalia.patterns.wim import WiM

    text, _ = demo()
    gen = load(16, backend)
    reader = WiM(gen, segment_tokens=segment_tokens, batch_margins=True).reader(text, store=SnapshotStore(store_dir))
    print(json.dumps(timed(reader, question)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segment-tokens", type=int, default=512)
    ap.add_argument("--questions", type=int, nargs=2, default=(0, 1), help="indices of the demo questions")
    ap.add_argument("--rounds", type=int, default=3, help="second questions timed, each way")
    ap.add_argument("--backend", choices=("llamacpp", "transformers"), default="llamacpp",
                    help="in-process backend (transformers: SmolLM2 de-quantized to fp32)")
    ap.add_argument("--name", default=None, help="the measurement's name (default: read_once, or "
                    "read_once_<backend> for another backend)")
    ap.add_argument("--no-write", action="store_true", help="print the section, store nothing")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2], args.child[3])
        return

    from marginalia.app import demo
    from marginalia.models.snapshots import SnapshotStore
    from marginalia.patterns.wim import WiM

    text, questions = demo()
    q1, q2 = (questions[i]["question"] for i in args.questions)
    t_start = time.perf_counter()
    store_dir = tempfile.mkdtemp(prefix="read-once-")
    batched_gen, sequential_gen = load(16, args.backend), load(0, args.backend)
    batched = WiM(batched_gen, segment_tokens=args.segment_tokens, batch_margins=True).reader(
        text, store=SnapshotStore(store_dir))
    sequential = WiM(sequential_gen, segment_tokens=args.segment_tokens).reader(text)
    first = timed(batched, q1)
    print(f"first question: {first['wall_s']:.1f} s, {first['prefilled_context']} context tokens prefilled", flush=True)
    sequential.answer(q1)  # its own reading, kept
    runs: dict[str, list[dict[str, Any]]] = {"batched": [], "sequential": []}
    for _ in range(args.rounds):  # interleaved, so a slow minute hurts both
        for name, reader in (("batched", batched), ("sequential", sequential)):
            runs[name].append(timed(reader, q2))
            r = runs[name][-1]
            print(f"  second, {name}: {r['wall_s']:.1f} s, margins {r['margin_s']:.1f} s, "
                  f"{r['prefilled_context']} context tokens prefilled", flush=True)
    out = subprocess.run([sys.executable, __file__, "--child", store_dir, str(args.segment_tokens), q2,
                          args.backend],
                         capture_output=True, text=True, check=True)
    fresh = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"  second, fresh process from the stored reading: {fresh['wall_s']:.1f} s, "
          f"{fresh['prefilled_context']} context tokens prefilled", flush=True)

    from marginalia.patterns.long_context import LongContext

    lc = LongContext(sequential_gen)
    t0 = time.perf_counter()
    lc_first = measure(lc.answer(text, q1), time.perf_counter() - t0)
    lc_runs = []
    for _ in range(args.rounds):  # each second question after the first, as a reader asks them
        lc.answer(text, q1)
        t0 = time.perf_counter()
        lc_runs.append(measure(lc.answer(text, q2), time.perf_counter() - t0))
    lc_second = {**lc_runs[0], "wall_s": statistics.median(r["wall_s"] for r in lc_runs)}
    print(f"long context: first {lc_first['wall_s']:.1f} s, second {lc_second['wall_s']:.1f} s, "
          f"{lc_second['prefilled_context']} context tokens prefilled", flush=True)

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    def per_token(name: str) -> float:
        return statistics.median(1000 * r["margin_s"] / max(r["margin_tokens"], 1) for r in runs[name])

    def row(r: dict[str, Any], **medians: float) -> dict[str, Any]:
        return {k: v for k, v in {**r, **medians}.items() if k != "margins"}

    b, s = runs["batched"][0], runs["sequential"][0]
    numbers = {
        "backend": args.backend, "runtime": {"llamacpp": "llama.cpp", "transformers": "transformers (fp32)"}[args.backend],
        "segment_tokens": args.segment_tokens, "rounds": args.rounds, "document_tokens": first["context_tokens"],
        "questions": [q1, q2],
        "rows": {"first": row(first),
                 "batched": row(b, wall_s=med("batched", "wall_s"), margin_s=med("batched", "margin_s")),
                 "sequential": row(s, wall_s=med("sequential", "wall_s"), margin_s=med("sequential", "margin_s")),
                 "fresh": row(fresh), "lc_first": row(lc_first), "lc_second": row(lc_second)},
        "same_margins": sum(x == y for x, y in zip(b["margins"], s["margins"], strict=True)),
        "margins": len(b["margins"]),
        "per_token_ms": {"batched": per_token("batched"), "sequential": per_token("sequential")},
        "total_min": (time.perf_counter() - t_start) / 60,
    }
    name = args.name or ("read_once" if args.backend == "llamacpp" else f"read_once_{args.backend}")
    show(measurement("read_once", numbers, name=name), write=not args.no_write)


def summary(m: Record) -> list[list[str]]:
    n = m["numbers"]
    r = n["rows"]
    return [[f"A second question on a kept reading (WiM, {n['runtime']})",
             f"{ratio(r['sequential']['wall_s'], r['first']['wall_s'])} the first question's wall time "
             f"({ratio(r['batched']['wall_s'], r['first']['wall_s'])} with batch_margins), "
             f"{num(r['sequential']['prefilled_context'], 0)} document tokens prefilled again", made_by(m)]]


READ_ONCE_ROWS = {
    "first": "WiM, first question (reads the report)",
    "sequential": "WiM, second question (median)",
    "batched": "WiM, second question, batch_margins (median)",
    "fresh": "WiM, second question, batch_margins, a fresh process",
    "lc_first": "long context, first question",
    "lc_second": "long context, second question (median)",
}


def section(m: Record) -> list[str]:
    n = m["numbers"]
    r = n["rows"]
    doc = n["document_tokens"]
    first = r["first"]["wall_s"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "not met"

    seq, bat, fresh = (r[k]["wall_s"] / first for k in ("sequential", "batched", "fresh"))
    margin = r["batched"]["margin_s"] / r["sequential"]["margin_s"]
    lines = [f"The demo report ({num(doc, 0)} tokens) read for one question, then a second asked from the kept "
             f"reading ({n['rounds']} times each way); SmolLM2-135M on {n['runtime']}, {n['segment_tokens']}-token "
             "segments.", "",
             *table(["", "wall (s)", "document tokens prefilled", "margin phase (s)", "margin tokens"],
                    [[label, num(r[k]["wall_s"]), num(r[k]["prefilled_context"], 0), num(r[k]["margin_s"]),
                      num(r[k]["margin_tokens"], 0)] for k, label in READ_ONCE_ROWS.items() if k in r]), "",
             f"- The second question prefilled {r['sequential']['prefilled_context'] / doc:.3f}x the document (goal "
             f"at most 0.05x: {verdict(r['sequential']['prefilled_context'] <= 0.05 * doc)}) and took {seq:.2f}x "
             f"the first's wall time by default, {bat:.2f}x with batch_margins, {fresh:.2f}x from a fresh process "
             f"(goal at most 0.25x: {', '.join(verdict(x <= 0.25) for x in (seq, bat, fresh))}).",
             f"- batch_margins: margin phase {margin:.2f}x the default's (goal at most 0.5x: {verdict(margin <= 0.5)}); "
             f"{n['same_margins']} of {n['margins']} margins the same word for word (branches side by side round "
             "differently: why batching is not the default)."]
    if "lc_second" in r:
        lines.append(f"- Long context's second question: {ratio(r['lc_second']['wall_s'], r['lc_first']['wall_s'])} "
                     f"its first; WiM's took {ratio(r['sequential']['wall_s'], r['lc_second']['wall_s'])} long context's.")
    return lines


BENCHMARKS["read_once"] = Benchmark("Read once, ask many", section, summary)


if __name__ == "__main__":
    main()
