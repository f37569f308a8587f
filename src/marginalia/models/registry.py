"""Model backends chosen by spec string (``smollm2``, ``hf:<dir>``, ``gguf:<file>``).

Built-in backends register exactly as a third-party one would: a prefix (or a bare
name) and a factory that receives the rest of the spec. Factories import their
heavy dependencies lazily.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..home import resolve_home
from .base import Generator
from .openai.spec import OPENAI_SPEC_FORM

Factory = Callable[[str, "LoadContext"], Generator]


@dataclass(frozen=True)
class LoadContext:
    """What a factory may need besides the spec."""

    home: Path
    device: str = "auto"
    log: Callable[[str], None] | None = None
    backend: str = "auto"  # as asked for; GGUF specs resolve "auto" with gguf_backend()
    api_key: str | None = None  # for HTTP backends; else they read their environment


BACKENDS = ("auto", "llamacpp", "transformers")
DEVICES = ("auto", "cpu", "cuda")


def gguf_backend(requested: str = "auto", device: str = "auto") -> str:
    """The in-process backend for a GGUF file: llama.cpp when installed (it decodes faster than
    transformers on a CPU), else transformers; or what was asked for."""
    if requested not in BACKENDS:
        raise UserError(f"unknown backend {requested!r}; choose one of {', '.join(BACKENDS)}")
    if requested != "auto":
        return requested
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        return "transformers"
    if device == "cuda" or (device == "auto" and _cuda_available()):
        return "transformers"  # the llama.cpp wheel built here is CPU-only
    return "llamacpp"


def _cuda_available() -> bool:
    import importlib.util
    import sys

    if importlib.util.find_spec("torch") is None:
        return False
    if sys.platform.startswith("linux") and not any(
        Path(p).exists() for p in ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia")
    ):
        return False  # no NVIDIA driver: skip importing torch (~1 s) just to hear "no"
    import torch

    return bool(torch.cuda.is_available())


_PREFIXED: dict[str, tuple[Factory, str]] = {}
_NAMED: dict[str, tuple[Factory, str]] = {}


def register_backend(key: str, factory: Factory, help: str, prefixed: bool = True) -> None:
    """Register ``key:<arg>`` (``prefixed``) or a bare name ``key``."""
    (_PREFIXED if prefixed else _NAMED)[key] = (factory, help)


def known_specs() -> list[tuple[str, str]]:
    """(spec form, description) of every registered backend, for --help."""
    rows = [(k, h) for k, (_, h) in _NAMED.items()]
    rows += [(f"{k}:<arg>", h) for k, (_, h) in _PREFIXED.items()]
    return rows


def load_generator(
    spec: str,
    home: str | Path | None = None,
    device: str = "auto",
    log: Callable[[str], None] | None = None,
    backend: str = "auto",
    api_key: str | None = None,
) -> Generator:
    """Load a generator from a spec string.

    ``backend`` picks the in-process engine for GGUF specs (``smollm2``, ``gguf:``):
    ``auto`` (llama.cpp when installed), ``llamacpp`` or ``transformers``.

    Raises:
        UserError: unknown spec (with a "did you mean"), or a missing model file.
        MissingDependency: the backend's extra is not installed.
    """
    spec = spec.strip()
    if not spec:
        raise UserError("empty model spec; try 'smollm2'")
    if backend not in BACKENDS:
        raise UserError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    ctx = LoadContext(home=resolve_home(home), device=device, log=log, backend=backend,
                      api_key=api_key)
    if spec in _NAMED:
        return _NAMED[spec][0]("", ctx)
    prefix, sep, rest = spec.partition(":")
    if sep and prefix in _PREFIXED:
        if not rest:
            raise UserError(f"model spec {spec!r} needs something after '{prefix}:'")
        return _PREFIXED[prefix][0](rest, ctx)
    candidates = list(_NAMED) + [f"{k}:" for k in _PREFIXED]
    close = difflib.get_close_matches(spec if not sep else prefix + ":", candidates, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    forms = ", ".join(form for form, _ in known_specs())
    raise UserError(f"unknown model spec {spec!r}{hint} (known forms: {forms})")


# -- built-ins ---------------------------------------------------------------


def _load_gguf(path: Path, name: str, ctx: LoadContext, lora: Path | None = None,
               as_q8: bool = False) -> Generator:
    """``path`` on the backend ``ctx`` resolves to; ``lora``, a llama.cpp adapter, is for llama.cpp only;
    ``as_q8``: on llama.cpp, its weights as Q8_0 (`gguf_copy`: the embedded model's, which llama.cpp reads
    faster as Q8_0 than as shipped)."""
    if gguf_backend(ctx.backend, ctx.device) == "llamacpp":
        if ctx.device == "cuda":
            raise UserError("the llama.cpp backend here is a CPU build; use --backend transformers "
                            "for --device cuda")
        from .llamacpp.backend import LlamaCppGenerator

        if not path.is_file():
            raise UserError(f"no GGUF file at {path}; check the path after 'gguf:'")
        if as_q8:
            from .llamacpp.gguf_copy import q8_copy

            path = q8_copy(path, ctx.log)
        return LlamaCppGenerator(path, name=name, lora=lora)
    from .hf.loaders import load_gguf

    return load_gguf(path, name=name, home=ctx.home, device=ctx.device, log=ctx.log)


def _smollm2(_: str, ctx: LoadContext) -> Generator:
    from .weights import embedded_gguf

    return _load_gguf(embedded_gguf(), "smollm2", ctx, as_q8=True)


def _hf(arg: str, ctx: LoadContext) -> Generator:
    from .hf.loaders import load_hf_dir

    if ctx.backend == "llamacpp":
        raise UserError("hf: folders run on transformers; drop --backend llamacpp or give a gguf: file")
    return load_hf_dir(Path(arg).expanduser(), name=f"hf:{arg}", device=ctx.device)


def _gguf(arg: str, ctx: LoadContext) -> Generator:
    return _load_gguf(Path(arg).expanduser(), f"gguf:{arg}", ctx)


def gguf_file(spec: str) -> Path | None:
    """The GGUF file a spec loads (``smollm2``, ``gguf:<file>``), or None for other specs."""
    if spec == "smollm2":
        from .weights import embedded_gguf

        return embedded_gguf()
    prefix, _, rest = spec.partition(":")
    return Path(rest).expanduser() if prefix == "gguf" and rest else None


def _tuned(arg: str, ctx: LoadContext) -> Generator:
    import json

    from .llamacpp.lora_gguf import ADAPTER_FILE, TUNED_RECORD

    folder = Path(arg).expanduser()
    try:
        record = json.loads((folder / TUNED_RECORD).read_text("utf-8"))
    except (OSError, ValueError):
        raise UserError(f"{folder} is not a tuned model's folder (no readable {TUNED_RECORD}); make one with "
                        "'marginalia tune train'") from None
    base = gguf_file(str(record.get("base_model", "")))
    adapter = folder / ADAPTER_FILE
    if base is not None and adapter.is_file() and gguf_backend(ctx.backend, ctx.device) == "llamacpp":
        if not base.is_file():
            raise UserError(f"the base model of {folder} is gone ({base}); tune again, or use hf:{folder / 'model'}")
        return _load_gguf(base, f"tuned:{arg}", ctx, lora=adapter, as_q8=record.get("base_model") == "smollm2")
    if ctx.backend == "llamacpp":
        raise UserError(f"{folder} has no llama.cpp adapter ({ADAPTER_FILE}: its base is not a GGUF llama "
                        "model); drop --backend llamacpp to run its merged model on transformers")
    from .hf.loaders import load_hf_dir

    return load_hf_dir(folder / "model", name=f"tuned:{arg}", device=ctx.device)


def _scripted(arg: str, ctx: LoadContext) -> Any:
    from .fake import ScriptedGenerator

    return ScriptedGenerator(default=arg or "I do not know.")


register_backend("smollm2", _smollm2, "SmolLM2-135M-Instruct, the embedded default (offline; on llama.cpp, its "
                 "weights as Q8_0, copied once to $MARGINALIA_CACHE or the user cache)", prefixed=False)
register_backend("hf", _hf, "a local Hugging Face model folder (transformers, in-process)")
register_backend("gguf", _gguf, "a local GGUF file (llama.cpp, or transformers via a converted cache)")
register_backend("tuned", _tuned, "a folder made by 'marginalia tune train': on llama.cpp with its adapter when "
                 "its base is a GGUF, else its merged model on transformers")
register_backend("scripted", _scripted, "a fake that answers with the given text (for tests)")


def _openai(arg: str, ctx: LoadContext) -> Generator:
    from .openai.backend import from_spec

    options = {"api_key": ctx.api_key} if ctx.api_key else {}
    return from_spec(arg, lambda spec: load_generator(spec, home=ctx.home, device=ctx.device, log=ctx.log),
                     **options)


register_backend("openai", _openai, f"an OpenAI-compatible server: {OPENAI_SPEC_FORM}")
