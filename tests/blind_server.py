"""An OpenAI-compatible model server, in process (an httpx mock transport), whose replies give the prompt's length
(``usage.prompt_tokens``) but not what it took from its prefix cache, as vLLM's do without
``--enable-prompt-tokens-details``: the stats that rest on it must come out unknown."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx

from marginalia.models.fake import ScriptedGenerator
from marginalia.models.openai.backend import OpenAIGenerator


def blind_generator(respond: Callable[[str], str], name: str = "blind") -> OpenAIGenerator:
    """A generator on such a server; ``respond`` gets each prompt's text and returns the whole reply."""
    borrowed = ScriptedGenerator()
    tok = borrowed.tokenizer

    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # the model list: a server that shares its prefix cache, as vLLM's
            return httpx.Response(200, json={"object": "list", "data": [{"id": name, "owned_by": "vllm"}]})
        body = json.loads(request.content)
        prompt = body["prompt"]
        text = respond(tok.decode(prompt) if isinstance(prompt, list) else prompt)
        pieces = [text[i:i + 8] for i in range(0, len(text), 8)] or [""]
        events = [{"choices": [{"index": 0, "text": p, "finish_reason": None}]} for p in pieces]
        events.append({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})
        n = len(prompt) if isinstance(prompt, list) else len(tok.encode(prompt))
        events.append({"choices": [], "usage": {"prompt_tokens": n, "completion_tokens": len(pieces),
                                                "total_tokens": n + len(pieces), "prompt_tokens_details": None}})
        stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream.encode())

    return OpenAIGenerator("http://127.0.0.1:9/v1", name, borrowed, context_window=1_000_000,
                           client=httpx.Client(transport=httpx.MockTransport(handle)), name=f"openai:{name}")
