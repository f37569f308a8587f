"""Summarise a `marginalia bench` run (by default the example config's) into
benchmarks/measurements/bench_example.json, which benchmarks/report.py renders into BENCHMARKS.md.

Run the benchmark first, then this:

    marginalia bench run configs/bench/example.toml [--limit N]
    python benchmarks/bench_example.py [RUN]      # RUN: a run folder or name (default: example)
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from _common import BENCHMARKS, Benchmark, command_line, run_measurement, show
from _markdown import Record, estimate, num, table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default="example", help="run folder or name under <home>/bench/runs")
    ap.add_argument("--home", default=None, help="marginalia's home (default: $MARGINALIA_HOME)")
    ap.add_argument("--no-write", action="store_true", help="print the section, store nothing")
    args = ap.parse_args()

    from marginalia.bench.analysis import find_run, load_run, pattern_order

    data = load_run(find_run(args.run, args.home))
    meta = data.info
    numbers = summarise(data.records, pattern_order(data), meta)
    numbers["run"] = args.run
    numbers["summarised_by"] = command_line()
    show(run_measurement("bench_example", numbers, meta,
                         f"marginalia bench run configs/bench/example.toml {_limit(meta)}".rstrip()),
         write=not args.no_write)


def summarise(records: list[dict[str, Any]], patterns: list[str], meta: dict[str, Any]) -> dict[str, Any]:
    """The run's numbers: per task and pattern, answers holding the gold (`contains`) at each context length and
    over all with a 95% interval, mean F1 and EM; the answers' statuses; the cost per answer of each pattern."""
    from marginalia.bench.analysis import cost_rows, metric_value
    from marginalia.bench.statistics import estimate

    tasks = list(dict.fromkeys(r["task"] for r in records))
    lengths = sorted({r["target_tokens"] for r in records if r.get("target_tokens")})

    def values(group: list[dict[str, Any]], metric: str) -> list[float]:
        return [v for v in (metric_value(r, metric) for r in group) if v is not None]

    out = []
    for task in tasks:
        rows = []
        for p in patterns:
            group = [r for r in records if r["task"] == task and r["pattern"] == p and r["status"] == "ok"]
            if not group:
                continue
            by_length = {}
            for n in lengths:
                right = values([r for r in group if r["target_tokens"] == n], "contains")
                if right:
                    by_length[str(n)] = [sum(right), len(right)]
            f1, em = values(group, "f1"), values(group, "em")
            rows.append({"pattern": p, "by_length": by_length, "contains": asdict(estimate(values(group, "contains"))),
                         "f1": sum(f1) / len(f1) if f1 else None, "em": sum(em) / len(em) if em else None})
        out.append({"task": task, "questions": len({r["example_id"] for r in records if r["task"] == task}),
                    "patterns": rows})
    models = meta.get("models", {})
    return {
        "model": models.get("generator", {}).get("spec", "?"), "engine": models.get("generator", {}).get("engine", "?"),
        "embedder": models.get("embedder", "?"), "lengths": lengths, "tasks": out,
        "answers": {s: sum(r["status"] == s for r in records) for s in ("ok", "overflow", "error")},
        "cost": [{k: row[k] for k in ("pattern", "n", "prefilled_context", "prefilled_other", "generated", "seconds")}
                 for row in cost_rows(records, patterns)],
    }


def _limit(meta: dict[str, Any]) -> str:
    invocations = meta.get("invocations") or [{}]
    limit = invocations[-1].get("limit")
    return f"--limit {limit}" if limit else ""


def section(m: Record) -> list[str]:
    n = m["numbers"]
    lengths = [str(x) for x in n["lengths"]]
    seconds = {c["pattern"]: c["seconds"] for c in n["cost"]}
    rows = []
    for t in n["tasks"]:
        for p in t["patterns"]:
            cells = [f"{p['by_length'][x][0]:.0f}/{p['by_length'][x][1]}" if x in p["by_length"] else "–"
                     for x in lengths]
            rows.append([t["task"], p["pattern"], *cells, estimate(p["contains"]), num(p["f1"], 2),
                         num(seconds.get(p["pattern"]))])
    a = n["answers"]
    tasks = ", ".join(f"{t['task']} ({t['questions']} questions)" for t in n["tasks"])
    return [f"Tasks {tasks}, contexts of {' and '.join(lengths)} tokens, the gold at depths 0, 0.5 and 1; model "
            f"`{n['model']}` ({n['engine']}); {a['ok']} answered, {a['overflow']} overflow, {a['error']} errors. So "
            f"few questions show the harness at work, not a verdict (`marginalia bench report {n['run']}` for "
            "depths and plots).", "",
            *table(["task", "pattern", *(f"contains @ {x}" for x in lengths), "contains (95% CI)", "F1",
                    "s / answer"], rows, "ll" + "r" * (len(lengths) + 3))]


BENCHMARKS["bench_example"] = Benchmark("`marginalia bench` on the example config", section)


if __name__ == "__main__":
    main()
