"""Scoring tokens (`CachingGenerator.score`): log-probabilities that match a full forward pass, and a cache
left exactly as it was."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from marginalia.errors import BackendError
from marginalia.models.base import GenerationParams
from marginalia.models.fake import ScriptedGenerator

PROMPT = "The harbour opens at dawn and closes at dusk. Rain fell on the market square"
MORE = " all week, and the road to the mill flooded. Ships, carts and bicycles crowd the bridge."
GREEDY = GenerationParams(max_new_tokens=8)


def test_transformers_scores_match_one_full_forward(make_tiny: Any, tiny_parts: Any) -> None:
    torch = pytest.importorskip("torch")
    model, _ = tiny_parts
    gen = make_tiny(prefill_chunk=5)  # scoring crosses chunk boundaries too
    prompt, more = gen.tokenizer.encode(PROMPT), gen.tokenizer.encode(MORE)
    gen.prefill(prompt)
    before = "".join(gen.generate_from_cache([], GREEDY))
    scores = gen.score(more)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + more])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    expected = [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(more)]
    assert len(scores) == len(more)
    np.testing.assert_allclose(scores, expected, atol=1e-4)
    assert all(s < 0 for s in scores)
    assert gen.cached_ids == tuple(prompt)
    assert "".join(gen.generate_from_cache([], GREEDY)) == before  # the cache is as it was


@pytest.mark.slow
def test_llamacpp_batch_scores_match_token_by_token(smollm2_llamacpp: Any) -> None:
    gen = smollm2_llamacpp.fork(keep_cache=False)
    tok = gen.tokenizer
    prompt, more = tok.encode(PROMPT), tok.encode(MORE)
    gen.prefill(prompt)
    before = "".join(gen.generate_from_cache([], GREEDY))
    scores = gen.score(more)
    assert gen.cached_ids == tuple(prompt)
    assert "".join(gen.generate_from_cache([], GREEDY)) == before

    one = smollm2_llamacpp.fork(keep_cache=False)
    expected = []
    for k, token in enumerate(more[:6]):  # each token after a prompt read in one batch, as prefill reads it
        one.reset()
        one.prefill(prompt + more[:k])
        expected.append(one.score([token])[0])
    np.testing.assert_allclose(scores[:6], expected, atol=1e-3)
    # the text itself is far likelier than the same tokens shuffled
    shuffled = list(np.random.default_rng(0).permutation(more))
    assert np.mean(scores) > np.mean(gen.score(shuffled)) + 1.0
    gen.reset()
    one.reset()


def test_score_needs_a_prompt_and_logits(make_tiny: Any) -> None:
    gen = make_tiny()
    with pytest.raises(BackendError, match="empty"):
        gen.score(gen.tokenizer.encode("word"))
    assert gen.score([]) == []
    fake = ScriptedGenerator(["x"])
    fake.prefill(fake.tokenizer.encode("a b"))
    with pytest.raises(BackendError, match="cannot score"):
        fake.score(fake.tokenizer.encode("c"))
