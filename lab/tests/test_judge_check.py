"""lab/judge_check.py on a few made-up SQuAD and HotpotQA questions, judged by a scripted model."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

SQUAD = {"data": [{"paragraphs": [
    {"context": "The ferry leaves from pier 47. The harbour master is Orla Maye. Boats arrive at dawn.",
     "qas": [{"id": "q1", "question": "Which pier does the ferry leave from?", "answers": [{"text": "pier 47"}]},
             {"id": "q2", "question": "Who is the harbour master?", "answers": [{"text": "Orla Maye"}]}]},
    {"context": "The lighthouse has 3 lamps. It was painted by Tam Brodie. Its keeper sleeps late.",
     "qas": [{"id": "q3", "question": "How many lamps does the lighthouse have?", "answers": [{"text": "3"}]},
             {"id": "q4", "question": "Who painted the lighthouse?", "answers": [{"text": "Tam Brodie"}]}]}]}]}
HOTPOT = [{"id": "h1", "question": "Are both harbours in Scotland?", "answer": "yes"},
          {"id": "h2", "question": "Is the pier older than the lighthouse?", "answer": "no"},
          {"id": "h3", "question": "Who built the pier?", "answer": "Tam"}]


def test_answers_of_known_kinds_are_made_and_judged(load_script: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    judge_check = load_script("judge_check")
    (tmp_path / "squad-v1.1-dev.part1.json").write_text(json.dumps(SQUAD), "utf-8")
    (tmp_path / "hotpotqa-dev-distractor.part1.json").write_text(json.dumps(HOTPOT), "utf-8")
    monkeypatch.setattr(judge_check, "DATA", tmp_path)
    rows = judge_check.candidates(2)
    kinds = [r["kind"] for r in rows if r["group"] == "squad/q3"]
    assert kinds == [*judge_check.KINDS[:6], "gold number in words"]
    assert next(r for r in rows if r["kind"] == "gold number in words")["prediction"] == "Three."
    assert [(r["prediction"], r["right"]) for r in rows if r["group"] == "hotpotqa/h2"] == [
        ("No, according to the text.", True), ("Yes, according to the text.", False)]

    # the scripted model replies "0.9" to everything: no verdict is JSON, and P(YES) is 0.9 for every answer
    monkeypatch.setattr(sys, "argv", ["judge_check.py", "--model", "scripted:0.9", "--limit", "2", "--no-write",
                                      "--rows", str(tmp_path / "rows.jsonl")])
    monkeypatch.setattr(judge_check, "write_finding", lambda *_: pytest.fail("--no-write wrote the finding"))
    judge_check.main()
    out = capsys.readouterr().out
    assert "17 answers whose rightness is known, made from 2 SQuAD development questions" in out
    assert "- Unreadable verdicts (retried, then counted as not right): 17." in out
    saved = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text("utf-8").splitlines()]
    assert len(saved) == 17 and all(r["verdict"] is None and r["p_yes"] == pytest.approx(0.9) for r in saved)
    # yes/no questions answered yes or no are settled by rule, whatever the model said
    assert all(r["rule"] == r["right"] for r in saved if r["kind"].startswith("yes/no"))
    assert all(r["contains"] == r["right"] for r in saved if r["kind"] in ("gold, bare", "a refusal"))
