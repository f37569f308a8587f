"""WiM against vLLM, where it is installed: a first question reads the document once through vLLM's prefix
cache, a second over the same reading reads next to none of it, and the counts are vLLM's own.

The test starts `make vllm-serve`'s server from ``.vllm-venv`` (made by that target) on a free port, or uses the
one ``TEST_VLLM_URL`` names (its API root, e.g. http://127.0.0.1:8000/v1, serving the embedded model as
``smollm2`` with ``--enable-prefix-caching --enable-prompt-tokens-details``); it skips, saying how to enable it,
where neither is there. CI does not install vLLM.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow  # loads the embedded model (its tokenizer here, its weights in vLLM)

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".vllm-venv" / "bin" / "python"
URL_VAR = "TEST_VLLM_URL"
FACT = "The secret code for the Brackwater vault is 4719."
QUESTION = "What is the secret code for the Brackwater vault?"
SEGMENT_TOKENS = 256


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vllm_command(folder: Path, port: int) -> list[str]:
    """`make vllm-serve`'s command line, read from the Makefile (dry run) so that the test serves as it does."""
    dry = subprocess.run(["make", "-s", "-n", "-o", "setup", "vllm-serve", f"PORT={port}"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    line = " ".join(dry.replace("\\\n", " ").split())
    found = re.search(r"exec (\S+) (-m vllm\S* .*?)$", line)
    assert found, f"no vLLM command in `make -n vllm-serve`: {line[-500:]}"
    args = found.group(2).replace('"$folder"', str(folder)).split()
    return [str(VLLM_PYTHON), *args]


@pytest.fixture(scope="session")
def vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The API root of a vLLM server on the embedded model: the one TEST_VLLM_URL names, else one started here."""
    given = os.environ.get(URL_VAR)
    if given:
        yield given.rstrip("/")
        return
    if not VLLM_PYTHON.is_file():
        pytest.skip(f"vLLM is not installed: `make vllm-serve` installs it into .vllm-venv (once), or set {URL_VAR} "
                    "to a running vLLM server's API root")
    from marginalia.app import model_folder

    folder = model_folder("smollm2", home=tmp_path_factory.mktemp("vllm-home"))
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="vllm-", suffix=".log")[1])
    with log.open("w") as out:
        proc = subprocess.Popen(vllm_command(folder, port), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 600  # vLLM's CPU build takes minutes to start on a small machine
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited ({proc.returncode}): {log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM did not answer within 600 s; its log: {log}")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.unlink(missing_ok=True)


def test_wim_reads_the_document_once_and_a_second_question_next_to_none(
        vllm_url: str, make_haystack: Callable[..., str]) -> None:
    from marginalia.models import load_generator
    from marginalia.patterns.wim import WiM

    gen: Any = load_generator(f"openai:{vllm_url}#smollm2;prompt=tokens;tokenizer=smollm2;window=8192")
    reader = WiM(gen, segment_tokens=SEGMENT_TOKENS).reader(make_haystack(60, FACT, 0.5))
    first = reader.answer(QUESTION)
    assert "4719" in first.text
    s = first.stats
    assert s.prompt_cache_unreported == 0, "start vLLM with --enable-prompt-tokens-details"
    assert s.prompt_tokens_cached is not None and s.prompt_tokens_cached > 0
    # each context token computed about once: past the last whole cache block, a request computes its
    # prefix's tail again (at most a block per request)
    assert s.prefilled_context_tokens is not None and s.reprefilled_context_tokens is not None
    assert s.context_tokens <= s.prefilled_context_tokens <= 1.1 * s.context_tokens
    second = reader.answer("Which pier does the night ferry leave from?")
    t = second.stats
    # the reading was kept, and vLLM's prefix cache served it: by vLLM's account, it computed again only the
    # tails past the last whole cache block
    assert t.prefilled_context_tokens is not None and t.reprefilled_context_tokens is not None
    assert t.cached_context_tokens == t.context_tokens - (t.prefilled_context_tokens - t.reprefilled_context_tokens)
    assert t.prefilled_context_tokens is not None and t.prefilled_context_tokens <= 0.1 * t.context_tokens
    assert t.prompt_tokens_cached is not None and t.prompt_tokens_cached > 0.8 * t.prompt_tokens_sent
