"""`bench calibrate`'s choice worked out on items: support from one sentence or two is weighed with the rest."""

from __future__ import annotations

from marginalia.bench.calibrate import Outcome, candidates


def item(rag_right: bool, single: float, two: float) -> dict[str, Outcome]:
    signals = {"support": two, "single_support": single, "topic": 1.0, "abstains": 0.0, "gathers": 0.0}
    return {"rag": Outcome(float(rag_right), 1.0, signals), "wim": Outcome(1.0, 10.0, {})}


def test_two_sentences_are_chosen_where_multi_hop_answers_stand_only_on_two():
    # RAG right where its answer joins two sentences, wrong where it copied one about something else
    items = [item(True, 0.2, 0.9)] * 6 + [item(False, 0.6, 0.6)] * 6
    found = [c for c in candidates(items, ["wim"], "wim") if c.within]
    cheapest = min(found, key=lambda c: (c.seconds, c.support_threshold))
    assert (cheapest.support_sentences, cheapest.score, cheapest.escalated) == (2, 1.0, 6)
    assert 0.6 < cheapest.support_threshold <= 0.9
    assert "from two sentences" in cheapest.describe()
    # from one sentence, keeping the multi-hop answers keeps the copied ones too
    one = [c for c in candidates(items, ["wim"], "wim") if c.support_sentences == 1 and c.escalate == "wim"]
    assert all(c.score < 1.0 or c.escalated == 12 for c in one)
