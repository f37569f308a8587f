"""Where a run was made: the git commit of the code and the machine (CPU, cores, memory, GPUs), as run.json
records them for each invocation."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any


def git_commit(path: Path | None = None) -> dict[str, Any] | None:
    """``{"commit": sha, "dirty": bool}`` of the checkout holding marginalia's source, or None outside one."""
    path = path or Path(__file__).resolve().parent.parent
    if shutil.which("git") is None:
        return None

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, timeout=10)

    try:
        # an installed package inside some repository's virtualenv is not that repository's code
        if git("ls-files", "--error-unmatch", "__init__.py").returncode != 0:
            return None
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--", ".").stdout.strip() != ""
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head.stdout.strip(), "dirty": dirty}


def _cpuinfo(field: str) -> str | None:
    """The first value of ``field`` in /proc/cpuinfo (None: not on Linux, or no such field)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux, else what `platform` knows)."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_vectors() -> str | None:
    """The widest vector instructions the CPU has, "AVX-512" or "AVX2" (llama.cpp's kernels, and so its speed,
    depend on them); None when neither or unknown."""
    flags = set((_cpuinfo("flags") or "").split())
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None


def machine_info(jobs: int = 1) -> dict[str, Any]:
    """CPU, cores (all, and those this process may use: ``taskset`` narrows them, and llama.cpp takes a thread
    per usable core), memory and GPUs of this machine (without importing torch); ``jobs``: the worker
    processes of ``--jobs``, each on its own ``usable_cores``."""
    from ..app import usable_cores

    cpu = cpu_name()
    try:
        ram_gb: float | None = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        ram_gb = None
    gpus: list[str] = []
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            gpus = [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []
        except (OSError, subprocess.SubprocessError):
            pass
    return {"cpu": cpu, "vectors": cpu_vectors(), "cores": os.cpu_count(), "usable_cores": usable_cores(),
            "ram_gb": ram_gb, "gpus": gpus, "platform": platform.platform(), "python": platform.python_version(),
            **({"jobs": jobs} if jobs > 1 else {})}
