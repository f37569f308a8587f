"""Documents longer than the window: WiM drops the oldest segments from the cache (the intro stays),
carries every relevant margin to the answer, reports the drops, and never holds more than the window."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from marginalia.errors import ContextOverflow
from marginalia.models.fake import Request, ScriptedGenerator
from marginalia.patterns.wim import WiM
from marginalia.records import Done, SegmentRead, SegmentsDropped
from wim_requests import is_margin

FACT = "The night ferry to Brackwater leaves from pier 47."
QUESTION = "Which pier does the night ferry to Brackwater leave from?"
ANSWER_MARK = "Notes taken while reading the document:"


def reader(req: Request) -> str:
    """Notes the fact when the newest segment holds it; answers from the notes alone."""
    if is_margin(req):
        return FACT if FACT in req.prefix[-700:] else "NONE"
    if ANSWER_MARK in req.suffix:
        return "Pier 47." if "pier 47" in req.suffix.split(ANSWER_MARK, 1)[1] else "I do not know."
    return "I do not know."


@pytest.fixture
def long_doc(make_haystack: Callable[..., str]) -> str:
    return make_haystack(160, FACT, 0.1)  # the fact early, many segments after it


def test_a_document_longer_than_the_window_is_read_to_the_end(long_doc: str) -> None:
    gen = ScriptedGenerator(reader, context_window=1200)
    wim = WiM(gen, segment_tokens=150)
    events = list(wim.run(long_doc, QUESTION))
    answer = next(e for e in events if isinstance(e, Done)).answer
    n_context = answer.stats.context_tokens
    assert n_context > 3 * gen.context_window
    drops = [e for e in events if isinstance(e, SegmentsDropped)]
    assert drops and answer.stats.dropped_context_tokens == sum(d.tokens for d in drops)
    reads = [e for e in events if isinstance(e, SegmentRead)]
    assert len(reads) == answer.segments_total == answer.segments_read and not answer.stopped_early
    assert answer.stats.prefilled_context_tokens == n_context  # every segment read once
    assert 0 < answer.stats.peak_cache_tokens <= gen.context_window
    # only what had to go was dropped: at the end the cache still holds most of a window of the document
    held = n_context - answer.stats.dropped_context_tokens
    assert gen.context_window // 2 < held < gen.context_window
    # every request the model saw fit the window
    assert all(len(r.prefix_ids) + len(r.suffix_ids) + r.params.max_new_tokens <= gen.context_window
               for r in gen.requests)
    # the fact's margin, written before its segment left the cache, reaches the answer
    assert answer.text == "Pier 47." and any(m.relevant for m in answer.margins)
    fact_at = long_doc.index(FACT)
    assert any(r.start <= fact_at < r.end for r in answer.references)
    # drops come in order, and the intro stays at the front of every prompt
    assert [d.first for d in drops] == sorted(d.first for d in drops)
    head = wim.framing().head
    assert all(list(r.prefix_ids[:len(head)]) == head for r in gen.requests if is_margin(r))


def test_a_long_document_is_read_anew_for_each_question(long_doc: str) -> None:
    gen = ScriptedGenerator(reader, context_window=1200)
    r = WiM(gen, segment_tokens=150).reader(long_doc)
    first, second = r.answer(QUESTION), r.answer(QUESTION)
    assert second.stats.prefilled_context_tokens == first.stats.prefilled_context_tokens > 0
    assert second.text == first.text == "Pier 47."


def test_an_intro_and_segment_that_do_not_fit_alone_are_refused(long_doc: str) -> None:
    gen = ScriptedGenerator(reader, context_window=400)
    with pytest.raises(ContextOverflow) as info:
        WiM(gen, segment_tokens=300).answer(long_doc, QUESTION)
    assert info.value.window == 400 and info.value.needed > 400


@pytest.mark.slow
def test_llamacpp_drop_matches_a_fresh_prefill(smollm2_llamacpp: Any) -> None:
    """Removing cells and shifting the later ones down gives nearly the logits of prefilling the kept
    tokens at their new positions (not exactly: the kept cells were computed while the dropped ones were
    there, as in llama.cpp's own context shift)."""
    import numpy as np

    gen = smollm2_llamacpp.fork(keep_cache=False)
    tok = gen.tokenizer
    head = tok.encode("Notes on the harbour.")
    middle = tok.encode(" The weather was mild all week and the market was busy.")
    tail = tok.encode(" The night ferry leaves from pier")
    gen.prefill(head + middle + tail)
    gen.drop(len(head), len(head) + len(middle))
    assert gen.length == len(head) + len(tail)
    shifted = gen._pending_logits().copy()
    fresh = smollm2_llamacpp.fork(keep_cache=False)
    fresh.prefill(head + tail)
    expected = fresh._pending_logits()
    assert int(np.argmax(shifted)) == int(np.argmax(expected))
    assert np.corrcoef(shifted, expected)[0, 1] > 0.98


# -- stopping once the answer is found ------------------------------------------------------------------


def test_reading_stops_within_one_segment_of_a_margin_that_meets_the_score(make_haystack: Callable[..., str]) -> None:
    from marginalia.records import MarginJudged, ReadingStopped

    doc = make_haystack(60, FACT, 0.3)
    gen = ScriptedGenerator(reader)
    events = list(WiM(gen, segment_tokens=100, stop_at_score=1.0).run(doc, QUESTION))
    answer = next(e for e in events if isinstance(e, Done)).answer
    judged = [e.margin for e in events if isinstance(e, MarginJudged)]
    trigger = next(m for m in judged if m.relevant and (m.score or 0) >= 1.0)
    stop = next(e for e in events if isinstance(e, ReadingStopped))
    assert stop.reason == "found" == answer.stop_reason and answer.stopped_early
    assert stop.after <= trigger.segment_index + 1 and answer.segments_read <= trigger.segment_index + 2
    assert answer.segments_read < answer.segments_total and answer.text == "Pier 47."
    full = WiM(ScriptedGenerator(reader), segment_tokens=100).answer(doc, QUESTION)
    assert full.stop_reason == "" and not full.stopped_early
    assert answer.stats.prefilled_context_tokens < full.stats.prefilled_context_tokens



def test_a_margin_below_the_score_does_not_stop_reading(make_haystack: Callable[..., str]) -> None:
    doc = make_haystack(30, FACT, 0.3)
    # the margin adds a word the text does not hold: relevant by the grounded judge, with a lower score
    gen = ScriptedGenerator(lambda r: FACT.replace("night ", "late night ") if is_margin(r) and FACT in
                            r.prefix[-700:] else reader(r))
    answer = WiM(gen, segment_tokens=100, stop_at_score=1.0).answer(doc, QUESTION)
    assert answer.stop_reason == "" and answer.segments_read == answer.segments_total
    assert any(m.relevant and m.score is not None and m.score < 1.0 for m in answer.margins)


def test_the_default_drop_prefills_the_kept_tail_again(make_tiny: Callable[..., Any]) -> None:
    """Backends without a position shift (transformers) drop by prefilling the kept tail at its new
    positions: the same cache as reading the kept tokens alone."""
    import torch

    gen = make_tiny()
    ids = gen.tokenizer.encode("The harbour opens at dawn. Rain fell all week. Fact 17: the value is 1717.")
    gen.prefill(ids)
    gen.drop(3, 9)
    assert gen.cached_ids == tuple(ids[:3] + ids[9:])
    fresh = make_tiny()
    fresh.prefill(ids[:3] + ids[9:])
    # equal up to float rounding: the tail is prefilled in chunks that start elsewhere
    assert torch.allclose(gen._pending_logits(), fresh._pending_logits(), atol=1e-5)


def test_long_context_from_a_reading_that_dropped_segments_reads_it_anew(
        make_haystack: Callable[..., str]) -> None:
    """WiM's prompts need more room than long context's answer: a document can fit the window for lc yet
    have lost its first segments in WiM's reading; lc then reads it again, whole, instead of failing."""
    from marginalia.patterns.long_context import LongContext

    doc = make_haystack(20, FACT, 0.5)
    n = len(ScriptedGenerator(reader).tokenizer.encode(doc))
    gen = ScriptedGenerator(reader, context_window=n + 190)
    wim_reader = WiM(gen, segment_tokens=100, margin_tokens=48, max_new_tokens=16).reader(doc)
    assert wim_reader.answer(QUESTION).stats.dropped_context_tokens > 0
    whole = wim_reader.ask_whole(QUESTION, LongContext(gen, max_new_tokens=16)).answer()
    assert whole.stats.prefilled_context_tokens == whole.stats.context_tokens == n
    assert whole.stats.reprefilled_context_tokens == 0  # a new reading, not a repeat within one
    assert FACT in gen.requests[-1].prefix and len(gen.requests[-1].prefix_ids) + 16 <= gen.context_window
