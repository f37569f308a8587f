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
    routing, report = load("routing"), load("report")
    singles = routing.singles(LINES, RUNS)
    at = routing.offline(LINES, RUNS, "support", 0.0)
    numbers = {"singles": singles, "items": 4, "signals_from": "signals",
               "sweeps": {"support": [{"threshold": t, "tasks": routing.offline(LINES, RUNS, "support", t)}
                                      for t in (0.0, 0.5, 1.0)]},
               "default": {"signal": "support", "threshold": 0.0, "tasks": at}, "cwe_from": None,
               "goals": routing.goals(singles, at)}
    text = "\n".join(report.routing_section({"numbers": numbers}))
    assert "missed on t 0.50 against wim's 0.75 (short by 0.23" in text
    assert "Support ≥ 0.5 holds every QA task's goal, escalating t 50%." in text
    assert "| t (4) | 0.50 | 0.75 | 0.50 | 0.50 | 25% | – |" in text
