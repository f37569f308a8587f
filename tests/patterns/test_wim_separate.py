"""The separate judge classifies margin i while segment i+1 is read, and keeps the reading's results."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from marginalia.models.fake import Request, ScriptedGenerator
from marginalia.patterns.wim import WiM
from marginalia.records import Done, MarginJudged, MarginWritten, SegmentRead
from wim_requests import is_margin

FACT = "The night ferry to Brackwater leaves from pier 47."
QUESTION = "Which pier does the night ferry to Brackwater leave from?"
CLASSIFY_MARK = "Does the note answer the question?"


def test_classification_runs_beside_the_next_segment(make_haystack: Callable[..., str]) -> None:
    doc = make_haystack(40, FACT, 0.5)
    threads: set[str] = set()

    def respond(req: Request) -> str:
        if CLASSIFY_MARK in req.suffix:
            threads.add(threading.current_thread().name)
            return "YES" if "pier 47" in req.suffix else "NO"
        if is_margin(req):
            return FACT if FACT in req.prefix[-600:] else "NONE"
        return "Pier 47."

    gen = ScriptedGenerator(respond)
    events = list(WiM(gen, segment_tokens=100, judge="separate").run(doc, QUESTION))
    answer = next(e for e in events if isinstance(e, Done)).answer
    kinds = [(type(e).__name__, e.segment_index if isinstance(e, MarginWritten) else e.margin.segment_index)
             for e in events if isinstance(e, (MarginWritten, MarginJudged))]
    # margin i is judged after margin i+1 is written: its classification ran while segment i+1 was read
    written = [i for k, i in kinds if k == "MarginWritten"]
    order = [k for k, _ in kinds]
    assert order[:3] == ["MarginWritten", "MarginWritten", "MarginJudged"]
    assert [m.segment_index for m in answer.margins] == written == list(range(answer.segments_total))
    assert threads and all(name.startswith("wim-judge") for name in threads)
    assert [m.relevant for m in answer.margins].count(True) >= 1 and answer.text == "Pier 47."
    # the classification requests are counted in the run's usage
    classify = sum(1 for r in gen.requests if CLASSIFY_MARK in r.suffix)
    assert classify == sum(1 for m in answer.margins if m.text != "NONE")
    assert answer.stats.prefilled_other_tokens > 0
    assert sum(isinstance(e, SegmentRead) for e in events) == answer.segments_total


def test_the_separate_judge_over_http_warns_of_one_slot_servers(caplog: pytest.LogCaptureFixture) -> None:
    from marginalia.models.openai.backend import OpenAIGenerator

    gen = OpenAIGenerator("http://127.0.0.1:9/v1", "m", ScriptedGenerator(), context_window=4096)
    with caplog.at_level(logging.WARNING, logger="marginalia.patterns.wim"):
        WiM(gen, judge="separate")
    assert "one cache slot" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="marginalia.patterns.wim"):
        WiM(gen, judge="grounded")
    assert caplog.text == ""
