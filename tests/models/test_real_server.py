"""LC, RAG and WiM against a real OpenAI-compatible server: llama-cpp-python's, on SmolLM2."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from marginalia.index.embedders import HashingEmbedder
from marginalia.models.base import GenerationParams
from marginalia.patterns import make_pattern

pytest.importorskip("llama_cpp")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow  # every test here loads the embedded model

FACT = "The secret code for the Brackwater vault is 4719."
QUESTION = "What is the secret code for the Brackwater vault?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def server(smollm2_llamacpp: Any) -> Iterator[str]:
    """Start `marginalia serve-model`'s command; yield the model spec that reaches it."""
    from marginalia.cli import serve_command

    args = argparse.Namespace(model="smollm2", host="127.0.0.1", port=free_port(), n_ctx=8192,
                              verbose=False)
    command, spec = serve_command(args)
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{args.port}/v1"
    deadline = time.monotonic() + 90
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                if httpx.get(f"{base}/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("the server did not answer within 90 s")
            time.sleep(0.3)
        yield spec
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def remote(server: str) -> Any:
    from marginalia.models import load_generator

    return load_generator(server)


def test_serve_model_spec_names_the_server(server: str) -> None:
    assert server.startswith("openai:http://127.0.0.1:")
    assert server.endswith("#smollm2;prompt=text;window=8192;x-repeat_penalty=1")


def test_server_window_is_known(remote: Any) -> None:
    assert remote.context_window == 8192


def test_greedy_server_agrees_with_in_process_llamacpp(remote: Any, smollm2_llamacpp: Any) -> None:
    messages = [{"role": "system", "content": "You answer in one short sentence."},
                {"role": "user", "content": "Which colour is the sky on a clear day?"}]
    params = GenerationParams(max_new_tokens=20)
    local = smollm2_llamacpp.fork(keep_cache=False).generate(messages, params)
    assert local.strip()
    assert remote.generate(messages, params) == local


@pytest.mark.parametrize("pattern", ["lc", "rag", "wim"])
def test_patterns_run_against_the_server(remote: Any, pattern: str,
                                         make_haystack: Callable[..., str]) -> None:
    context = make_haystack(60, FACT, 0.5)
    options: dict[str, Any] = {"embedder": HashingEmbedder()} if pattern == "rag" else {}
    if pattern == "wim":
        options["segment_tokens"] = 256
    before = remote.usage.snapshot()
    answer = make_pattern(pattern, remote, **options).answer(context, QUESTION)
    assert "4719" in answer.text
    used = remote.usage.since(before)
    assert used.requests >= (answer.segments_total + 1 if pattern == "wim" else 1)
    assert used.prompt_tokens_sent > 0
    assert answer.stats.prompt_tokens_sent == used.prompt_tokens_sent
    assert answer.stats.prompt_cache_unreported == used.cache_unreported


def test_pipelined_margins_match_sequential_ones(server: str, remote: Any,
                                                  make_haystack: Callable[..., str]) -> None:
    """With three margin requests in flight, the server queues them (serve-model starts it
    with --interrupt_requests false) and greedy margins come out as they do one by one."""
    from marginalia.models import load_generator

    context = make_haystack(40, FACT, 0.5)
    sequential = make_pattern("wim", remote, segment_tokens=256).answer(context, QUESTION)
    piped = load_generator(f"{server};concurrency=3")
    answer = make_pattern("wim", piped, segment_tokens=256).answer(context, QUESTION)
    assert [m.text for m in answer.margins] == [m.text for m in sequential.margins]
    assert answer.text == sequential.text and "4719" in answer.text
    assert piped.usage.requests == answer.segments_total + 1
