"""Summarise the quality run (`configs/bench/quality.toml`: the eval model, 50 questions per task) into
BENCHMARKS.md: per task, each pattern's score with its 95% interval, the patterns compared on the same items
(paired differences), kept-margin precision and recall, judge-vs-contains disagreement, and the cost per answer.

    marginalia bench run configs/bench/quality.toml       (resumable; hours on 2 cores)
    marginalia bench judge quality --model SPEC            (optional: verdicts from a model judge)
    python benchmarks/quality.py [RUN]                     (default: the run named "quality")

A run still in progress is summarised as far as it got (the section says how far).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import ROOT, write_section  # noqa: E402

PLOTS = ROOT / "benchmarks"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default="quality", help="run folder or name under <home>/bench/runs")
    ap.add_argument("--home", default=None, help="marginalia's home (default: $MARGINALIA_HOME)")
    ap.add_argument("--section", default="quality", help="the BENCHMARKS.md section to write")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave BENCHMARKS.md alone")
    ap.add_argument("--goals", action="store_true",
                    help="open the section with the quality goals (WiM against long context and RAG, margins kept)")
    ap.add_argument("--wim", default="wim", metavar="PATTERN",
                    help="the pattern the goals take for WiM (default: wim; e.g. a variant the run measures)")
    ap.add_argument("--no-plot", action="store_true",
                    help="leave out the figure (benchmarks/<section>.png: scores and paired differences)")
    args = ap.parse_args()

    from marginalia.bench.report import (
        cores_text,
        find_run,
        load_run,
        pattern_order,
        run_machines,
        task_sections,
        task_tables,
    )

    folder = find_run(args.run, args.home)
    data = load_run(folder, rescore_answers=True)  # stored scores may predate a metric fix
    info, records = data.info, data.records
    patterns = pattern_order(data)
    config = info.get("config") or {}
    planned = {t.get("name") or t.get("dataset"): t.get("limit") for t in config.get("tasks", [])}
    models = info.get("models") or {}
    commit = str((info.get("commit") or {}).get("commit", "?"))[:10]
    invocations = info.get("invocations") or []
    commits = sorted({str((i.get("commit") or {}).get("commit", "?"))[:10] for i in invocations})
    machines = list(dict.fromkeys(f"{cores_text(m)}, {m.get('cpu', '?')}" for m in run_machines(info)))
    shared = [p.get("name") or p.get("kind") for p in config.get("patterns", []) if p.get("reading")]
    judge = models.get("judge")
    lines = [
        f"## {' vs '.join(patterns)}, up to {max(planned.values(), default=0)} questions per task: "
        f"{config.get('name', args.run)} "
        "(`benchmarks/quality.py`)", "",
        f"Commands: `marginalia bench run configs/bench/{config.get('name', 'quality')}.toml` then "
        f"`python benchmarks/quality.py {args.run}"
        + (f" --section {args.section}" if args.section != "quality" else "") + (" --goals" if args.goals else "")
        + (f" --wim {args.wim}" if args.wim != "wim" else "")
        + "` · "
        f"started at commit {commit}" + (f" (resumed at {', '.join(c for c in commits if c != commit)})"
                                         if len(commits) > 1 else "")
        + f" · model `{(models.get('generator') or {}).get('spec', '?')}` · started {info.get('started', '?')}"
        + (f" · answered on {'; '.join(machines)}" if machines else ""), "",
    ]
    done = {t: len({r["example_id"] for r in records if r["task"] == t}) for t in dict.fromkeys(r["task"] for r in records)}
    progress = ", ".join(f"{t} {done.get(t, 0)} of {n} questions" for t, n in planned.items())
    lines += [f"Progress: {progress}. Each question once, at {', '.join(str(x) for x in config.get('tasks', [{}])[0].get('lengths', []))} "
              "tokens" + ("; a QA task's gold at one of five depths in turn (0, 0.25, 0.5, 0.75, 1). "
                          if any((t.get("options") or {}).get("rotate_depths") for t in config.get("tasks", [])) else ". ")
              + (f"{', '.join(shared)} answers from a wim reading of the same item (unless that reading has "
                 "instructions = \"margin\", its prompt opens with WiM's intro, not long context's own, which "
                 "the margin_style section measures against long context's own reading). " if shared else "")
              + ("Verdicts from the judge " + str(judge.get("name")) + " (the tables' first score; the goals "
                 "keep `contains`, and each task's \"Judge and contains\" table says where the two part)." if judge else
                 "No model judge: scores are lexical (`contains` for QA, set F1 for CWE).")
              + (f" Scored with the metrics of this checkout ({data.rescored} "
                 + ("answer's stored score, from an older version, differs)." if data.rescored == 1 else
                    "answers' stored scores, from an older version, differ).") if data.rescored else ""), ""]
    if args.goals:
        lines += goal_lines(records, patterns, wim=args.wim, tasks=set(planned))
    drawn = args.wim if args.wim in patterns else next(iter(patterns), None)  # the pattern the others are taken from
    if drawn is not None and not args.no_plot and not args.no_write:
        figure = PLOTS / f"{args.section}.png"
        if plot(records, patterns, drawn, figure,
                f"{config.get('name', args.run)}: {(models.get('generator') or {}).get('spec', '?').split('/')[-1]}"):
            lines += [f"![scores and paired differences, {config.get('name', args.run)}]"
                      f"(benchmarks/{figure.name})", "",
                      "Left, each pattern's score with its 95% interval; right, "
                      f"{drawn} minus each other pattern on the same "
                      "items, with the paired 95% interval (a difference is clear when its bar misses the zero "
                      "line). QA tasks are scored by `contains`, CWE by set F1, as in the goals.", ""]
    for task in dict.fromkeys(r["task"] for r in records):
        group = [r for r in records if r["task"] == task]
        _, summary, _ = task_tables(group, patterns)
        lines += [f"### {task}", "", summary, *task_sections(group, patterns, level="####"), ""]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(args.section, text)


def goal_lines(records: list[dict[str, Any]], patterns: list[str], wim: str = "wim",
               tasks: set[str] | None = None) -> list[str]:
    """The quality goals of the run's ``tasks`` (default: all), each with what the run measured and whether
    that meets it; ``wim`` is the pattern that stands for WiM."""
    if wim not in patterns:
        raise SystemExit(f"the run has no pattern {wim!r} (it has {', '.join(patterns)}): pass --wim NAME")
    from marginalia.bench.report import margin_counts, paired

    lc = "lc-own" if "lc-own" in patterns else "lc"  # long context on its own reading, where the run has it
    rows = []
    missed: list[str] = []  # the kinds of goal missed (keys of TRIED), in order

    def versus(task: str, a: str, b: str, metric: str, at_least: float, above_zero: bool) -> None:
        if tasks is not None and task not in tasks:
            return
        margin = f" {at_least:+.2f}" if at_least else ""
        goal = f"{task}: {a} ≥ {b}{margin} ({metric}, mean)" + (", interval above zero" if above_zero else "")
        d = paired([r for r in records if r["task"] == task], a, b, metric)
        if d is None:
            rows.append(f"| {goal} | not run yet | – |")
            return
        kind = "aggregation" if task == "cwe" else "versus rag" if b == "rag" else "versus lc"
        if d.mean < at_least:
            verdict = f"not met (short by {at_least - d.mean:.2f})"
            missed.append(kind)
        elif above_zero and d.low <= 0:
            verdict = "not met (its interval reaches zero)"
            missed.append(kind)
        elif d.low <= at_least:
            verdict = f"met on the mean (its interval reaches {d.low:+.2f})"
        else:
            verdict = "met"
        rows.append(f"| {goal} | {d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}] on {d.items} items | {verdict} |")

    judged: list[str] = []  # the same comparisons by the model judge's verdicts, where the run was judged
    for task in ("hotpotqa", "multihop"):
        versus(task, wim, lc, "contains", 0.05, True)
        versus(task, wim, "rag", "contains", 0.0, False)
        if tasks is not None and task not in tasks:
            continue
        group = [r for r in records if r["task"] == task]
        for other in (lc, "rag"):
            d = paired(group, wim, other, "judge")
            if d is not None:
                judged.append(f"{task} {wim} − {other} {d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}] ({d.items} items)")
    versus("cwe", wim, lc, "f1", 0.20, False)
    for task in ("squad", "hotpotqa"):
        if tasks is not None and task not in tasks:
            continue
        c = margin_counts([r for r in records if r["task"] == task], wim)
        # precision counts a multi-hop question's bridge fact (drawn from a gold passage) as relevant
        for name, value, part, whole, goal in (("precision", c.relevant_precision, c.relevant, c.kept, 0.9),
                                               ("recall", c.recall, c.noted, c.bearing, 0.8)):
            measured = "not run yet" if value is None else f"{value:.2f} ({part} of {whole})"
            if name == "precision" and value is not None and c.relevant != c.hits:
                measured += f"; {c.precision:.2f} holding the answer"
            if name == "recall" and value is not None and c.copies != c.bearing:
                measured += f" notes; {c.copy_recall:.2f} of each copy ({c.copies_kept} of {c.copies})"
            verdict = "–" if value is None else "met" if value >= goal else f"not met (short by {goal - value:.2f})"
            if verdict.startswith("not met"):
                missed.append(name)
            rows.append(f"| {task}: kept-margin {name} ≥ {goal} | {measured} | {verdict} |")
    return ["### Goals", "",
            f"WiM (`{wim}`) against long context (`{lc}`)" + (" and RAG" if "rag" in patterns else "")
            + " on the same items (paired 95% intervals)"
            + (", and the margins WiM kept" if tasks is None or tasks & {"squad", "hotpotqa"} else "")
            + "; each row says by how much a goal is missed."
            + (" A kept margin is relevant when it holds a gold answer or, for a question that needs several gold "
               "passages (HotpotQA's two), when it is drawn from one of them: the bridge fact holds no answer, yet "
               "the answer needs it. Recall counts notes: margins written with the same words are one note, "
               "kept when one copy is." if tasks is None or tasks & {"squad", "hotpotqa"} else ""), "",
            "| goal | measured | |", "|---|---|---|", *rows, "",
            *([f"By the model judge's verdicts instead of `contains`: {'; '.join(judged)}. The goals keep "
               "`contains`: a small judge accepts long answers that name the wrong thing (each task's \"Judge "
               "and contains\" table counts where the two part).", ""] if judged else []),
            *(["Tried where a goal is missed (each kept only where paired runs said so; the sections named hold "
               "the measurements):", "", *(f"- {TRIED[k]}" for k in dict.fromkeys(missed)), ""] if missed else [])]


def goal_metric(records: list[dict[str, Any]]) -> str:
    """The score the goals read for a task's records: set F1 for word lists (CWE), else `contains`."""
    return "f1" if any(r.get("scoring") == "set" for r in records) else "contains"


def plot_data(records: list[dict[str, Any]], patterns: list[str], wim: str) -> list[dict[str, Any]]:
    """Per task (in run order): its goal metric, each pattern's `Estimate`, and ``wim`` minus each other pattern
    on the same items (`Paired`; patterns ``wim`` shares no item with are left out)."""
    from marginalia.bench.report import estimate, metric_value, paired

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


#: what was tried for each kind of goal missed, and the BENCHMARKS.md sections that measured it
TRIED = {
    "versus lc": "WiM against long context: where WiM says what a margin is (`instructions`: intro or each margin's "
                 "prompt), what a margin copies (`margin_style`), the answer's form (`answer-style`), kept "
                 "margins as written or as their evidence sentences (`kept_as`), a judge rule for questions of "
                 "several clauses (judge ablation, MultiHop-RAG), yes/no questions asked again (`yes_no`); offline on "
                 "the 8k records, WiM declining to answer when it kept no margin (it gains MultiHop-RAG's "
                 "unanswerable questions and loses more on HotpotQA and SQuAD; not built).",
    "versus rag": "WiM against RAG: the same changes as against long context; RAG's top-k and chunk size are "
                  "the run's config.",
    "aggregation": "Aggregation (CWE): list margins copied from the part just read (`margin_decoding`), their "
                   "items tallied across notes (`tally_lists`, `tally_only`): the aggregation and "
                   "aggregation-lists-8k sections.",
    "precision": "Kept-margin precision: topicality thresholds from 0.2 to 0.4, the model's own P(YES) weighed "
                 "in (`combined`; on HotpotQA it ranks answer-bearing margins no better than chance), a multi-hop "
                 "link between passages (`linked_topic`): the relevance-check sections; and a rule that a margin "
                 "naming the question's subject must draw on a sentence that names it (offline, `relevance_check.py "
                 "evaluate --baseline`; not kept: it lost correct multi-hop margins). HotpotQA's distractors are "
                 "chosen to share the question's words, which a check on the text read cannot tell from the gold "
                 "passages.",
    "recall": "Kept-margin recall: the same relevance-check sections; a bare answer copied from the text is "
              "kept without the question's words beside it only when its sentence holds enough of them. Offline "
              "on the 8k records: a repeated note dropped only when it adds no new word (few of the notes that "
              "rule would keep hold a gold answer the kept ones lack; not built).",
}


if __name__ == "__main__":
    main()
