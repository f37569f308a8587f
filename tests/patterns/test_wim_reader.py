"""Read once, ask many: a second question over the same document prefills no document token, and its
margins and answer equal those of a fresh reading (scripted fake, tiny random Llama, the real SmolLM2);
stored caches survive a new process, and a damaged one is ignored and written again."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from marginalia import WimOptions
from marginalia.models.base import GenerationParams
from marginalia.models.fake import Request, ScriptedGenerator
from marginalia.models.snapshots import SnapshotStore
from marginalia.patterns.long_context import LongContext
from marginalia.patterns.wim import WiM
from marginalia.records import Answer, SegmentRead
from wim_requests import is_margin

FACT = "The night ferry to Brackwater leaves from pier 47."
Q1 = "Which pier does the night ferry to Brackwater leave from?"
Q2 = "Where does the ferry go at night?"


def echo(req: Request) -> str:
    """A margin that depends on everything the request saw: equal replies mean equal requests."""
    if is_margin(req):
        return f"seen {len(req.prefix_ids)} tokens ending {req.prefix.split()[-1]!r}; asked {req.suffix.split()[-3]}"
    return f"answer after {len(req.prefix_ids) + len(req.suffix_ids)} tokens"


@pytest.fixture
def doc(make_haystack: Callable[..., str]) -> str:
    return make_haystack(40, FACT, 0.6)


def margins(answer: Answer) -> list[tuple[int, str, bool]]:
    return [(m.segment_index, m.text, m.relevant) for m in answer.margins]


def fresh(doc: str, question: str) -> tuple[Answer, list[Request]]:
    gen = ScriptedGenerator(echo)
    answer = WiM(gen, segment_tokens=100).answer(doc, question)
    return answer, gen.requests


def test_a_second_question_reads_no_document_token(doc: str) -> None:
    gen = ScriptedGenerator(echo)
    reader = WiM(gen, segment_tokens=100).reader(doc)
    first = reader.answer(Q1)
    n_context = first.stats.context_tokens
    assert first.stats.prefilled_context_tokens == n_context and first.stats.cached_context_tokens == 0
    before = gen.usage.snapshot()
    second = reader.answer(Q2)
    used = gen.usage.since(before)
    assert second.stats.prefilled_context_tokens == 0
    assert second.stats.cached_context_tokens == n_context
    # only the margin prompts and the answer prompt were prefilled: no intro, no segment
    assert used.prefilled_tokens == second.stats.prefilled_other_tokens
    assert second.stats.prefilled_other_tokens < first.stats.prefilled_other_tokens - len(reader.framing.head) + 40
    assert second.segments_read == second.segments_total and not second.stopped_early


def test_the_second_questions_requests_and_answer_equal_a_fresh_reading(doc: str) -> None:
    gen = ScriptedGenerator(echo)
    reader = WiM(gen, segment_tokens=100).reader(doc)
    reader.answer(Q1)
    start = len(gen.requests)
    second = reader.answer(Q2)
    expected, requests = fresh(doc, Q2)
    assert [(r.prefix, r.suffix) for r in gen.requests[start:]] == [(r.prefix, r.suffix) for r in requests]
    assert margins(second) == margins(expected) and second.text == expected.text
    assert second.references == expected.references


def test_events_say_which_segments_came_from_the_cache(doc: str) -> None:
    reader = WiM(ScriptedGenerator(echo), segment_tokens=100).reader(doc)
    assert not any(e.cached for e in reader.ask(Q1) if isinstance(e, SegmentRead))
    reads = [e for e in reader.ask(Q2) if isinstance(e, SegmentRead)]
    assert reads and all(e.cached for e in reads)
    assert [e.segment.index for e in reads] == list(range(len(reads)))


def test_a_reading_stopped_early_is_continued_by_the_next_question(doc: str) -> None:
    gen = ScriptedGenerator(echo)
    reader = WiM(gen, segment_tokens=100).reader(doc)
    run = reader.ask(Q1)
    for event in run:
        if isinstance(event, SegmentRead) and event.segment.index == 2:
            run.stop()
    first = run.answer()
    assert first.stopped_early and first.segments_read == 3
    second = reader.answer(Q2)
    expected, _ = fresh(doc, Q2)
    read_first = sum(s.n_tokens for s in reader.segments[:3])
    assert second.stats.cached_context_tokens == read_first
    assert second.stats.prefilled_context_tokens == second.stats.context_tokens - read_first
    assert margins(second) == margins(expected) and second.text == expected.text


def test_a_stored_reading_serves_a_new_process(doc: str, tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "cache")
    WiM(ScriptedGenerator(echo), segment_tokens=100).reader(doc, store=store).answer(Q1)
    assert len(store.files()) == 1
    gen = ScriptedGenerator(echo)  # a new process: a new model, an empty cache
    second = WiM(gen, segment_tokens=100).reader(doc, store=store).answer(Q2)
    expected, _ = fresh(doc, Q2)
    assert second.stats.prefilled_context_tokens == 0
    assert margins(second) == margins(expected) and second.text == expected.text


def test_another_segment_size_does_not_meet_the_stored_reading(doc: str, tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "cache")
    WiM(ScriptedGenerator(echo), segment_tokens=100).reader(doc, store=store).answer(Q1)
    other = WiM(ScriptedGenerator(echo), WimOptions(segment_tokens=120)).reader(doc, store=store).answer(Q2)
    assert other.stats.cached_context_tokens == 0
    assert len(store.files()) == 2


@pytest.mark.parametrize("damage", [b"", b"not json\n123", b'{"schema": 1}\n', "flip"])
def test_a_damaged_stored_reading_is_ignored_and_written_again(doc: str, tmp_path: Path, damage: Any,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    store = SnapshotStore(tmp_path / "cache")
    WiM(ScriptedGenerator(echo), segment_tokens=100).reader(doc, store=store).answer(Q1)
    (path,) = store.files()
    data = path.read_bytes()
    path.write_bytes(data[:-3] + b"999" if damage == "flip" else damage)
    with caplog.at_level(logging.WARNING, logger="marginalia.models.snapshots"):
        answer = WiM(ScriptedGenerator(echo), segment_tokens=100).reader(doc, store=store).answer(Q2)
    expected, _ = fresh(doc, Q2)
    assert answer.stats.cached_context_tokens == 0 and margins(answer) == margins(expected)
    assert "ignoring the damaged or mismatched cache file" in caplog.text
    assert path.read_bytes() == data  # written again, whole


def test_the_store_keeps_within_its_bound_dropping_the_least_recently_used(
        make_haystack: Callable[..., str], tmp_path: Path) -> None:
    docs = [make_haystack(12, FACT, 0.5, seed=seed) for seed in range(4)]
    probe = SnapshotStore(tmp_path / "probe")
    WiM(ScriptedGenerator(echo), segment_tokens=100).reader(docs[0], store=probe).answer(Q1)
    one = probe.size()
    store = SnapshotStore(tmp_path / "cache", max_bytes=int(one * 2.5))
    for d in docs:
        WiM(ScriptedGenerator(echo), segment_tokens=100).reader(d, store=store).answer(Q1)
        assert store.size() <= store.max_bytes
    assert len(store.files()) == 2
    # the newest two are kept: the first document is read again, the last is not
    first = WiM(ScriptedGenerator(echo), segment_tokens=100).reader(docs[0], store=store).answer(Q2)
    last = WiM(ScriptedGenerator(echo), segment_tokens=100).reader(docs[3], store=store).answer(Q2)
    assert first.stats.cached_context_tokens == 0 and last.stats.prefilled_context_tokens == 0


# -- real models: greedy margins from the kept cache equal a fresh reading ------------------------------


def oracle(make: Callable[[], Any], doc: str, **opts: Any) -> None:
    reader = WiM(make(), **opts).reader(doc)
    reader.answer(Q1)
    second = reader.answer(Q2)
    expected = WiM(make(), **opts).answer(doc, Q2)
    assert second.stats.prefilled_context_tokens == 0
    assert [m.text for m in second.margins] == [m.text for m in expected.margins]
    assert second.text == expected.text


def test_tiny_llama_oracle(make_tiny: Callable[..., Any]) -> None:
    doc = " ".join(["The harbour opens at dawn and closes at dusk.", "Fact 17: the value is 1717."] * 2)
    oracle(make_tiny, doc, segment_tokens=24, margin_tokens=6, max_new_tokens=6)


def test_tiny_llama_stored_state_round_trips(make_tiny: Callable[..., Any], tmp_path: Path) -> None:
    doc = " ".join(["Ships, carts and bicycles crowd the bridge every morning."] * 2)
    store = SnapshotStore(tmp_path / "cache")
    WiM(make_tiny(), segment_tokens=24, margin_tokens=6, max_new_tokens=6).reader(doc, store=store).answer(Q1)
    second = WiM(make_tiny(), segment_tokens=24, margin_tokens=6, max_new_tokens=6).reader(
        doc, store=store).answer(Q2)
    expected = WiM(make_tiny(), segment_tokens=24, margin_tokens=6, max_new_tokens=6).answer(doc, Q2)
    assert second.stats.prefilled_context_tokens == 0
    assert [m.text for m in second.margins] == [m.text for m in expected.margins] and second.text == expected.text


def test_transformers_batched_margins_equal_one_after_another(make_tiny: Callable[..., Any]) -> None:
    """transformers decodes a kept reading's margins side by side (one forward pass a step, masked per
    segment): on the tiny model, the margins and answer written one after another, no document token again."""
    doc = " ".join(["The harbour opens at dawn and closes at dusk.", "Fact 17: the value is 1717.",
                    "Ships, carts and bicycles crowd the bridge every morning."])
    opts = {"segment_tokens": 24, "margin_tokens": 6, "max_new_tokens": 6, "judge": "grounded"}
    batched = WiM(make_tiny(), batch_margins=True, **opts).reader(doc)
    sequential = WiM(make_tiny(), **opts).reader(doc)
    for reader in (batched, sequential):
        reader.answer(Q1)
    calls = []
    gen = batched.worker
    original = gen.branches
    gen.branches = lambda *a, **k: calls.append(len(a[0])) or original(*a, **k)  # type: ignore[method-assign]
    a, b = batched.answer(Q2), sequential.answer(Q2)
    assert calls and sum(calls) == len(a.margins) == a.segments_total >= 3
    assert a.stats.prefilled_context_tokens == 0
    assert [m.text for m in a.margins] == [m.text for m in b.margins] and a.text == b.text


def branch_calls(reader: Any) -> list[int]:
    """How many branches each of the reader's `branches` calls decodes, as it goes."""
    calls: list[int] = []
    original = reader.worker.branches
    reader.worker.branches = lambda *a, **k: calls.append(len(a[0])) or original(*a, **k)
    return calls


def test_a_first_reading_with_batched_margins_reads_all_then_writes_them_side_by_side(
        make_tiny: Callable[..., Any]) -> None:
    """batch_margins on a first question: every segment is read first, then the margins are decoded as
    branches, each reading only up to its own segment: on the tiny model, the margins and answer written one
    after another during the reading, and the document prefilled once."""
    from marginalia.records import MarginWritten

    doc = " ".join(["The harbour opens at dawn and closes at dusk.", "Fact 17: the value is 1717.",
                    "Ships, carts and bicycles crowd the bridge every morning."])
    opts = {"segment_tokens": 24, "margin_tokens": 6, "max_new_tokens": 6, "judge": "grounded"}
    batched = WiM(make_tiny(), batch_margins=True, **opts).reader(doc)
    calls = branch_calls(batched)
    events = list(batched.ask(Q1))
    a = events[-1].answer
    b = WiM(make_tiny(), **opts).answer(doc, Q1)
    kinds = [type(e) for e in events if isinstance(e, SegmentRead | MarginWritten)]
    reads = kinds.count(SegmentRead)
    assert reads == a.segments_total >= 3 and kinds == [SegmentRead] * reads + [MarginWritten] * reads
    assert sum(calls) == len(a.margins) == reads
    assert a.stats.prefilled_context_tokens == a.stats.context_tokens
    assert [m.text for m in a.margins] == [m.text for m in b.margins] and a.text == b.text


def test_a_first_reading_stopped_early_still_writes_the_margins_of_what_it_read(
        make_tiny: Callable[..., Any]) -> None:
    doc = " ".join(["The harbour opens at dawn and closes at dusk.", "Fact 17: the value is 1717.",
                    "Ships, carts and bicycles crowd the bridge every morning."])
    reader = WiM(make_tiny(), batch_margins=True, segment_tokens=24, margin_tokens=6, max_new_tokens=6).reader(doc)
    calls = branch_calls(reader)
    run = reader.ask(Q1)
    for event in run:
        if isinstance(event, SegmentRead) and event.segment.index == 1:
            run.stop()
    answer = run.answer()
    assert answer.stopped_early and answer.stop_reason == "asked"
    assert answer.segments_read == 2 < answer.segments_total
    assert [m.segment_index for m in answer.margins] == [0, 1] and calls == [2]  # side by side, after the stop


def test_stop_at_score_keeps_a_first_reading_writing_margins_as_it_reads(make_tiny: Callable[..., Any]) -> None:
    """Stopping at a margin's score needs each margin as its segment is read: such a reading is not batched."""
    from marginalia.records import MarginWritten

    doc = " ".join(["The harbour opens at dawn and closes at dusk.", "Fact 17: the value is 1717."] * 2)
    opts = {"batch_margins": True, "segment_tokens": 24, "margin_tokens": 6, "max_new_tokens": 6}
    plain = WiM(make_tiny(), **opts).reader(doc)
    plain_calls = branch_calls(plain)
    plain.answer(Q1)
    assert plain_calls  # without stop_at_score this reading is batched: the document fits
    reader = WiM(make_tiny(), stop_at_score=1.0, **opts).reader(doc)
    calls = branch_calls(reader)
    kinds = [type(e) for e in reader.ask(Q1) if isinstance(e, SegmentRead | MarginWritten)]
    assert kinds[:3] == [SegmentRead, MarginWritten, SegmentRead] and not calls


@pytest.mark.slow
def test_smollm2_llamacpp_oracle(smollm2_llamacpp: Any, make_haystack: Callable[..., str], tmp_path: Path) -> None:
    """In memory, and from a stored state in a new reader: the same greedy margins and answer."""
    doc = make_haystack(14, FACT, 0.5)
    opts = {"segment_tokens": 128, "margin_tokens": 24, "max_new_tokens": 24}
    store = SnapshotStore(tmp_path / "cache")

    def wim() -> WiM:
        return WiM(smollm2_llamacpp.fork(keep_cache=False), **opts)

    reader = wim().reader(doc, store=store)
    reader.answer(Q1)
    second = reader.answer(Q2)
    stored = wim().reader(doc, store=store).answer(Q2)
    expected = wim().answer(doc, Q2)
    assert len(expected.margins) >= 3
    for answer in (second, stored):
        assert answer.stats.prefilled_context_tokens == 0
        assert [m.text for m in answer.margins] == [m.text for m in expected.margins]
        assert answer.text == expected.text


@pytest.mark.slow
def test_smollm2_llamacpp_batched_branches_keep_the_cache(smollm2_llamacpp: Any,
                                                         make_haystack: Callable[..., str]) -> None:
    """Margins decoded side by side: no document token prefilled, the cache as it was, and margins that
    read the question (they are not byte-equal to one-at-a-time decoding: see LlamaCppGenerator.branches)."""
    doc = make_haystack(14, FACT, 0.5)
    gen = smollm2_llamacpp.fork(keep_cache=False)
    assert gen.max_branches > 1
    reader = WiM(gen, segment_tokens=128, margin_tokens=24, max_new_tokens=24, batch_margins=True).reader(doc)
    reader.answer(Q1)
    length = reader.worker.length
    second = reader.answer(Q2)
    assert second.stats.prefilled_context_tokens == 0 and reader.worker.length == length
    assert len(second.margins) == second.segments_total >= 3
    assert any("ferry" in m.text.lower() for m in second.margins)


# -- long context answered from WiM's reading (the benchmark's shared reading) -------------------------------


def test_a_whole_answer_from_the_reading_prefills_no_document_token(doc: str) -> None:
    gen = ScriptedGenerator(echo)
    reader = WiM(gen, segment_tokens=100).reader(doc)
    reader.answer(Q1)
    whole = reader.ask_whole(Q2, LongContext(gen, max_new_tokens=7)).answer()
    assert whole.pattern == "lc" and whole.segments_total == 1
    assert whole.stats.prefilled_context_tokens == 0 and whole.stats.reprefilled_context_tokens == 0
    assert whole.stats.cached_context_tokens == whole.stats.context_tokens > 0
    assert gen.requests[-1].params.max_new_tokens == 7  # lc's answer settings, not wim's


def test_a_whole_answer_equals_long_context_with_wims_intro(doc: str) -> None:
    """The same prompt, token for token, as long context given WiM's intro: the reading changes the cost
    of the answer, never the answer."""
    gen = ScriptedGenerator(echo)
    wim = WiM(gen, segment_tokens=100)
    reader = wim.reader(doc)
    reader.answer(Q1)
    whole = reader.ask_whole(Q2, LongContext(gen)).answer()
    alone = ScriptedGenerator(echo)
    expected = LongContext(alone, intro="wim_intro").answer(doc, Q2)
    assert whole.text == expected.text
    last, other = gen.requests[-1], alone.requests[-1]
    assert last.prompt == other.prompt  # (each fake numbers its own tokens: compare the text)


def test_a_whole_answer_reads_what_a_stopped_reading_left_unread(doc: str) -> None:
    gen = ScriptedGenerator(echo)
    reader = WiM(gen, segment_tokens=100).reader(doc)
    run = reader.ask(Q1)
    for event in run:
        if isinstance(event, SegmentRead):
            run.stop()
    assert reader.read == 1 < len(reader.segments)
    whole = reader.ask_whole(Q2, LongContext(gen)).answer()
    first = reader.segments[0].n_tokens
    assert whole.stats.prefilled_context_tokens == whole.stats.context_tokens - first
    assert whole.stats.reprefilled_context_tokens == 0
    # and a later question's margins come from the reading it completed
    assert reader.answer(Q1).stats.prefilled_context_tokens == 0


def test_tiny_llama_whole_answer_equals_long_context_with_wims_intro(make_tiny: Callable[..., Any]) -> None:
    doc = " ".join(["The harbour opens at dawn and closes at dusk.", "Fact 17: the value is 1717."] * 2)
    opts = {"segment_tokens": 24, "margin_tokens": 6, "max_new_tokens": 6}
    gen = make_tiny()
    wim = WiM(gen, **opts)
    reader = wim.reader(doc)
    reader.answer(Q1)
    whole = reader.ask_whole(Q2, LongContext(gen, max_new_tokens=6)).answer()
    expected = LongContext(make_tiny(), intro="wim_intro", max_new_tokens=6).answer(doc, Q2)
    assert whole.stats.prefilled_context_tokens == 0
    assert whole.text == expected.text


@pytest.mark.slow
def test_smollm2_llamacpp_whole_answer_after_other_work(smollm2_llamacpp: Any,
                                                       make_haystack: Callable[..., str]) -> None:
    """The model's one context served other requests (a judge, say) between the reading and lc's answer:
    the answer restores the kept reading instead of prefilling the document again."""
    doc = make_haystack(14, FACT, 0.5)
    gen = smollm2_llamacpp.fork(keep_cache=False)
    wim = WiM(gen, segment_tokens=128, margin_tokens=24, max_new_tokens=24)
    reader = wim.reader(doc)
    reader.answer(Q1)
    other = gen.fork(keep_cache=False)
    "".join(other.generate_from_cache(gen.tokenizer.encode("An unrelated request about bread."),
                                      GenerationParams(max_new_tokens=4)))
    whole = reader.ask_whole(Q1, LongContext(gen, max_new_tokens=24)).answer()
    assert whole.stats.prefilled_context_tokens == 0 and whole.stats.reprefilled_context_tokens == 0
    assert whole.stats.prefilled_other_tokens < 60
    expected = LongContext(smollm2_llamacpp.fork(keep_cache=False), intro="wim_intro",
                           max_new_tokens=24).answer(doc, Q1)
    assert whole.text == expected.text
