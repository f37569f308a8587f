"""The three margin judges, as units (WiM runs with each are in test_wim.py)."""

from __future__ import annotations

import pytest

from marginalia.errors import UserError
from marginalia.models.base import GenerationParams
from marginalia.models.fake import ScriptedGenerator
from marginalia.patterns.judges import (
    FusedJudge,
    GroundedJudge,
    SeparateJudge,
    content_words,
    find_evidence,
    is_empty_margin,
    make_judge,
)
from marginalia.records import Segment

QUESTION = "Which pier does the night ferry to Brackwater leave from?"
FACT = "The night ferry to Brackwater leaves from pier 47."
READ = ("The bakery near the Carrow bridge was known for its bright rye bread. "
        f"{FACT} Traders at the Lindholm market sold wool and honey from early morning.\n")
SEGMENT = Segment(0, 0, len(READ), READ, ())


@pytest.mark.parametrize("text", ["", "  ", "NONE", "None.", "no", "Nothing", "n/a", "- none -"])
def test_empty_margins(text: str) -> None:
    assert is_empty_margin(text)


@pytest.mark.parametrize("text", ["Pier 47.", "No ferry leaves at night.", "Nonetheless, pier 47."])
def test_nonempty_margins(text: str) -> None:
    assert not is_empty_margin(text)


def test_content_words_drop_stopwords_and_inflections() -> None:
    words = content_words("Which pier does THE ferry leave from?")
    assert len(words) == 3
    assert words == content_words("pier ferry leaves")
    assert content_words("leaves") == content_words("leave")
    assert content_words("named") == content_words("name")
    assert content_words("4719 47") == ["4719", "47"]


def test_grounded_accepts_a_quote_and_cites_its_sentence() -> None:
    verdict = GroundedJudge().judge(QUESTION, FACT, SEGMENT, READ)
    assert verdict.relevant and verdict.score == 1.0
    assert verdict.evidence is not None
    assert READ[slice(*verdict.evidence)].strip() == FACT


@pytest.mark.parametrize(
    "margin, reason",
    [
        ("NONE", "nothing was found"),
        ("The bakery near the Carrow bridge was known for its bright rye bread.", "no word"),
        ("Pier 99.", "none of the words it adds"),     # its only new word was never read
        ("The night ferry to Brackwater.", "adds nothing"),  # nothing beyond the question
        ("The ferry pier is near the Carrow bakery.", "not beside"),
    ],
)
def test_grounded_rejects(margin: str, reason: str) -> None:
    verdict = GroundedJudge().judge(QUESTION, margin, SEGMENT, READ)
    assert not verdict.relevant
    assert reason in verdict.reason


def test_grounded_threshold() -> None:
    margin = f"{FACT[:-1]} with lanterns."  # new words: 47 (read) and lanterns (not): 50%
    assert GroundedJudge(0.5).judge(QUESTION, margin, SEGMENT, READ).relevant
    assert not GroundedJudge(0.75).judge(QUESTION, margin, SEGMENT, READ).relevant
    for bad in (-0.1, 1.5):
        with pytest.raises(UserError):
            GroundedJudge(bad)


def test_grounded_rejects_a_wrong_number_in_a_copied_sentence() -> None:
    """Found as a bug: {leaves, 99} once gave support 0.5 (leaves found) and passed."""
    for margin in ("The night ferry to Brackwater leaves from pier 99.",
                   "The night ferry to Brackwater leaves from pier 47 at 9 pm."):
        verdict = GroundedJudge().judge(QUESTION, margin, SEGMENT, READ)
        assert not verdict.relevant, margin


def test_grounded_rejects_the_question_paired_with_a_name_from_elsewhere() -> None:
    """Found as a bug (SmolLM2 wrote this margin on a haystack): 'leaves' (question: 'leave')
    counted as a rare new word found in the fact's sentence, so support was 0.6."""
    read = ("The bakery near the Carrow bridge was known for its rye bread. Children crossed "
            "the Carrow bridge to school. The road over the Carrow bridge was repaired in May. "
            f"{FACT} Traders sold wool.\n")
    margin = ("The pier that the night ferry to Brackwater leaves from is the pier that the "
              "Carrow Bridge is on.")
    verdict = GroundedJudge().judge(QUESTION, margin, Segment(0, 0, len(read), read, ()), read)
    assert not verdict.relevant


def test_find_evidence_weights_rare_words() -> None:
    text = "Carts cross the bridge. Carts cross the bridge daily. The pier 47 bridge is old."
    ev = find_evidence("Which bridge?", "pier 47 carts", text)
    assert ev is not None
    # 'pier' and '47' occur once (weight 1 each), 'carts' twice (weight 1/2): the third sentence wins
    assert text[ev.start:ev.end].strip() == "The pier 47 bridge is old."
    assert ev.support == pytest.approx(2 / 2.5)
    assert find_evidence("Which bridge?", "bridge", text) is None  # nothing new


def test_fused_verdicts() -> None:
    judge = FusedJudge()
    yes = judge.judge(QUESTION, f"YES: {FACT}", SEGMENT, READ)
    assert yes.relevant and yes.text == FACT
    assert yes.evidence is not None and READ[slice(*yes.evidence)].strip() == FACT
    no = judge.judge(QUESTION, "NO", SEGMENT, READ)
    assert not no.relevant and no.reason == "the model said NO"
    bare_yes = judge.judge(QUESTION, "YES", SEGMENT, READ)
    assert not bare_yes.relevant  # YES with nothing after it is an empty note
    other = judge.judge(QUESTION, FACT, SEGMENT, READ)
    assert not other.relevant and "did not start with YES" in other.reason


def test_fused_read_stops_at_no() -> None:
    consumed: list[str] = []

    def stream():  # type: ignore[no-untyped-def]
        for piece in ["NO", ",", " it", " does", " not"]:
            consumed.append(piece)
            yield piece

    assert FusedJudge().read(stream()) == "NO"
    assert consumed == ["NO"]
    assert FusedJudge().read(iter(["YES", " pier", " 47"])) == "YES pier 47"


def test_separate_judge_asks_a_stateless_question() -> None:
    gen = ScriptedGenerator(replies=["YES", "no."])
    judge = SeparateJudge(gen)
    yes = judge.judge(QUESTION, FACT, SEGMENT, READ)
    no = judge.judge(QUESTION, "Pier 12.", SEGMENT, READ)
    empty = judge.judge(QUESTION, "NONE", SEGMENT, READ)
    assert yes.relevant and READ[slice(*yes.evidence)].strip() == FACT  # type: ignore[misc]
    assert not no.relevant and no.evidence is None
    assert not empty.relevant
    assert len(gen.requests) == 2  # the empty margin cost no request
    for req, note in zip(gen.requests, [FACT, "Pier 12."], strict=True):
        assert req.prefix_ids == ()
        assert f"Question: {QUESTION}\nNote: {note}\n" in req.suffix


def test_make_judge() -> None:
    gen = ScriptedGenerator()
    assert isinstance(make_judge("grounded", gen), GroundedJudge)
    assert isinstance(make_judge("fused", gen), FusedJudge)
    assert isinstance(make_judge("separate", gen), SeparateJudge)
    with pytest.raises(UserError):
        make_judge("telepathy", gen)


def test_fused_judge_needs_a_constrained_first_token() -> None:
    class Unconstrained(ScriptedGenerator):
        supports_first_choices = False

    gen = Unconstrained(name="loose")
    with pytest.raises(UserError, match="fused judge needs the margin's first token restricted to YES or NO, "
                                        "and loose cannot do that"):
        make_judge("fused", gen)
    assert isinstance(make_judge("grounded", gen), GroundedJudge)
    with pytest.raises(UserError, match="loose cannot restrict the first generated token"):
        gen.generate("Is it?", GenerationParams(first_choices=FusedJudge.choices))
    assert gen.requests == []  # refused, not sent without the constraint


def test_evidence_span_is_the_sentence_without_surrounding_space() -> None:
    text = "The road was quiet. The vault code is 4719. Rain fell."
    ev = find_evidence("What is the vault code?", "The vault code is 4719.", text)
    assert ev is not None
    assert text[ev.start:ev.end] == "The vault code is 4719."
