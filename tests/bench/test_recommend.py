"""The recommendation: per kind of question, the cheapest reading within the best one's paired interval."""

from __future__ import annotations

from pathlib import Path

from marginalia.bench.recommend import recommend
from marginalia.bench.report import write_report
from marginalia.bench.statistics import bootstrap, estimate
from test_bench_report import INFO, PNG, fixture_run, result


def interval(values):
    est = estimate(values)
    return est.low, est.high


def scores(values: list[float]) -> dict[str, float]:
    return {f"q{i}": v for i, v in enumerate(values)}


def test_the_cheapest_reading_within_the_best_ones_interval_is_chosen():
    best = [1.0] * 12 + [0.0] * 4
    close = [1.0] * 11 + [0.0] * 5  # one item worse: within the paired interval
    far = [0.0] * 16
    rec = recommend("hotpotqa", {"wim": scores(best), "rag": scores(close), "lc": scores(far)},
                    {"wim": 90.0, "rag": 5.0, "lc": 1.0}, bootstrap, interval)
    assert rec is not None and (rec.best, rec.chosen) == ("wim", "rag")
    by = {r.reading: r for r in rec.readings}
    assert by["rag"].within and not by["lc"].within  # lc is cheaper but clearly worse
    assert by["rag"].difference[0] == -1 / 16
    line = rec.line()
    assert line.startswith("- **hotpotqa**: read with **rag** (within wim's interval (-0.06 [")
    assert "wim 0.75 at 90.0 s; rag 0.69 at 5.0 s; lc 0.00 at 1.0 s" in line


def test_the_best_is_chosen_when_nothing_cheaper_is_within_and_unknown_seconds_never_win():
    rec = recommend("squad", {"wim": scores([1.0] * 16), "rag": scores([0.0] * 16), "lc": scores([1.0] * 16)},
                    {"wim": 50.0, "rag": 1.0, "lc": None}, bootstrap, interval)
    assert rec is not None and rec.chosen == "wim" and "the best score" in rec.line()
    assert recommend("empty", {"wim": {}}, {}, bootstrap, interval) is None


def test_the_report_opens_with_a_recommendation_per_task_and_draws_it(tmp_path: Path):
    records = []
    for n in range(10):
        records.append(result("wim", 1000, 0.5, 1.0, 1.0, n=n, seconds=20.0))
        records.append(result("lc", 1000, 0.5, float(n != 0), 1.0, n=n, seconds=2.0))
        records.append(result("wim", 1000, 0.5, 1.0, 1.0, n=n, seconds=20.0, task="hotpotqa"))
        records.append(result("lc", 1000, 0.5, 0.0, 0.0, n=n, seconds=2.0, task="hotpotqa"))
    folder = fixture_run(tmp_path / "run", records, INFO)
    files = write_report(folder)
    text = files.report.read_text()
    opening = text[:text.index("## Task")]
    assert "## Recommendation" in opening
    assert "- **squad**: read with **lc** (within wim's interval" in opening
    assert "- **hotpotqa**: read with **wim** (the best score)" in opening
    plot = folder / "recommendation.png"
    assert plot in files.plots and plot.read_bytes()[:8] == PNG and "![recommendation.png]" in opening


def test_a_pattern_answering_from_anothers_reading_costs_that_reading_too(tmp_path: Path):
    records = []
    for n in range(10):
        records.append(result("wim", 1000, 0.5, 1.0, 1.0, n=n, seconds=20.0))
        records.append(result("lc", 1000, 0.5, 1.0, 1.0, n=n, seconds=2.0))
    info = {**INFO, "config": {**INFO["config"], "patterns": [{"name": "wim", "kind": "wim"},
                                                              {"name": "lc", "kind": "lc", "reading": "wim"}]}}
    text = write_report(fixture_run(tmp_path / "run", records, info), plots=False).report.read_text()
    assert "- **squad**: read with **wim** (the best score). Each reading: wim 1.00 at 20.0 s; lc 1.00 at 22.0 s" \
        in text
