"""Readings side by side on an OpenAI-compatible server: how many a generator allows, and the fork each one
reads on (a usage account and a prefix of its own)."""

from __future__ import annotations

import pytest

from engine_support import Engine
from marginalia.models.fake import ScriptedGenerator
from marginalia.models.openai.backend import OpenAIGenerator


@pytest.mark.parametrize(("owned_by", "concurrency", "parallel"),
                         [("vllm", 4, 4), ("vllm", 1, 1), ("llamacpp", 4, 1)])
def test_readings_side_by_side_where_the_server_shares_prefixes(owned_by: str, concurrency: int,
                                                                parallel: int) -> None:
    borrowed = ScriptedGenerator()
    with Engine(borrowed.tokenizer, lambda prompt: "Pier 41.", owned_by) as engine:
        gen = OpenAIGenerator(engine.url, "tiny", borrowed, context_window=10_000, concurrency=concurrency)
        assert gen.parallel_readings == parallel
        assert ScriptedGenerator().parallel_readings == 1  # in process: one reading at a time


def test_a_reading_fork_has_a_usage_account_and_a_prefix_of_its_own() -> None:
    borrowed = ScriptedGenerator()
    with Engine(borrowed.tokenizer, lambda prompt: "Pier 41.") as engine:
        gen = OpenAIGenerator(engine.url, "tiny", borrowed, context_window=10_000, concurrency=4)
        gen.prefill(gen.tokenizer.encode("The shared model's own prefix."))
        one, two = gen.fork_reading(), gen.fork_reading()
        assert one.length == two.length == 0 and one.client is gen.client
        one.prefill(one.tokenizer.encode("Harbour log 1."))
        assert two.length == 0 and gen.length == len(gen.tokenizer.encode("The shared model's own prefix."))
        assert "".join(one.generate_from_cache(one.tokenizer.encode(" Which pier?"))) == "Pier 41."
        margin = one.fork()  # a reading's own forks still share its account
        assert "".join(margin.generate_from_cache(margin.tokenizer.encode(" And?"))) == "Pier 41."
        assert one.usage.requests == 2 and one.usage.prompt_tokens_sent == sum(len(p) for p in engine.prompts)
        assert two.usage.requests == gen.usage.requests == 0


def test_a_second_reading_says_the_document_came_from_the_servers_prefix_cache() -> None:
    from marginalia import WimOptions
    from marginalia.app import ask_text

    text = " ".join(f"Entry {i}: the tide was calm." for i in range(60)) + " The ferry leaves from pier 41."
    borrowed = ScriptedGenerator()
    respond = lambda prompt: "The ferry leaves from pier 41." if "pier 41" in prompt else "NONE"  # noqa: E731
    with Engine(borrowed.tokenizer, respond) as engine:
        gen = OpenAIGenerator(engine.url, "tiny", borrowed, context_window=10_000, concurrency=1)
        options = WimOptions(segment_tokens=100)
        first = ask_text(text, "Which pier?", options, generator=gen).answer().stats
        second = ask_text(text, "Where does the ferry leave from?", options, generator=gen).answer().stats
    assert first.cached_context_tokens == 0  # an empty prefix cache: every context token computed
    assert first.prefilled_context_tokens == first.context_tokens
    # the server's account: it computed none of the document again, its prefix cache held it all
    assert second.prefilled_context_tokens == 0
    assert second.cached_context_tokens == second.context_tokens


def test_a_kept_readings_margins_are_all_sent_at_once() -> None:
    from marginalia import WimOptions
    from marginalia.patterns.wim import WiM

    text = " ".join(f"Entry {i}: the tide was calm." for i in range(60)) + " The ferry leaves from pier 41."
    borrowed = ScriptedGenerator()
    respond = lambda prompt: "The ferry leaves from pier 41." if "pier 41" in prompt else "NONE"  # noqa: E731
    with Engine(borrowed.tokenizer, respond, reading_of=lambda prompt: str(len(prompt))) as engine:
        gen = OpenAIGenerator(engine.url, "tiny", borrowed, context_window=10_000, concurrency=4)
        reader = WiM(gen, WimOptions(segment_tokens=100)).reader(text)
        first = reader.answer("Which pier?")
        assert first.segments_total >= 4
        # each margin prompt is a reading of its own here: no request is answered until four have arrived, which
        # they do only if each is sent without waiting for the one before it to begin answering
        engine.hold(4, deadline=5.0)
        second = reader.answer("Where does the ferry leave from?")
    assert not engine.gave_up
    assert "41" in second.text
