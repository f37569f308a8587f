"""The benchmark report: score tables with 95% confidence intervals, cost per pattern, and plots.

`write_report` reads a run folder (``run.json``, ``results.jsonl``, ``disagreements.jsonl``) and writes
``report.md`` and PNG plots. The primary score of a task is the judge's accuracy where a judge gave
verdicts, else the lenient ``contains`` score (or set F1, F1, EM: the first the metrics gave).
Scores average over answered items; overflow and error results are counted apart. Its parts: `statistics`,
`analysis` (what the results say), `tables` (the markdown) and `plots`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..files import atomic_write_text
from .analysis import find_run, in_order, load_run, pattern_order
from .plots import plot_cost, plot_recommendations, plot_task
from .recommend import recommendations, shared_readings
from .tables import render_markdown

REPORT = "report.md"


@dataclass(frozen=True)
class ReportFiles:
    report: Path
    plots: tuple[Path, ...]


def write_report(run: str | Path, out: str | Path | None = None, home: str | Path | None = None,
                 plots: bool = True, rescore: bool = False) -> ReportFiles:
    """Render ``report.md`` and the plots for a run folder (or a run name under the home).

    Args:
        run: a run folder, or a run's name under ``<home>/bench/runs``.
        out: where to write (default: the run folder).
        home: marginalia's home, for run names.
        plots: draw the PNG plots (needs matplotlib).
        rescore: score the stored answers again with today's metrics (see `load_run`).

    Raises:
        UserError: no such run, or it has no results yet.
        MissingDependency: matplotlib is missing and plots were asked for.
    """
    folder = find_run(run, home)
    data = load_run(folder, rescore_answers=rescore)
    if not data.records:
        raise UserError(f"{folder} has no results yet; run the benchmark first (marginalia bench run CONFIG)")
    target = Path(out).expanduser() if out is not None else folder
    target.mkdir(parents=True, exist_ok=True)
    patterns = pattern_order(data)
    drawn: dict[str, list[str]] = {}
    if plots:
        for task in in_order(r["task"] for r in data.records):
            drawn[task] = plot_task([r for r in data.records if r["task"] == task], task, patterns, target)
        drawn["cost"] = plot_cost(data.records, patterns, target)
        drawn["recommendation"] = plot_recommendations(
            recommendations(data.records, patterns, shared_readings(data)), target)
    text = render_markdown(data, drawn)
    path = target / REPORT
    atomic_write_text(path, text)
    return ReportFiles(path, tuple(target / n for names in drawn.values() for n in names))
