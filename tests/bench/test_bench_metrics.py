"""Answer metrics against values worked out by hand under the official SQuAD v1.1 evaluation rules."""

from __future__ import annotations

from fractions import Fraction

import pytest

from marginalia.bench.items import Item
from marginalia.bench.metrics import (
    contains_answer,
    exact_match,
    extract_words,
    is_abstention,
    normalize_answer,
    qa_scores,
    score_item,
    set_scores,
    token_f1,
)
from marginalia.errors import UserError


@pytest.mark.parametrize(("text", "expected"), [
    ("The Eiffel Tower!", "eiffel tower"),
    ("  A  cat,\tan apple ", "cat apple"),
    ("Theory of the atom", "theory of atom"),  # articles only as whole words
    ("U.S.-based", "usbased"),  # punctuation is removed, not replaced by a space
    ("An", ""),
])
def test_normalize(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


@pytest.mark.parametrize(("prediction", "gold", "em"), [
    ("The Eiffel Tower", "eiffel tower", 1.0),
    ("eiffel tower.", "The Eiffel Tower", 1.0),
    ("Eiffel Tower in Paris", "Eiffel Tower", 0.0),
    ("Denver, Colorado", "denver colorado", 1.0),
])
def test_exact_match(prediction: str, gold: str, em: float) -> None:
    assert exact_match(prediction, gold) == em


@pytest.mark.parametrize(("prediction", "gold", "f1"), [
    # pred {denver, broncos, won} vs gold {denver, broncos}: P = 2/3, R = 1
    ("the Denver Broncos won", "Denver Broncos", Fraction(4, 5)),
    # P = 1, R = 1/2
    ("Broncos", "Denver Broncos", Fraction(2, 3)),
    # multiset overlap: "new" and "york" once each; P = 2/4, R = 1
    ("new york new york", "new york", Fraction(2, 3)),
    # {in, 10th} vs {10th, century}: P = R = 1/2
    ("in the 10th", "10th century", Fraction(1, 2)),
    ("Denver, Colorado.", "denver colorado", Fraction(1)),
    ("Paris", "Denver Broncos", Fraction(0)),
    # both normalise to nothing: no common token, so 0 under v1.1
    ("the", "a", Fraction(0)),
])
def test_token_f1(prediction: str, gold: str, f1: Fraction) -> None:
    assert token_f1(prediction, gold) == pytest.approx(float(f1))


def test_scores_take_the_best_gold() -> None:
    golds = ["10th century", "the first half of the 10th century", "10th"]
    assert qa_scores("10th century", golds)["em"] == 1.0
    scores = qa_scores("in the 10th", ["10th century", "10th"])
    assert scores["em"] == 0.0
    assert scores["f1"] == pytest.approx(2 / 3)  # against "10th": P = 1/2, R = 1
    assert scores["contains"] == 1.0  # "10th" appears as a word


def test_contains_is_whole_words() -> None:
    assert contains_answer("The answer is the Denver Broncos.", "Denver Broncos") == 1.0
    assert contains_answer("Denverite fans cheered", "Denver") == 0.0
    assert contains_answer("anything", "the") == 0.0  # an answer that normalises to nothing never matches
    # a possessive does not hide the answer, and a possessive gold still matches itself
    assert contains_answer("Google's report states it has no plans.", "Google") == 1.0
    assert contains_answer("It is Google\u2019s.", "Google") == 1.0
    assert contains_answer("They ate at McDonald's.", "McDonald's") == 1.0
    assert contains_answer("The googles are big.", "Google") == 0.0
    # an accent the prediction leaves out (or adds) does not hide the answer (SQuAD 4k: "Ogedei Khan")
    assert contains_answer("Ogedei Khan was assigned as his successor.", "Ögedei Khan") == 1.0
    assert contains_answer("She ate at the Café Zoë.", "Cafe Zoe") == 1.0
    assert contains_answer("Ogedei was there.", "Ögedei Khan") == 0.0
    assert contains_answer("Tiếng Việt", "Tieng Viet") == 1.0
    assert contains_answer("カラス", "ガラス") == 0.0  # a voiced kana is another sound, not an accent


def test_unanswerable_needs_an_abstention() -> None:
    for answer in ("", "I don't know.", "The context does not say who it was.", "Unanswerable",
                   "There is insufficient information to answer."):
        assert is_abstention(answer), answer
        assert qa_scores(answer, []) == {"em": 1.0, "f1": 1.0, "contains": 1.0, "abstained": 1.0}
    assert qa_scores("Rollo", []) == {"em": 0.0, "f1": 0.0, "contains": 0.0, "abstained": 0.0}
    # an answer that normalisation empties is still an answer (MultiHop-RAG: a credit rating of "A")
    for answer in ("A", "A.", "an", "The"):
        assert not is_abstention(answer), answer
        assert qa_scores(answer, [])["contains"] == 0.0
    assert is_abstention(" ... ") and is_abstention("?")
    # an answerable question answered with an abstention scores nothing
    scores = qa_scores("I don't know", ["Rollo"])
    assert (scores["em"], scores["f1"], scores["abstained"]) == (0.0, 0.0, 1.0)


@pytest.mark.parametrize(("text", "words"), [
    ("1. apple\n2. Banana\n3) cherry", ["apple", "banana", "cherry"]),
    ("The most common words are: apple, banana and cherry.", ["apple", "banana", "cherry"]),
    ("apple, banana, apple, cherry", ["apple", "banana", "cherry"]),
    ("The words are apple, pear", ["apple", "pear"]),
    ("- apple (30 times)\n- pear (29 times)", ["apple", "pear"]),
    ("", []),
])
def test_extract_words(text: str, words: list[str]) -> None:
    assert extract_words(text) == words


def test_set_scores() -> None:
    gold = ["apple", "banana", "cherry", "date"]
    scores = set_scores("apple, banana, kiwi", gold)  # P = 2/3, R = 2/4
    assert scores["precision"] == pytest.approx(2 / 3)
    assert scores["recall"] == pytest.approx(1 / 2)
    assert scores["f1"] == pytest.approx(4 / 7)
    assert scores["em"] == 0.0
    assert set_scores("1. Date\n2. cherry\n3. banana\n4. apple", gold)["em"] == 1.0
    assert set_scores("I cannot tell.", gold)["f1"] == 0.0


def _item(scoring: str, answers: tuple[str, ...]) -> Item:
    return Item(id="t/1", task="t", example_id="1", question="q", answers=answers, context="c",
                context_tokens=1, scoring=scoring)


def test_score_item_dispatches_on_scoring() -> None:
    assert score_item(_item("qa", ("Denver Broncos",)), "the Denver Broncos won")["f1"] == pytest.approx(0.8)
    assert score_item(_item("set", ("apple", "pear")), "apple, pear")["f1"] == 1.0
    with pytest.raises(UserError):
        score_item(_item("rouge", ("x",)), "x")


def test_same_words_points_each_text_at_the_first_in_the_same_words() -> None:
    from marginalia.bench.metrics import same_words

    assert same_words(["1999", "The 1999.", "", "", "It was 1838", "it was 1838!", "1999"]) == [0, 0, 2, 3, 4, 4, 0]
