"""benchmarks/routing.py: the router worked out offline from stored answers, its goals, and its section."""

from __future__ import annotations

from typing import Any

from benchmark_scripts import load


def record(pattern: str, contains: float, seconds: float) -> dict[str, Any]:
    return {"pattern": pattern, "scoring": "qa", "scores": {"contains": contains}, "seconds": seconds}


def line(item: str, support: float | None, abstains: bool = False, gathers: bool = False) -> dict[str, Any]:
    return {"task": "t", "item_id": item, "signals": {"support": support, "retrieval": 0.5},
            "abstains": abstains, "gathers": gathers}


# item: (rag right?, wim right?) and the RAG answer's support
RUNS = {("t", "a"): {"rag": record("rag", 1, 4), "wim": record("wim", 0, 100), "lc-own": record("lc-own", 0, 80)},
        ("t", "b"): {"rag": record("rag", 0, 4), "wim": record("wim", 1, 100), "lc-own": record("lc-own", 1, 80)},
        ("t", "c"): {"rag": record("rag", 0, 6), "wim": record("wim", 1, 100), "lc-own": record("lc-own", 0, 80)},
        ("t", "d"): {"rag": record("rag", 1, 6), "wim": record("wim", 1, 100), "lc-own": record("lc-own", 1, 80)}}
LINES = [line("a", 1.0), line("b", 0.2), line("c", 0.9), line("d", 0.1, abstains=True)]


def test_offline_keeps_rag_where_supported_and_takes_wims_score_where_it_escalates():
    routing = load("routing")
    at = routing.offline(LINES, RUNS, "support", 0.5)["t"]
    # a and c stand (support ≥ 0.5); b escalates (0.2), d escalates (its answer abstains)
    assert at["score"] == (1 + 1 + 0 + 1) / 4
    assert at["seconds"] == (4 + (4 + 100) + 6 + (6 + 100)) / 4
    assert at["escalated"] == 0.5
    assert (at["kept_worse"], at["escalated_worse"]) == (1, 0)  # c kept, though WiM had it right
    everything = routing.offline(LINES, RUNS, "support", 1.01)["t"]
    assert everything["escalated"] == 1.0 and everything["score"] == 0.75


def test_goals_compare_with_the_best_single_pattern_and_half_of_wims_cost():
    routing = load("routing")
    singles = routing.singles(LINES, RUNS)
    assert singles["t"]["wim"]["score"] == 0.75 and singles["t"]["rag"]["score"] == 0.5
    goals = routing.goals(singles, routing.offline(LINES, RUNS, "support", 0.5))
    assert goals["tasks"]["t"] == {"auto": 0.75, "best": "wim", "best_score": 0.75, "met": True}
    assert goals["cost_ratio"] == round(((4 + 104 + 6 + 106) / 4) / 100, 3) and goals["cost_met"] is False
    missed = routing.goals(singles, routing.offline(LINES, RUNS, "support", 0.0))  # only d escalates
    assert missed["tasks"]["t"]["met"] is False and missed["cost_met"] is True


def test_the_section_says_which_goal_was_missed_and_by_how_much():
    routing = load("routing")
    singles = routing.singles(LINES, RUNS)
    at = routing.offline(LINES, RUNS, "support", 0.0)
    numbers = {"singles": singles, "items": 4, "signals_from": "signals",
               "sweeps": {"support": [{"threshold": t, "tasks": routing.offline(LINES, RUNS, "support", t)}
                                      for t in (0.0, 0.5, 1.0)]},
               "default": {"signal": "support", "threshold": 0.0, "tasks": at}, "cwe_from": None,
               "goals": routing.goals(singles, at)}
    text = "\n".join(routing.section({"numbers": numbers}))
    assert "missed on t 0.50 against wim's 0.75 (short by 0.23" in text
    assert "Support ≥ 0.5 holds every QA task's goal, escalating t 50%." in text
    assert "| t (4) | 0.50 | 0.75 | 0.50 | 0.50 | 25% | – |" in text


def test_cwe_comes_from_the_live_auto_run_where_its_export_holds_one(tmp_path, monkeypatch):
    import json

    import pytest

    routing = load("routing")
    monkeypatch.setattr(routing, "MEASUREMENTS", tmp_path)
    summary = {"wim": "wim", "lc": "lc-own", "tasks": [{"task": "cwe", "patterns": {
        "wim": {"n": 12, "score": {"mean": 0.36}, "cost": {"seconds": 447.0}},
        "lc-own": {"n": 12, "score": {"mean": 0.05}, "cost": {"seconds": 161.0}}}}]}
    (tmp_path / "agg.json").write_text(json.dumps({"numbers": summary}))
    stored = routing.aggregate_task("agg")  # no export: the summary's WiM stands for both
    assert stored["auto"]["seconds"] == 447.0 and stored["singles"]["lc-own"]["score"] == 0.05

    def auto(item: str, f1: float, seconds: float, taken: str = "wim",
             reason: str = "the question gathers over the whole document") -> dict:
        return {"schema": 2, "task": "cwe", "item_id": item, "pattern": "auto", "kind": "auto", "status": "ok",
                "scoring": "set", "scores": {"f1": f1}, "seconds": seconds,
                "route": {"taken": taken, "reason": reason, "signals": {}}}

    (tmp_path / "agg").mkdir()
    results = tmp_path / "agg" / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in (auto("a", 0.4, 150), auto("b", 0.2, 160))))
    live = routing.aggregate_task("agg")
    assert live["auto"]["score"] == pytest.approx(0.3) and live["auto"]["seconds"] == 155
    assert live["singles"]["wim"]["seconds"] == 155 and live["singles"]["lc-own"]["seconds"] == 161.0
    assert live["source"] == "agg (live auto)"
    with results.open("a") as f:  # an answer RAG kept is not WiM's reading: refused, not averaged in
        f.write(json.dumps(auto("c", 0.0, 5, taken="rag", reason="RAG's answer stands")) + "\n")
    with pytest.raises(SystemExit, match="not every CWE question went to WiM at once"):
        routing.aggregate_task("agg")


def test_the_timing_check_sets_the_stored_wim_seconds_against_fresh_ones(tmp_path):
    import json

    routing = load("routing")
    fresh = [{"task": "t", "item_id": i, "pattern": "wim", "kind": "wim", "status": "ok", "scoring": "qa",
              "scores": {"contains": 1}, "seconds": s} for i, s in (("a", 50), ("b", 25))]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in fresh))
    check = routing.timing_check(tmp_path, RUNS)
    assert check["items"] == 2 and check["ratio"] == (100 / 50 + 100 / 25) / 2
    assert check["stored_seconds"] == 100 and check["fresh_seconds"] == 37.5
    assert (check["lowest"], check["highest"]) == (2.0, 4.0)
    singles = routing.singles(LINES, RUNS)
    autos = routing.offline(LINES, RUNS, "support", 0.5)
    # the QA task's seconds, auto's and WiM's alike, divided by one ratio: their quotient is unchanged
    assert round(routing.checked_cost(singles, autos, 3.0), 3) == routing.goals(singles, autos)["cost_ratio"]


def test_the_support_signal_section_sets_one_sentence_beside_one_or_two():
    signals = load("routing_signals")
    rule = {"score": 0.4, "seconds": 50.0, "escalated": 3, "picked_better": 4}
    task = {"items": 30, "rag": 0.4, "wim": 0.4, "oracle": 0.5, "items_where_they_differ": 6,
            "rules": {"one sentence, support >= 0.5": {**rule, "score": 0.37},
                      "one or two sentences, support >= 0.5": {**rule, "score": 0.43, "picked_better": 5}}}
    m = {"name": "routing_signals-quality", "benchmark": "routing_signals", "command": "c", "commit": "abc",
         "machine": "m", "date": "2026-12-06T00:00:00Z", "numbers": {"run": "quality", "tasks": {"multihop": task}}}
    text = "\n".join(signals.together([m]))
    assert "| quality: multihop (30) | 0.40 | 0.40 | 0.50 | 0.37 · 50 s · 4/6 | 0.43 · 50 s · 5/6 |" in text
    (row,) = signals.summary(m)
    assert row[0].endswith("(quality)") and row[1] == "multihop 0.37→0.43 (oracle 0.50)"
