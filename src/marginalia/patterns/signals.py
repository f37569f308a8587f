"""Whether a RAG answer stands on the passages it read: how much of it one or two of their sentences hold, and
whether those sentences are about what the question asks.

A multi-hop answer joins facts from two passages ("the speedway where the race was held" from one, its name
from another): no single sentence holds all of it, two together do (`support`). An answer copied from a sentence
about something else is fully supported and still wrong: the question's words and names are not around it
(`topic`, `names`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .grounding import Reading, find_evidence, question_names, units

#: how many of the best-supporting sentences are tried in pairs (each pair's union is weighed)
PAIR_CANDIDATES = 24
#: words that add nothing to an answer beyond the question's (a yes or a no)
_FILLER = frozenset({"yes", "no", "the", "a", "an", "is", "was", "are", "were"})


@dataclass(frozen=True)
class AnswerSupport:
    """How a RAG answer stands on its passages (each share weighs units by their rarity in the passages).

    ``support``: the share of the answer's units beyond the question's that the best sentence, or the best two
    sentences together, hold (1.0: copied); ``single``: the same for the best single sentence; ``topic``: the
    share of the question's units (those the passages use, and its names) that the supporting sentences and the
    sentence before each hold; ``names``: the share of the question's names that the passages holding the
    supporting sentences hold (1.0 for a question that names nothing); ``sentences``: how many sentences
    support it (0: none does).
    """

    support: float
    single: float
    topic: float
    names: float
    sentences: int

    def signals(self) -> dict[str, float | None]:
        """The measures as a route's signals."""
        return {"support": round(self.support, 4), "single_support": round(self.single, 4),
                "topic": round(self.topic, 4), "names": round(self.names, 4)}


NONE = AnswerSupport(0.0, 0.0, 0.0, 0.0, 0)
ECHO = AnswerSupport(1.0, 1.0, 1.0, 1.0, 0)  # an answer that adds nothing to the question: nothing to find


def measure(question: str, answer: str, passages: Sequence[str]) -> AnswerSupport:
    """How ``answer`` stands on ``passages`` (see `AnswerSupport`)."""
    text = "\n\n".join(passages)
    if not text.strip():
        return NONE
    reading = Reading.of(text)
    evidence = find_evidence(question, answer, reading, min_support=0.0)
    if evidence is None:
        says = set(re.findall(r"\w+", answer.lower())) - set(re.findall(r"\w+", question.lower()))
        return ECHO if not says - _FILLER else NONE
    first = reading.sentence_at(evidence.start)
    chosen = [first]
    support = evidence.support
    new = set(units(answer)) - set(units(question))
    if support < 1.0 and new:
        weight = {u: reading.idf(u) for u in new}
        total = sum(weight.values())

        def held(*ks: int) -> float:
            return sum(weight[u] for u in new if any(u in reading.sets[k] for k in ks)) / total

        candidates = sorted(reading.holding_any(new), key=held, reverse=True)[:PAIR_CANDIDATES]
        for i, j in itertools.combinations(candidates, 2):
            both = held(i, j)
            if both > support + 1e-9 and both > max(held(i), held(j)) + 1e-9:
                support, chosen = both, [i, j]
    asked = set(units(question))
    named = question_names(question)
    counted, weight_total = reading.question_weights(asked, named)
    near: set[str] = set()
    for k in chosen:
        near |= reading.near(k)
    topic = (sum(reading.idf(q) for q in counted if q in near) / weight_total) if weight_total else 1.0
    return AnswerSupport(support, evidence.support, topic, _names_held(named, chosen, reading, passages),
                         len(chosen))


def _names_held(named: set[str], chosen: Sequence[int], reading: Reading, passages: Sequence[str]) -> float:
    """The share of the question's names (by rarity) held by the passages that hold the ``chosen`` sentences."""
    if not named:
        return 1.0
    bounds = list(itertools.accumulate(len(p) + 2 for p in passages))  # where each passage ends in the text
    held: set[str] = set()
    for k in chosen:
        start = reading.spans[k][0]
        n = next((i for i, end in enumerate(bounds) if start < end), len(passages) - 1)
        held |= set(units(passages[n]))
    total = sum(reading.idf(u) for u in named)
    return sum(reading.idf(u) for u in named if u in held) / total if total else 1.0
