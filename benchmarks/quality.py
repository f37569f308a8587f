"""Summarise a quality run (`configs/bench/quality*.toml`: long context, RAG and WiM on the same items) into
benchmarks/measurements/<config>.json, which benchmarks/report.py renders into BENCHMARKS.md: per task, each
pattern's score with its 95% interval (and the model judge's, where the run was judged), WiM's paired
differences with the other patterns, kept-margin precision and recall, the cost per answer, and the goals.

    marginalia bench run configs/bench/quality.toml       (resumable; hours on 2 cores)
    marginalia bench judge quality --model SPEC            (optional: verdicts from a model judge)
    python benchmarks/quality.py [RUN]                     (default: the run named "quality")

A run's text-free export (`marginalia bench export`) is a run folder too: benchmarks/measurements/quality holds
the eval model's. A run still in progress is summarised as far as it got (the numbers say how far).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _common import BENCHMARKS, MEASUREMENTS, ROOT, Benchmark, command_line, run_measurement, show
from _markdown import Record, difference, estimate, made_by, model_name, num, provenance, table, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default="quality", help="run folder or name under <home>/bench/runs")
    ap.add_argument("--home", default=None, help="marginalia's home (default: $MARGINALIA_HOME)")
    ap.add_argument("--name", default=None, help="the measurement's name (default: the run's config name)")
    ap.add_argument("--no-write", action="store_true", help="print the section, store nothing")
    ap.add_argument("--wim", default="wim", metavar="PATTERN",
                    help="the pattern that stands for WiM (default: wim; e.g. a variant the run measures)")
    ap.add_argument("--no-plot", action="store_true",
                    help="leave out the figure (benchmarks/measurements/<name>.png: scores and paired differences)")
    args = ap.parse_args()

    from marginalia.bench.analysis import find_run, load_run, pattern_order

    folder = find_run(args.run, args.home)
    data = load_run(folder, rescore_answers=True)  # stored scores may predate a metric fix
    info, records = data.info, data.records
    patterns = pattern_order(data)
    config = info.get("config") or {}
    name = args.name or str(config.get("name") or args.run)
    numbers = summarise(records, patterns, config, info, wim=args.wim)
    numbers["rescored"] = data.rescored
    figure = MEASUREMENTS / f"{name}.png"
    if not args.no_plot and not args.no_write and plot(
            records, patterns, args.wim, figure,
            f"{config.get('name', args.run)}: {(numbers['model'] or '?').split('/')[-1]}"):
        numbers["figure"] = figure.relative_to(ROOT).as_posix()
    commit = str((info.get("commit") or {}).get("commit", "?"))[:10]
    commits = sorted({str((i.get("commit") or {}).get("commit", "?"))[:10] for i in info.get("invocations") or []})
    numbers["resumed_at"] = [c for c in commits if c != commit]
    numbers["summarised_by"] = command_line()
    show(run_measurement("quality", numbers, info, f"marginalia bench run configs/bench/{config.get('name', name)}.toml",
                         name=name), write=not args.no_write)


def summarise(records: list[dict[str, Any]], patterns: list[str], config: dict[str, Any], info: dict[str, Any],
              wim: str = "wim") -> dict[str, Any]:
    """A run's numbers as the measurement file holds them: per task, each pattern's score on the task's goal
    metric (`goal_metric`) and the judge's, with 95% intervals, other scores' means and the cost per answer;
    ``wim`` against each other pattern on the same items; the margins ``wim`` kept; and the goals (`goals`)."""
    if wim not in patterns:
        raise SystemExit(f"the run has no pattern {wim!r} (it has {', '.join(patterns)}): pass --wim NAME")
    from marginalia.bench.analysis import cost_rows, margin_counts, metric_value, paired, primary_metric
    from marginalia.bench.statistics import estimate

    planned = {t.get("name") or t.get("dataset"): t.get("limit") for t in config.get("tasks", [])}
    lc = "lc-own" if "lc-own" in patterns else "lc"  # long context on its own reading, where the run has it
    tasks = []
    for task in dict.fromkeys(r["task"] for r in records):
        group = [r for r in records if r["task"] == task]
        metric = goal_metric(group)
        judged = primary_metric(group) == "judge"
        by_pattern: dict[str, Any] = {}
        for p in patterns:
            mine = [r for r in group if r["pattern"] == p]
            if not mine:
                continue

            def values(key: str, mine: list[dict[str, Any]] = mine) -> list[float]:
                return [v for v in (metric_value(r, key) for r in mine) if v is not None]

            cost = cost_rows(mine, [p])[0]
            by_pattern[p] = {
                "n": sum(r.get("status") == "ok" for r in mine),
                "score": asdict(estimate(values(metric))),
                "judge": asdict(estimate(values("judge"))) if judged else None,
                **{k: sum(v) / len(v) if (v := values(k)) else None for k in ("contains", "f1", "em")},
                "overflow": cost["overflow"], "error": cost["error"],
                "cost": {k: cost[k] for k in ("prefilled_context", "prefilled_other", "generated", "seconds")},
            }
        versus = {other: paired(group, wim, other, metric) for other in by_pattern if other != wim}
        by_judge = {other: paired(group, wim, other, "judge") for other in by_pattern if other != wim} if judged else {}
        counts = margin_counts(group, wim)
        tasks.append({
            "task": task, "metric": metric, "planned": planned.get(task),
            "done": len({r["example_id"] for r in group}), "patterns": by_pattern,
            "paired": {k: asdict(d) for k, d in versus.items() if d is not None},
            "paired_judge": {k: asdict(d) for k, d in by_judge.items() if d is not None},
            "margins": {"kept": counts.kept, "precision": counts.relevant_precision,
                        "answer_precision": counts.precision, "recall": counts.recall,
                        "copy_recall": counts.copy_recall, "questions": [counts.found, counts.asked]}
            if counts.answers else None,
        })
    generator = (info.get("models") or {}).get("generator") or {}
    notes = {}
    for p in config.get("patterns", []):
        label = p.get("name") or p.get("kind")
        if p.get("reading"):
            notes[label] = f"long context answering from {p['reading']}'s reading of the same item (one prefill for both)"
        elif p.get("kind") == "lc" and label == lc and "lc" in patterns and lc != "lc":
            notes[label] = "long context on its own reading"
    return {
        "config": config.get("name"), "model": generator.get("spec"),
        "judge": ((info.get("models") or {}).get("judge") or {}).get("name"),
        "lengths": list(dict.fromkeys(x for t in config.get("tasks", []) for x in t.get("lengths", []))),
        "patterns": patterns, "wim": wim, "lc": lc, "rag": "rag" if "rag" in patterns else None,
        "pattern_notes": notes, "tasks": tasks,
        "goals": goals(records, patterns, wim=wim, tasks=set(planned)),
    }


def goals(records: list[dict[str, Any]], patterns: list[str], wim: str = "wim",
          tasks: set[str] | None = None) -> list[dict[str, str]]:
    """The quality goals of the run's ``tasks`` (default: all), each with what the run measured and whether
    that meets it; ``wim`` is the pattern that stands for WiM."""
    from marginalia.bench.analysis import margin_counts, paired

    lc = "lc-own" if "lc-own" in patterns else "lc"  # long context on its own reading, where the run has it
    rows: list[dict[str, str]] = []

    def versus(task: str, a: str, b: str, metric: str, at_least: float, above_zero: bool) -> None:
        if tasks is not None and task not in tasks:
            return
        margin = f" {at_least:+.2f}" if at_least else ""
        goal = f"{task}: {a} ≥ {b}{margin} ({metric}, mean)" + (", interval above zero" if above_zero else "")
        d = paired([r for r in records if r["task"] == task], a, b, metric)
        if d is None:
            rows.append({"goal": goal, "measured": "not run yet", "verdict": "–"})
            return
        if d.mean < at_least:
            verdict = f"not met (short by {at_least - d.mean:.2f})"
        elif above_zero and d.low <= 0:
            verdict = "not met (its interval reaches zero)"
        elif d.low <= at_least:
            verdict = f"met on the mean (its interval reaches {d.low:+.2f})"
        else:
            verdict = "met"
        rows.append({"goal": goal, "measured": f"{d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}] on {d.items} items",
                     "verdict": verdict})

    for task in ("hotpotqa", "multihop"):
        versus(task, wim, lc, "contains", 0.05, True)
        versus(task, wim, "rag", "contains", 0.0, False)
    versus("cwe", wim, lc, "f1", 0.20, False)
    for task in ("squad", "hotpotqa"):
        if tasks is not None and task not in tasks:
            continue
        c = margin_counts([r for r in records if r["task"] == task], wim)
        # precision counts a multi-hop question's bridge fact (drawn from a gold passage) as relevant
        for name, value, part, whole, goal in (("precision", c.relevant_precision, c.relevant, c.kept, 0.9),
                                               ("recall", c.recall, c.noted, c.bearing, 0.8)):
            measured = "not run yet" if value is None else f"{value:.2f} ({part} of {whole})"
            verdict = "–" if value is None else "met" if value >= goal else f"not met (short by {goal - value:.2f})"
            rows.append({"goal": f"{task}: kept-margin {name} ≥ {goal}", "measured": measured, "verdict": verdict})
    return rows


def goal_metric(records: list[dict[str, Any]]) -> str:
    """The score the goals read for a task's records: set F1 for word lists (CWE), else `contains`."""
    return "f1" if any(r.get("scoring") == "set" for r in records) else "contains"


def plot_data(records: list[dict[str, Any]], patterns: list[str], wim: str) -> list[dict[str, Any]]:
    """Per task (in run order): its goal metric, each pattern's `Estimate`, and ``wim`` minus each other pattern
    on the same items (`Paired`; patterns ``wim`` shares no item with are left out)."""
    from marginalia.bench.analysis import metric_value, paired
    from marginalia.bench.statistics import estimate

    out = []
    for task in dict.fromkeys(r["task"] for r in records):
        group = [r for r in records if r["task"] == task]
        metric = goal_metric(group)
        scores = {}
        for p in patterns:
            values = [v for v in (metric_value(r, metric) for r in group if r["pattern"] == p) if v is not None]
            if values:
                scores[p] = estimate(values)
        diffs = {}
        for other in patterns:
            d = paired(group, wim, other, metric) if other != wim else None
            if d is not None and d.items > 1:
                diffs[other] = d
        out.append({"task": task, "metric": metric, "scores": scores, "diffs": diffs})
    return out


def plot(records: list[dict[str, Any]], patterns: list[str], wim: str, path: Path, title: str) -> bool:
    """Draw `plot_data` to ``path`` (PNG): scores as bars with error bars, paired differences as intervals
    around zero. False, and nothing written, when the run has no answers to draw."""
    data = plot_data(records, patterns, wim)
    if not any(t["scores"] for t in data):
        return False
    from matplotlib.figure import Figure

    colours = {p: f"C{i}" for i, p in enumerate(patterns)}
    fig = Figure(figsize=(11.0, 0.6 + 0.75 * len(data) * max(len(patterns), 2) / 2 + 0.6), layout="constrained")
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.1, 1.0]})
    width = 0.8 / max(len(patterns), 1)
    rows = range(len(data))
    for k, p in enumerate(patterns):
        ys = [i + (k - (len(patterns) - 1) / 2) * width for i in rows]
        ests = [t["scores"].get(p) for t in data]
        shown = [(y, e) for y, e in zip(ys, ests, strict=True) if e is not None]
        if shown:
            left.barh([y for y, _ in shown], [e.mean for _, e in shown], height=width, color=colours[p], label=p,
                      xerr=[[max(e.mean - e.low, 0.0) for _, e in shown], [max(e.high - e.mean, 0.0) for _, e in shown]],
                      capsize=2)
    left.set_yticks(list(rows), [f"{t['task']} ({t['metric']})" for t in data])
    left.invert_yaxis()
    left.set_xlim(0.0, 1.0)
    left.set_xlabel("score (95% interval)")
    left.grid(alpha=0.3, axis="x")
    left.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(patterns), fontsize="small", frameon=False)
    others = [p for p in patterns if p != wim]
    step = 0.8 / max(len(others), 1)
    for k, p in enumerate(others):
        ys = [i + (k - (len(others) - 1) / 2) * step for i in rows]
        shown = [(y, t["diffs"][p]) for y, t in zip(ys, data, strict=True) if p in t["diffs"]]
        if shown:
            right.errorbar([d.mean for _, d in shown], [y for y, _ in shown], fmt="o", color=colours[p],
                           xerr=[[max(d.mean - d.low, 0.0) for _, d in shown],
                                 [max(d.high - d.mean, 0.0) for _, d in shown]], capsize=3, label=f"{wim} − {p}")
    right.axvline(0.0, color="black", linewidth=0.8)
    right.set_yticks(list(rows), [t["task"] for t in data])
    right.set_ylim(len(data) - 0.5, -0.5)
    right.set_xlim(-1.0, 1.0)
    right.set_xlabel(f"{wim} minus another pattern, same items (paired 95% interval)")
    right.grid(alpha=0.3, axis="x")
    if right.lines:
        right.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=max(len(others), 1), fontsize="small",
                     frameon=False)
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return True


#: the order quality tasks are shown in (others after them, by name)
TASK_ORDER = ("hotpotqa", "multihop", "squad", "cwe")


def task_order(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(tasks, key=lambda t: (TASK_ORDER.index(t["task"]) if t["task"] in TASK_ORDER else len(TASK_ORDER),
                                        t["task"]))


def summary(m: Record) -> list[list[str]]:
    """Summary rows of a quality run: per task, long context, RAG and WiM with intervals, WiM's paired
    differences and the seconds per answer."""
    n = m["numbers"]
    rows = []
    lc, rag, wim = n["lc"], n.get("rag"), n["wim"]
    where = f"{model_name(n['model']).split(' (')[0]}, {tokens(n['lengths'])}"
    for t in task_order(n["tasks"]):
        p = t["patterns"]
        if wim not in p:
            continue
        task = t["task"] + (f" ({n['wim_label']})" if n.get("wim_label") else "")
        seconds = " · ".join(num((p[x]["cost"] or {}).get("seconds"), 0) if x in p else "–" for x in (lc, rag, wim))
        rows.append([task, where, estimate(p.get(lc, {}).get("score")),
                     estimate(p.get(rag, {}).get("score")) if rag else "–", estimate(p[wim]["score"]),
                     difference(t["paired"].get(lc)), difference(t["paired"].get(rag)) if rag else "–",
                     seconds, made_by(m)])
    return rows


def quality_cell(p: dict[str, Any]) -> str:
    """A pattern's results on one task, compactly: score (/ judge) · tokens generated · seconds, per answer."""
    cost = p.get("cost") or {}
    judge = p.get("judge") or {}
    return (f"{num((p.get('score') or {}).get('mean'), 2)}"
            + (f" / {num(judge.get('mean'), 2)}" if judge.get("mean") is not None else "")
            + f" · {num(cost.get('generated'), 0)} tok · {num(cost.get('seconds'), 0)} s")


def together(runs: list[Record]) -> list[str]:
    lines = ["## Quality: long context vs RAG vs WiM", "",
             "Each question once per pattern, on the same items; a QA task's gold at one of five depths in turn. "
             "A cell: the mean score, then the model judge's accuracy where the run was judged (a small, lenient "
             "judge), tokens generated and seconds per answer. Margins WiM kept: precision (holding a gold answer "
             "or a multi-hop bridge fact) / recall (answer-bearing notes kept).", ""]
    for m in runs:
        n = m["numbers"]
        patterns = list(dict.fromkeys(p for t in n["tasks"] for p in t["patterns"]))
        lines += [f"### {n['config']}: {model_name(n['model'])}, {tokens(n['lengths'])} tokens", "",
                  provenance(m) + "".join(f" `{p}`: {note}." for p, note in (n.get("pattern_notes") or {}).items()), "",
                  *table(["task", *patterns],
                         [[f"{t['task']} ({t['patterns'][n['wim']]['n'] if n['wim'] in t['patterns'] else '?'})",
                           *(quality_cell(t["patterns"][p]) if p in t["patterns"] else "–" for p in patterns)]
                          for t in task_order(n["tasks"])], "l" + "r" * len(patterns))]
        margins = [f"{t['task']} {num(t['margins']['precision'], 2)} / {num(t['margins']['recall'], 2)}"
                   for t in task_order(n["tasks"]) if t.get("margins")]
        if margins:
            lines += ["", f"Margins `{n['wim']}` kept: " + ", ".join(margins) + "."]
        if n.get("figure"):
            lines += ["", f"![{n['config']}: scores and paired differences]({n['figure']})"]
        lines.append("")
    return lines


BENCHMARKS["quality"] = Benchmark(
    "Quality: long context vs RAG vs WiM", summary=summary, together=together, first=("quality", "aggregation-lists-8k", "quality-smollm2"),
    table=("**Quality.** Mean score per answer with its 95% interval (`contains` for QA, set F1 for CWE), "
           "WiM minus long context and minus RAG on the same items (paired 95% interval: clear when it "
           "excludes zero), and seconds per answer; made by `marginalia bench run configs/bench/<config>` and "
           "summarised by `python benchmarks/quality.py`.",
           ["task", "model, context tokens", "long context", "RAG", "WiM", "WiM − long context", "WiM − RAG",
            "s / answer (LC · RAG · WiM)", "made by"], "llrrrrrrl"))


if __name__ == "__main__":
    main()
