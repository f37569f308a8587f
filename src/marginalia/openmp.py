"""How the OpenMP runtime waits, set when marginalia is imported.

llama.cpp (and torch) compute on OpenMP teams: a model call runs on a team of threads that meet at a barrier
after every operation of the graph, hundreds of times per token. GNU libgomp, the runtime both use here, lets
a thread spin at a barrier for a while before it sleeps, unless the process holds more OpenMP threads than
there are cores: then it spins a hundred times at most and sleeps at nearly every barrier, and waking it again
costs more than the operation. Composition holds two teams (the client on the writer's thread, the memory
model on a background thread, whose team lives as long as the thread), so where cores are few every
suggestion would pay that price, even while the memory model sits idle.

``OMP_WAIT_POLICY=active`` raises that short spin tenfold; ``GOMP_SPINCOUNT=300000`` keeps the long spin of
an idle team at libgomp's default (without it, the active policy spins for minutes). libgomp reads both once,
when it is loaded, so they are set on import of the package, before any backend loads. Where either is
already set, both are left as they are (``GOMP_SPINCOUNT=300000`` alone gives libgomp's own defaults).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import Literal

#: what is set where the environment says nothing of OpenMP waiting
WAIT_DEFAULTS = {"OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": "300000"}

State = Literal["set", "user", "late"]


def runtime_loaded(maps: Path = Path("/proc/self/maps")) -> bool:
    """Whether this process has loaded GNU libgomp already (Linux; elsewhere False)."""
    try:
        return "libgomp" in maps.read_text(errors="replace")
    except OSError:
        return False


def tune_wait(environ: MutableMapping[str, str] = os.environ, loaded: bool | None = None) -> State:
    """Set `WAIT_DEFAULTS` in ``environ`` unless it names either variable; return what happened."""
    if any(name in environ for name in WAIT_DEFAULTS):
        return "user"
    environ.update(WAIT_DEFAULTS)
    late = runtime_loaded() if loaded is None else loaded
    return "late" if late else "set"


#: what `tune_wait` found on import: "set" (the defaults took effect), "user" (the environment had its own),
#: "late" (an OpenMP runtime was loaded before marginalia was imported, so it kept its own defaults)
state: State = tune_wait()


def late_notice() -> str | None:
    """What to tell a user whose OpenMP runtime was loaded before marginalia (None: nothing to tell)."""
    if state != "late":
        return None
    return ("an OpenMP runtime (torch or llama.cpp) was loaded before marginalia was imported, so it waits the "
            "slow way when two models share the cores and suggestions may be much slower; import "
            "marginalia first, or set OMP_WAIT_POLICY=active GOMP_SPINCOUNT=300000 in the environment")
