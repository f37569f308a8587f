"""benchmarks/quality.py: a run's numbers per task (scores, paired differences, the judge's view), its goals, its
figure."""

from __future__ import annotations

from typing import Any

from benchmark_scripts import load


def record(item: int, pattern: str, contains: float, verdict: str | None) -> dict[str, Any]:
    return {"task": "hotpotqa", "item_id": f"hotpotqa/{item}", "example_id": str(item), "pattern": pattern,
            "status": "ok", "scores": {"contains": contains},
            "judge": {"verdict": verdict} if verdict else None, "question": "Q?", "answers": ["a"], "margins": []}


def test_goals_say_whether_met() -> None:
    quality = load("quality")
    # wim right on all 20 items, long context on 10, rag on none
    records = [record(i, "wim", 1.0, "correct") for i in range(20)]
    records += [record(i, "lc-own", float(i % 2), "correct") for i in range(20)]
    records += [record(i, "rag", 0.0, "wrong") for i in range(20)]
    goals = quality.goals(records, ["rag", "wim", "lc-own"], tasks={"hotpotqa"})
    first = goals[0]
    assert first["goal"] == "hotpotqa: wim ≥ lc-own +0.05 (contains, mean), interval above zero"
    assert first["measured"].startswith("+0.50 [") and first["verdict"] == "met"
    assert goals[1]["goal"] == "hotpotqa: wim ≥ rag (contains, mean)" and goals[1]["verdict"] == "met"
    # long context as good as wim: the goal is missed by its margin
    records = [{**r, "judge": None, "scores": {"contains": 1.0}} for r in records]
    goals = quality.goals(records, ["rag", "wim", "lc-own"], tasks={"hotpotqa"})
    assert goals[0]["measured"] == "+0.00 [+0.00, +0.00] on 20 items"
    assert goals[0]["verdict"] == "not met (short by 0.05)"


def test_a_run_is_summarised_per_task_with_wims_paired_differences_and_the_judges() -> None:
    quality, report = load("quality"), load("report")
    # the judge thinks long context was right on all 20 items, where `contains` says half
    records = [record(i, "wim", 1.0, "correct") for i in range(20)]
    records += [record(i, "lc-own", float(i % 2), "correct") for i in range(20)]
    records += [record(i, "rag", 0.0, "wrong") for i in range(20)]
    config = {"name": "tiny", "tasks": [{"dataset": "hotpotqa", "limit": 20, "lengths": [8192]}],
              "patterns": [{"kind": "rag"}, {"kind": "wim"}, {"kind": "lc", "name": "lc-own"}]}
    info = {"models": {"generator": {"spec": "smollm2"}}}
    numbers = quality.summarise(records, ["rag", "wim", "lc-own"], config, info)
    assert (numbers["wim"], numbers["lc"], numbers["rag"], numbers["lengths"]) == ("wim", "lc-own", "rag", [8192])
    task = numbers["tasks"][0]
    assert (task["task"], task["metric"], task["planned"], task["done"]) == ("hotpotqa", "contains", 20, 20)
    assert task["patterns"]["lc-own"]["score"]["mean"] == 0.5 and task["patterns"]["lc-own"]["judge"]["mean"] == 1.0
    assert task["paired"]["lc-own"]["mean"] == 0.5 and task["paired"]["rag"]["mean"] == 1.0
    assert task["paired_judge"]["lc-own"]["mean"] == 0.0
    assert [g["verdict"] for g in numbers["goals"][:2]] == ["met", "met"]
    common = load("_common")
    stored = common.measurement("quality", numbers, name="tiny", command="marginalia bench run configs/bench/tiny.toml",
                                commit="abc1234", machine_text="2 cores", date="2026-11-30")
    section = report.section(common.plain(stored))
    assert "| hotpotqa (20) | 0.00 / 0.00 · – tok · – s | 1.00 / 1.00 · – tok · – s | 0.50 / 1.00 · – tok · – s |" \
        in section


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
