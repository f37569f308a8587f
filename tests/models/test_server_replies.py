"""The usage account against replies recorded from real servers (tests/data/server_replies/, made by its
record.py): where a server says what it took from its prefix cache, the counts are its own; where it does not,
they are unknown, never a guess (a prompt counted as evaluated in full)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from marginalia.models.base import GenerationParams
from marginalia.models.fake import ScriptedGenerator
from marginalia.models.openai.backend import OpenAIGenerator

REPLIES = Path(__file__).parent.parent / "data" / "server_replies"

#: per recording: the (prompt tokens, cached tokens) its server reported for each of its two replies, or None
#: where it did not say what it took from its cache
EXPECTED: dict[str, list[tuple[int, int]] | None] = {
    "vllm-prompt-tokens-details": [(137, 0), (138, 128)],
    "vllm": None,
    "llama-server": [(137, 0), (138, 135)],  # in its timings, and in usage as vLLM's
    "llama-cpp-python": None,  # no usage at all
}


def recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REPLIES / f"{name}.json").read_text("utf-8"))
    return data


def replaying(replies: list[list[Any]]) -> httpx.Client:
    """A client whose every POST gets the next recorded reply, as the event stream it was."""
    queue = list(replies)

    def handle(request: httpx.Request) -> httpx.Response:
        events = queue.pop(0)
        body = "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body.encode())

    return httpx.Client(transport=httpx.MockTransport(handle))


def test_every_recording_is_expected() -> None:
    assert sorted(p.stem for p in REPLIES.glob("*.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_usage_is_what_the_server_said(name: str) -> None:
    data = recorded(name)
    gen = OpenAIGenerator("http://127.0.0.1:9/v1", "smollm2", ScriptedGenerator(), context_window=8192,
                          client=replaying(data["replies"]))
    ids = gen.tokenizer.encode("A prompt of a few words.")
    texts = ["".join(gen.stream_prompt(ids, GenerationParams(max_new_tokens=4))) for _ in data["replies"]]
    assert all(texts)
    u = gen.usage
    assert u.requests == len(data["replies"]) and u.prompt_tokens_sent == len(ids) * u.requests
    expected = EXPECTED[name]
    if expected is None:  # unknown: in neither count, and said so
        assert u.cache_unreported == u.requests
        assert (u.prompt_tokens_cached, u.prefilled_tokens) == (0, 0)
    else:
        assert u.cache_unreported == 0
        assert u.prompt_tokens_cached == sum(cached for _, cached in expected)
        assert u.prefilled_tokens == sum(prompt - cached for prompt, cached in expected)
