"""The lab's summaries of stored bench runs (early_exit.py, long_documents.py) on run folders made up here."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest


def write_run(folder: Path, records: list[dict[str, Any]], info: dict[str, Any]) -> Path:
    folder.mkdir(parents=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), "utf-8")
    (folder / "run.json").write_text(json.dumps(info), "utf-8")
    return folder


def run_main(module: Any, argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
             ) -> str:
    monkeypatch.setattr(sys, "argv", [f"{module.__name__}.py", *argv])
    module.main()
    return capsys.readouterr().out


def margin(segment: int, kept: bool, score: float | None, text: str = "") -> dict[str, Any]:
    return {"segment": segment, "kept": kept, "score": score, "text": text}


def test_early_exit_replays_a_reading_up_to_the_first_margin_kept_with_the_score(load_script: Any) -> None:
    early_exit = load_script("early_exit")
    record = {"margins": [margin(0, True, 0.6), margin(1, False, 1.0), margin(2, True, 0.95), margin(3, True, 1.0)]}
    assert early_exit.stop_at(record, 0.5) == 0
    assert early_exit.stop_at(record, 0.9) == 2  # a margin not kept never stops, whatever its score
    assert early_exit.stop_at({"margins": [margin(0, True, None)]}, 0.5) is None


def test_early_exit_compares_full_and_stopped_readings(load_script: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    early_exit = load_script("early_exit")

    def answer(item: str, pattern: str, right: bool, read: int, tokens: int) -> dict[str, Any]:
        return {"task": "niah", "item_id": item, "pattern": pattern, "status": "ok", "answers": ["pier 47"],
                "scores": {"contains": 1.0 if right else 0.0}, "segments_read": read, "segments_total": 4,
                "stats": {"prefilled_context_tokens": tokens}, "seconds": 2.0,
                "margins": [margin(0, False, None), margin(1, True, 0.95, "Pier 47."), margin(2, True, 0.5)]}

    records = [answer("a", "wim", True, 4, 2000), answer("a", "wim-exit", True, 2, 1000),
               answer("b", "wim", True, 4, 2000), answer("b", "wim-exit", False, 2, 1000)]
    info = {"commit": {"commit": "0123456789abcdef"}, "models": {"generator": {"spec": "scripted"}},
            "config": {"tasks": [{"dataset": "niah", "lengths": [2048]}],
                       "patterns": [{"name": "wim"}, {"name": "wim-exit", "stop_at_score": 0.9,
                                                      "segment_tokens": 512}]}}
    folder = write_run(tmp_path / "run", records, info)
    monkeypatch.setattr(sys.modules[early_exit.finish.__module__], "write_finding",
                        lambda *_: pytest.fail("--no-write wrote the finding"))
    out = run_main(early_exit, [str(folder), "--no-write"], monkeypatch, capsys)
    assert "run commit 0123456789 · model `scripted`" in out and "at least 0.9" in out
    assert "| niah | wim | 2/2 (" in out and "| niah | wim-exit | 1/2 (" in out
    assert "early exit read 50% fewer context tokens on average; answers right with full reading and wrong " \
           "with early exit: 1; the other way round: 0." in out
    # the sweep over the full readings' margins: at 0.9 both stop on segment 1 of 4, which holds the answer
    assert "| niah | 0.90 | 2/2 | 2/2 | 0.50 |" in out
    assert "| niah | 0.50 | 2/2 | 2/2 | 0.50 |" in out

    # over a server that did not say what its prompt cache saved, the token counts are unknown, not a crash
    for r in records:
        r["stats"]["prefilled_context_tokens"] = None
    write_run(tmp_path / "unreported", records, info)
    out = run_main(early_exit, [str(tmp_path / "unreported"), "--no-write"], monkeypatch, capsys)
    assert "| niah | wim | 2/2 (" in out and "| – |" in out
    assert "early exit read 0% fewer context tokens" in out


def test_long_documents_sets_wim_against_the_window(load_script: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    long_documents = load_script("long_documents")
    assert [long_documents.bucket(n) for n in (7600, 8192, 8193, 63000)] == ["8k", "8k", "16k", "64k"]

    def answer(task: str, pattern: str, tokens: int, right: bool, status: str = "ok") -> dict[str, Any]:
        return {"task": task, "pattern": pattern, "context_tokens": tokens, "status": status,
                "scores": {"contains": 1.0 if right else 0.0}, "seconds": 10.0,
                "stats": {"peak_cache_tokens": 8000, "dropped_context_tokens": max(0, tokens - 8192)}}

    records = [answer("niah", "wim", 8000, True), answer("niah", "wim", 16000, True),
               answer("niah", "lc", 16000, False, "overflow"),
               answer("babilong", "wim", 16000, True), answer("babilong", "wim", 16000, False)]
    info = {"commit": {"commit": "abc"}, "models": {"generator": {"context_window": 8192}},
            "config": {"tasks": [{"dataset": "niah", "lengths": [8000, 16000]}]}}
    folder = write_run(tmp_path / "run", records, info)
    out = run_main(long_documents, [str(folder), "--no-write"], monkeypatch, capsys)
    assert "| niah | 16k | 0/1 (1 overflow) | 1/1 | 8000 | 7808 | 10 |" in out
    assert "peak 8000 of 8192 tokens" in out
    assert "8k: 1.00 (1 items), 16k: 1.00 (1 items) (goal at least 0.8 at every length: met)" in out
    assert "WiM right on 1 of 2" in out


def test_the_early_exit_config_loads(tmp_path: Path) -> None:
    """lab/configs/early_exit.toml names only options the product has (configs reject unknown keys); its data
    paths are read from its folder, so it is loaded from a copy beside made-up data files."""
    import re

    from marginalia.bench import load_config

    text = (Path(__file__).resolve().parent.parent / "configs" / "early_exit.toml").read_text("utf-8")
    config_path = tmp_path / "checkout" / "lab" / "configs" / "early_exit.toml"
    config_path.parent.mkdir(parents=True)
    config_path.write_text(text, "utf-8")
    for relative in re.findall(r'^path = "(.+)"$', text, re.M):
        data = (config_path.parent / relative).resolve()
        data.parent.mkdir(parents=True, exist_ok=True)
        data.touch()
    config = load_config(config_path)
    assert [(p.name or p.kind, p.kind) for p in config.patterns] == [("wim", "wim"), ("wim-exit", "wim")]
    assert config.patterns[1].stop_at_score == 0.9 and config.patterns[0].stop_at_score is None
    assert [t.dataset for t in config.tasks] == ["niah", "squad"]
