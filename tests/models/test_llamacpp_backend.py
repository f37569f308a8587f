"""The in-process llama.cpp backend: same tokenizer and template as transformers, exact rollback."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from marginalia.models.base import GenerationParams
from marginalia.models.registry import gguf_backend

pytest.importorskip("llama_cpp")

GREEDY = GenerationParams(max_new_tokens=12)
TEXT = ("Read the following document.\n\nThe bakery on Mill Street opens at six. Zoë sells "
        "café crème for €3.\n\nThe secret code for the Brackwater vault is 4719. Rain fell.")


def test_auto_picks_llamacpp_when_installed() -> None:
    assert gguf_backend("auto", "cpu") == "llamacpp"
    assert gguf_backend("transformers", "cpu") == "transformers"


@pytest.mark.slow
def test_tokenizer_and_template_match_transformers(smollm2_llamacpp: Any, smollm2: Any) -> None:
    ids, offsets = smollm2_llamacpp.tokenizer.encode_with_offsets(TEXT)
    assert (ids, offsets) == smollm2.tokenizer.encode_with_offsets(TEXT)
    assert smollm2_llamacpp.tokenizer.decode(ids) == TEXT
    assert "".join(TEXT[a:b] for a, b in offsets) == TEXT
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q {x} $y"}]
    assert smollm2_llamacpp.render_chat(messages) == smollm2.render_chat(messages)
    assert smollm2_llamacpp.encode_chat(messages) == smollm2.encode_chat(messages)


@pytest.mark.slow
def test_rollback_then_continue_equals_never_generating(smollm2_llamacpp: Any) -> None:
    tok = smollm2_llamacpp.tokenizer
    frame = smollm2_llamacpp.chat_frame("You are a careful reader.")
    head = tok.encode(frame.head, allow_special=True) + tok.encode(TEXT)
    more = tok.encode(" The market closes at noon.")
    suffix = tok.encode("\n\nQuestion: What is the vault code?") + tok.encode(frame.tail, allow_special=True)

    a = smollm2_llamacpp.fork(keep_cache=False)
    a.prefill(head)
    margin = "".join(a.generate_from_cache(suffix, GREEDY))
    assert margin.strip() and a.length == len(head)
    a.prefill(more)
    logits_a = a._pending_logits().copy()
    text_a = "".join(a.generate_from_cache(suffix, GREEDY))

    b = smollm2_llamacpp.fork(keep_cache=False)  # same evaluation calls, no margin between
    b.prefill(head)
    b.prefill(more)
    assert np.array_equal(logits_a, b._pending_logits())
    assert "".join(b.generate_from_cache(suffix, GREEDY)) == text_a


@pytest.mark.slow
def test_the_same_request_after_a_generation_starts_from_the_same_logits(smollm2_llamacpp: Any) -> None:
    # Re-evaluating the cache's last token alone rounds differently from the batch that read it; on some
    # CPUs that flipped a near-tie, so the same request gave other tokens the second time.
    gen = smollm2_llamacpp.fork(keep_cache=False)
    gen.prefill(smollm2_llamacpp.tokenizer.encode(TEXT))
    read = gen._pending_logits().copy()
    first = "".join(gen.generate_from_cache([], GREEDY))
    assert np.array_equal(gen._pending_logits(), read)
    assert "".join(gen.generate_from_cache([], GREEDY)) == first
    gen.score(smollm2_llamacpp.tokenizer.encode(" The market closes at noon."))
    assert np.array_equal(gen._pending_logits(), read)
    assert np.array_equal(gen.fork()._pending_logits(), read)  # a fork of the same cache too
    gen.rollback(gen.length - 1)  # cut below the read: its logits are evaluated again
    assert not np.array_equal(gen._pending_logits(), read)


@pytest.mark.slow
def test_forks_keep_their_own_tokens(smollm2_llamacpp: Any) -> None:
    tok = smollm2_llamacpp.tokenizer
    x, y = tok.encode("Alpha beta gamma."), tok.encode("Delta epsilon.")
    one = smollm2_llamacpp.fork(keep_cache=False)
    two = smollm2_llamacpp.fork(keep_cache=False)
    one.prefill(x)
    two.prefill(y)        # takes the shared context
    one.prefill(y)        # re-syncs: the context holds x + y again
    llm = smollm2_llamacpp._shared.llm
    assert llm.input_ids[: llm.n_tokens].tolist() == x + y
    assert one.length == len(x + y) and two.length == len(y)


@pytest.mark.slow
def test_stateless_requests_do_not_evict_the_document(smollm2_llamacpp: Any) -> None:
    worker = smollm2_llamacpp.fork(keep_cache=False)
    worker.prefill(worker.tokenizer.encode(TEXT))
    before = worker.usage.prefilled_tokens
    reply = worker.generate([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}],
                            GenerationParams(max_new_tokens=3))
    assert reply
    llm = smollm2_llamacpp._shared.llm
    assert llm.input_ids[: llm.n_tokens].tolist() == worker.tokenizer.encode(TEXT)
    worker.prefill(worker.tokenizer.encode(" More."))
    prompt_tokens = worker.usage.prefilled_tokens - before
    assert prompt_tokens < 40  # the chat prompt + " More.", not the document again


@pytest.mark.slow
def test_stateless_requests_reuse_the_prompt_they_share_and_answer_the_same(smollm2_llamacpp: Any) -> None:
    """Two stateless requests on one document evaluate it once (to a batch boundary), and each answer is the
    one a fresh context gives."""
    from marginalia.models.llamacpp.backend import LlamaCppGenerator

    gen = smollm2_llamacpp
    tok = gen.tokenizer
    document = tok.encode(TEXT * 60)
    assert len(document) > 2 * 512
    params = GenerationParams(max_new_tokens=6)
    asks = [document + tok.encode(f"\nQuestion {n}: what does the text say?\nAnswer:") for n in (1, 2)]
    before = gen.usage.prefilled_tokens
    first = "".join(gen.stream_prompt(asks[0], params))
    middle = gen.usage.prefilled_tokens
    second = "".join(gen.stream_prompt(asks[1], params))
    after = gen.usage.prefilled_tokens
    assert middle - before == len(asks[0])
    assert after - middle < 512 + 20  # from the last batch boundary inside the document
    fresh = LlamaCppGenerator(gen._shared.path, n_ctx=gen._shared.options["n_ctx"], n_branches=0)
    assert "".join(fresh.stream_prompt(asks[1], params)) == second
    assert "".join(fresh.stream_prompt(asks[0], params)) == first


@pytest.mark.slow
def test_a_bad_rollback(smollm2_llamacpp: Any) -> None:
    from marginalia.errors import BackendError

    gen = smollm2_llamacpp.fork(keep_cache=False)
    gen.prefill(gen.tokenizer.encode(TEXT))
    with pytest.raises(BackendError, match="cannot roll back"):
        gen.rollback(gen.length + 1)


@pytest.mark.slow
def test_copy_decoding_writes_only_pieces_of_the_source(smollm2_llamacpp: Any) -> None:
    from marginalia.models.copying import JOINERS

    gen = smollm2_llamacpp.fork(keep_cache=False)
    source = "12. mushy\n13. hydrogen\n14. tenant\n15. mushy\n16. wingman\n17. tenant"
    messages = [{"role": "user", "content": "Name five fruits, separated by commas."}]
    free = gen.generate(messages, GenerationParams(max_new_tokens=16))
    pieces = [" ".join(p.split()).casefold() for p in JOINERS.split(free)]
    assert any(p and p not in source for p in pieces)  # unconstrained, it names fruits
    copied = gen.generate(messages, GenerationParams(max_new_tokens=16, copy_from=source))
    pieces = [" ".join(p.split()).casefold() for p in JOINERS.split(copied)]
    assert copied.strip() and all(p in source for p in pieces), copied


@pytest.mark.slow
def test_no_repeat_ngram_breaks_a_greedy_loop(smollm2_llamacpp: Any) -> None:
    from marginalia.models.repeats import repeating

    gen = smollm2_llamacpp.fork(keep_cache=False)
    prompt = gen.tokenizer.encode("Fruit list: apple, apple, apple, apple,")

    def written(params: GenerationParams) -> list[int]:
        gen.rollback(0)
        gen.prefill(prompt)
        list(gen.generate_from_cache([], params, commit=True))
        return list(gen.cached_ids[len(prompt):])

    def repeats(ids: list[int]) -> bool:
        return any(ids[i] in repeating(ids[:i], 3) for i in range(len(ids)))

    assert repeats(written(GenerationParams(max_new_tokens=24)))  # greedy, it loops
    guarded = written(GenerationParams(max_new_tokens=24, no_repeat_ngram=3))
    assert guarded and not repeats(guarded), gen.tokenizer.decode(guarded)


@pytest.mark.slow
def test_the_default_guard_lets_numbers_repeat(smollm2_llamacpp: Any) -> None:
    from marginalia.options import NO_REPEAT_NGRAM

    gen = smollm2_llamacpp
    for text in (" from 2005 to 2006, and again in 2007", " between 1,000 and 2,000 people"):
        guard = gen.repeat_guard(GenerationParams(no_repeat_ngram=NO_REPEAT_NGRAM))
        for token in gen.tokenizer.encode(text):  # the digits are tokens of their own here
            assert token not in guard.banned(), (text, gen.tokenizer.decode(guard.written))
            guard.feed(token)
    # the words of a loop are still banned
    guard = gen.repeat_guard(GenerationParams(no_repeat_ngram=NO_REPEAT_NGRAM))
    loop = gen.tokenizer.encode(" in the town, in the town, in the town")
    banned = []
    for token in loop:
        banned += [token] if token in guard.banned() else []
        guard.feed(token)
    assert banned and all(gen.tokenizer.decode([t]).strip() for t in banned)


@pytest.mark.slow
def test_key_cache_precision_is_a_choice() -> None:
    from marginalia.errors import UserError
    from marginalia.models.llamacpp.backend import LlamaCppGenerator
    from marginalia.models.weights import embedded_gguf

    with pytest.raises(UserError, match="unknown key cache type 'q4'; choose one of f16, q8_0"):
        LlamaCppGenerator(embedded_gguf(), key_cache="q4")
    eight = LlamaCppGenerator(embedded_gguf(), key_cache="q8_0")
    assert eight._shared.options["type_k"] == 8  # the scratch context is made with the same options
    messages = [{"role": "user", "content": "Which colour is the sky on a clear day?"}]
    assert eight.generate(messages, GREEDY).strip()


@pytest.mark.slow
def test_prefill_runs_on_the_threads_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-cpp-python prefills on every core the machine reports unless told otherwise: a thread limit (or a
    CPU set narrower than the machine) must hold for prefill as for decoding."""
    import multiprocessing

    from marginalia.models.llamacpp.backend import LlamaCppGenerator
    from marginalia.models.weights import embedded_gguf

    monkeypatch.setattr(multiprocessing, "cpu_count", lambda: 64)  # a container seeing the host's cores
    one = LlamaCppGenerator(embedded_gguf(), n_threads=1, n_branches=0)
    params = one._shared.llm.context_params
    assert (params.n_threads, params.n_threads_batch) == (1, 1)
    assert one._shared.options["n_threads_batch"] == 1  # and the scratch context is made with it


@pytest.mark.slow
def test_choice_probabilities_leave_the_cache_as_it_was(smollm2_llamacpp: Any) -> None:
    gen = smollm2_llamacpp.fork(keep_cache=False)
    ids = gen.tokenizer.encode("The harbour opens at dawn.")
    gen.prefill(ids)
    probs = gen.choice_probabilities(gen.tokenizer.encode(" Does it open at dawn? Reply YES or NO."), ("YES", "NO"))
    assert gen.cached_ids == tuple(ids)
    assert sum(probs.values()) == pytest.approx(1.0) and 0.0 < probs["YES"] < 1.0


@pytest.mark.slow
def test_a_yielding_thread_pauses_before_every_step_and_prefills_in_slices(smollm2_llamacpp: Any) -> None:
    from marginalia.models.base import YIELD_STEP, GenerationParams, yielding_to

    gen = smollm2_llamacpp.fork(keep_cache=False)
    ids = gen.tokenizer.encode("The ferry to Lindholm leaves the old harbour at seven. " * 4)
    assert len(ids) > 2 * YIELD_STEP
    paused: list[int] = []
    gen.prefill(ids[:5])
    assert paused == []  # no pause outside the block
    with yielding_to(lambda: paused.append(gen.length)):
        gen.prefill(ids[5:])
        slices = len(paused)
        text = "".join(gen.generate_from_cache([], GenerationParams(max_new_tokens=4), commit=False))
    assert slices == -(-(len(ids) - 5) // YIELD_STEP)
    assert len(paused) - slices >= len(gen.tokenizer.encode(text)) - 1  # a pause before each decoded token
    before = len(paused)
    gen.prefill(ids[:1])
    assert len(paused) == before  # and none after the block
    gen.reset()
