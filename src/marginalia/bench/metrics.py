"""Answer metrics: SQuAD-style exact match and token F1, a lenient "contains", and set F1 for word lists.

Normalisation follows the official SQuAD v1.1 evaluation: lower-case, drop punctuation, drop the articles
a/an/the, collapse whitespace. Every score is the maximum over the gold answers.

Unanswerable questions (empty ``answers``, the SQuAD v2 convention) are right only when the model abstains:
an answer with no letter or digit, or one that says it cannot answer ("I don't know", "unanswerable", "the
context does not say", "insufficient information", ...; see `ABSTENTION`). An answer that normalisation
empties ("A", a credit rating) is an answer. A wordy abstention counts as an abstention, because small
models rarely answer with nothing at all; an answerable question answered with an abstention scores 0.
"""

from __future__ import annotations

import re
import string
import unicodedata
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence

from ..errors import UserError
from .items import Item

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")

#: Phrases (matched on the normalised answer) that mean "I cannot answer this".
ABSTENTION = re.compile(
    r"\b(i (do not|dont|cannot|cant|am unable to|am not able to) (know|tell|say|answer|find|determine)"
    r"|unanswerable|not answerable|(cannot|cant|can not) be (answered|determined|found)|no answer|not sure"
    r"|(insufficient|not enough|no) (information|context|evidence)|no mention"
    r"|(does|do|did) not (say|mention|state|specify|provide|contain|include|give)"
    r"|not (mentioned|stated|given|specified|provided)|unknown|not known)\b"
)


def normalize_answer(text: str) -> str:
    """Lower-case, remove punctuation, remove articles (a, an, the), collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def is_abstention(prediction: str) -> bool:
    """Whether an answer declines to answer: no letter or digit at all, or an abstention phrase.

    A one-word answer that normalisation would empty (a credit rating "A", a letter "an") is an answer.
    """
    if not any(ch.isalnum() for ch in prediction):
        return True
    return bool(ABSTENTION.search(normalize_answer(prediction.replace("\u2019", "'").replace("'", ""))))


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised prediction equals the normalised gold answer, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """Harmonic mean of precision and recall over normalised tokens (multiset overlap); 0.0 with no overlap."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


_POSSESSIVE = re.compile(r"(\w)['\u2019]s\b")


YES_NO = ("yes", "no")


def is_yes_no_gold(answers: Sequence[str]) -> bool:
    """Whether a question is a yes/no one by its gold answers: there are some, and each is yes or no."""
    return bool(answers) and all(normalize_answer(str(a)) in YES_NO for a in answers)


def bearing_is_telling(question: str, answers: Sequence[str]) -> bool:
    """Whether a margin holding a gold answer (`holds_answer`) tells anything: not for a yes/no question (a
    margin saying "no" bears nothing) nor for one that names its own answer (a comparison, "who is older, A
    or B?": every margin naming A or B would hold it)."""
    return bool(answers) and not is_yes_no_gold(answers) and not holds_answer(question, answers)


def says_neither_yes_nor_no(prediction: str, answers: Sequence[str]) -> bool:
    """A yes/no question (`is_yes_no_gold`) answered without the word yes or no: ``contains`` scores it wrong
    whatever it says ("X and Y were of the same nationality" for a gold "yes")."""
    return is_yes_no_gold(answers) and not set(normalize_answer(prediction).split()) & set(YES_NO)


def contains_answer(prediction: str, gold: str) -> float:
    """1.0 when the normalised gold appears in the normalised prediction as whole words, else 0.0.

    A possessive in the prediction does not hide the answer: "Google's report" contains "Google" (SQuAD's
    normalisation alone makes it "googles report"); nor do accents either side leaves out: "Ogedei Khan"
    contains "Ögedei Khan".
    """
    ref = normalize_answer(_unaccented(gold))
    if not ref:
        return 0.0
    return float(any(f" {ref} " in f" {normalize_answer(_unaccented(text))} "
                     for text in (prediction, _POSSESSIVE.sub(r"\1", prediction))))


def _unaccented(text: str) -> str:
    """``text`` without the accents of alphabetic scripts (Latin, Greek, Cyrillic): "Ögedei" -> "Ogedei",
    "café" -> "cafe". Marks on other scripts stay: Japanese "ガ" is another sound than "カ"."""
    out: list[str] = []
    for ch in unicodedata.normalize("NFD", text):
        if unicodedata.combining(ch) and out and _accented_script(out[-1]):
            continue
        out.append(ch)
    return unicodedata.normalize("NFC", "".join(out))


def _accented_script(ch: str) -> bool:
    return ch < "\u0530" or "\u1e00" <= ch < "\u2000"


def holds_answer(text: str, answers: Sequence[str]) -> bool:
    """Whether ``text`` contains any of ``answers`` (`contains_answer`): a margin or an answer that bears one."""
    return any(contains_answer(text, a) for a in answers)


def same_words(texts: Sequence[str]) -> list[int]:
    """For each text, the index of the first text with the same words (`normalize_answer`): its own index
    when it is the first, or has no words (margins written again in the same words are one note)."""
    first: dict[str, int] = {}
    out = []
    for i, text in enumerate(texts):
        words = normalize_answer(text)
        out.append(first.setdefault(words, i) if words else i)
    return out


def qa_scores(prediction: str, answers: Sequence[str]) -> dict[str, float]:
    """``em``, ``f1``, ``contains`` (each the max over ``answers``) and ``abstained``.

    With no gold answers (unanswerable), all three are 1.0 when the prediction abstains, else 0.0.
    """
    abstained = is_abstention(prediction)
    if not answers:
        right = float(abstained)
        return {"em": right, "f1": right, "contains": right, "abstained": float(abstained)}
    return {
        "em": max(exact_match(prediction, g) for g in answers),
        "f1": max(token_f1(prediction, g) for g in answers),
        "contains": max(contains_answer(prediction, g) for g in answers),
        "abstained": float(abstained),
    }


# -- word sets (common-words extraction) ---------------------------------------------------------------------

_ITEM_MARKER = re.compile(r"^\s*(?:\(?\d+[.):]|[-*\u2022]|\d+\s*[-\u2013])\s*")
_PARENTHETICAL = re.compile(r"\([^)]*\)|\[[^\]]*\]")
_WORD = re.compile(r"[a-z][a-z'\-]*")
_SPLIT = re.compile(r"[\n,;]|\band\b|\bor\b")


def extract_words(prediction: str) -> list[str]:
    """The words a model listed, in order, without repeats.

    Handles numbered or bulleted lines ("1. apple"), comma lists ("apple, pear and plum") and a preamble
    ending in a colon ("The most common words are: ..."). A piece of several words contributes one word:
    the last of the first piece (a preamble without a colon: "the words are apple") and the first of any
    later piece ("plum (30 times)").
    """
    text = prediction.strip()
    head, colon, rest = text.partition(":")
    if colon and re.search(r"[\n,]", rest) and "\n" not in head.strip():
        text = rest
    pieces = []
    for raw in _SPLIT.split(text.lower()):
        piece = _PARENTHETICAL.sub(" ", _ITEM_MARKER.sub("", raw))
        words = _WORD.findall(piece)
        words = [w.strip("'-") for w in words if w.strip("'-")]
        if words:
            pieces.append(words)
    out: list[str] = []
    for i, words in enumerate(pieces):
        word = words[-1] if i == 0 and len(pieces) > 1 else words[0]
        if word not in out:
            out.append(word)
    return out


def set_scores(prediction: str, answers: Sequence[str]) -> dict[str, float]:
    """Set precision, recall and F1 of the words in ``prediction`` against the gold word set.

    Returned under the shared keys too: ``f1`` (set F1), ``em`` (1.0 when the sets are equal) and
    ``contains`` (recall: the share of gold words named).
    """
    gold = {normalize_answer(a) for a in answers if normalize_answer(a)}
    pred = set(extract_words(prediction))
    same = len(gold & pred)
    precision = same / len(pred) if pred else 0.0
    recall = same / len(gold) if gold else float(not pred)
    f1 = 2 * precision * recall / (precision + recall) if same else float(not gold and not pred)
    return {"em": float(pred == gold), "f1": f1, "contains": recall, "precision": precision, "recall": recall}


# -- the seam ------------------------------------------------------------------------------------------------------


class Metric(ABC):
    """Scores one prediction against an item's gold answers."""

    @abstractmethod
    def score(self, prediction: str, answers: Sequence[str]) -> dict[str, float]:
        """Named scores in [0, 1]; every metric returns at least ``em``, ``f1`` and ``contains``."""


class QAMetric(Metric):
    """Exact match, token F1 and "contains", max over the gold answers (SQuAD v2 rule when there are none)."""

    def score(self, prediction: str, answers: Sequence[str]) -> dict[str, float]:
        return qa_scores(prediction, answers)


class SetMetric(Metric):
    """Set F1 of the listed words against the gold set (common-words extraction)."""

    def score(self, prediction: str, answers: Sequence[str]) -> dict[str, float]:
        return set_scores(prediction, answers)


#: Metrics by `Item.scoring`.
METRICS: dict[str, Metric] = {"qa": QAMetric(), "set": SetMetric()}


def score_item(item: Item, prediction: str) -> dict[str, float]:
    """Score a model's answer to an item with the metric its ``scoring`` names.

    Args:
        item: the benchmark item (its ``answers`` and ``scoring``).
        prediction: the model's answer text.

    Returns:
        ``{"em", "f1", "contains", ...}`` in [0, 1]: for ``qa`` also ``abstained``; for ``set`` also
        ``precision`` and ``recall``.

    Raises:
        UserError: an item whose ``scoring`` no metric handles.
    """
    metric = METRICS.get(item.scoring)
    if metric is None:
        raise UserError(f"item {item.id} asks for scoring {item.scoring!r}; known: {', '.join(sorted(METRICS))}")
    return metric.score(prediction, item.answers)


__all__ = [
    "ABSTENTION",
    "METRICS",
    "Metric",
    "QAMetric",
    "SetMetric",
    "bearing_is_telling",
    "contains_answer",
    "exact_match",
    "extract_words",
    "holds_answer",
    "is_abstention",
    "is_yes_no_gold",
    "normalize_answer",
    "qa_scores",
    "same_words",
    "says_neither_yes_nor_no",
    "score_item",
    "set_scores",
]
