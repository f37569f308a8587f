"""Section-bounded chunking: tiling and never-crossing invariants, size limits, overlap, a real tokenizer."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marginalia.errors import UserError
from marginalia.ingest.chunking import chunk_sections, paragraph_spans
from marginalia.ingest.loaders import content_id
from marginalia.ingest.sections import parse_sections
from marginalia.records import Chunk, Document, Section


def words(text: str) -> int:
    return len(text.split())


def doc_of(text: str, page_starts: tuple[int, ...] = ()) -> Document:
    return Document("t.md", text, content_id(text), "markdown", "T", page_starts)


def chunk(text: str, count: Any = words, **kwargs: int) -> tuple[Document, list[Section], list[Chunk]]:
    doc = doc_of(text)
    sections = parse_sections(doc)
    return doc, sections, chunk_sections(doc, sections, count, **kwargs)


def sentence(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n - 1)) + f" {tag}end."


def check_invariants(doc: Document, sections: list[Section], chunks: list[Chunk], count: Any,
                     max_tokens: int) -> None:
    """Spans are the text, chunks stay inside one section's body and tile it, and none is too long."""
    text = doc.text
    assert [c.index for c in chunks] == list(range(len(chunks)))
    by_section: dict[int, list[Chunk]] = {}
    for c in chunks:
        section = sections[c.section_index]
        assert c.text == text[c.start:c.end] and c.text
        assert section.body_start <= c.start < c.end <= section.body_end
        assert c.section_path == section.path and c.doc_id == doc.doc_id
        assert c.n_tokens == count(c.text)
        assert c.n_tokens <= max_tokens or len(c.text.split()) == 1
        assert c.page == doc.page_at(c.start)
        by_section.setdefault(c.section_index, []).append(c)
    for section in sections:
        own = by_section.get(section.index, [])
        if not text[section.body_start:section.body_end].strip():
            assert own == []
            continue
        assert own[0].start == section.body_start and own[-1].end == section.body_end
        assert all(a.end == b.start for a, b in zip(own, own[1:], strict=False))


# -- random markdown --------------------------------------------------------------

_word = st.sampled_from(["mill", "weir", "tide", "rope", "barley", "canal", "ledger", "quay"])
_sentence = st.lists(_word, min_size=1, max_size=14).map(lambda ws: " ".join(ws).capitalize() + ".")
_paragraph = st.tuples(st.lists(_sentence, min_size=1, max_size=12), st.sampled_from([" ", "\n"])).map(
    lambda t: t[1].join(t[0]))
_block = st.one_of(
    _paragraph,
    _paragraph,
    st.tuples(st.integers(1, 4), _word).map(lambda t: "#" * t[0] + " " + t[1]),
    st.lists(_word, min_size=1, max_size=8).map(lambda ws: "```\n" + " ".join(ws) + "\n\n" + ws[0] + "\n```"),
    st.lists(_word, min_size=2, max_size=6).map(lambda ws: "| " + " | ".join(ws) + " |\n|---|---|\n| a | b |"),
    st.just(""),
)
_markdown = st.tuples(st.lists(_block, max_size=30), st.sampled_from(["\n\n", "\n\n\n", "\n"])).map(
    lambda t: t[1].join(t[0]) + "\n")
_sizes = st.integers(4, 60).flatmap(lambda mx: st.tuples(st.integers(0, mx), st.just(mx)))


@given(_markdown, _sizes)
def test_invariants_random_markdown(text: str, sizes: tuple[int, int]) -> None:
    min_tokens, max_tokens = sizes
    doc, sections, chunks = chunk(text, min_tokens=min_tokens, max_tokens=max_tokens)
    check_invariants(doc, sections, chunks, words, max_tokens)
    for a, b in zip(chunks, chunks[1:], strict=False):
        # a small chunk next to another in its section could not have been merged into it
        if a.section_index == b.section_index and min(a.n_tokens, b.n_tokens) < min_tokens:
            assert a.n_tokens + b.n_tokens > max_tokens
    # a fenced block that fits is never cut
    for match in re.finditer(r"```\n.*?\n```", text, re.DOTALL):
        if words(match.group()) <= max_tokens:
            assert any(c.start <= match.start() and match.end() <= c.end for c in chunks)


@given(_markdown, st.integers(6, 60).flatmap(lambda mx: st.tuples(st.integers(1, mx - 1), st.just(mx))))
def test_overlap_random_markdown(text: str, sizes: tuple[int, int]) -> None:
    overlap, max_tokens = sizes
    doc, sections, chunks = chunk(text, min_tokens=0, max_tokens=max_tokens, overlap_tokens=overlap)
    # the chunks without their overlaps are the chunks of the smaller budget that leaves room for it
    _, _, cores = chunk(text, min_tokens=0, max_tokens=max_tokens - overlap)
    assert [(c.end, c.section_index) for c in chunks] == [(c.end, c.section_index) for c in cores]
    for c, core in zip(chunks, cores, strict=True):
        section = sections[c.section_index]
        assert c.text == doc.text[c.start:c.end]
        assert section.body_start <= c.start <= core.start
        assert c.start == section.body_start or doc.text[c.start - 1].isspace()
        assert c.n_tokens == words(c.text) <= max_tokens or len(c.text.split()) == 1
        before = doc.text[section.body_start:core.start]
        assert words(doc.text[c.start:core.start]) == min(overlap, words(before))


# -- specific rules ----------------------------------------------------------------


def test_long_paragraph_splits_at_sentence_ends() -> None:
    paragraph = " ".join(sentence(10, f"s{i}x") for i in range(50))
    doc, sections, chunks = chunk(f"# Long\n\n{paragraph}\n", min_tokens=10, max_tokens=35)
    check_invariants(doc, sections, chunks, words, 35)
    assert [c.n_tokens for c in chunks] == [30] * 16 + [20]
    assert all(c.text.rstrip().endswith("end.") for c in chunks)
    assert chunks[1].text.startswith("s3x0 ")


def test_long_sentence_splits_at_whitespace() -> None:
    doc, sections, chunks = chunk(sentence(100) + "\n", min_tokens=20, max_tokens=30)
    check_invariants(doc, sections, chunks, words, 30)
    assert [c.n_tokens for c in chunks] == [30, 30, 30, 10]


def test_unbreakable_word_stays_whole() -> None:
    text = "short words here\n\n" + "x" * 50 + "\n\nmore short words\n"
    doc, sections, chunks = chunk(text, count=len, min_tokens=0, max_tokens=20)
    check_invariants(doc, sections, chunks, len, 20)
    assert [c.text.strip() for c in chunks] == ["short words here", "x" * 50, "more short words"]


def test_small_remainder_takes_from_previous_chunk() -> None:
    paragraphs = [sentence(14, "a"), sentence(12, "b"), sentence(2, "c")]
    doc, sections, chunks = chunk("\n\n".join(paragraphs) + "\n", min_tokens=13, max_tokens=27)
    assert [c.n_tokens for c in chunks] == [14, 14]
    assert chunks[1].text.startswith("b0 ")


def test_paragraphs_pack_greedily_up_to_max() -> None:
    paragraphs = [sentence(n, t) for n, t in [(5, "a"), (6, "b"), (7, "c"), (8, "d"), (9, "e")]]
    text = "\n\n".join(paragraphs) + "\n"
    doc, sections, chunks = chunk(text, min_tokens=0, max_tokens=18)
    assert [c.n_tokens for c in chunks] == [18, 17]
    assert chunks[0].text == paragraphs[0] + "\n\n" + paragraphs[1] + "\n\n" + paragraphs[2] + "\n\n"


def test_chunks_never_cross_sections() -> None:
    text = "Lead in.\n\n# A\n\none two three\n\n## A.1\n\nfour five\n\n# Empty\n\n# B\n\nsix\n"
    doc, sections, chunks = chunk(text, min_tokens=100, max_tokens=200)
    assert [(c.text, c.section_path) for c in chunks] == [
        ("Lead in.", ()), ("one two three", ("A",)), ("four five", ("A", "A.1")), ("six", ("B",))]
    assert [c.section_index for c in chunks] == [0, 1, 2, 4]


def test_pages_come_from_the_document() -> None:
    text = "# One\n\nfirst page words\n\n# Two\n\nsecond page words\n"
    doc = doc_of(text, page_starts=(0, text.index("# Two")))
    chunks = chunk_sections(doc, parse_sections(doc), words)
    assert [(c.text, c.page) for c in chunks] == [("first page words", 1), ("second page words", 2)]


def test_code_and_tables_are_one_paragraph() -> None:
    text = "intro\n\n```\na\n\nb\n```\n\n| x | y |\n|---|---|\n| 1 | 2 |\n\nend\n~~~\nc\n~~~\nafter\n"
    spans = paragraph_spans(text, 0, len(text))
    assert [(text[a:b], block) for a, b, block in spans] == [
        ("intro\n\n", False), ("```\na\n\nb\n```\n\n", True), ("| x | y |\n|---|---|\n| 1 | 2 |\n\n", True),
        ("end\n", False), ("~~~\nc\n~~~\n", True), ("after\n", False)]


def test_each_paragraph_is_counted_once() -> None:
    calls: list[str] = []

    def counting(text: str) -> int:
        calls.append(text)
        return words(text)

    paragraphs = [sentence(n, f"p{n}x") for n in (5, 9, 4, 12, 7, 3, 8, 6, 10, 5)]
    doc, sections, chunks = chunk("# S\n\n" + "\n\n".join(paragraphs) + "\n", count=counting,
                                  min_tokens=5, max_tokens=20)
    check_invariants(doc, sections, chunks, words, 20)
    assert len(set(calls)) == len(calls) <= len(paragraphs) + len(chunks)  # no text is counted twice
    assert set(paragraphs) <= {c.strip() for c in calls}


@pytest.mark.parametrize("kwargs", [dict(min_tokens=30, max_tokens=20), dict(max_tokens=0),
                                    dict(max_tokens=20, overlap_tokens=20), dict(overlap_tokens=-1)])
def test_bad_sizes(kwargs: dict[str, int]) -> None:
    with pytest.raises(UserError):
        chunk("# A\n\nwords\n", **kwargs)


# -- the embedded model's tokenizer ----------------------------------------------

REPORT = """# Harbour Report

The harbour trust met in March. It discussed the quay, the ferry timetable and the state of the old granary.
Members agreed that the granary roof needs new slates before the autumn storms arrive.

## Tides and Depths

Spring tides reach 5.2 metres at the inner quay; neap tides rarely pass 3 metres. Dredging last took place
in 2019, and silt has since raised the channel floor by about 40 centimetres near the mouth.

```
depth_m = {"inner quay": 5.2, "outer quay": 6.8, "channel": 4.1}
```

## Finances

| Item | Cost |
|---|---|
| Slates | 12,400 |
| Dredging | 88,000 |

Income from mooring fees rose by a tenth. The trust keeps a reserve for emergencies; it was not touched this year.
"""


@pytest.mark.slow
@pytest.mark.parametrize("sizes", [(20, 40, 0), (5, 24, 0), (10, 40, 12)])
def test_smollm2_tokenizer_counts(smollm2: Any, sizes: tuple[int, int, int]) -> None:
    count = smollm2.tokenizer.count
    min_tokens, max_tokens, overlap = sizes
    text = REPORT + "\n" + "\n\n".join(
        f"Paragraph {i}: the ferry from Ostervik to Carrow ran {i} times in May. " * (1 + i % 4) for i in range(12))
    doc, sections, chunks = chunk(text, count=count, min_tokens=min_tokens, max_tokens=max_tokens,
                                  overlap_tokens=overlap)
    assert len(chunks) > 5
    for c in chunks:
        section = sections[c.section_index]
        assert c.text == doc.text[c.start:c.end]
        assert section.body_start <= c.start < c.end <= section.body_end
        assert c.n_tokens == count(c.text) <= max_tokens
    if not overlap:
        check_invariants(doc, sections, chunks, count, max_tokens)


@pytest.mark.slow
@settings(max_examples=40)
@given(text=_markdown, sizes=_sizes, overlap=st.integers(0, 3))
def test_invariants_smollm2_tokenizer(smollm2: Any, text: str, sizes: tuple[int, int], overlap: int) -> None:
    """The packing sums per-paragraph counts; the real tokenizer counts joined text a little differently,
    and still no chunk may exceed the maximum."""
    count = smollm2.tokenizer.count
    min_tokens, max_tokens = sizes
    max_tokens = max(max_tokens, overlap + 1)
    doc, sections, chunks = chunk(text, count=count, min_tokens=min(min_tokens, max_tokens),
                                  max_tokens=max_tokens, overlap_tokens=overlap)
    if overlap:
        for c in chunks:
            section = sections[c.section_index]
            assert section.body_start <= c.start < c.end <= section.body_end and c.text == doc.text[c.start:c.end]
            assert c.n_tokens == count(c.text) <= max_tokens or len(c.text.split()) == 1
    else:
        check_invariants(doc, sections, chunks, count, max_tokens)
