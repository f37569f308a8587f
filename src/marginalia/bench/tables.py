"""The run report's markdown: per task, the score tables with 95% intervals, patterns compared on the same items,
judge against ``contains``, yes/no answers, the cost per answer and the margins kept."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from .analysis import (
    RunData,
    cores_text,
    cost_rows,
    in_order,
    is_yes_no,
    margin_counts,
    metric_value,
    paired,
    pattern_order,
    position,
    primary_metric,
    run_machines,
    says_neither,
    sort_key,
    values_of,
)
from .folder import DISAGREEMENTS, RESULTS
from .recommend import recommendation_lines, recommendations, shared_readings
from .statistics import estimate

SECONDARY = ("em", "f1", "contains", "set_f1")


def fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _score_row(group: list[dict[str, Any]], metric: str, extra: Sequence[str]) -> list[str]:
    ok = [r for r in group if r.get("status") == "ok"]
    est = estimate(values_of(ok, metric))
    row = [str(est.n), est.format()]
    for key in extra:
        vals = values_of(ok, key)
        row.append(fmt(sum(vals) / len(vals)) if vals else "–")
    if metric == "judge":
        row.append(str(sum((r.get("judge") or {}).get("verdict") == "unjudged" for r in ok)))
    row.append(str(sum(r.get("status") == "overflow" for r in group)))
    row.append(str(sum(r.get("status") == "error" for r in group)))
    return row


def task_tables(records: list[dict[str, Any]], patterns: Sequence[str]) -> tuple[str, str, list[str]]:
    """Markdown for one task: the pattern x length x position table and the pooled pattern x length table."""
    metric = primary_metric(records)
    keys = in_order(k for r in records for k in (r.get("scores") or {}))
    extra = [k for k in SECONDARY if k in keys and k != metric] + \
        [k for k in keys if k not in SECONDARY and k != metric]
    pos_name = "depth" if any(r.get("depth") is not None for r in records) else \
        "distractors" if any(r.get("distractor_fraction") is not None for r in records) else "position"
    tail = [*extra, *(["unjudged"] if metric == "judge" else []), "overflow", "error"]
    label = "judge accuracy" if metric == "judge" else metric
    lengths = sorted(in_order(r.get("target_tokens") for r in records), key=sort_key)
    positions = sorted(in_order(position(r) for r in records), key=sort_key)
    rows = []
    pooled = []
    for p in patterns:
        for length in lengths:
            group = [r for r in records if r["pattern"] == p and r.get("target_tokens") == length]
            if not group:
                continue
            pooled.append([p, str(length), *_score_row(group, metric, extra)])
            for pos in positions:
                cell = [r for r in group if position(r) == pos]
                if cell:
                    rows.append([p, str(length), fmt(pos), *_score_row(cell, metric, extra)])
    detail = markdown_table(["pattern", "length", pos_name, "n", f"{label} (95% CI)", *tail], rows)
    summary = markdown_table(["pattern", "length", "n", f"{label} (95% CI)", *tail], pooled)
    return detail, summary, [label, pos_name]


def paired_rows(records: list[dict[str, Any]], patterns: Sequence[str], metric: str) -> list[list[str]]:
    """Each pair of patterns compared on the items both answered (`paired`), per length (wim patterns first)."""
    lengths = sorted(in_order(r.get("target_tokens") for r in records), key=sort_key)
    kinds = {r["pattern"]: r.get("kind") for r in records}
    patterns = sorted(patterns, key=lambda p: kinds.get(p) != "wim")  # wim first: "wim − lc", "wim − rag"
    rows = []
    for length in lengths:
        for i, a in enumerate(patterns):
            for b in patterns[i + 1:]:
                d = paired(records, a, b, metric, length)
                if d is None:
                    continue
                rows.append([f"{a} − {b}", str(length), str(d.items), f"{d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}]",
                             str(d.first_higher), str(d.second_higher),
                             f"{a} {d.reading}" if d.reading != "no clear difference" else d.reading])
    return rows


def agreement_rows(records: list[dict[str, Any]], patterns: Sequence[str]) -> list[list[str]]:
    """Where the judge and ``contains`` both scored an answer: how often they disagree, each way."""
    rows = []
    for p in patterns:
        both = [(metric_value(r, "judge"), metric_value(r, "contains")) for r in records if r["pattern"] == p]
        both = [(j, c) for j, c in both if j is not None and c is not None]
        if not both:
            continue
        judge_only = sum(j == 1.0 and c == 0.0 for j, c in both)
        contains_only = sum(j == 0.0 and c == 1.0 for j, c in both)
        rows.append([p, str(len(both)), f"{(judge_only + contains_only) / len(both):.2f}",
                     str(judge_only), str(contains_only)])
    return rows


def yes_no_rows(records: list[dict[str, Any]], patterns: Sequence[str]) -> list[list[str]]:
    """Per pattern: answers to yes/no questions, and those saying neither yes nor no (which ``contains``
    cannot score: they count as wrong)."""
    rows = []
    for p in patterns:
        group = [r for r in records if r["pattern"] == p and r.get("status") == "ok" and r.get("scoring") == "qa"
                 and is_yes_no(r)]
        if group:
            unscored = sum(says_neither(r) for r in group)
            rows.append([p, str(len(group)), str(unscored), f"{unscored / len(group):.2f}"])
    return rows


def task_cost_rows(records: list[dict[str, Any]], patterns: Sequence[str]) -> list[list[str]]:
    """Tokens and seconds per answer, per pattern and length, for one task."""
    rows = []
    for length in sorted(in_order(r.get("target_tokens") for r in records), key=sort_key):
        for c in cost_rows([r for r in records if r.get("target_tokens") == length], patterns):
            if c["n"]:
                rows.append([c["pattern"], str(length), str(c["n"]), fmt(c["prefilled_context"], 0),
                             fmt(c["prefilled_other"], 0), fmt(c["generated"], 1), fmt(c["seconds"], 2)])
    return rows


def margin_rows(records: list[dict[str, Any]], patterns: Sequence[str]) -> list[list[str]]:
    """`margin_counts` of each pattern that has any, as table rows."""
    rows = []
    for p in patterns:
        c = margin_counts(records, p)
        if c.answers:
            rows.append([p, str(c.answers), str(c.kept), fmt(c.precision), fmt(c.recall), fmt(c.copy_recall),
                         f"{c.found} of {c.asked}", fmt(c.on_gold / c.located if c.located else None),
                         fmt(c.relevant_precision)])
    return rows


def _header(data: RunData) -> list[str]:
    info = data.info
    config = info.get("config") or {}
    models = info.get("models") or {}
    gen = models.get("generator") or {}
    commit = info.get("commit")
    commit_text = "unknown (not a git checkout)" if not commit else \
        commit.get("commit", "?")[:12] + (" (with uncommitted changes)" if commit.get("dirty") else "")
    machine = info.get("machine") or {}
    statuses = {s: sum(r.get("status") == s for r in data.records) for s in ("ok", "overflow", "error")}
    lines = [
        f"# Benchmark report: {config.get('name') or data.folder.name}",
        "",
        f"- **model**: {gen.get('name', config.get('model', '?'))} ({gen.get('engine', '?')}, "
        f"device {gen.get('device', '?')}, window {gen.get('context_window', '?')} tokens)",
    ]
    if models.get("embedder"):
        lines.append(f"- **embedder** (rag): {models['embedder']}")
    judge = models.get("judge")
    if judge:
        lines.append(f"- **judge**: {judge.get('name')} ({judge.get('engine')})")
    if config.get("voting"):
        v = config["voting"]
        lines.append(f"- **voting**: medoid of {v['samples']} answers sampled at temperature {v['temperature']}")
    lines += [
        f"- **commit**: {commit_text}",
        f"- **started**: {info.get('started', '?')}",
        f"- **machine**: {cores_text(machine)} ({machine.get('cpu', '?')}), "
        f"{machine.get('ram_gb', '?')} GB RAM" + (f", GPU: {'; '.join(machine['gpus'])}" if machine.get("gpus")
                                                 else ""),
    ]
    machines = run_machines(info)
    if len(machines) > 1:  # a run carried from machine to machine (bench export / import)
        lines.append(f"- **machines**: answered on {len(machines)} machines ("
                     + "; ".join(f"{cores_text(m)}, {m.get('cpu', '?')}"
                                 + (f" ({m['vectors']})" if m.get("vectors") else "") for m in machines)
                     + "): its seconds per answer mix them")
    lines += [
        f"- **results**: {len(data.records)} ({statuses['ok']} answered, {statuses['overflow']} overflow, "
        f"{statuses['error']} error)",
    ]
    if data.rescored:
        lines.append(f"- **scores**: {data.rescored} answers scored again with today's metrics (their stored "
                     f"scores were computed by an older version; {RESULTS} keeps those)")
    judged = [r for r in data.records if r.get("judge")]
    if judged:
        unjudged = sum(r["judge"].get("verdict") == "unjudged" for r in judged)
        lines.append(f"- **judge verdicts**: {len(judged) - unjudged} judged, {unjudged} unjudged; "
                     f"{data.disagreements} disagreements with the lexical scores (see {DISAGREEMENTS})")
    lines += ["", "Scores average over answered items (95% confidence intervals: Wilson for 0/1 scores, "
              "bootstrap otherwise); overflow (the context did not fit the model's window) and error results "
              "are counted apart. Length is the target context size in the model's tokens."]
    return lines


def _subsection(level: str, title: str, text: str, header: Sequence[str], rows: list[list[str]]) -> list[str]:
    """A heading, a line saying what the table shows, and the table; nothing when there are no rows."""
    return ["", f"{level} {title}", "", text, "", markdown_table(header, rows)] if rows else []


def task_sections(records: list[dict[str, Any]], patterns: Sequence[str], level: str = "###") -> list[str]:
    """Markdown for one task beyond its score tables: patterns compared on the same items, judge against
    contains, cost per answer, margins kept (each where the records give it), under ``level`` headings."""
    metric = primary_metric(records)
    label = "judge accuracy" if metric == "judge" else metric
    lines = _subsection(
        level, f"Patterns compared on the same items ({label})",
        "The mean difference of the two patterns' scores on the items both answered, with a paired bootstrap 95% "
        "interval; a difference is clear when its interval excludes zero.",
        ["patterns", "length", "items", "difference (95% CI)", "first right, second not", "second right, first not",
         "reading"], paired_rows(records, patterns, metric))
    lines += _subsection(
        level, "Judge and contains",
        "Answers scored by both: the share where they disagree; the judge accepting an answer that holds no gold "
        "answer, and rejecting one that holds it.",
        ["pattern", "answers", "disagree", "judge right, contains wrong", "judge wrong, contains right"],
        agreement_rows(records, patterns))
    lines += _subsection(
        level, "Yes/no questions",
        "Answers to questions whose gold answer is yes or no, and those that say neither word: `contains` counts "
        "them wrong whatever they state.",
        ["pattern", "answers", "say neither yes nor no", "share"], yes_no_rows(records, patterns))
    lines += ["", f"{level} Cost per answer", "",
              markdown_table(["pattern", "length", "n", "prefilled context tokens", "prefilled other tokens",
                      "generated tokens", "seconds"], task_cost_rows(records, patterns))]
    lines += _subsection(
        level, "Margins kept",
        "Of the kept margins, the share holding a gold answer (precision); of the notes holding one, the share "
        "kept (recall: margins written with the same words are one note, kept when one copy is); the same for each "
        "copy apart; questions where one was written, and kept; of the kept margins, the share drawn from a "
        "gold passage (where results keep where each was found); of the kept margins, the share relevant: holding "
        "a gold answer or, for a question that needs several gold passages, drawn from one of them (a bridge "
        "fact). A dropped margin written before a gold passage "
        "was read (its answer from the model's memory) is not counted. Questions answered yes or no, or naming their "
        "own answer (\"who is older, A or B?\"), are left out: a margin holding their gold answer tells nothing.",
        ["pattern", "n", "kept", "precision", "recall", "recall, each copy", "questions with a kept answer",
         "kept from a gold passage", "precision, bridge facts counted"],
        margin_rows(records, patterns))
    return lines


def render_markdown(data: RunData, plots: dict[str, list[str]] | None = None) -> str:
    """The report's markdown; ``plots`` maps a section (task name, ``cost`` or ``recommendation``) to PNG file
    names."""
    plots = plots or {}
    patterns = pattern_order(data)
    lines = _header(data) + recommendation_lines(recommendations(data.records, patterns, shared_readings(data)),
                                                 plots.get("recommendation", []))
    for task in in_order(r["task"] for r in data.records):
        records = [r for r in data.records if r["task"] == task]
        detail, summary, (label, pos_name) = task_tables(records, patterns)
        lines += ["", f"## Task {task}", "", f"Primary score: **{label}**.", "",
                  f"### {label} by pattern and length", "", summary, "",
                  f"### {label} by pattern, length and {pos_name}", "", detail]
        lines += task_sections(records, patterns)
        for name in plots.get(task, []):
            lines += ["", f"![{name}]({name})"]
    costs = cost_rows(data.records, patterns)
    lines += ["", "## Cost per pattern", "", "Means per answered item (all tasks).", "",
              markdown_table(["pattern", "n", "prefilled context tokens", "prefilled other tokens", "generated tokens",
                      "seconds", "judge seconds", "overflow", "error"],
                     [[c["pattern"], str(c["n"]), fmt(c["prefilled_context"], 0), fmt(c["prefilled_other"], 0),
                       fmt(c["generated"], 1), fmt(c["seconds"], 2), fmt(c["judge_seconds"], 2),
                       str(c["overflow"]), str(c["error"])] for c in costs])]
    for name in plots.get("cost", []):
        lines += ["", f"![{name}]({name})"]
    return "\n".join(lines) + "\n"
