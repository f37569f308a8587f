"""The augmentation coordinator: decides when the text has changed enough to ask for new memory.

It watches the text being written as token ids. When the token-level Levenshtein distance between the
text at the last memory request and the text now reaches the threshold, it makes a request whose query
is only what is new since the last request that was sent. Requests never queue up: at most one is in
flight (on the coordinator's own worker thread), and a newer trigger replaces a pending one. The
items that come back enter a FIFO memory of bounded size, oldest out first.

A request that fails or runs past its time leaves memory as it was; the first failure of a run of
failures carries a notice for the writer, and suggestions go on with the memory there is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from ..errors import MissingDependency
from .events import (
    ComposeEvent,
    MemoryFailed,
    MemoryItem,
    MemoryRequest,
    MemoryRequested,
    MemoryStarted,
    MemoryUpdated,
)
from .threads import start_background, wait_limit

log = logging.getLogger(__name__)

COMPOSE_INSTALL = "pip install 'marginalia[compose]'"
#: what a memory request is answered with
Fetch = Callable[[MemoryRequest], Sequence[MemoryItem]]


def token_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """The Levenshtein distance between two token-id sequences (insertions, deletions, substitutions)."""
    try:
        from rapidfuzz.distance import Levenshtein
    except ImportError as exc:
        raise MissingDependency("rapidfuzz (for composition assistance)", COMPOSE_INSTALL) from exc
    return int(Levenshtein.distance(list(a), list(b)))


def new_part(before: str, now: str) -> str:
    """What ``now`` holds beyond its longest common prefix with ``before`` (the whole of ``now`` when the
    writer changed its very start)."""
    common = 0
    for x, y in zip(before, now, strict=False):
        if x != y:
            break
        common += 1
    return now[common:]


class AugmentationCoordinator:
    """Asks for new memory when the text has changed by ``threshold`` token edits.

    Args:
        fetch: answers a request with memory items (the memory generator); runs on the coordinator's
            worker thread, one request at a time.
        threshold: token edits between the text at the last request and now that trigger a request.
        memory_size: the most items the memory holds; the oldest go first.
        timeout: seconds a request may take; past it, its items are dropped when they come and the next
            request may start once it has returned (a model cannot be interrupted mid-call).
        on_event: called with every event (from the thread that caused it).
        on_memory: called with the whole memory each time it changes (on the worker thread).
        pause: called before every model step of ``fetch`` (on the worker thread); the composer's waits
            while a suggestion is being written, so that memory work never slows one down.
    """

    def __init__(self, fetch: Fetch, *, threshold: int, memory_size: int, timeout: float = 60.0,
                 on_event: Callable[[ComposeEvent], None] | None = None,
                 on_memory: Callable[[tuple[MemoryItem, ...], int], None] | None = None,
                 pause: Callable[[], None] | None = None) -> None:
        if threshold <= 0 or memory_size <= 0 or not timeout > 0:  # `not >`: NaN is refused too
            raise ValueError("threshold, memory_size and timeout must be positive")
        token_distance([], [])  # a missing rapidfuzz fails here, not on the first keystroke
        self.fetch = fetch
        self.threshold = threshold
        self.memory_size = memory_size
        self.timeout = timeout
        self.on_event = on_event
        self.on_memory = on_memory
        self.pause = pause
        self._lock = threading.Condition()
        self._memory: list[MemoryItem] = []
        self._version = 0
        self._ids: tuple[int, ...] = ()  # the text's tokens at the last request made (sent or pending)
        self._sent_text = ""  # the text at the last request sent (a query holds only what is new since)
        self._good_text = ""  # the text at the last request that succeeded
        self._next_id = 1
        self._pending: MemoryRequest | None = None
        self._in_flight: MemoryRequest | None = None
        self._failing = False  # the last request failed: the next failure gives no notice
        self._closed = False
        self._worker: threading.Thread | None = None

    # -- what it holds -----------------------------------------------------------------------------

    @property
    def memory(self) -> tuple[MemoryItem, ...]:
        """The memory, oldest item first."""
        with self._lock:
            return tuple(self._memory)

    @property
    def version(self) -> int:
        """How many times the memory has changed."""
        with self._lock:
            return self._version

    @property
    def in_flight(self) -> MemoryRequest | None:
        with self._lock:
            return self._in_flight

    @property
    def pending(self) -> MemoryRequest | None:
        with self._lock:
            return self._pending

    def busy(self) -> bool:
        """Whether a request is in flight or waiting."""
        with self._lock:
            return self._in_flight is not None or self._pending is not None

    # -- watching the text -------------------------------------------------------------------------

    def observe(self, text: str, ids: Sequence[int]) -> MemoryRequest | None:
        """Take the text as it is now (``ids``: its tokens); return the request it triggered, if any."""
        ids = tuple(ids)
        with self._lock:
            if self._closed:
                return None
            distance = token_distance(self._ids, ids)
            if distance < self.threshold:
                return None
            request = MemoryRequest(self._next_id, new_part(self._sent_text, text), text, distance)
            self._next_id += 1
            self._ids = ids
            replaced = self._pending.id if self._pending is not None else None
            self._pending = request
            started = self._in_flight is None
            self._ensure_worker()
            self._lock.notify_all()
        self._emit(MemoryRequested(request, replaced, started))
        return request

    def _ensure_worker(self) -> None:
        if self._worker is None:
            self._worker = start_background(self._work, "compose-memory", self.pause)

    def _take(self) -> MemoryRequest | None:
        """Wait for a pending request and mark it in flight (None once closed)."""
        with self._lock:
            while self._pending is None and not self._closed:
                self._lock.wait()
            request, self._pending = self._pending, None
            if self._closed or request is None:
                return None
            self._in_flight = request
            self._sent_text = request.context
            return request

    def _work(self) -> None:
        while (request := self._take()) is not None:
            self._emit(MemoryStarted(request))
            t0 = time.perf_counter()
            timed_out = threading.Event()

            def expire(request: MemoryRequest = request, timed_out: threading.Event = timed_out) -> None:
                timed_out.set()
                self._failed(request, f"the memory model took more than {self.timeout:g} s", True)

            timer = threading.Timer(wait_limit(self.timeout), expire)
            timer.daemon = True
            timer.start()
            try:
                items = list(self.fetch(request))
                error: Exception | None = None
            except Exception as exc:  # any failure of the memory model: completion goes on without it
                items, error = [], exc
            finally:
                timer.cancel()
            try:
                if timed_out.is_set():
                    log.info("memory request %d returned after it timed out; its items are dropped", request.id)
                elif error is not None:
                    log.debug("memory request %d failed", request.id, exc_info=error)
                    self._failed(request, f"{type(error).__name__}: {error}", False)
                else:
                    self._succeeded(request, items, time.perf_counter() - t0)
            finally:  # in flight until its memory and events are out, so that `wait_idle` means done
                with self._lock:
                    self._in_flight = None
                    self._lock.notify_all()

    def _succeeded(self, request: MemoryRequest, items: list[MemoryItem], seconds: float) -> None:
        with self._lock:
            self._failing = False
            self._good_text = request.context
            memory = self._memory
            for item in items:  # a repeat moves to the end (it is fresh again) instead of being kept twice
                memory[:] = [m for m in memory if m.key != item.key]
                memory.append(item)
            del memory[: max(0, len(memory) - self.memory_size)]
            self._version += 1
            snapshot, version = tuple(memory), self._version
        if self.on_memory is not None:
            self.on_memory(snapshot, version)
        self._emit(MemoryUpdated(request.id, tuple(items), snapshot, version, round(seconds, 4)))

    def _failed(self, request: MemoryRequest, message: str, timed_out: bool) -> None:
        with self._lock:
            first = not self._failing
            self._failing = True
            # the text the failed request carried is asked for again with the next one
            if self._sent_text == request.context:
                self._sent_text = self._good_text
        why = ("; memory is written only on CPU time that nothing else on this machine wants, so a busy "
               "machine or a slow memory model needs a longer memory timeout") if timed_out else ""
        notice = ("memory could not be refreshed (" + message + "); suggestions go on with the memory "
                  "they have" + why) if first else ""
        self._emit(MemoryFailed(request.id, message, timed_out, notice))

    def _emit(self, event: ComposeEvent) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:  # a listener's bug must not stop the coordinator
                log.exception("a compose event listener failed")

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no request is in flight or pending, the last one's memory and events given out (for
        tests and benchmarks); False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: self._in_flight is None and self._pending is None, timeout)

    def close(self) -> None:
        """Stop taking requests; a request in flight finishes on its own (its thread is a daemon)."""
        with self._lock:
            self._closed = True
            self._pending = None
            self._lock.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        """After `close`: wait for the worker thread to end (after the request in flight, if any); False on
        timeout."""
        with self._lock:
            worker = self._worker
        if worker is not None:
            worker.join(timeout)
            return not worker.is_alive()
        return True
