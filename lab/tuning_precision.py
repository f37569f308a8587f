"""The composition client's LoRA tuning in fp32 and in bf16 (``TuneOptions.precision``), in one run on one
machine: seconds per training step, and the held-out label loss each reaches after the same steps on the same
examples (both measured in fp32, so they compare).

The examples are a tuning-data file (``marginalia tune data`` or ``benchmarks/compose_tuning.py``, which
writes them under the home's ``bench/compose_tuning``); the first ``--examples`` of it are used, whole texts
held out by source as the tuning does. The two tunings run one after the other (fp32 first), not step for
step in turn, so the section gives the load average before and after.

    python lab/tuning_precision.py --data FILE [--examples 300] [--steps 40] [--threads 2]

The examples' texts stay where they are (under the home); nothing of them is kept in the repository.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _lab_common import command_line, cpu_flags, finish, git_commit, load_note, machine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a tuning-data file (JSONL)")
    ap.add_argument("--examples", type=int, default=300, help="use the first N examples of the file")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--modules", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--home", type=Path, default=None, help="marginalia's home (default: its own default)")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave lab/findings alone")
    args = ap.parse_args()

    from marginalia import TuneOptions, load_model, tune_client

    data = args.data
    if not data.is_file():
        sys.exit(f"no tuning data at {data}; give --data (a file that 'marginalia tune data' or "
                 "benchmarks/compose_tuning.py wrote)")
    try:
        examples = [line for line in data.read_text("utf-8").splitlines() if line.strip()][: args.examples]
    except UnicodeDecodeError:
        sys.exit(f"{data} is not UTF-8 text; give a tuning-data file (JSONL)")
    if len(examples) < 8:
        sys.exit(f"{data} holds {len(examples)} examples; give a file with at least 8")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    client = load_model("smollm2", home=args.home, device="cpu", backend="transformers")
    load_before = os.getloadavg()
    runs: dict[str, dict[str, Any]] = {}
    for precision in ("fp32", "bf16"):
        options = TuneOptions(rank=args.rank, alpha=2.0 * args.rank, steps=args.steps, batch_size=args.batch_size,
                              learning_rate=3e-4, held_out=0.15, modules=args.modules, precision=precision,
                              checkpoint_every=0)
        stamps: list[float] = []
        with tempfile.TemporaryDirectory() as out:
            part = Path(out) / data.name  # the first --examples of the file
            part.write_text("\n".join(examples) + "\n", "utf-8")
            t0 = time.perf_counter()
            report = tune_client(part, Path(out) / "tuned", options, generator=client, home=args.home,
                                 on_step=lambda *_, stamps=stamps: stamps.append(time.perf_counter()))
            total = time.perf_counter() - t0
        steps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]  # the first step's start is not seen
        runs[precision] = {"step": statistics.median(steps), "total": total, "report": report}
        print(f"{precision}: median {runs[precision]['step']:.2f} s/step, held-out {report.held_out_before:.3f} -> "
              f"{report.held_out_after:.3f}, {total:.0f} s", flush=True)
    load_after = os.getloadavg()

    fp32, bf16 = runs["fp32"], runs["bf16"]
    flags = cpu_flags()
    cpu_note = ", ".join(f for f in ("avx512_bf16", "amx_bf16") if f in flags) or "neither avx512_bf16 nor amx_bf16"
    rows = []
    for precision in ("fp32", "bf16"):
        r = runs[precision]
        rep = r["report"]
        rows.append(f"| {precision} | {r['step']:.2f} | {statistics.mean(rep.losses[-5:]):.3f} | "
                    f"{rep.held_out_before:.3f} | {rep.held_out_after:.3f} | {r['total'] / 60:.1f} |")
    report = fp32["report"]
    body = "\n".join([
        "## LoRA tuning in fp32 and bf16 (`lab/tuning_precision.py`)",
        "",
        f"Command: `{command_line()}` · commit {git_commit()} · client: smollm2 on transformers, CPU · "
        f"machine: {machine()} (CPU flags: {cpu_note}; torch threads {torch.get_num_threads()}) · "
        f"{load_note(load_before[0], load_after[0])}",
        "",
        f"{len(examples)} examples of `{data.name}` ({report.train_examples} for training, "
        f"{report.held_out_examples} held out by text); LoRA rank {args.rank} on {args.modules}; {args.steps} steps "
        f"of {args.batch_size} examples, AdamW lr 3e-4 (linear), the same seed. bf16: the steps' forward and "
        "backward under autocast; the adapters, the optimizer and the held-out loss in fp32.",
        "",
        "| precision | median s/step | training loss (last 5 steps) | held-out label loss before | after | "
        "total min |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"bf16 takes {bf16['step'] / fp32['step']:.2f}x the fp32 step time ({fp32['step'] / bf16['step']:.2f}x "
        f"as fast); its held-out label loss after the same steps is {bf16['report'].held_out_after:.3f} against "
        f"{fp32['report'].held_out_after:.3f}.",
    ])
    finish("tuning_precision", body, write=not args.no_write)


if __name__ == "__main__":
    main()
