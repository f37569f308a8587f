"""Loading what reads: language models by spec, embedders, the bundled demo, the command that serves a
GGUF model over HTTP, and the model folder a serving engine loads.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..models.base import Generator

if TYPE_CHECKING:
    from ..index.embedders import Embedder

#: the embedder a new collection, or rag without one given, uses
DEFAULT_EMBEDDER = "minilm"


def load_model(spec: str = "smollm2", *, home: str | Path | None = None, device: str = "auto",
               backend: str = "auto", api_key: str | None = None,
               log: Callable[[str], None] | None = None) -> Generator:
    """Load the generator a spec names (see `marginalia.models.registry.known_specs`).

    Raises:
        UserError: an unknown or malformed spec (with a "did you mean"), a missing local file.
        MissingDependency: the backend's extra is not installed (the message has the pip command).
    """
    from ..models import load_generator

    return load_generator(spec, home=home, device=device, log=log, backend=backend, api_key=api_key)


def model_specs() -> list[tuple[str, str]]:
    """``(spec form, description)`` of every model backend, for help texts."""
    from ..models.registry import known_specs

    return known_specs()


def model_server_command(model: str = "smollm2", *, host: str = "127.0.0.1", port: int = 8080, n_ctx: int = 8192,
                         verbose: bool = False, log: Callable[[str], None] | None = None) -> tuple[list[str], str]:
    """The command that serves a GGUF model (``smollm2`` or ``gguf:<file>``) over llama-cpp-python's
    OpenAI-compatible server, and the model spec that reaches it (see `marginalia.models.llamacpp.server`).

    Raises:
        UserError: a spec that is not a GGUF model, a missing file.
        MissingDependency: llama-cpp-python's server is not installed.
    """
    from ..models.llamacpp.server import server_command

    return server_command(model, host=host, port=port, n_ctx=n_ctx, verbose=verbose, log=log)


def model_folder(spec: str = "smollm2", *, home: str | Path | None = None,
                 log: Callable[[str], None] | None = None) -> Path:
    """A Hugging Face model folder (config, safetensors weights, tokenizer) of a GGUF model (``smollm2`` or
    ``gguf:<file>``), de-quantized once into the home directory: what a serving engine such as vLLM or SGLang
    loads (``--model FOLDER``). ``log``: what the conversion says, the first time.

    Raises:
        UserError: a spec that is not a GGUF model, a missing file.
        MissingDependency: transformers or gguf is not installed.
    """
    from ..errors import UserError
    from ..home import resolve_home
    from ..models import gguf_file
    from ..models.hf.loaders import convert_gguf

    path = gguf_file(spec)
    if path is None:
        raise UserError(f"a model folder is made from a GGUF model: give 'smollm2' or 'gguf:<file>', not {spec!r} "
                        "(an hf: folder is one already)")
    if not path.is_file():
        raise UserError(f"no GGUF file at {path}; check the path after 'gguf:'")
    return convert_gguf(path, resolve_home(home), log=log)


def load_embedder(spec: str = DEFAULT_EMBEDDER) -> Embedder:
    """Load an embedder: ``minilm`` (embedded), ``hashing`` or ``st:<local folder>``."""
    from ..index.embedders import load_embedder as load

    return load(spec)


def demo() -> tuple[str, list[dict[str, Any]]]:
    """The bundled sample report (markdown) and its questions (``question``, ``answer``, ``position``)."""
    base = resources.files("marginalia").joinpath("data", "demo")
    text = base.joinpath("harbour_report.md").read_text("utf-8")
    questions = json.loads(base.joinpath("harbour_report.questions.json").read_text("utf-8"))
    return text, questions
