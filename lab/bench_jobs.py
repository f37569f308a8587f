"""One bench run answered by one process on every core, and by ``--jobs N`` one-core workers: answers per hour.

The same config (HotpotQA development items among distractors, rag, wim and lc, as the SmolLM2 quality runs
have them) runs twice into fresh folders, first as one process (llama.cpp on all usable cores), then with
``--jobs`` (each worker held to its share of the cores); the machine should be otherwise idle. Also says how
many answers the two runs share word for word (a thread count changes llama.cpp's sums, so near-ties can
flip).

    python lab/bench_jobs.py [--items 6] [--length 4096] [--model smollm2] [--jobs 2]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from _lab_common import DATA, command_line, finish, git_commit, load_note, machine, usable_cores

CONFIG = """\
name = "bench-jobs"
seed = 0
model = "{model}"
embedder = "minilm"
max_new_tokens = 48

[[tasks]]
dataset = "hotpotqa"
path = "{path}"
limit = {items}
lengths = [{length}]
depths = [0.0, 0.25, 0.5, 0.75, 1.0]
options = {{ rotate_depths = true }}

[[patterns]]
kind = "rag"
top_k = 4
chunk_tokens = 128

[[patterns]]
kind = "wim"
segment_tokens = 512
judge = "grounded"
margin_tokens = 48

[[patterns]]
kind = "lc"
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=6, help="HotpotQA items (each answered by every pattern)")
    ap.add_argument("--length", type=int, default=4096, help="context tokens per item")
    ap.add_argument("--model", default="smollm2", help="model spec")
    ap.add_argument("--jobs", type=int, default=2, help="workers in the second run")
    ap.add_argument("--data", type=Path, default=DATA / "hotpotqa-dev-distractor.part1.json")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave lab/findings alone")
    args = ap.parse_args()
    if not args.data.is_file():
        raise SystemExit(f"{args.data} is missing (the development data lives in ../shared/data)")

    from marginalia.bench import RESULTS, load_config, read_results, run_benchmark, run_jobs

    cores = usable_cores()
    before = os.getloadavg()[0]
    started = time.perf_counter()
    seconds: dict[int, float] = {}
    answers: dict[int, dict[tuple[str, str], str]] = {}
    per_answer: dict[int, float] = {}
    answering: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        config_path = Path(tmp) / "bench-jobs.toml"
        config_path.write_text(CONFIG.format(model=args.model, path=json.dumps(str(args.data))[1:-1],
                                             items=args.items, length=args.length), encoding="utf-8")
        config = load_config(config_path)
        for jobs in (1, args.jobs):
            print(f"{jobs} job(s) ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            folder = Path(tmp) / f"jobs{jobs}"
            summary = run_benchmark(config, out=folder, err=io.StringIO()) if jobs == 1 else \
                run_jobs(config, jobs, out=folder, err=io.StringIO())
            seconds[jobs] = time.perf_counter() - t0
            records = read_results(folder / RESULTS)
            if summary.written != args.items * 3 or any(r["status"] != "ok" for r in records):
                raise SystemExit(f"{jobs} job(s): {summary.written} answers, statuses {summary.statuses}")
            answers[jobs] = {(r["item_id"], r["pattern"]): r["prediction"] for r in records}
            per_answer[jobs] = sum(r["seconds"] for r in records) / len(records)
            ends = [datetime.fromisoformat(r["finished"]).timestamp() for r in records]
            starts = [end - r["seconds"] for end, r in zip(ends, records, strict=True)]
            answering[jobs] = max(ends) - min(starts)  # loading the models left out
    after = os.getloadavg()[0]
    n = args.items * 3
    same = sum(answers[1][k] == answers[args.jobs][k] for k in answers[1])
    rate = {j: 3600 * n / s for j, s in answering.items()}
    rows = ["| run | wall time (s) | answering (s) | answers per hour | seconds per answer, as each answer took | "
            "answers per hour vs one process |", "|---|---:|---:|---:|---:|---:|"]
    for jobs in (1, args.jobs):
        what = f"one process on {cores} cores" if jobs == 1 else f"--jobs {jobs} (one core each)" \
            if cores == jobs else f"--jobs {jobs}"
        rows.append(f"| {what} | {seconds[jobs]:.0f} | {answering[jobs]:.0f} | {rate[jobs]:.0f} | "
                    f"{per_answer[jobs]:.1f} | {rate[jobs] / rate[1]:.2f}x |")
    body = "\n".join([
        "## One bench run on every core, or as one-core jobs (`lab/bench_jobs.py`)",
        "",
        f"Command: `{command_line()}` · commit {git_commit()} · model {args.model} · machine: {machine()} · "
        f"{load_note(before, after)} · {(time.perf_counter() - started) / 60:.1f} min",
        "",
        f"{args.items} HotpotQA development items at {args.length} tokens, each answered by rag, wim and lc "
        f"({n} answers per run; the SmolLM2 quality runs' patterns), run twice into fresh folders: one process, "
        f"then `bench run --jobs {args.jobs}`. Wall time includes loading the models (each job loads its own); "
        "answering runs from the first answer's start to the last one's end, and answers per hour are counted on "
        "it, as a long run sees them.",
        "",
        *rows,
        "",
        f"- The two runs give the same answer, word for word, in {same} of {n} cases (llama.cpp's sums change "
        "with the thread count, so near-ties can go the other way).",
    ])
    finish("bench_jobs", body, write=not args.no_write)


if __name__ == "__main__":
    main()
