"""The composer: ties the coordinator, the memory generator and the client together for one text being
written.

Every edit goes to the coordinator (which may ask for memory on its own thread) and cancels the
suggestion in progress; a suggestion completes the text as it is with whatever memory is current, and
new memory reaches the client when the memory generator has written it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable

from .client import Completion, CompletionClient
from .coordinator import AugmentationCoordinator, Fetch
from .events import ComposeEvent, Listener, MemoryFailed, MemoryItem, Suggested

log = logging.getLogger(__name__)

#: events kept for `Composer.events` (the latest ones)
EVENT_HISTORY = 1000


class Composer:
    """Suggestions for a text being written, with memory kept up to date in the background.

    Args:
        client: completes the text (see `CompletionClient`).
        fetch: answers memory requests (a `MemoryGenerator`).
        threshold: token edits that trigger a memory request (see `AugmentationCoordinator`).
        memory_size: the most memory items kept.
        memory_timeout: seconds a memory request may take.
        debounce: seconds `suggest` waits for more typing before it starts completing.
        listeners: called with every event, from the thread that caused it.
        give_way: the memory model pauses before each of its steps while a suggestion is being written
            (`CompletionClient.give_way`), so that a refresh does not slow suggestions down; memory then
            takes longer to come while the writer types.
    """

    def __init__(self, client: CompletionClient, fetch: Fetch, *, threshold: int, memory_size: int,
                 memory_timeout: float = 60.0, debounce: float = 0.0, listeners: Iterable[Listener] = (),
                 give_way: bool = True) -> None:
        self.client = client
        self.debounce = debounce
        self.listeners = list(listeners)
        self.events: deque[ComposeEvent] = deque(maxlen=EVENT_HISTORY)
        self.notices: list[str] = []
        client.on_event = self._emit
        self.coordinator = AugmentationCoordinator(fetch, threshold=threshold, memory_size=memory_size,
                                                   timeout=memory_timeout, on_event=self._emit,
                                                   on_memory=client.set_memory,
                                                   pause=client.give_way if give_way else None)
        self._lock = threading.Condition()
        self._edit_lock = threading.Lock()
        self._text: str | None = None
        self._edits = 0
        self._current: Completion | None = None

    # -- state -----------------------------------------------------------------------------------

    @property
    def memory(self) -> tuple[MemoryItem, ...]:
        """The memory the coordinator holds (the client may still be preparing it)."""
        return self.coordinator.memory

    @property
    def text(self) -> str:
        with self._lock:
            return self._text or ""

    def _emit(self, event: ComposeEvent) -> None:
        self.events.append(event)
        if isinstance(event, MemoryFailed) and event.notice:
            self.notices.append(event.notice)
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:
                log.exception("a compose event listener failed")

    # -- typing ----------------------------------------------------------------------------------

    def edit(self, text: str) -> None:
        """The text as it is now: cancels the suggestion in progress; may ask for new memory."""
        self._edit(text)

    def _edit(self, text: str) -> int:
        """`edit`; returns the count of edits as this one left it (counted under the same lock as the text
        is set, so that a newer edit from another thread always counts on top)."""
        with self._edit_lock:
            with self._lock:
                if text == self._text:
                    return self._edits
                self._text = text
                self._edits += 1
                edits = self._edits
                current, self._current = self._current, None
                self._lock.notify_all()
            if current is not None:
                current.cancel()
            ids = self.client.encode(text)
            self.client.update(ids)
            self.coordinator.observe(text, ids)
            return edits

    def stream(self, text: str) -> Completion:
        """Start a suggestion for ``text`` (after `edit`); iterate it for text deltas. A later edit cancels it."""
        self.edit(text)
        completion = self.client.complete(text)
        with self._lock:
            stale = self._text != text
            if not stale:
                self._current = completion
        if stale:  # edited again meanwhile
            completion.cancel()
        return completion

    def settle(self, text: str) -> bool:
        """`edit` to ``text``, then wait ``debounce`` seconds for more typing; False when the text changed
        meanwhile (a suggestion for ``text`` is not wanted any more)."""
        seq = self._edit(text)
        with self._lock:
            deadline = time.monotonic() + self.debounce
            while self._edits == seq and (left := deadline - time.monotonic()) > 0:
                self._lock.wait(left)
            return self._edits == seq

    def cancelled(self, text: str) -> Suggested:
        """The record of a suggestion for ``text`` that newer typing made moot before it began."""
        return Suggested(len(text), "", 0, 0, None, 0.0, self.client.memory_version, True)

    def suggest(self, text: str) -> Suggested:
        """A whole suggestion for ``text``: waits ``debounce`` seconds for more typing first; a later edit
        cancels it (its record then says ``cancelled``)."""
        if not self.settle(text):
            return self.cancelled(text)
        completion = self.stream(text)
        written = completion.text()
        return completion.result or Suggested(len(text), written, 0, 0, None, 0.0, self.client.memory_version, True)

    # -- lifecycle -------------------------------------------------------------------------------

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no memory request is in flight or pending and new memory is prepared (tests,
        benchmarks); False on timeout."""
        t0 = time.monotonic()
        if not self.coordinator.wait_idle(timeout):
            return False
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - t0))
        return self.client.wait_prepared(left)

    def close(self) -> None:
        """Stop asking for memory and preparing it; the suggestion in progress is cancelled."""
        with self._lock:
            current, self._current = self._current, None
        if current is not None:
            current.cancel()
        self.coordinator.close()
        self.client.close()

    def join(self, timeout: float | None = None) -> bool:
        """After `close`: wait until its background threads have stopped (a memory request in flight runs
        to its end), so that its models may serve someone else; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for join in (self.coordinator.join, self.client.join):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not join(left):
                return False
        return True

    def __enter__(self) -> Composer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
