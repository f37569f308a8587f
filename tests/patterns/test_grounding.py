"""The grounded judge's reading of a text that grows: sentences found once, a bound on their length, an index
built once per reading, and the same verdicts as judging each prefix from scratch."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pysbd
import pytest
from pysbd.processor import Processor

from grounding_oracle import DOCUMENTS, REFERENCE, calls, segments, verdict_row
from marginalia.patterns import grounding
from marginalia.patterns.grounding import (
    MAX_SENTENCE,
    Reading,
    SentenceSplitter,
    cut_long,
    find_evidence,
)
from marginalia.patterns.judges import GroundedJudge
from marginalia.records import Segment


def test_a_reading_judged_segment_by_segment_gives_the_reference_verdicts() -> None:
    """The oracle: verdicts stored from the judge that split and indexed every prefix from scratch, on two long
    documents, each read twice (a second question over the same prefixes) and then at prefixes cut mid-segment,
    out of order."""
    reference = json.loads(REFERENCE.read_text("utf-8"))
    judge = GroundedJudge()
    got = [verdict_row(judge, call) for call in calls()]
    assert len(got) == len(reference)
    for call, new, old in zip(calls(), got, reference, strict=True):
        assert new == old, f"{call[0]} read to {call[4]}, margin {call[2]!r}"


def pysbd_spans(text: str) -> list[tuple[int, int]]:
    """pysbd's own sentences of the whole text at once, surrounding space left out."""
    out = []
    for span in pysbd.Segmenter(language="en", clean=False, char_span=True).segment(text):
        sentence = span.sent.strip()
        if sentence:
            start = span.start + len(span.sent) - len(span.sent.lstrip())
            out.append((start, start + len(sentence)))
    return out


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_sentences_found_as_the_text_grows_are_those_of_the_whole_text(name: str) -> None:
    doc = DOCUMENTS[name]
    whole = pysbd_spans(doc)
    assert max(e - s for s, e in whole) <= MAX_SENTENCE  # the bound cuts nothing here
    index = grounding.SentenceIndex()
    for segment in segments(doc, 7):
        reading = index.reading(doc[:segment.end])
    assert reading.spans == whole
    assert Reading(doc).spans == whole  # from scratch, window by window
    # a prefix asked after the whole (a second question reading from the start) takes the sentences closed in it
    cut = doc.index(" ", len(doc) // 3)
    assert index.reading(doc[:cut]).spans == pysbd_spans(doc[:cut]) == Reading(doc[:cut]).spans


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_the_index_gives_what_scanning_every_sentence_gives(name: str) -> None:
    """Sentence frequencies, the sentences holding a unit and the paragraphs, through the index of a text read
    segment by segment, against counting over the reading's sentences one by one."""
    doc = DOCUMENTS[name]
    index = grounding.SentenceIndex()
    for segment in segments(doc, 3):
        reading = index.reading(doc[:segment.end])
    for k in (0, len(segments(doc, 3)) // 2):
        reading = index.reading(doc[:segments(doc, 3)[k].end])  # a prefix again
        assert reading.seqs == [grounding.units(reading.text[s:e]) for s, e in reading.spans]
        for unit in sorted(set().union(*reading.sets))[::7]:
            holding = [i for i, held in enumerate(reading.sets) if unit in held]
            assert reading.holding(unit) == holding and reading.df(unit) == len(holding)
        numbers = [0]
        for (a, _), (b, _) in zip(reading.spans, reading.spans[1:], strict=False):
            numbers.append(numbers[-1] + bool(grounding._PARAGRAPH_BREAK.search(reading.text, a, b)))
        assert [reading.paragraph(i).start for i in range(len(reading.spans))] == \
            [numbers.index(n) for n in numbers]
        assert [reading.sentence_at(s) for s, _ in reading.spans] == list(range(len(reading.spans)))


def run_of_words(chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    while sum(map(len, out)) + len(out) < chars:
        out.append("".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 12))))
    return " ".join(out)


def test_a_run_without_a_sentence_boundary_is_cut_at_the_bound_at_a_space() -> None:
    text = run_of_words(9_000)
    spans = SentenceSplitter().spans(text)
    assert len(spans) == 5 and all(e - s <= MAX_SENTENCE for s, e in spans)
    # pieces end at a space, as long as they can be, and tile the run with the spaces between them left out
    assert all(text[e] == " " and text[e + 1:].find(" ") + e + 1 - s > MAX_SENTENCE for s, e in spans[:-1])
    assert " ".join(text[s:e] for s, e in spans) == text
    assert spans == cut_long(text, 0, len(text))
    # grown a little at a time, the pieces are those of the whole run
    grown = SentenceSplitter()
    rng = random.Random(1)
    at = 0
    while at < len(text):
        at = min(len(text), at + rng.randint(1, 3000))
        part = grown.spans(text[:at])
        assert all(e - s <= MAX_SENTENCE for s, e in part)
    assert part == spans
    # a run without a space is cut at the bound
    assert SentenceSplitter().spans("x" * 4500) == [(0, 2000), (2000, 4000), (4000, 4500)]


def test_a_margin_copied_from_a_text_without_full_stops_cites_its_pieces() -> None:
    text = run_of_words(30_000, seed=2)
    words = text.split()
    margin = " ".join(words[2_000:2_012])
    at = text.index(margin)
    ev = find_evidence("What do " + " ".join(words[1_995:1_999]) + " say?", margin, text)
    assert ev is not None and ev.copied
    assert ev.start <= at and at + len(margin) <= ev.end <= ev.start + 2 * MAX_SENTENCE + 1  # one piece, or two


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Characters given to pysbd and to `grounding.units`, counted."""
    seen = {"split": 0, "units": 0}
    process, units = Processor.process, grounding.units

    def counting_process(self: Processor) -> Any:
        seen["split"] += len(self.text)
        return process(self)

    def counting_units(text: str) -> list[str]:
        seen["units"] += len(text)
        return units(text)

    monkeypatch.setattr(Processor, "process", counting_process)
    monkeypatch.setattr(grounding, "units", counting_units)
    return seen


def punctuated(chars: int) -> str:
    return DOCUMENTS["towns"] * (chars // len(DOCUMENTS["towns"]) + 1)


def parts(text: str, size: int) -> Iterator[Segment]:
    start = 0
    while start < len(text):
        end = text.find(" ", start + size)
        end = len(text) if end < 0 else end
        yield Segment(0, start, end, text[start:end], ())
        start = end


@pytest.mark.parametrize("text", [punctuated(120_000), run_of_words(120_000, seed=3)],
                         ids=["punctuated", "unpunctuated"])
def test_each_character_read_is_split_and_indexed_a_bounded_number_of_times(
        text: str, counted: dict[str, int]) -> None:
    """Judging a margin after every part of a long text splits and indexes what each part adds, and the open
    end of the text: not everything read (or its unfinished last sentence) again for every margin."""
    judge = GroundedJudge()
    question = "Which pier does the night ferry to Brackwater leave from?"
    read = list(parts(text, 1500))
    for segment in read:
        margin = " ".join(segment.text.split()[3:15])
        judge.judge(question, margin, segment, text[:segment.end], document=text)
    assert len(read) > 70
    assert counted["split"] <= 3 * len(text)
    # each sentence's units once, the open end's, the whole document's once (the words still to come), and
    # each margin's and question's
    assert counted["units"] <= 4 * len(text)


def test_readings_of_several_documents_at_once_judge_as_one_alone() -> None:
    """Threads judging their own documents (two of them the same one) at the same time, through the shared
    indexes, give the verdicts each gives alone."""
    docs = [DOCUMENTS["towns"], DOCUMENTS["notes"], DOCUMENTS["towns"], DOCUMENTS["notes"][:20_000] + " Coda."]
    question = "Which pier does the night ferry to Brackwater leave from?"

    def judge_all(doc: str) -> list[tuple[bool, str]]:
        judge, out = GroundedJudge(), []
        for segment in segments(doc, 5):
            margin = " ".join(segment.text.split()[2:14])
            v = judge.judge(question, margin, segment, doc[:segment.end], document=doc)
            out.append((v.relevant, v.reason))
        return out

    alone = [judge_all(doc) for doc in docs]
    with ThreadPoolExecutor(max_workers=len(docs)) as pool:
        together = list(pool.map(judge_all, docs))
    assert together == alone
