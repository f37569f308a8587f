"""benchmarks/calibration.py: acceptance by rule, the two halves, and the held-out verdict."""

from __future__ import annotations

from typing import Any

from benchmark_scripts import load

TEXT = "# Fleet\n\nThe oldest boat is the Bramble Lark. She was built in 1938.\n"


def pair(pid: str, question: str, kind: str = "single", start: int | None = None, said: str = "",
         source: str = "") -> dict[str, Any]:
    at = TEXT.index(said) if said else start
    spans = [{"start": at, "end": at + len(said), "text": said}] if said else []
    return {"id": pid, "kind": kind, "question": question, "source": source, "evidence_spans": spans,
            "status": "pending"}


def test_accepted_by_rule_evidence_verbatim_and_no_near_duplicate(tmp_path):
    calibration = load("calibration")
    doc = tmp_path / "fleet.md"
    doc.write_text(TEXT, encoding="utf-8")
    moved = pair("p3", "When was she built?", said="She was built in 1938.", source=str(doc))
    moved["evidence_spans"][0]["start"] += 1  # offsets that no longer slice the document
    moved["evidence_spans"][0]["end"] += 1
    pairs = [pair("p1", "Which is the oldest boat?", said="The oldest boat is the Bramble Lark.", source=str(doc)),
             pair("p2", "Which boat is the oldest?", said="The oldest boat is the Bramble Lark.", source=str(doc)),
             moved,
             pair("p4", "What colour is the harbour cat?", kind="unanswerable", source=str(doc)),
             pair("p5", "Who built the Bramble Lark?", source=str(doc))]  # no evidence for an answerable kind
    kept, refused = calibration.accept(pairs)
    assert [p["id"] for p in kept] == ["p1", "p4"] and all(p["status"] == "accepted" for p in kept)
    assert refused == {"near duplicate": 1, "evidence not found verbatim": 2}


def test_the_halves_deal_each_kind_in_turn():
    calibration = load("calibration")
    pairs = [pair(f"s{i}", "q?") for i in range(5)] + [pair(f"u{i}", "q?", kind="unanswerable") for i in range(3)]
    first, second = calibration.halves(pairs)
    assert len(first) == 4 and len(second) == 4
    for kind, n in (("single", 5), ("unanswerable", 3)):
        counts = [sum(p["kind"] == kind for p in half) for half in (first, second)]
        assert sum(counts) == n and abs(counts[0] - counts[1]) <= 1
    assert {p["id"] for p in first} | {p["id"] for p in second} == {p["id"] for p in pairs}
    assert calibration.halves(list(reversed(pairs))) == (first, second)  # the ids fix the order, not the input


def test_the_profile_is_set_against_the_best_fixed_reading_on_the_items_all_answered():
    calibration = load("calibration")
    right = {"rag": [1, 0, 0, 1], "wim": [1, 1, 0, 1], "lc": [0, 1, 0, 0], "profile": [1, 1, 0, 0]}
    results = {name: {f"i{k}": (float(v), 2.0 if name != "wim" else 10.0) for k, v in enumerate(values)}
               for name, values in right.items()}
    results["lc"]["extra"] = (1.0, 1.0)  # an item the others did not answer: left out
    c = calibration.compared(results)
    assert c["items"] == 4 and c["best_fixed"] == "wim" and c["readings"]["lc"]["score"] == 0.25
    assert c["difference"]["mean"] == -0.25 and c["difference"]["low"] <= -0.25 <= c["difference"]["high"]
    assert c["wim_share"] == 0.2 and c["seconds_goal_met"] and not c["score_goal_met"]


def _compared(profile: float, best: float, share: float, met: bool) -> dict[str, Any]:
    return {"items": 24, "best_fixed": "lc", "wim_share": share,
            "readings": {"rag": {"score": 0.4, "seconds": 5.0}, "wim": {"score": 0.5, "seconds": 30.0},
                         "lc": {"score": best, "seconds": 12.0}, "profile": {"score": profile, "seconds": 18.0}},
            "difference": {"mean": profile - best, "low": -0.1, "high": 0.08},
            "score_goal_met": met, "seconds_goal_met": share <= 0.5}


def test_the_section_shows_each_fold_and_both_with_their_verdicts():
    calibration = load("calibration")
    folds = [{"fit": "calibrate", "held": "score", "fit_best": "rag", "chosen": "rag alone (escalate rag): …",
              **_compared(0.54, 0.55, 0.6, True)},
             {"fit": "score", "held": "calibrate", "fit_best": "lc", "chosen": "escalate to lc below support 0.5: …",
              **_compared(0.40, 0.45, 0.4, False)}]
    numbers = {"model": "smollm2", "length": 1536, "folds": folds, "both": _compared(0.47, 0.5, 0.5, False),
               "pairs": {"documents": 6, "generated_by": "gguf:/x/model.gguf", "generated": 54, "accepted": 49,
                         "kinds": {"single": 35, "join": 4}, "calibrate": 25, "score": 24}}
    m = {"name": "calibration-smollm2", "benchmark": "calibration", "command": "c", "commit": "abc",
         "machine": "m", "date": "2026-12-06T00:00:00Z", "numbers": numbers}
    text = "\n".join(calibration.together([m]))
    assert "| SmolLM2-135M A→B | 0.40 · 5 s | 0.50 · 30 s | 0.55 · 12 s | 0.54 · 18 s | -0.01 [-0.10, +0.08] (lc): " \
           "met | 0.60x: not met |" in text
    assert "| SmolLM2-135M B→A |" in text and "-0.05 [-0.10, +0.08] (lc): not met | 0.40x: met |" in text
    assert "| SmolLM2-135M both |" in text
    assert "B→A escalate to lc below support 0.5 (lc best where fitted); made by `c`" in text
    (row,) = calibration.summary(m)
    assert "profile 0.47 vs best fixed (lc) 0.50, 0.60x WiM's seconds" in row[1]
