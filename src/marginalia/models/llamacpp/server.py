"""The command that serves a GGUF model over llama-cpp-python's OpenAI-compatible server, set up so that its
greedy replies agree with the in-process llama.cpp backend's."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from ...errors import MissingDependency, UserError
from ..weights import embedded_gguf
from .backend import DEFAULT_KEY_CACHE, KEY_CACHE_TYPES, LLAMACPP_INSTALL
from .gguf_copy import q8_copy


def server_command(model: str = "smollm2", *, host: str = "127.0.0.1", port: int = 8080, n_ctx: int = 8192,
                   verbose: bool = False, log: Callable[[str], None] | None = None) -> tuple[list[str], str]:
    """The server's command line and the model spec that reaches it.

    Args:
        model: ``smollm2`` (its Q8_0 copy, made once: the weights the in-process backend reads) or
            ``gguf:<file>``.
        n_ctx: the context window to allocate, in tokens.
        log: what making the embedded model's Q8_0 copy says, the first time.

    Raises:
        UserError: a spec that is not a GGUF model, a missing file.
        MissingDependency: llama-cpp-python's server is not installed.
    """
    if model == "smollm2":  # the weights the in-process backend reads, so greedy replies agree
        path, alias = q8_copy(embedded_gguf(), log), "smollm2"
    elif model.startswith("gguf:") and len(model) > 5:
        path = Path(model[5:]).expanduser()
        alias = path.stem
        if not path.is_file():
            raise UserError(f"no GGUF file at {path}; check the path after 'gguf:'")
    else:
        raise UserError(f"serve-model serves GGUF models: give 'smollm2' or 'gguf:<file>', not {model!r}")
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("uvicorn") is None:
        raise MissingDependency("llama-cpp-python's server", LLAMACPP_INSTALL)
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(path),
               "--model_alias", alias, "--host", host, "--port", str(port),
               "--n_ctx", str(n_ctx), "--verbose", "true" if verbose else "false",
               # queue concurrent requests; by default this server cuts the running stream off
               "--interrupt_requests", "false",
               # the in-process backend's key cache, so greedy replies agree with it
               "--type_k", str(KEY_CACHE_TYPES[DEFAULT_KEY_CACHE])]
    tokenizer = "" if alias == "smollm2" else f";tokenizer={model}"
    # that server penalises repeats by default: ask for plain greedy/temperature sampling
    # the server's /models does not report its window, so the spec carries it
    return command, (f"openai:http://{host}:{port}/v1#{alias};prompt=text"
                     f";window={n_ctx};x-repeat_penalty=1{tokenizer}")
