"""A writer lock per collection: a ``filelock.FileLock`` waited on with one warning and a timeout, naming its holder."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from types import TracebackType

from filelock import FileLock, Timeout

from ..errors import CollectionBusy
from ..files import process_alive

logger = logging.getLogger("marginalia.index")


def _holder(pid: int | None) -> str:
    return f"process {pid}" if pid else "another process"


def pid_path(lock_path: Path) -> Path:
    """Where the holder of the lock at ``lock_path`` writes its pid.

    A file of its own, because older filelock releases truncate the lock file when they open it.
    """
    return lock_path.with_name(lock_path.name + ".pid")


def _read_pid(path: Path) -> int | None:
    """The pid in ``path`` if that process is alive (a killed holder leaves its pid behind)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None
    pid = int(text)
    return pid if process_alive(pid) else None


class WriterLock:
    """An exclusive lock on ``path``, held by one writer at a time (a context manager).

    ``filelock`` takes an ``flock`` on a descriptor of its own per lock object, so two
    threads of one process exclude each other as two processes do, and the kernel drops
    the lock of a process that dies (SIGKILL included). The lock's state is not
    thread-local, so the thread that releases it need not be the one that took it.
    """

    def __init__(self, path: Path, name: str, timeout: float) -> None:
        self.path = path
        self.name = name
        self.timeout = timeout
        # a lock object of its own (filelock's default, not a per-path singleton), so another WriterLock on the
        # same path, in this thread or another, waits instead of re-entering this one
        self._lock = FileLock(path, timeout=timeout, thread_local=False)

    def __enter__(self) -> WriterLock:
        started = time.monotonic()
        try:
            self._lock.acquire(blocking=False)
        except Timeout:
            logger.warning("collection %r is being written by %s; waiting up to %.0f s for it",
                           self.name, _holder(_read_pid(pid_path(self.path))), self.timeout)
            try:
                self._lock.acquire(timeout=self.timeout)
            except Timeout:
                waited = time.monotonic() - started
                raise CollectionBusy(self.name, _read_pid(pid_path(self.path)), waited) from None
        try:
            pid_path(self.path).write_text(f"{os.getpid()}\n")
        except BaseException:
            self._lock.release()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._lock.is_locked:
            return
        try:
            pid_path(self.path).unlink(missing_ok=True)
        finally:
            self._lock.release()
