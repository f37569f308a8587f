"""The segmenter: segments tile the context exactly, respect the size and cut at natural boundaries."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from marginalia.errors import UserError
from marginalia.ingest.segment import (
    LINE,
    PARAGRAPH,
    SENTENCE,
    TOKEN,
    WORD,
    boundary_strength,
    segment_text,
)
from marginalia.models.base import Tokenizer
from marginalia.models.fake import WordTokenizer

PIECES = [
    " ", "  ", "\n", "\n\n", "\n \n", "\n\n\n", "\t", ". ", "! ", "? ", ", ", "; ", ".\n", "...",
    "\u00e9", "\u00fc", "\u00df", "\u2014", "\u201cquoted\u201d", "\u6f22\u5b57", "\u0627\u0644\u0639",
    "\U0001f600", "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467", "e\u0301",
    "Fact 17: the value is 1717.", "The harbour opens at dawn.", "<|im_start|>", "{x} $y",
]
# any assigned, printable code point (control characters come from PIECES: tab, newlines)
chars = st.characters(blacklist_categories=("Cs", "Cc", "Co", "Cn"))
texts = st.lists(
    st.one_of(st.sampled_from(PIECES), st.text(chars, min_size=1, max_size=6)),
    min_size=0, max_size=40,
).map("".join)


def check_invariants(text: str, tok: Tokenizer, max_tokens: int) -> None:
    segs = segment_text(text, tok, max_tokens)
    whole = tok.encode(text)
    assert "".join(s.text for s in segs) == text
    assert [i for s in segs for i in s.token_ids] == whole
    if not text:
        assert segs == []
        return
    assert segs[0].start == 0 and segs[-1].end == len(text)
    for k, s in enumerate(segs):
        assert s.index == k
        assert s.text == text[s.start:s.end]
        assert s.n_tokens >= 1
        assert s.end > s.start
        # a segment's tokens are exactly its text's tokens: no character is split between two
        assert tok.decode(s.token_ids) == s.text
        if k:
            assert segs[k - 1].end == s.start
        if s.n_tokens > max_tokens:
            # only allowed when no cut in its first max_tokens tokens keeps characters whole
            for j in range(1, max_tokens + 1):
                assert not s.text.startswith(tok.decode(s.token_ids[:j])), (k, j)


@settings(max_examples=300, deadline=None)
@given(text=texts, max_tokens=st.integers(1, 50))
def test_invariants_word_tokenizer(text: str, max_tokens: int) -> None:
    tok = WordTokenizer()
    check_invariants(text, tok, max_tokens)
    # every word-level token is at least one whole character, so the bound always holds
    assert all(1 <= s.n_tokens <= max_tokens for s in segment_text(text, tok, max_tokens))


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts, max_tokens=st.integers(1, 50))
def test_invariants_smollm2_tokenizer(smollm2: Any, text: str, max_tokens: int) -> None:
    tok = smollm2.tokenizer
    # SmolLM2's byte-level vocabulary lacks a few bytes (0xF1, 0xF2, some C0 controls), so
    # a handful of rare characters do not survive encode/decode; that is the model's, not ours
    assume(tok.decode(tok.encode(text)) == text)
    check_invariants(text, tok, max_tokens)


@pytest.mark.slow
def test_smollm2_segments_respect_size(smollm2: Any) -> None:
    text = "Fact 3: the value is 33. \u00dcber caf\u00e9s \u2014 fine.\n\n" * 30
    for max_tokens in (2, 5, 17, 50):
        segs = segment_text(text, smollm2.tokenizer, max_tokens)
        assert all(1 <= s.n_tokens <= max_tokens for s in segs)
        assert "".join(s.text for s in segs) == text
    # ' \u00dc' is two byte-level tokens that share one character: at size 1 it cannot be cut,
    # and it is the only kind of segment allowed to exceed the size
    over = {s.text for s in segment_text(text, smollm2.tokenizer, 1) if s.n_tokens > 1}
    assert over == {" \u00dc"}


def test_non_positive_size_is_a_user_error() -> None:
    for bad in (0, -1):
        with pytest.raises(UserError) as info:
            segment_text("some text", WordTokenizer(), bad)
        assert str(bad) in str(info.value)


def test_empty_text_has_no_segments() -> None:
    assert segment_text("", WordTokenizer(), 5) == []


def test_short_text_is_one_segment() -> None:
    text = "One short line.\n"
    segs = segment_text(text, WordTokenizer(), 50)
    assert len(segs) == 1 and segs[0].text == text and (segs[0].start, segs[0].end) == (0, len(text))


# -- boundaries -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, cut, strength",
    [
        ("para one.\n\nPara two", 11, PARAGRAPH),
        ("para one.\n  \nPara two", 13, PARAGRAPH),
        ("line one\nline two", 9, LINE),
        ("One. Two", 5, SENTENCE),
        ("Really?\u201d Yes", 9, SENTENCE),
        ("one two", 4, WORD),
        ("one two", 3, WORD),
        ("onetwo", 3, TOKEN),
        ("anything", 0, PARAGRAPH),
    ],
)
def test_boundary_strength(text: str, cut: int, strength: int) -> None:
    assert boundary_strength(text, cut) == strength


FACTS = [f"Fact {i}: the value is {i}{i}." for i in range(1, 41)]
LAYOUTS = {
    "spaces": " ".join(FACTS),
    "lines": "\n".join(FACTS),
    "paragraphs": "\n\n".join(FACTS),
    "mixed": "\n\n".join(" ".join(FACTS[i:i + 5]) for i in range(0, 40, 5)),
}


def _facts_intact(text: str, tok: Tokenizer, max_tokens: int) -> None:
    segs = segment_text(text, tok, max_tokens)
    assert len(segs) >= 8  # the size forces many cuts
    assert "".join(s.text for s in segs) == text
    for fact in FACTS:
        holders = [s.index for s in segs if fact in s.text]
        assert len(holders) == 1, f"{fact!r} is split across segments"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_cuts_keep_sentences_whole_word_tokenizer(layout: str) -> None:
    _facts_intact(LAYOUTS[layout], WordTokenizer(), 40)


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_cuts_keep_sentences_whole_smollm2(smollm2: Any, layout: str) -> None:
    """Found as a bug: byte-level BPE puts the space after '.' into the next token, so the
    cut sits before the space and a sentence end was scored as a plain word break."""
    _facts_intact(LAYOUTS[layout], smollm2.tokenizer, 40)


def test_cuts_prefer_paragraphs() -> None:
    tok = WordTokenizer()
    text = LAYOUTS["mixed"]
    segs = segment_text(text, tok, 100)  # a paragraph is ~70 word tokens
    assert all(s.text.endswith("\n\n") for s in segs[:-1])
