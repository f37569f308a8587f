"""Readings side by side on an OpenAI-compatible server: how many a generator allows, and the fork each one
reads on (a usage account and a prefix of its own)."""

from __future__ import annotations

import pytest

from engine_support import Engine
from marginalia.models.fake import ScriptedGenerator
from marginalia.models.openai_backend import OpenAIGenerator


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
