"""The service end to end on the embedded SmolLM2 (greedy): WiM over a pasted text, streamed, finds the
planted fact and cites it; the same answer comes as JSON. Slow: two readings on two CPU cores."""

from __future__ import annotations

from typing import Any

import pytest

from server_support import make_client, parse_sse

FACT = "The night ferry to Brackwater leaves from pier 47."


@pytest.fixture
def client(smollm2_llamacpp: Any) -> Any:
    return make_client(generator=smollm2_llamacpp)


@pytest.mark.slow
def test_wim_over_http_finds_and_cites_the_planted_fact(client: Any, make_haystack: Any) -> None:
    text = make_haystack(24, FACT, depth=0.6, seed=3)
    body = {"question": "Which pier does the night ferry to Brackwater leave from?", "text": text,
            "reading": {"pattern": "wim", "segment_tokens": 160, "margin_tokens": 32, "max_new_tokens": 24}}
    events = parse_sse(client.post("/v1/ask", json={**body, "stream": True}).text)
    kinds = [k for k, _ in events]
    assert kinds[0] == "started" and kinds[-1] == "done" and "error" not in kinds
    done = events[-1][1]
    assert "47" in done["text"]
    assert any(FACT in ref["text"] for ref in done["references"]), done["references"]
    assert "".join(d["text"] for k, d in events if k == "answer_delta").strip() == done["text"]
    whole = client.post("/v1/ask", json=body).json()
    assert whole["text"] == done["text"] and whole["references"] == done["references"]
