"""How OpenMP's waiting policy changes composition's suggestions when a memory model shares the process.

The client (SmolLM2 on llama.cpp, every core) completes the lead of a WikiText article a word at a time, 15
tokens per suggestion, first alone, then after the memory model evaluated a prompt on a background thread
that stays alive (as composition's memory thread does, waiting for the next request). Each setting runs in
a process of its own (libgomp reads its settings once, when it is loaded), in rounds, alternating:

- libgomp's defaults (``GOMP_SPINCOUNT=300000`` alone, which marginalia leaves as it is);
- marginalia's defaults (`marginalia.openmp`: ``OMP_WAIT_POLICY=active GOMP_SPINCOUNT=300000``);
- libgomp's defaults with the memory model on one thread (the other way out: its team has no second thread).

Also measured: the CPU seconds the process takes in the 2 s after the memory thread went idle (an idle team
must not spin).

    python benchmarks/openmp_wait.py [--memory-model gguf:FILE] [--rounds 2]

The text is read at run time from ../shared/data; nothing of it is kept in the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import command_line, git_commit, load_note, machine, write_section  # noqa: E402
from compose_latency import DATA, clean, split_lead  # noqa: E402

SETTINGS = {
    "libgomp's defaults": ({"GOMP_SPINCOUNT": "300000"}, None),
    "marginalia's defaults": ({}, None),
    "libgomp's defaults, memory model on 1 thread": ({"GOMP_SPINCOUNT": "300000"}, 1),
}
WORDS = 60
SUGGESTIONS = 8


def worker(args: argparse.Namespace) -> None:
    """One setting, in this process: print the medians as JSON."""
    from marginalia import openmp
    from marginalia.compose import CompletionClient
    from marginalia.models import load_generator
    from marginalia.models.llamacpp_backend import LlamaCppGenerator
    from marginalia.models.registry import gguf_file

    articles = [json.loads(line) for line in args.data.read_text("utf-8").splitlines() if line.strip()]
    words = split_lead(clean(articles[args.article]["text"]))[0].split()
    client = CompletionClient(load_generator("smollm2", backend="llamacpp"),
                              standby=load_generator("smollm2", backend="llamacpp"), suggestion_tokens=15)
    path = gguf_file(args.memory_model)
    assert path is not None
    memory = LlamaCppGenerator(path, name=args.memory_model, n_threads=args.threads)

    def suggestions() -> float:
        client.complete(" ".join(words[:WORDS])).text()  # the prompt prefilled once
        times = []
        for n in range(WORDS + 1, WORDS + 1 + SUGGESTIONS):
            t0 = time.perf_counter()
            client.complete(" ".join(words[:n])).text()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    alone = suggestions()
    done, stop = threading.Event(), threading.Event()

    def memory_thread() -> None:
        gen = memory.fork(keep_cache=False)
        gen.prefill(gen.tokenizer.encode(" ".join(words[:200])))
        done.set()
        stop.wait()

    thread = threading.Thread(target=memory_thread, daemon=True)
    thread.start()
    done.wait()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(2.0)
    idle_cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    beside = suggestions()
    stop.set()
    thread.join()
    print(json.dumps({"state": openmp.state, "alone": alone, "beside": beside, "idle_cpu": idle_cpu}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--article", type=int, default=0)
    ap.add_argument("--memory-model", default="smollm2", help="a GGUF model: smollm2 or gguf:FILE")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.data.is_file():
        sys.exit(f"no data at {args.data}; give --data")
    if args.worker is not None:
        worker(args)
        return
    from marginalia.models.registry import gguf_file

    path = gguf_file(args.memory_model)
    if path is None or not path.is_file():
        ap.error(f"--memory-model must name a GGUF file on this machine (smollm2 or gguf:FILE), not "
                 f"{args.memory_model!r}")

    t_start = time.perf_counter()
    load_before = os.getloadavg()
    clean_env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    for r in range(args.rounds):
        for name, (env, threads) in SETTINGS.items():
            cmd = [sys.executable, __file__, "--worker", name, "--data", str(args.data), "--article",
                   str(args.article), "--memory-model", args.memory_model]
            if threads is not None:
                cmd += ["--threads", str(threads)]
            out = subprocess.run(cmd, env={**clean_env, **env}, capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            results[name].append(row)
            print(f"round {r + 1}, {name} ({row['state']}): alone {row['alone'] * 1000:.0f} ms, beside "
                  f"{row['beside'] * 1000:.0f} ms, idle CPU {row['idle_cpu']:.2f}", flush=True)
    load_after = os.getloadavg()

    def med(name: str, key: str) -> float:
        return statistics.median(row[key] for row in results[name])

    base = med("libgomp's defaults", "beside")
    rows = [f"| {name} | {med(name, 'alone') * 1000:.0f} | {med(name, 'beside') * 1000:.0f} | "
            f"{med(name, 'beside') / med(name, 'alone'):.2f}x | {med(name, 'beside') / base:.2f}x | "
            f"{med(name, 'idle_cpu'):.2f} |" for name in SETTINGS]
    body = "\n".join([
        "## OpenMP's waiting and composition's suggestions (`benchmarks/openmp_wait.py`)",
        "",
        f"Command: `{command_line()}` · commit {git_commit()} · client: SmolLM2-135M on llama.cpp, every core · "
        f"memory model: {path.name} · machine: {machine()} · {load_note(load_before[0], load_after[0])} · total "
        f"{(time.perf_counter() - t_start) / 60:.1f} min",
        "",
        f"The lead of WikiText's {json.loads(args.data.read_text('utf-8').splitlines()[args.article])['title']!r} "
        f"completed after {WORDS + 1} to {WORDS + SUGGESTIONS} of its words, one 15-token suggestion each "
        f"(median of {SUGGESTIONS}), each setting in a process of its own, {args.rounds} round(s) alternating "
        "(medians over rounds). \"Beside\": after the memory model evaluated a prompt on a thread that stays "
        "alive, idle. Idle CPU: the process's CPU seconds per second in the 2 s after that thread went idle.",
        "",
        "| setting | full suggestion, alone (ms) | beside an idle memory thread (ms) | beside / alone | "
        "against libgomp's defaults | idle CPU |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
    ])
    write_section("openmp_wait", body)


if __name__ == "__main__":
    main()
