"""Chat sessions: a source and how to read it, kept between questions, expiring when idle.

A WiM session over a document reads it once: the first message stores the full reading (see
`Service.readings`), and each later one writes only its margins from it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import NotFound
from .errors import Busy
from .schemas import Target
from .worker import Prepared

#: the most question-answer turns a session keeps in its history
HISTORY = 50


@dataclass
class Session:
    """One conversation over one source. ``busy`` while a message is being answered."""

    id: str
    target: Target
    created_at: float
    last_used: float
    history: list[dict[str, Any]] = field(default_factory=list)
    busy: int = 0

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


class SessionStore:
    """At most ``limit`` sessions; one idle for ``ttl`` seconds expires, and when the store is full the least
    recently used idle one makes room (its client gets 404 and starts a new one)."""

    def __init__(self, ttl: float, limit: int, clock: Callable[[], float] = time.time) -> None:
        self.ttl = ttl
        self.limit = limit
        self.clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    def _expire(self) -> None:
        now = self.clock()
        for sid in [s.id for s in self._sessions.values() if not s.busy and now - s.last_used > self.ttl]:
            del self._sessions[sid]

    def create(self, target: Target) -> Session:
        """A new session.

        Raises:
            Busy: the store is full and every session is answering a message.
        """
        with self._lock:
            self._expire()
            if len(self._sessions) >= self.limit:
                idle = next((s.id for s in self._sessions.values() if not s.busy), None)
                if idle is None:
                    raise Busy(5, len(self._sessions))
                del self._sessions[idle]
            now = self.clock()
            session = Session(uuid.uuid4().hex, target, now, now)
            self._sessions[session.id] = session
            return session

    def _find(self, session_id: str) -> Session:
        self._expire()
        session = self._sessions.get(session_id)
        if session is None:
            raise NotFound(f"no session {session_id!r}: it expired after {self.ttl:.0f} s idle, was ended, or made "
                           "room for newer ones; start a new one with POST /v1/sessions", "session", session_id)
        session.last_used = self.clock()
        self._sessions.move_to_end(session_id)
        return session

    def get(self, session_id: str) -> Session:
        """The session, marked as used now.

        Raises:
            NotFound: no such session (it may have expired).
        """
        with self._lock:
            return self._find(session_id)

    def acquire(self, session_id: str) -> Session:
        """The session, kept from expiring or being evicted until `release`."""
        with self._lock:
            session = self._find(session_id)
            session.busy += 1
            return session

    def release(self, session: Session) -> None:
        with self._lock:
            session.busy -= 1
            session.last_used = self.clock()

    def delete(self, session_id: str) -> None:
        with self._lock:
            if self._sessions.pop(session_id, None) is None:
                raise NotFound(f"no session {session_id!r}", "session", session_id)

    def __len__(self) -> int:
        """Sessions alive now."""
        with self._lock:
            self._expire()
            return len(self._sessions)
