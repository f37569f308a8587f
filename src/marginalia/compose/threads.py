"""Background threads of composition (the memory requests, the preparation of new memory): daemon threads
that run at a lower scheduling priority than the completions the writer waits for.

On Linux a thread has a nice value of its own, and the threads a model starts to compute (llama.cpp's
workers) inherit it, so the model work done in the background yields the CPU to a completion. A lower
priority still lets the background take its share of two cores, and a completion's compute threads wait
for each other at every layer, so one slowed thread slows all: the background can also pause before each
model step until no completion is running (``pause``).
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
    """Make the calling thread `BACKGROUND_NICE` nicer than the main thread (Linux; elsewhere nothing
    happens)."""
    setpriority = getattr(os, "setpriority", None)
    if setpriority is None or not hasattr(threading, "get_native_id"):
        return
    try:
        tid = threading.get_native_id()
        # relative to the main thread's, so a background thread started by another one is not nicer still
        nice = min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + BACKGROUND_NICE)
        setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
    except OSError as exc:  # not allowed here: run at the usual priority
        log.debug("could not lower a background thread's priority: %s", exc)
