"""Background threads of composition (the memory requests, the preparation of new memory): daemon threads
that run at a lower scheduling priority than the completions the writer waits for.

On Linux a thread has a scheduling policy and a nice value of its own, and the threads a model starts to
compute (llama.cpp's workers) inherit them. Background threads run in the idle class (``SCHED_IDLE``): they
get a core only when nothing else wants it. A nicer thread of the normal class still takes its share of the
cores now and then, and a completion's compute threads wait for each other at every layer, so one held-up
thread holds up all: a suggestion written during a memory refresh would be slowed by that share. The
price: on a machine kept busy by other work, memory comes late or not at all (the memory timeout then says
so). Where the idle class is not offered, the threads are made nicer instead.
The background also pauses before each model step until no completion is running (``pause``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from ..models.base import yielding_to

log = logging.getLogger(__name__)

#: how much nicer than the process the background threads are
BACKGROUND_NICE = 10
#: whether background threads go to the idle scheduling class (False: only `BACKGROUND_NICE` nicer, in the
#: normal class)
IDLE_CLASS = True


def wait_limit(seconds: float) -> float:
    """``seconds`` as a wait the thread primitives take: at most `threading.TIMEOUT_MAX` (a longer wait
    raises OverflowError in `threading.Event.wait`, `Condition.wait` and `Thread.join`, which a background
    thread would die of)."""
    return min(seconds, threading.TIMEOUT_MAX)


def start_background(target: Callable[[], None], name: str,
                     pause: Callable[[], None] | None = None) -> threading.Thread:
    """Start ``target`` on a daemon thread at background priority (where the platform allows); with
    ``pause``, every model step it takes first calls ``pause`` (see `marginalia.models.base.yielding_to`)."""

    def run() -> None:
        lower_priority()
        with yielding_to(pause):
            target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def lower_priority() -> None:
    """Put the calling thread in the idle scheduling class, and make it `BACKGROUND_NICE` nicer than the main
    thread (what counts where the idle class is missing or refused); on platforms without either, nothing
    happens."""
    setpriority = getattr(os, "setpriority", None)
    if setpriority is None or not hasattr(threading, "get_native_id"):
        return
    tid = threading.get_native_id()
    try:
        # relative to the main thread's, so a background thread started by another one is not nicer still
        nice = min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + BACKGROUND_NICE)
        setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
    except OSError as exc:  # not allowed here: run at the usual priority
        log.debug("could not lower a background thread's priority: %s", exc)
    idle = getattr(os, "SCHED_IDLE", None)
    if idle is None or not IDLE_CLASS:
        return
    try:
        os.sched_setscheduler(tid, idle, os.sched_param(0))
    except OSError as exc:
        log.debug("could not put a background thread in the idle scheduling class: %s", exc)
