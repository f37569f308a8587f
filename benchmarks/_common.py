"""Shared by the benchmark scripts: machine description, git commit, the measurement files they write, how
BENCHMARKS.md shows each benchmark (`BENCHMARKS`), and the plumbing of those that start a server or many clients
(a free port, waiting for a server, threads at once).

Each script stores its result as one JSON file in benchmarks/measurements/ (`write_measurement`): the command
that made it, the commit, the machine, the date and the numbers; and registers, in `BENCHMARKS`, the code that
shows those numbers: its rows of the summary table and its section. benchmarks/report.py renders BENCHMARKS.md
from the files and the registry; no script writes markdown into it.
"""

from __future__ import annotations

import math
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _markdown import Record, provenance

from marginalia.files import atomic_write_json

ROOT = Path(__file__).resolve().parent.parent
MEASUREMENTS = ROOT / "benchmarks" / "measurements"
#: the layout of a measurement file (`measurement`); benchmarks/report.py refuses another
SCHEMA = 1


def machine() -> str:
    import torch

    from marginalia.bench.provenance import cpu_name, cpu_vectors

    cpu = ", ".join(filter(None, (cpu_name(), cpu_vectors())))
    return (f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, "
            f"torch {torch.__version__} ({torch.get_num_threads()} threads)")


def load_note(before: float, after: float, noisy: str = "times are noisy") -> str:
    """"load average B before, A after", saying the machine was shared when its load before the run passed half
    its cores (the load after counts the benchmark's own work)."""
    text = f"load average {before:.1f} before, {after:.1f} after"
    if before > (os.cpu_count() or 1) / 2:
        text += f" (the machine was shared with other work: {noisy})"
    return text


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return out + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def command_line() -> str:
    return "python " + " ".join([str(Path(sys.argv[0]).relative_to(ROOT))
                                 if Path(sys.argv[0]).is_absolute() else sys.argv[0], *sys.argv[1:]])


def write_if_changed(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` unless the file already holds it (its change time, which caches and indexes
    read, stays as it was); returns ``path``."""
    if not path.is_file() or path.read_text("utf-8") != text:
        path.write_text(text, "utf-8")
    return path


def measurement(benchmark: str, numbers: dict[str, Any], *, name: str | None = None, command: str | None = None,
                commit: str | None = None, machine_text: str | None = None, date: str | None = None,
                **extra: Any) -> dict[str, Any]:
    """One benchmark run as stored: ``benchmark`` (the script, which names its section in BENCHMARKS.md),
    ``name`` (the file's stem: the benchmark's own name, or a variant's), the command line, commit, machine and
    date of this process unless given, anything in ``extra`` (e.g. ``source`` for numbers taken from elsewhere),
    and ``numbers``: what the script measured, as the renderer reads it."""
    return {"schema": SCHEMA, "benchmark": benchmark, "name": name or benchmark,
            "command": command if command is not None else command_line(),
            "commit": commit if commit is not None else git_commit(),
            "machine": machine_text if machine_text is not None else machine(),
            "date": date if date is not None else datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            **extra, "numbers": numbers}


def run_measurement(benchmark: str, numbers: dict[str, Any], info: dict[str, Any], command: str,
                    name: str | None = None) -> dict[str, Any]:
    """A `measurement` that summarises a `marginalia bench` run: the commit it started at, the machines it was
    answered on and the time it started, from its run info (``info``); ``command``: the bench command."""
    from marginalia.bench.analysis import cores_text, run_machines

    machines = dict.fromkeys(f"{cores_text(m)}, {m.get('cpu', '?')}" for m in run_machines(info))
    return measurement(benchmark, numbers, name=name, command=command,
                       commit=str((info.get("commit") or {}).get("commit", "?"))[:10],
                       machine_text="; ".join(machines) or "?", date=str(info.get("started", "?")))


def plain(value: Any) -> Any:
    """``value`` as JSON can hold it: tuples and sets as lists, keys as strings, NaN and infinities as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return [plain(v) for v in sorted(value, key=str)]
    return value


def write_measurement(record: dict[str, Any], folder: Path = MEASUREMENTS) -> Path:
    """Store a `measurement` as ``<folder>/<name>.json`` (replacing the last run's) and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{record['name']}.json"
    atomic_write_json(path, plain(record))
    return path


@dataclass(frozen=True)
class Benchmark:
    """How BENCHMARKS.md shows one benchmark's measurements: its section's ``title`` and ``section`` (a
    measurement's lines below the title and its provenance), its ``summary`` rows ("what", "result", "made by").

    A benchmark whose runs share one section (quality) gives ``together`` instead: that section, heading
    included, of its runs, which come in the order of ``first`` (the others after them, by name); its summary
    rows then go to a ``table`` of their own (the line above it, its header, its columns' alignment)."""

    title: str
    section: Callable[[Record], list[str]] | None = None
    summary: Callable[[Record], list[list[str]]] | None = None
    together: Callable[[list[Record]], list[str]] | None = None
    table: tuple[str, Sequence[str], str] | None = None
    first: tuple[str, ...] = ()


#: each benchmark (its script's name, which its measurements name) as BENCHMARKS.md shows it; each script
#: registers its own, and benchmarks/report.py shows them in the order of its `SCRIPTS`
BENCHMARKS: dict[str, Benchmark] = {}


def section(m: Record) -> str:
    """One measurement's section as BENCHMARKS.md shows it (what a script prints after a run)."""
    b = BENCHMARKS[m["benchmark"]]
    if b.together is not None:
        return "\n".join(b.together([m])).rstrip() + "\n"
    name = f" ({m['name']})" if m["name"] != m["benchmark"] else ""
    return "\n".join([f"## {b.title}{name}", "", provenance(m), "", *b.section(m)]) + "\n"


def show(record: dict[str, Any], write: bool = True) -> None:
    """Store ``record`` (unless ``write`` is false) and print its section as BENCHMARKS.md will show it."""
    if write:
        print(f"wrote {write_measurement(record).relative_to(ROOT)}", file=sys.stderr)
    print(section(plain(record)))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, seconds: float, proc: subprocess.Popen[Any] | None = None, log: Path | None = None) -> None:
    """Until ``GET url`` answers 200, while ``proc`` (the server, if given) still runs.

    Raises:
        SystemExit: the server exited first (with its log's tail), or ``seconds`` went by.
    """
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log else ""
            raise SystemExit(f"the server exited ({proc.returncode}) before it was ready:\n{tail}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{url} did not answer within {seconds:g} s")


def run_together(calls: Sequence[Callable[[], None]]) -> float:
    """Each of ``calls`` on a thread of its own, all started at once; the seconds until the last has ended."""
    threads = [threading.Thread(target=call) for call in calls]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0
