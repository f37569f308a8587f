"""benchmarks/quality.py's goals: each goal's verdict from paired differences, and the judge's view beside it."""

from __future__ import annotations

from typing import Any

from benchmark_scripts import load


def record(item: int, pattern: str, contains: float, verdict: str | None) -> dict[str, Any]:
    return {"task": "hotpotqa", "item_id": f"hotpotqa/{item}", "example_id": str(item), "pattern": pattern,
            "status": "ok", "scores": {"contains": contains},
            "judge": {"verdict": verdict} if verdict else None, "question": "Q?", "answers": ["a"], "margins": []}


def test_goals_say_whether_met_and_what_the_judge_says() -> None:
    quality = load("quality")
    # wim right on all 20 items, long context on 10, rag on none; the judge thinks long context was right on all
    records = [record(i, "wim", 1.0, "correct") for i in range(20)]
    records += [record(i, "lc-own", float(i % 2), "correct") for i in range(20)]
    records += [record(i, "rag", 0.0, "wrong") for i in range(20)]
    lines = quality.goal_lines(records, ["rag", "wim", "lc-own"], tasks={"hotpotqa"})
    text = "\n".join(lines)
    assert "| hotpotqa: wim ≥ lc-own +0.05 (contains, mean), interval above zero | +0.50 [" in text
    row = next(line for line in lines if line.startswith("| hotpotqa: wim ≥ lc-own"))
    assert row.endswith("| met |")
    assert "By the model judge's verdicts instead of `contains`: hotpotqa wim − lc-own +0.00 [+0.00, +0.00] " \
           "(20 items); hotpotqa wim − rag +1.00" in text
    # unjudged: no judge line; long context as good as wim: the goal is missed, and what was tried is listed
    records = [{**r, "judge": None, "scores": {"contains": 1.0}} for r in records]
    lines = quality.goal_lines(records, ["rag", "wim", "lc-own"], tasks={"hotpotqa"})
    text = "\n".join(lines)
    assert "By the model judge" not in text
    assert "| +0.00 [+0.00, +0.00] on 20 items | not met (short by 0.05) |" in text
    assert quality.TRIED["versus lc"] in text


def test_the_figure_draws_each_task_with_its_goal_metric_and_paired_differences(tmp_path: Any) -> None:
    quality = load("quality")
    records = [record(i, "wim", 1.0, None) for i in range(10)]
    records += [record(i, "lc-own", float(i < 4), None) for i in range(10)]
    records += [record(i, "rag", 1.0, None) for i in range(5)]  # rag answered only half the items
    records += [{**record(i, p, 0.0, None), "task": "cwe", "item_id": f"cwe/{i}", "scoring": "set",
                 "scores": {"contains": 1.0, "f1": f1}} for i in range(6) for p, f1 in (("wim", 0.5), ("lc-own", 0.25))]
    data = quality.plot_data(records, ["rag", "wim", "lc-own"], "wim")
    assert [(t["task"], t["metric"]) for t in data] == [("hotpotqa", "contains"), ("cwe", "f1")]
    hotpot, cwe = data
    assert hotpot["scores"]["wim"].mean == 1.0 and hotpot["scores"]["lc-own"].mean == 0.4
    assert hotpot["diffs"]["lc-own"].mean == 0.6 and hotpot["diffs"]["lc-own"].items == 10
    assert hotpot["diffs"]["rag"].items == 5 and hotpot["diffs"]["rag"].mean == 0.0  # paired on shared items only
    assert "rag" not in cwe["scores"] and cwe["diffs"]["lc-own"].mean == 0.25  # F1, not contains

    path = tmp_path / "figures" / "quality.png"
    assert quality.plot(records, ["rag", "wim", "lc-own"], "wim", path, "test run")
    import matplotlib.image

    assert matplotlib.image.imread(path).shape[2] in (3, 4)
    unanswered = [{**r, "status": "error"} for r in records]
    assert not quality.plot(unanswered, ["rag", "wim", "lc-own"], "wim", tmp_path / "none.png", "empty")
    assert not (tmp_path / "none.png").exists()
