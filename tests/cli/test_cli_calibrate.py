"""`bench calibrate` end to end: a run's results make a collection's reading profile, which `ask --collection`
then reads with (and names in its route); another model's profile is not used."""

from __future__ import annotations

import json

import pytest

from test_cli import run_cli

pytest.importorskip("lancedb")

HARBOUR = """# Harbour report

## Dredging

Silt builds up in the inner basin every year. The dredger hired for the work was the Orla Maye.

The work took six weeks and lifted 18,400 cubic metres of silt.

## Lifeboat

The lifeboat launched 37 times this year. Its new coxswain is Ingrid Tasker.
"""
QUESTION = "Which dredger was hired for the basin?"
#: an answer that is not in the passages: auto's defaults escalate it to WiM
UNSUPPORTED = "scripted:Captain Ahab."


def write_run(folder, model: str, rag_score: float = 1.0, wim_score: float = 1.0) -> None:
    """A small run in which rag scores as well as wim at a tenth of its seconds."""
    folder.mkdir(parents=True)
    info = {"schema": 2, "config": {"name": folder.name, "patterns": [
        {"kind": "rag", "name": "rag", "top_k": 3, "chunk_tokens": 128}, {"kind": "wim", "name": "wim"}]},
        "models": {"generator": {"name": model, "engine": "ScriptedGenerator"}}}
    (folder / "run.json").write_text(json.dumps(info), encoding="utf-8")
    lines = []
    for i in range(8):
        for kind, score, seconds in (("rag", rag_score, 1.0), ("wim", wim_score, 10.0)):
            record = {"schema": 2, "task": "own", "item_id": f"q{i}", "pattern": kind, "kind": kind, "scoring": "qa",
                      "status": "ok", "scores": {"contains": score}, "stats": {"total_seconds": seconds},
                      "seconds": seconds}
            if kind == "rag":
                record["signals"] = {"support": 0.3, "topic": 0.5, "abstains": 0.0, "gathers": 0.0}
            lines.append(json.dumps(record))
    (folder / "results.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def collection(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "harbour.md").write_text(HARBOUR, encoding="utf-8")
    code, _, err = run_cli("index", str(folder), "--collection", "docs", "--embedder", "hashing",
                           "--model", "scripted:x")
    assert code == 0, err
    return "docs"


def ask(*extra: str) -> dict:
    code, out, err = run_cli("ask", "--collection", "docs", QUESTION, "--model", UNSUPPORTED, "--uncertain", "0.05",
                             "--json", "-q", *extra)
    assert code == 0, err
    return json.loads(out)


def test_calibrate_stores_a_profile_that_ask_reads_with_and_names(collection, tmp_path):
    before = ask()["route"]
    assert before["taken"] == "wim" and "profile" not in before["reason"]
    write_run(tmp_path / "pairs-run", model="scripted")
    code, out, err = run_cli("bench", "calibrate", str(tmp_path / "pairs-run"), "--collection", "docs")
    assert code == 0, err
    assert "rag alone (escalate rag)" in out and "stored the reading profile" in out
    assert "best rag" in err
    answer = ask()
    route = answer["route"]
    # rag scored as well as wim for a tenth of the seconds: the profile escalates to nothing
    assert route["taken"] == "rag" and route["reason"].endswith("profile from run pairs-run")
    assert answer["text"] == "Captain Ahab."
    assert len(answer["references"]) <= 3  # the run's rag options came with the profile (top_k 3)
    # a request that names a pattern or sets an option reads without it
    assert "profile" not in ask("--pattern", "auto")["route"]["reason"]
    assert ask("--support-threshold", "0.6")["route"]["taken"] == "wim"


def test_where_wim_is_better_the_profile_escalates_to_it(collection, tmp_path):
    write_run(tmp_path / "wim-run", model="scripted", rag_score=0.0)
    code, out, err = run_cli("bench", "calibrate", str(tmp_path / "wim-run"), "--collection", "docs", "--dry-run")
    assert code == 0, err
    assert "escalate to wim" in out and "stored" not in out
    assert "profile" not in ask()["route"]["reason"]  # a dry run stores nothing


def test_a_profile_made_with_another_model_is_not_used_and_the_route_says_why(collection, tmp_path):
    write_run(tmp_path / "other-run", model="another-model")
    code, _, err = run_cli("bench", "calibrate", str(tmp_path / "other-run"), "--collection", "docs")
    assert code == 0, err
    route = ask()["route"]
    assert route["taken"] == "wim"  # today's defaults
    assert "made with another model (another-model (run other-run)), not scripted" in route["reason"]


def test_calibrate_refuses_a_run_without_router_signals(collection, tmp_path):
    folder = tmp_path / "old-run"
    write_run(folder, model="scripted")
    lines = [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()]
    (folder / "results.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "signals"}) + "\n"
                                                  for r in lines))
    code, _, err = run_cli("bench", "calibrate", str(folder), "--collection", "docs")
    assert code != 0 and "keep no router signals" in err


def test_calibrate_says_when_its_items_are_too_few_to_tell(collection, tmp_path):
    folder = tmp_path / "close-run"
    write_run(folder, model="scripted")
    lines = [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()]
    lines[0]["scores"]["contains"] = 0.0  # rag wrong on one item of eight: 0.88 against wim's 1.00
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    code, out, err = run_cli("bench", "calibrate", str(folder), "--collection", "docs", "--dry-run")
    assert code == 0, err
    assert "rag alone" in out  # within wim's interval on eight items, at a tenth of the seconds
    (note,) = [line for line in err.splitlines() if line.startswith("note:")]
    assert "on 8 items the choice may score as much as 0.38 below wim" in note and "accepted pairs" in note
    write_run(tmp_path / "even-run", model="scripted")
    code, _, err = run_cli("bench", "calibrate", str(tmp_path / "even-run"), "--collection", "docs", "--dry-run")
    assert code == 0 and "note:" not in err
