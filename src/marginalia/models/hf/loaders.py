"""Loading model weights on transformers: local HF dirs, and GGUF files through a converted cache.

De-quantizing a GGUF file with transformers is slow, so it is done once and saved as a
safetensors cache under the home directory, which later loads read quickly.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from ...errors import BackendError, MissingDependency, UserError
from ...files import atomic_rename
from ..weights import fingerprint
from .backend import TransformersGenerator, import_torch, pick_device

CACHE_SCHEMA = 1


def gguf_cache_dir(gguf: Path, home: Path) -> Path:
    return home / "models" / f"{gguf.stem}-{fingerprint(gguf)}-v{CACHE_SCHEMA}"


def convert_gguf(gguf: Path, home: Path, log: Any = None) -> Path:
    """De-quantize ``gguf`` into a safetensors directory under ``home`` (once).

    The conversion writes into a temporary directory and renames it into place, so
    a crash or a concurrent conversion never leaves a half-written cache.
    """
    target = gguf_cache_dir(gguf, home)
    if (target / "config.json").is_file():
        return target
    torch = import_torch()
    quiet_transformers()
    try:
        import gguf as _gguf  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise MissingDependency("GGUF support (gguf)", "pip install 'marginalia[hf]'") from exc
    if log:
        log(f"converting {gguf.name} to a safetensors cache in {target} (once, ~20 s)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        # the de-quantized weights are plain tensors: drop the GGUF marker so they save
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            atomic_rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process won the race
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, (UserError, MissingDependency)):
            raise
        raise BackendError(f"could not convert {gguf}: {exc}") from exc
    return target


def quiet_transformers() -> None:
    """transformers' own progress bars and advice would interleave with our stderr."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def load_hf_dir(path: Path, name: str, device: str = "auto") -> TransformersGenerator:
    """Load a local Hugging Face model directory (config.json + weights + tokenizer)."""
    if not path.is_dir():
        raise UserError(f"no model directory at {path}; give a local folder with config.json")
    if not (path / "config.json").is_file():
        raise UserError(f"{path} has no config.json; give a Hugging Face model folder")
    torch = import_torch()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    dev, dtype = pick_device(device)
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except Exception as exc:
        raise BackendError(f"could not load the model in {path}: {exc}") from exc
    model.to(dev)  # type: ignore[arg-type]
    model.eval()
    del torch
    return TransformersGenerator(model, tok, name=name)


def load_gguf(path: Path, name: str, home: Path, device: str = "auto", log: Any = None) -> TransformersGenerator:
    if not path.is_file():
        raise UserError(f"no GGUF file at {path}; check the path after 'gguf:'")
    return load_hf_dir(convert_gguf(path, home, log=log), name=name, device=device)


def _stderr(msg: str) -> None:
    print(f"marginalia: {msg}", file=sys.stderr)
