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
    with pytest.raises(SystemExit, match="no_such_benchmark: register one in the script"):
        report.render(report.load(folder))
    (folder / "no_such_benchmark.json").write_text(json.dumps({"schema": 99, "benchmark": "wim_overhead"}), "utf-8")
    with pytest.raises(SystemExit, match="schema 99"):
        report.load(folder)


def fuzz_numbers() -> dict[str, Any]:
    def part(name: str, where: str, outcomes: dict[str, int], slowest: float, mb: float, **more: Any) -> dict[str, Any]:
        return {"name": name, "where": where, "inputs": sum(outcomes.values()), "outcomes": outcomes, "unhandled": 0,
                "server_errors": 0, "seconds": 9.0, "slowest_s": slowest, "p99_s": slowest / 2,
                "over_time_bound": int(slowest > 30), "peak_rss_mb": mb, **more}

    parts = [part("schemathesis", "in process", {"2xx": 21, "4xx": 79}, 0.41, 517.2),
             part("documents", "in process", {"BadInput": 50, "EmptyDocument": 20, "ok": 130}, 0.2, 414),
             part("PDF bombs", "own process", {"document_too_large": 4, "indexed": 1}, 11.94, 2106.4,
                  health_slowest_s=0.22),
             part("slow clients", "own process", {"headers trickled: 408": 4, "held open: 408": 63,
                                                   "held open: 503": 1, "past the connection limit: 503": 4}, 15.01,
                  286, health_slowest_s=0.01),
             part("foreign Origin, Host", "own process", {"Host: 421": 3, "Origin: 403": 3, "own: 200": 1,
                                                          "own: 201": 2}, 0.05, 341, by_kind=True,
                  health_slowest_s=0.01),
             part("unpunctuated", "own process", {"200": 1}, 140.13, 703, health_slowest_s=1.74)]
    return {"requests_target": 100, "bounds": {"time_s": 30.0, "memory_mb": 3072.0},
            "live_server": {"header_timeout": 5.0, "body_timeout": 5.0, "body_total_timeout": 15.0,
                            "max_connections": 64},
            "http": {"requests": 100, "classes": {"2xx": 21, "4xx": 79}, "server_errors": 0, "unhandled": 0, "bad": 0},
            "live_http": {"requests": 90, "classes": {"2xx": 5, "4xx": 80, "5xx": 5}, "server_errors": 0, "busy": 5,
                          "bad": 0},
            "requests": 190, "server_errors": 0, "bad": 0, "hypothesis_inputs": 200,
            "inputs": sum(p["inputs"] for p in parts), "unhandled": 0, "over_time_bound": 1, "peak_rss_mb": 2106.4,
            "memory_ok": True, "parts": parts, "problems": [], "load": "load average 0.5 before, 1.5 after",
            "total_min": 4.8}


def test_the_fuzz_run_shows_time_and_memory_against_its_bounds() -> None:
    common, report, script = load("_common"), load("report"), load("server_fuzz")
    record = common.measurement("server_fuzz", fuzz_numbers(), command="python benchmarks/server_fuzz.py",
                                commit="abc1234", machine_text="2 cores", date="2026-12-01")
    (row,) = script.summary(record)
    assert row[:2] == ["Fuzzing the HTTP service",
                       "387 inputs: 0 server errors, 0 unhandled, 1 over 30 s; 2,106 MiB ≤ 3,072"]
    text = report.section(record)
    assert text.startswith("## Fuzzing the service\n")
    assert ("From PDF bombs on: `serve` in its own process, no key, timeouts 5 s (headers, body pause), 15 s (body), "
            "64 connections; `/v1/health` every 0.1 s ≤ 1.74 s.") in text
    assert "| part | inputs | outcomes | max s | MiB (+ conversions) |" in text
    # kinds summed by status, a loader's errors together, the page's own origin by class
    assert "| documents | 200 | ok 130, refused 70 | 0.2 | 414 |" in text
    assert "| PDF bombs | 5 | document_too_large 4, indexed 1 | 11.9 | 2,106 |" in text
    assert "| slow clients | 72 | 408 67, 503 5 | 15.0 | 286 |" in text
    assert "| foreign Origin, Host | 9 | Host: 421 3; Origin: 403 3; own: 2xx 3 | 0.1 | 341 |" in text
    assert "| unpunctuated | 1 | 200 1 | 140.1 | 703 |" in text
    record["numbers"]["memory_ok"] = False
    record["numbers"]["parts"][0]["server_errors"] = 2
    assert script.summary(record)[0][1].endswith("2,106 MiB > 3,072")
    assert "| schemathesis | 100 | 2xx 21, 4xx 79; 5xx 2 | 0.4 | 517 |" in report.section(record)


def test_benchmarks_md_is_what_the_stored_measurements_give() -> None:
    report = load("report")
    records = report.load()
    text = report.render(records)
    assert (BENCHMARKS.parent / "BENCHMARKS.md").read_text("utf-8") == text, "run `make benchmarks-md`"
    assert len(text.encode("utf-8")) <= report.MAX_BYTES
    # every kept benchmark script has its measurement, and the quality runs theirs
    assert {m["benchmark"] for m in records} == set(report.BENCHMARKS) == set(report.SCRIPTS)
    assert {m["name"] for m in records if m["benchmark"] == "quality"} >= {
        "quality", "quality-smollm2", "aggregation-lists-8k"}


def test_a_left_out_section_keeps_its_summary_row_and_prints_on_demand(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    report = load("report")
    monkeypatch.setattr(report, "PRINTED_ONLY", ("compose_latency",))
    folder = stored(tmp_path)
    text = report.render(report.load(folder))
    assert "| `compose_latency.py` · 0123abc+dirty |" in text  # the summary row stays
    assert "## Composition latency" not in text
    assert text.rstrip().endswith("The sections of `compose_latency` say how those runs went; `python "
                                  "benchmarks/report.py --show NAME` prints one from its stored measurement.")
    monkeypatch.setattr("sys.argv", ["report.py", "--measurements", str(folder), "--show", "compose_latency"])
    report.main()
    assert capsys.readouterr().out.startswith("## Composition latency\n")
