"""A writer lock per collection: an flock'ed file that names its holder, waited on with a message and a timeout."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from types import TracebackType

from ..errors import UserError

logger = logging.getLogger("marginalia.index")


class CollectionBusy(UserError):
    """Another process (or thread) kept a collection's writer lock past the timeout."""

    def __init__(self, name: str, holder_pid: int | None, waited: float) -> None:
        self.name = name
        self.holder_pid = holder_pid
        self.waited = waited
        holder = f"process {holder_pid}" if holder_pid else "another process"
        super().__init__(
            f"collection {name!r} is being written by {holder}; waited {waited:.0f} s for it. "
            "Let that indexing run finish (or stop it) and try again, or pass a longer lock timeout"
        )


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class WriterLock:
    """An exclusive ``fcntl.flock`` on ``path``, held by one writer at a time.

    flock locks belong to an open file description, so two threads of one process
    exclude each other as two processes do, and the kernel drops the lock of a
    process that dies (SIGKILL included): a stale pid in the file never blocks anyone.
    """

    def __init__(self, path: Path, name: str, timeout: float, poll: float = 0.1) -> None:
        self.path = path
        self.name = name
        self.timeout = timeout
        self.poll = poll
        self._fd: int | None = None

    def __enter__(self) -> WriterLock:
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        started = time.monotonic()
        warned = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - started
                if waited >= self.timeout:
                    os.close(fd)
                    raise CollectionBusy(self.name, _read_pid(self.path), waited) from None
                if not warned:
                    holder = _read_pid(self.path)
                    logger.warning("collection %r is being written by %s; waiting up to %.0f s for it",
                                   self.name, f"process {holder}" if holder else "another process", self.timeout)
                    warned = True
                time.sleep(min(self.poll, max(self.timeout - waited, 0.0)))
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        import fcntl

        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
