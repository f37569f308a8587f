"""BENCHMARKS.md is rendered from stored measurements (benchmarks/report.py): the summary table names each row's
command and commit, every benchmark has its section, and the committed file is what the committed measurements
give."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmark_scripts import BENCHMARKS, load


def estimate(mean: float, low: float, high: float, n: int = 20) -> dict[str, Any]:
    return {"n": n, "mean": mean, "low": low, "high": high}


def quality_numbers() -> dict[str, Any]:
    def pattern(mean: float, low: float, high: float, seconds: float) -> dict[str, Any]:
        return {"n": 20, "score": estimate(mean, low, high), "judge": estimate(mean + 0.1, low, high),
                "contains": mean, "f1": 0.2, "em": 0.0, "overflow": 0, "error": 0,
                "cost": {"prefilled_context": 8000, "prefilled_other": 90, "generated": 30.0, "seconds": seconds}}

    return {
        "config": "quality-tiny", "model": "smollm2", "judge": None, "lengths": [8192],
        "patterns": ["rag", "wim", "lc"], "wim": "wim", "lc": "lc", "rag": "rag", "pattern_notes": {},
        "tasks": [{"task": "hotpotqa", "metric": "contains", "planned": 20, "done": 20,
                   "patterns": {"rag": pattern(0.30, 0.15, 0.50, 5.2), "wim": pattern(0.55, 0.35, 0.74, 150.4),
                                "lc": pattern(0.40, 0.22, 0.61, 99.6)},
                   "paired": {"lc": {"items": 20, "mean": 0.15, "low": 0.05, "high": 0.25, "first_higher": 4,
                                     "second_higher": 1},
                              "rag": {"items": 20, "mean": 0.25, "low": -0.05, "high": 0.5, "first_higher": 7,
                                      "second_higher": 2}},
                   "paired_judge": {}, "margins": {"kept": 12, "precision": 0.75, "answer_precision": 0.5,
                                                   "recall": 0.8, "copy_recall": 0.6, "questions": [9, 10]}}],
        "goals": [],
    }


def overhead_numbers() -> dict[str, Any]:
    row = {"context_tokens": 6475, "prefilled_context": 6475, "reprefilled_context": 0, "prefilled_other": 80,
           "generated": 16, "margin_tokens": 0, "wall_s": 100.0, "prefill_s": 90.0, "first_margin_s": None,
           "first_answer_token_s": 91.0, "peak_rss_mb": 800, "correct": False, "question": "Who?", "answer": "Her."}
    return {"model": "smollm2", "segment_tokens": 512, "problems": [],
            "lc": row, "wim": {**row, "wall_s": 120.0, "prefilled_other": 500, "generated": 300, "margin_tokens": 280,
                               "first_margin_s": 9.5, "segments": 13, "correct": True}}


def latency_numbers() -> dict[str, Any]:
    def row(p50: float) -> dict[str, Any]:
        return {"p50_ms": p50, "p90_ms": p50 * 1.5, "p99_ms": p50 * 2, "n": 40}

    return {"setup": {"client": "SmolLM2-135M", "memory_model": "SmolLM2, loaded again", "memory_mode": "takeaways",
                      "threshold": 20, "hits": 3, "words": 80, "article": "A Title", "keystrokes": 425,
                      "char_delay_ms": 50.0, "word_pause_ms": 600.0},
            "counts": {"suggestions": 400, "memory_updates": 6, "memory_failed": 0, "baseline_texts": 40},
            "rows": {"first": row(9), "full": row(101), "baseline_first": row(990)},
            "baseline_first_ratio": 110.0, "baseline_full_ratio": 9.8, "memory_update_p50_s": 7.5}


def stored(tmp_path: Path) -> Path:
    common = load("_common")
    folder = tmp_path / "measurements"
    for benchmark, name, numbers, command, commit in (
            ("quality", "quality-tiny", quality_numbers(), "marginalia bench run configs/bench/quality-tiny.toml",
             "abc1234def"),
            ("wim_overhead", "wim_overhead", overhead_numbers(), "python benchmarks/wim_overhead.py", "def5678"),
            ("compose_latency", "compose_latency", latency_numbers(),
             "python benchmarks/compose_latency.py --memory-model smollm2", "0123abc+dirty")):
        common.write_measurement(common.measurement(benchmark, numbers, name=name, command=command, commit=commit,
                                                    machine_text="2 cores (a CPU), Python 3.11.7",
                                                    date="2026-11-30T10:00:00Z"), folder)
    return folder


def test_the_summary_gives_each_row_its_numbers_command_and_commit(tmp_path: Path) -> None:
    report = load("report")
    text = report.render(report.load(stored(tmp_path)))
    assert text.startswith("# Benchmarks\n")
    summary = text[text.index("## Summary"):text.index("## Quality")]
    assert ("| hotpotqa | SmolLM2-135M, 8k | 0.40 [0.22, 0.61] | 0.30 [0.15, 0.50] | 0.55 [0.35, 0.74] | "
            "+0.15 [+0.05, +0.25] | +0.25 [-0.05, +0.50] | 100 · 5 · 150 | `quality-tiny.toml` · abc1234 |") in summary
    assert ("| WiM vs long context, one question (6,475-token report) | wall time 1.20x; context tokens prefilled "
            "1.000x, none twice | `wim_overhead.py` · def5678 |") in summary
    assert "p50 9 ms (p99 18), full suggestion p50 101 ms; retrieve-then-write 110.0x slower" in summary
    assert "| `compose_latency.py` · 0123abc+dirty |" in summary
    # then one section each, quoting the whole command, the machine without its software and the date
    assert text.index("## Quality") < text.index("## WiM's overhead") < text.index("## Composition latency")
    assert ("Made by `python benchmarks/compose_latency.py --memory-model smollm2` at 0123abc+dirty on 2 cores "
            "(a CPU), 2026-11-30.") in text
    assert "| hotpotqa (20) | 0.30 / 0.40 · 30 tok · 5 s | 0.55 / 0.65 · 30 tok · 150 s |" in text
    assert "Margins `wim` kept: hotpotqa 0.75 / 0.80." in text
    assert "| time to the first answer token (s) | 91.0 | 91.0 |" in text


def test_a_script_prints_the_section_it_stored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common, report = load("_common"), load("report")
    record = common.measurement("wim_overhead", overhead_numbers(), command="python benchmarks/wim_overhead.py",
                                commit="def5678", machine_text="2 cores", date="2026-11-30")
    common.show(record, write=False)
    assert capsys.readouterr().out.strip() == report.section(record).strip()
    assert report.section(record).startswith("## WiM's overhead against long context\n\nMade by ")


def test_measurements_are_stored_as_plain_json(tmp_path: Path) -> None:
    common = load("_common")
    record = common.measurement("x", {"nan": math.nan, "pair": (1, 2), "keys": {3: {4}}}, command="c", commit="k",
                                machine_text="m", date="d")
    path = common.write_measurement(record, tmp_path)
    assert path == tmp_path / "x.json"
    stored = json.loads(path.read_text("utf-8"))
    assert stored["numbers"] == {"nan": None, "pair": [1, 2], "keys": {"3": [4]}}
    assert {k: stored[k] for k in ("schema", "benchmark", "name", "command", "commit", "machine", "date")} == {
        "schema": 1, "benchmark": "x", "name": "x", "command": "c", "commit": "k", "machine": "m", "date": "d"}


def test_an_unknown_benchmark_or_layout_is_refused(tmp_path: Path) -> None:
    common, report = load("_common"), load("report")
    folder = stored(tmp_path)
    common.write_measurement(common.measurement("no_such_benchmark", {}, command="c", commit="k", machine_text="m",
                                                date="d"), folder)
    with pytest.raises(SystemExit, match="no_such_benchmark"):
        report.render(report.load(folder))
    (folder / "no_such_benchmark.json").write_text(json.dumps({"schema": 99, "benchmark": "wim_overhead"}), "utf-8")
    with pytest.raises(SystemExit, match="schema 99"):
        report.load(folder)


def test_benchmarks_md_is_what_the_stored_measurements_give() -> None:
    report = load("report")
    records = report.load()
    text = report.render(records)
    assert (BENCHMARKS.parent / "BENCHMARKS.md").read_text("utf-8") == text, "run `make benchmarks-md`"
    assert len(text.encode("utf-8")) <= report.MAX_BYTES
    # every kept benchmark script has its measurement, and the quality runs theirs
    assert {m["benchmark"] for m in records} == set(report.BENCHMARKS) | {"quality"}
    assert {m["name"] for m in records if m["benchmark"] == "quality"} >= {
        "quality", "quality-smollm2", "quality-smollm2-4k", "aggregation-8k", "aggregation-lists-8k"}
