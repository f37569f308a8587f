"""The run report's plots (matplotlib): score against the gold's position, per length and pattern, with 95%
intervals; a position x length heatmap per pattern; tokens and seconds per answer; score against seconds per
answer for the recommendation."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import MissingDependency
from .analysis import cost_rows, in_order, position, primary_metric, sort_key, values_of
from .recommend import Recommendation
from .statistics import Estimate, estimate
from .tables import fmt


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _figure(**kwargs: Any) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingDependency("matplotlib (for the report's plots)", "pip install 'marginalia[bench]'") from exc
    return Figure(**kwargs)


def plot_task(records: list[dict[str, Any]], task: str, patterns: Sequence[str], out: Path) -> list[str]:
    """Score vs position (a panel per length, a line per pattern) and a position x length heatmap per pattern."""
    import numpy as np

    metric = primary_metric(records)
    label = "judge accuracy" if metric == "judge" else metric
    pos_name = "depth" if any(r.get("depth") is not None for r in records) else "distractor share"
    lengths = sorted(in_order(r.get("target_tokens") for r in records), key=sort_key)
    positions = sorted(in_order(position(r) for r in records), key=sort_key)
    names = []

    def at(p: str, length: Any, pos: Any = ...) -> Estimate:
        return estimate(values_of([r for r in records if r["pattern"] == p and r.get("target_tokens") == length
                                 and (pos is ... or position(r) == pos)], metric))

    def mean_at(p: str, length: Any, pos: Any) -> float:
        return at(p, length, pos).mean

    def bars(ax: Any, ests: list[Estimate], xs: Any, label: str | None) -> None:
        means = [e.mean for e in ests]
        errors = [[max(e.mean - e.low, 0.0) for e in ests], [max(e.high - e.mean, 0.0) for e in ests]]
        ax.bar(xs, means, width=0.8 / len(patterns), yerr=errors, capsize=3, label=label)

    xs = [x if x is not None else 0.0 for x in positions]
    if len(positions) == 1:  # one position: bars per length with their 95% intervals, not lone points
        fig = _figure(figsize=(2.2 + 1.4 * len(lengths) * max(len(patterns), 1) / 2, 3.4), layout="constrained")
        ax = fig.subplots()
        for k, p in enumerate(patterns):
            ests = [at(p, length) for length in lengths]
            if any(e.n for e in ests):
                bars(ax, ests, [i + (k - (len(patterns) - 1) / 2) * 0.8 / len(patterns)
                                for i in range(len(lengths))], p)
        ax.set_xticks(range(len(lengths)), [f"{v} tokens" if v is not None else task for v in lengths])
        ax.set_title(task + (f", {pos_name} {fmt(positions[0])}" if positions[0] is not None else ""))
        ax.set_ylabel(f"{label} (95% CI)")
        ax.set_ylim(0.0, 1.03)
        ax.grid(alpha=0.3, axis="y")
        if ax.patches:
            ax.legend(loc="best", fontsize="small")
        else:
            ax.text(0.5, 0.5, "no answers\n(overflow or error)", ha="center", va="center", transform=ax.transAxes,
                    color="gray")
    else:  # a line per pattern over the positions, each point with its 95% interval (nudged apart)
        fig = _figure(figsize=(4.2 * len(lengths), 3.4), layout="constrained")
        axes = fig.subplots(1, len(lengths), squeeze=False)[0]
        span = (max(xs) - min(xs)) or 1.0
        for ax, length in zip(axes, lengths, strict=True):
            for k, p in enumerate(patterns):
                ests = [at(p, length, pos) for pos in positions]
                if all(e.n == 0 for e in ests):
                    continue
                nudge = (k - (len(patterns) - 1) / 2) * 0.012 * span
                ax.errorbar([x + nudge for x in xs], [e.mean for e in ests],
                            yerr=[[max(e.mean - e.low, 0.0) if e.n else math.nan for e in ests],
                                  [max(e.high - e.mean, 0.0) if e.n else math.nan for e in ests]],
                            marker="o", capsize=3, label=p)
            if not ax.lines:
                ax.text(0.5, 0.5, "no answers\n(overflow or error)", ha="center", va="center",
                        transform=ax.transAxes, color="gray")
            ax.set_title(f"{task}, {length} tokens" if length is not None else task)
            ax.set_xlabel(pos_name)
            ax.set_ylabel(f"{label} (95% CI)")
            ax.set_ylim(-0.03, 1.03)
            ax.grid(alpha=0.3)
        axes[0].legend(loc="best", fontsize="small")
    name = f"score-{_safe(task)}.png"
    fig.savefig(out / name, dpi=110)
    names.append(name)
    if len(positions) == 1 or len(lengths) == 1:  # a heatmap of one row or column says nothing more
        return names

    for p in patterns:
        grid = np.array([[mean_at(p, length, pos) for length in lengths] for pos in positions], dtype=float)
        if np.isnan(grid).all():
            continue
        fig = _figure(figsize=(1.6 + 1.3 * len(lengths), 1.2 + 0.55 * len(positions)), layout="constrained")
        ax = fig.subplots()
        image = ax.imshow(np.ma.masked_invalid(grid), vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(lengths)), [str(v) for v in lengths])
        ax.set_yticks(range(len(positions)), [fmt(v) for v in positions])
        ax.set_xlabel("length (tokens)")
        ax.set_ylabel(pos_name)
        ax.set_title(f"{task}: {p}")
        for i, pos in enumerate(positions):
            for j, length in enumerate(lengths):
                if not math.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center",
                            color="white" if grid[i, j] < 0.6 else "black", fontsize="small")
                elif any(r["pattern"] == p and r.get("target_tokens") == length and position(r) == pos
                         and r.get("status") == "overflow" for r in records):
                    ax.text(j, i, "overflow", ha="center", va="center", color="gray", fontsize="small")
        fig.colorbar(image, ax=ax, label=label)
        name = f"heatmap-{_safe(task)}-{_safe(p)}.png"
        fig.savefig(out / name, dpi=110)
        names.append(name)
    return names


def plot_cost(records: list[dict[str, Any]], patterns: Sequence[str], out: Path) -> list[str]:
    """Bars per pattern: mean prefilled and generated tokens, and mean seconds per item."""
    costs = [c for c in cost_rows(records, patterns) if c["n"]]
    if not costs:
        return []
    fig = _figure(figsize=(4 + 1.2 * len(costs), 3.4), layout="constrained")
    tokens, seconds = fig.subplots(1, 2)
    xs = range(len(costs))
    labels = [c["pattern"] for c in costs]
    bottom = [0.0] * len(costs)
    for key, text in (("prefilled_context", "prefilled context"), ("prefilled_other", "prefilled other"),
                      ("generated", "generated")):
        if any(c[key] is None for c in costs):  # a model server that did not say: no bar, not a zero
            text += " (not reported by the server for some)"
        vals = [c[key] or 0.0 for c in costs]
        tokens.bar(xs, vals, bottom=bottom, label=text)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    tokens.set_xticks(list(xs), labels)
    tokens.set_ylabel("tokens per item")
    tokens.legend(fontsize="small")
    seconds.bar(xs, [c["seconds"] or 0.0 for c in costs], color="tab:gray")
    seconds.set_xticks(list(xs), labels)
    seconds.set_ylabel("seconds per item")
    name = "cost.png"
    fig.savefig(out / name, dpi=110)
    return [name]


def plot_recommendations(recommendations: Sequence[Recommendation], out: Path,
                         name: str = "recommendation.png") -> list[str]:
    """Score against seconds per answer, a panel per kind of question: each reading a point with its score's
    95% interval, the recommended one ringed. Returns the file names written."""
    shown = [r for r in recommendations if any(s.seconds is not None for s in r.readings)]
    if not shown:
        return []
    fig = _figure(figsize=(3.6 * len(shown) + 0.6, 3.4), layout="constrained")
    axes = fig.subplots(1, len(shown), squeeze=False)[0]
    for ax, rec in zip(axes, shown, strict=True):
        for s in rec.readings:
            if s.seconds is None:
                continue
            below, above = max(0.0, s.score - s.low), max(0.0, s.high - s.score)  # a bound may round past the mean
            ax.errorbar([s.seconds], [s.score], yerr=[[below], [above]], fmt="o", capsize=3, label=s.reading)
            if s.reading == rec.chosen:
                ax.scatter([s.seconds], [s.score], s=200, facecolors="none", edgecolors="black")
        ax.set_xscale("log")
        ax.set_title(f"{rec.kind}: {rec.chosen}", fontsize="medium")
        ax.set_xlabel("seconds per answer")
        ax.set_ylabel("score")
        ax.legend(fontsize="small")
    fig.savefig(out / name, dpi=110)
    return [name]
