"""The embedded model's weights as Q8_0, for llama.cpp on CPU.

SmolLM2 ships as Q4_1, a type llama.cpp's CPU build multiplies with generic kernels; the same weights as
Q8_0 go through faster ones, for prefill and decoding alike. The copy is made once per machine by
llama.cpp's own quantizer, in a child process (it prints to the terminal and can abort), and kept in
marginalia's model cache (`$MARGINALIA_CACHE`, else the user's cache directory), named by the source file's
fingerprint, so a new model file makes a new copy.

Re-quantizing moves each Q4_1 weight by at most half a Q8_0 step (a 254th of its block's largest weight),
far less than the Q4_1 rounding it came from; answers can still differ where two tokens were nearly tied,
as they do between llama.cpp's attention kernels. `gguf:<file>` loads a file as it is.

If the copy cannot be made (a full or read-only disk, a quantizer that fails), the file as shipped is used and
``log`` is told why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from ...files import atomic_rename
from ..weights import fingerprint

ENV_CACHE = "MARGINALIA_CACHE"
#: the type the copy is written in (llama.cpp's ``LLAMA_FTYPE_MOSTLY_*`` name)
COPY_TYPE = "Q8_0"
#: seconds the quantizer may take (SmolLM2 needs one or two)
TIMEOUT = 300

_QUANTIZE = """
import ctypes, sys
import llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3])
params.allow_requantize = True
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params)))
"""


def cache_dir() -> Path:
    """Where derived model files live: ``$MARGINALIA_CACHE``, else the user's cache directory."""
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("marginalia", appauthor=False))


def copy_path(source: Path) -> Path:
    """Where the Q8_0 copy of ``source`` is kept."""
    return cache_dir() / "gguf" / f"{source.stem}-{fingerprint(source)}.{COPY_TYPE}.gguf"


def q8_copy(source: Path, log: Callable[[str], None] | None = None) -> Path:
    """The Q8_0 copy of the GGUF ``source``, made on first use; ``source`` itself when it cannot be made."""
    target = copy_path(source)
    if target.is_file():
        return target
    if log:
        log(f"writing {source.name}'s weights as {COPY_TYPE} to {target} (once, a few seconds): llama.cpp "
            "reads them faster on CPU")
    tmp: Path | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".q8-", suffix=".gguf", dir=target.parent)
        os.close(fd)
        tmp = Path(name)
        done = subprocess.run([sys.executable, "-c", _QUANTIZE, str(source), str(tmp), COPY_TYPE],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=TIMEOUT, check=False)
        if done.returncode != 0 or tmp.stat().st_size == 0:
            last = (done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no message"])[-1]
            raise RuntimeError(f"llama.cpp's quantizer exited with {done.returncode}: {last}")
        os.chmod(tmp, 0o644)  # as a file written plainly would be (mkstemp's is private)
        atomic_rename(tmp, target)  # whole or not at all, also when two processes write it at once
        tmp = None
        return target
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        if log:
            log(f"could not write the {COPY_TYPE} copy ({exc}); using {source.name} as shipped")
        return source
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
