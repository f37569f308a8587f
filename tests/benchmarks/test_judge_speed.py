"""benchmarks/judge_speed.py at a tiny size: what it stores, and its section of BENCHMARKS.md."""

from __future__ import annotations

from benchmark_scripts import load


def test_judge_speed_stores_the_time_per_segment_of_each_size_and_kind() -> None:
    script, common, report = load("judge_speed"), load("_common"), load("report")
    assert script.text("punctuated", 300, seed=4).count(".") > 5
    assert "." not in script.text("unpunctuated", 300, seed=4) and "\n" not in script.text("unpunctuated", 300)
    numbers = script.measure([200, 400], ["punctuated", "unpunctuated"], segment_tokens=64, rounds=1)
    rows = numbers["rows"]
    assert [(r["kind"], r["tokens"]) for r in rows] == [("punctuated", 200), ("punctuated", 400),
                                                        ("unpunctuated", 200), ("unpunctuated", 400)]
    for r in rows:
        assert r["segments"] >= 3 and r["rounds"] == (2 if r["tokens"] == 200 else 1)
        assert 0 < r["median_ms"] <= r["max_ms"] and 0 < r["mean_ms"] <= r["max_ms"] and r["judge_s"] > 0
        assert 0 <= r["kept"] <= r["segments"]
    assert set(numbers["goal"]) == {"punctuated", "unpunctuated"}
    for kind, goal in numbers["goal"].items():
        mine = [r for r in rows if r["kind"] == kind]
        assert goal["growth"] == mine[1]["median_ms"] / mine[0]["median_ms"]
        assert goal["flat"] == (goal["growth"] <= numbers["flat"])
    record = common.measurement("judge_speed", numbers, command="python benchmarks/judge_speed.py", commit="abc1234",
                                machine_text="2 cores", date="2026-12-01")
    section = report.section(record)
    assert section.startswith("## The grounded judge's speed\n")
    assert "| tokens | punctuated | unpunctuated |" in section
    assert f"| {load('_markdown').tokens([200])} | {rows[0]['median_ms']:.1f} | {rows[2]['median_ms']:.1f} |" in section
    [summary] = report.BENCHMARKS["judge_speed"].summary(record)
    assert summary[1].startswith(f"punctuated {rows[0]['median_ms']:.1f} → {rows[1]['median_ms']:.1f}, unpunctuated ")
    assert summary[2] == "`judge_speed.py` · abc1234"
