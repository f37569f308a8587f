"""Summarise a `marginalia bench` run (by default the example config's) into BENCHMARKS.md.

Run the benchmark first, then this:

    marginalia bench run configs/bench/example.toml [--limit N]
    python benchmarks/bench_example.py [RUN]      # RUN: a run folder or name (default: example)
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import write_section  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default="example", help="run folder or name under <home>/bench/runs")
    ap.add_argument("--home", default=None, help="marginalia's home (default: $MARGINALIA_HOME)")
    args = ap.parse_args()

    from marginalia.bench.report import cost_rows, estimate, find_run, load_run, metric_value, pattern_order

    folder = find_run(args.run, args.home)
    data = load_run(folder)
    meta = data.info
    patterns = pattern_order(data)
    records = data.records
    tasks = list(dict.fromkeys(r["task"] for r in records))
    lengths = sorted({r["target_tokens"] for r in records if r.get("target_tokens")})
    examples = {t: len({r["example_id"] for r in records if r["task"] == t}) for t in tasks}

    lines = ["| task | pattern | " + " | ".join(f"contains @ {n}" for n in lengths)
             + " | contains, all (95% CI) | F1, all | EM, all |",
             "|---|---|" + "---:|" * len(lengths) + "---:|---:|---:|"]
    for task in tasks:
        for p in patterns:
            group = [r for r in records if r["task"] == task and r["pattern"] == p and r["status"] == "ok"]
            if not group:
                continue
            cells = []
            for n in lengths:
                vals = [v for r in group if r["target_tokens"] == n
                        for v in [metric_value(r, "contains")] if v is not None]
                cells.append(f"{sum(vals):.0f}/{len(vals)}" if vals else "–")
            every = [v for r in group for v in [metric_value(r, "contains")] if v is not None]
            f1 = [v for r in group for v in [metric_value(r, "f1")] if v is not None]
            em = [v for r in group for v in [metric_value(r, "em")] if v is not None]
            lines.append(f"| {task} | {p} | " + " | ".join(cells) + f" | {estimate(every).format()} | "
                         f"{sum(f1) / len(f1):.2f} | {sum(em) / len(em):.2f} |")
    cost = ["| pattern | items | context tokens prefilled | other tokens prefilled | tokens generated | seconds |",
            "|---|---:|---:|---:|---:|---:|"]
    for row in cost_rows(records, patterns):
        cost.append(f"| {row['pattern']} | {row['n']} | {row['prefilled_context']:.0f} | "
                    f"{row['prefilled_other']:.0f} | {row['generated']:.1f} | {row['seconds']:.1f} |")
    statuses = {s: sum(r["status"] == s for r in records) for s in ("ok", "overflow", "error")}
    models = meta.get("models", {})
    commit = (meta.get("commit") or {}).get("commit", "?")
    body = "\n".join([
        "## Long context vs RAG vs WiM on public QA (`marginalia bench`)",
        "",
        f"Commands: `marginalia bench run configs/bench/example.toml {_limit(meta)}` then "
        f"`python benchmarks/bench_example.py` · commit {str(commit)[:10]} · model "
        f"`{models.get('generator', {}).get('spec', '?')}` ({models.get('generator', {}).get('engine', '?')}), "
        f"embedder `{models.get('embedder', '?')}` · started {meta.get('started', '?')}",
        "",
        f"Tasks: {', '.join(f'{t} ({examples[t]} question' + ('s' if examples[t] != 1 else '') + ')' for t in tasks)}; each question's context built at "
        f"{' and '.join(map(str, lengths))} model tokens with the gold at depths 0, 0.5 and 1 (the same items "
        f"for every pattern). {len(records)} answers: {statuses['ok']} answered, {statuses['overflow']} "
        f"overflow, {statuses['error']} errors. Scores: `contains` = the normalised gold answer appears in the "
        "answer (the small model answers in sentences, so exact match is near zero); no model judge. "
        "With this few questions the intervals are wide: read them, not the point estimates.",
        "",
        *lines,
        "",
        "Cost per answer (means):",
        "",
        *cost,
        "",
        f"Full tables by depth and the plots: `marginalia bench report {args.run}` (report.md in the run folder).",
    ])
    write_section("bench_example", body)
    print(body)


def _limit(meta: dict) -> str:
    invocations = meta.get("invocations") or [{}]
    limit = invocations[-1].get("limit")
    return f"--limit {limit}" if limit else ""


if __name__ == "__main__":
    main()
