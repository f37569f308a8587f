"""Shared by the lab's scripts: machine description, git commit, stored bench runs, and each experiment's
write-up in ``lab/findings/``."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

LAB = Path(__file__).resolve().parent
ROOT = LAB.parent
FINDINGS = LAB / "findings"
DATA = ROOT.parent / "shared" / "data"  # the development data, beside the checkout
EVAL_GGUF = Path.home() / ".cache" / "marginalia-eval" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def cpuinfo(key: str) -> str | None:
    """A field of the first processor in /proc/cpuinfo (None elsewhere, or when it is missing)."""
    try:
        text = Path("/proc/cpuinfo").read_text("utf-8", errors="replace")
    except OSError:
        return None
    found = re.search(rf"^{re.escape(key)}\s*:\s*(.*)$", text, re.M)
    return found.group(1).strip() if found else None


def cpu_flags() -> frozenset[str]:
    return frozenset((cpuinfo("flags") or "").split())


def machine() -> str:
    import torch

    flags = cpu_flags()
    vectors = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
    cpu = ", ".join(filter(None, (cpuinfo("model name") or platform.processor() or platform.machine(), vectors)))
    return (f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, "
            f"torch {torch.__version__} ({torch.get_num_threads()} threads)")


def usable_cores() -> int:
    """The cores this process may run on (``taskset`` narrows them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def load_note(before: float, after: float, noisy: str = "times are noisy") -> str:
    """"load average B before, A after", saying the machine was shared when its load before the run passed half
    its cores (the load after counts the experiment's own work)."""
    text = f"load average {before:.1f} before, {after:.1f} after"
    if before > (os.cpu_count() or 1) / 2:
        text += f" (the machine was shared with other work: {noisy})"
    return text


def auc(scores: list[tuple[float, bool]]) -> float:
    """ROC AUC of (score, is positive) pairs: the chance that a positive scores above a negative, ties half
    (0.5 is chance; NaN without both kinds)."""
    pos = [s for s, right in scores if right]
    neg = [s for s, right in scores if not right]
    if not pos or not neg:
        return float("nan")
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "lab"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return out + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def command_line() -> str:
    script = Path(sys.argv[0])
    shown = str(script.resolve().relative_to(ROOT)) if script.resolve().is_relative_to(ROOT) else sys.argv[0]
    return "python " + " ".join([shown, *sys.argv[1:]])


def write_finding(experiment: str, body: str, section: str | None = None) -> Path:
    """Replace (or append) the section between the markers of ``section`` (default: the experiment's name) in
    ``lab/findings/<experiment>.md``; returns that file."""
    name = section or experiment
    path = FINDINGS / f"{experiment}.md"
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = path.read_text("utf-8") if path.exists() else ""
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = (text.rstrip() + "\n\n" if text.strip() else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, "utf-8")
    return path


def finish(experiment: str, body: str, write: bool = True, section: str | None = None) -> None:
    """Print an experiment's section and, when ``write``, put it in its write-up (`write_finding`)."""
    if write:
        write_finding(experiment, body, section)
    print(body)


def load_run(folder: str | None, name: str, config: str) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    """A bench run's result lines, its run info and its commit (short): ``folder``, or the run called ``name``
    under the home directory; exits saying how to make the run (``config``) when it holds no results."""
    from marginalia.bench import RESULTS, read_results, read_run_info, runs_dir

    where = Path(folder) if folder else runs_dir() / name
    records = read_results(where / RESULTS)
    if not records:
        raise SystemExit(f"no results in {where}; run: marginalia bench run {config}")
    info = read_run_info(where)
    return records, info, str((info.get("commit") or {}).get("commit", "unknown"))[:10]


def stored_run(name: str) -> tuple[Path, dict[str, Any], Any]:
    """The folder of the bench run called ``name`` under the home directory, its run info and its stored config
    (`marginalia.bench.stored_config`); exits naming the run when there is none."""
    from marginalia.bench import read_run_info, runs_dir, stored_config

    folder = runs_dir() / name
    info = read_run_info(folder)
    if not info:
        raise SystemExit(f"no run {name!r} under {runs_dir()} (`marginalia bench runs` lists them)")
    return folder, info, stored_config(info["config"])
