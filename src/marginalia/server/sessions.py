"""Chat sessions: a source and how to read it, kept between questions, expiring when idle.

A WiM session over a document reads it once: the first message stores the full reading (see
`Service.readings`), and each later one writes only its margins from it.

The pasted texts sessions keep are bounded in bytes, across sessions: a new session makes room by ending the
least recently used idle ones (as when the store is full), and is refused when the sessions answering a
message hold too much to make room.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from ..errors import MarginaliaError, NotFound
from .errors import Busy, TooLarge
from .schemas import Target
from .worker import Prepared

#: the most question-answer turns a session keeps in its history
HISTORY = 50
MIB = 1024 * 1024
#: seconds a client is told to wait when the sessions answering messages hold too much to make room
RETRY_AFTER = 5


@dataclass
class Session:
    """One conversation over one source. ``busy`` while a message is being answered."""

    id: str
    target: Target
    created_at: float
    last_used: float
    history: list[dict[str, Any]] = field(default_factory=list)
    busy: int = 0
    size: int = 0  # bytes its pasted text takes in memory (counted against the store's bound)
    owner: str | None = None  # the caller that opened it (`auth.Principal.owner`); None: anyone

    def prepare(self, question: str, temperature: float | None,
                read: Callable[[Target, str, float | None], Prepared]) -> Prepared:
        """Prepare the answer to ``question`` (``read`` starts from a stored reading of the source where one is)."""
        return read(self.target, question, temperature)

    def remember(self, question: str, answer: str) -> None:
        self.history.append({"question": question, "answer": answer, "at": time.time()})
        del self.history[:-HISTORY]

    def to_dict(self, ttl: float) -> dict[str, Any]:
        return {"id": self.id, "source": self.target.describe(), "pattern": self.target.reading.pattern,
                "created_at": self.created_at, "expires_at": self.last_used + ttl, "history": list(self.history)}


class Held(Protocol):
    """What a `BoundedStore` keeps: an id, a count of requests using it, when it was last used, and who
    opened it."""

    id: str
    busy: int
    last_used: float
    owner: str | None


H = TypeVar("H", bound=Held)


class Lease(Generic[H]):
    """An item kept from expiring or making room until `release` (which may be called any number of times:
    the first call releases it)."""

    def __init__(self, store: BoundedStore[H], item: H) -> None:
        self.store = store
        self.item = item
        self._released = False
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self.store.release(self.item)


class BoundedStore(Generic[H]):
    """At most ``limit`` items; one idle for ``ttl`` seconds ends, and when the store is full the least
    recently used idle one makes room (its client gets 404 and starts a new one). A busy item (`acquire`,
    `lease`) neither expires nor makes room.

    Args:
        ttl, limit: idle seconds before an item ends; the most items at once.
        what: what an item is called in errors ("session").
        start_with: how a client starts a new one ("POST /v1/sessions").
        full: the error when the store is full and every item is busy (HTTP 429), given the count.
        on_end: called, outside the lock, with the items that ended (expired, made room, deleted).
        clock: the time now, in seconds.
    """

    def __init__(self, ttl: float, limit: int, what: str, start_with: str, full: Callable[[int], Exception],
                 on_end: Callable[[list[H]], None] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.ttl = ttl
        self.limit = limit
        self.what = what
        self.start_with = start_with
        self.full = full
        self.on_end = on_end or (lambda items: None)
        self.clock = clock
        self._items: OrderedDict[str, H] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    def _expire(self) -> list[H]:
        """Take the items idle past ``ttl`` out (under the lock); the caller hands them to ``on_end``."""
        now = self.clock()
        ended = [h for h in self._items.values() if not h.busy and now - h.last_used > self.ttl]
        for item in ended:
            del self._items[item.id]
        return ended

    def check_room(self) -> None:
        """Raise the ``full`` error now when an `add` would (before making an item that is costly to make)."""
        with self._lock:
            ended = self._expire()
            full = len(self._items) >= self.limit and all(h.busy for h in self._items.values())
            count = len(self._items)
        self.on_end(ended)
        if full:
            raise self.full(count)

    def add(self, item: H) -> H:
        """Keep ``item``, making room if the store is full.

        Raises:
            the ``full`` error: the store is full and every item is busy.
        """
        with self._lock:
            ended = self._expire()
            error = self._make_room(item, ended)
            if error is None:
                self._items[item.id] = item
        self.on_end(ended)
        if error is not None:
            raise error
        return item

    def _make_room(self, item: H, ended: list[H]) -> Exception | None:
        """Make room for ``item`` (under the lock), adding what ended to ``ended``; the error when there is
        none to make."""
        while len(self._items) >= self.limit:
            if not self._end_idle(ended):
                return self.full(len(self._items))
        return None

    def _end_idle(self, ended: list[H]) -> bool:
        """End the least recently used idle item (under the lock); False when every item is busy."""
        idle = next((h for h in self._items.values() if not h.busy), None)
        if idle is None:
            return False
        del self._items[idle.id]
        ended.append(idle)
        return True

    def _take(self, item_id: str, busy: int, owner: str | None) -> H:
        with self._lock:
            ended = self._expire()
            item = self._items.get(item_id)
            if item is not None and not owns(owner, item):
                item = None  # another caller's: answered as if there were none
            if item is not None:
                item.last_used = self.clock()
                item.busy += busy
                self._items.move_to_end(item_id)
        self.on_end(ended)
        if item is None:
            raise NotFound(f"no {self.what} {item_id!r}: it expired after {self.ttl:.0f} s idle, was ended, or "
                           f"made room for newer ones; start a new one with {self.start_with}", self.what, item_id)
        return item

    def get(self, item_id: str, owner: str | None = None) -> H:
        """The item, marked as used now. ``owner``: the caller asking (`owns`).

        Raises:
            NotFound: no such item (it may have expired), or it is another caller's.
        """
        return self._take(item_id, 0, owner)

    def acquire(self, item_id: str, owner: str | None = None) -> H:
        """The item, kept from expiring or making room until `release`."""
        return self._take(item_id, 1, owner)

    def lease(self, item_id: str, owner: str | None = None) -> Lease[H]:
        """`acquire` as a `Lease`, whose release is safe to call from every path that ends the request."""
        return Lease(self, self.acquire(item_id, owner))

    def release(self, item: H) -> None:
        with self._lock:
            item.busy -= 1
            item.last_used = self.clock()

    def delete(self, item_id: str, owner: str | None = None) -> None:
        """End an item.

        Raises:
            NotFound: no such item, or it is another caller's.
        """
        with self._lock:
            item = self._items.get(item_id)
            if item is not None and owns(owner, item):
                del self._items[item_id]
            else:
                item = None
        if item is None:
            raise NotFound(f"no {self.what} {item_id!r}", self.what, item_id)
        self.on_end([item])

    def clear(self) -> list[H]:
        """Take every item out (the server stops); they are returned, not handed to ``on_end``."""
        with self._lock:
            items = list(self._items.values())
            self._items.clear()
        return items

    def __len__(self) -> int:
        """Items alive now."""
        with self._lock:
            ended = self._expire()
            count = len(self._items)
        self.on_end(ended)
        return count


def owns(caller: str | None, item: Held) -> bool:
    """Whether ``caller`` may use ``item``: the caller that opened it, or anyone on a server without keys
    (``caller`` None)."""
    return caller is None or item.owner == caller


class SessionsHoldTooMuch(Busy):
    """The sessions answering messages hold so many bytes that a new one cannot make room (HTTP 429)."""

    def __init__(self, message: str) -> None:
        MarginaliaError.__init__(self, message)
        self.retry_after = RETRY_AFTER


class SessionStore(BoundedStore[Session]):
    """Chat sessions (see `BoundedStore`), whose pasted texts take at most ``max_bytes`` together."""

    def __init__(self, ttl: float, limit: int, clock: Callable[[], float] = time.time,
                 max_bytes: int = 256 * MIB) -> None:
        super().__init__(ttl, limit, "session", "POST /v1/sessions", lambda n: Busy(RETRY_AFTER, n), clock=clock)
        self.max_bytes = max_bytes

    def create(self, target: Target, owner: str | None = None) -> Session:
        """A new session.

        Raises:
            TooLarge: its text alone takes more than ``max_bytes``.
            Busy: the store is full, or holds too many bytes, and the sessions in the way are answering
                messages.
        """
        now = self.clock()
        size = sys.getsizeof(target.text) if target.text is not None else 0
        return self.add(Session(uuid.uuid4().hex, target, now, now, size=size, owner=owner))

    def held(self) -> int:
        """Bytes the sessions' texts take now."""
        with self._lock:
            return sum(s.size for s in self._items.values())

    def _make_room(self, item: Session, ended: list[Session]) -> Exception | None:
        bound = f"{self.max_bytes / MIB:.0f} MiB, the server's --session-mb"
        if item.size > self.max_bytes:
            return TooLarge(f"this text takes {item.size / MIB:.1f} MiB, more than all chat sessions may hold "
                            f"together ({bound}); ask it with POST /v1/ask, which keeps nothing, or send a "
                            "shorter text")
        busy = sum(s.size for s in self._items.values() if s.busy)
        if busy + item.size > self.max_bytes:
            return SessionsHoldTooMuch(
                f"the chat sessions answering messages now hold {busy / MIB:.1f} MiB of text, and this one's "
                f"{item.size / MIB:.1f} MiB would pass the bound ({bound}); try again in a few seconds, or end "
                "sessions no longer needed (DELETE /v1/sessions/ID)")
        error = super()._make_room(item, ended)
        while error is None and sum(s.size for s in self._items.values()) + item.size > self.max_bytes:
            if not self._end_idle(ended):  # pragma: no cover - the busy ones leave room enough (checked above)
                error = self.full(len(self._items))
        return error
