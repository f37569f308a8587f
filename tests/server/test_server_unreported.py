"""A model server that does not say what it took from its prompt cache: the service's answers give the counts
that rest on it as null (JSON, the event stream, the OpenAI-compatible usage), never a guess."""

from __future__ import annotations

from typing import Any

from blind_server import blind_generator
from server_support import FACT, QUESTION, REPORT, index_text, make_client, parse_sse

UNKNOWN = ("prefilled_context_tokens", "reprefilled_context_tokens", "prefilled_other_tokens", "prompt_tokens_cached")


def respond(prompt: str) -> str:
    return FACT if "pier 47" in prompt else "Nothing about ferries here."


def check_unknown(stats: dict[str, Any]) -> None:
    assert stats["prompt_cache_unreported"] > 0 and stats["prompt_tokens_sent"] > 0
    for key in UNKNOWN:
        assert stats[key] is None, key


def test_ask_answers_with_the_unknown_counts_as_null() -> None:
    client = make_client(generator=blind_generator(respond))
    reply = client.post("/v1/ask", json={"question": QUESTION, "text": REPORT,
                                         "reading": {"pattern": "wim", "segment_tokens": 40}})
    assert reply.status_code == 200, reply.text
    check_unknown(reply.json()["stats"])
    streamed = client.post("/v1/ask", json={"question": QUESTION, "text": REPORT, "stream": True,
                                            "reading": {"pattern": "wim", "segment_tokens": 40}})
    done = [data for kind, data in parse_sse(streamed.text) if kind == "done"]
    assert len(done) == 1
    check_unknown(done[0]["stats"])


def test_openai_usage_counts_the_prompt_tokens_sent() -> None:
    client = make_client(generator=blind_generator(respond))
    index_text(client, "docs", "report.md", REPORT)
    reply = client.post("/v1/chat/completions", json={
        "model": "marginalia:docs", "messages": [{"role": "user", "content": QUESTION}],
        "marginalia": {"reading": {"pattern": "lc"}}})
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    assert usage["prompt_tokens"] > 0 and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
