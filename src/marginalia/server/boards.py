"""What the background job boards of the service share (question generation, evaluation): a job's life
(queued, running, then done with its result or failed with its error), one thread that runs the jobs in
order, the last ``keep`` finished jobs remembered, and a job out of a caller's reach not found, as a missing one.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Generic, Literal, TypeVar

from ..errors import NotFound
from .errors import describe, log

Status = Literal["queued", "running", "done", "failed"]


@dataclass
class BackgroundJob:
    """A job's identity and life (mutated by the board's thread under the board's lock)."""

    id: str
    collection: str
    _: KW_ONLY
    status: Status = "queued"
    result: dict[str, Any] | None = None
    error: dict[str, str] | None = None
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.status in ("done", "failed")

    def to_dict(self, detail: bool = True) -> dict[str, Any]:
        """The job as a client sees it; ``detail``: with what it made (pairs, answers)."""
        raise NotImplementedError


J = TypeVar("J", bound=BackgroundJob)


def new_id() -> str:
    return uuid.uuid4().hex


class Board(Generic[J]):
    """Jobs of one kind: one thread runs them in order; the last ``keep`` finished ones are remembered.

    Args:
        keep: how many finished jobs are remembered.
        what: the jobs' name in messages (``question job``).
        kind: the NotFound kind (``qa-job``).
        forgotten: what a NotFound adds about where a forgotten job's work stays, if anywhere.
    """

    def __init__(self, keep: int, what: str, kind: str, forgotten: str = "") -> None:
        self.keep, self.what, self.kind, self.forgotten = keep, what, kind, forgotten
        self._jobs: OrderedDict[str, J] = OrderedDict()
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"marginalia-{kind}")

    def _find(self, job_id: str, visible: Callable[[str], bool] | None = None) -> J:
        """The job; one of a collection ``visible`` says the caller may not see is not found, as a missing one."""
        job = self._jobs.get(job_id)
        if job is None or (visible is not None and not visible(job.collection)):
            raise NotFound(f"no {self.what} {job_id!r} (finished jobs are forgotten after {self.keep} more, and "
                           f"when the server restarts{self.forgotten})", self.kind, job_id)
        return job

    def get(self, job_id: str, detail: bool = True, visible: Callable[[str], bool] | None = None
            ) -> dict[str, Any]:
        with self._lock:
            return self._find(job_id, visible).to_dict(detail)

    def list(self, visible: Callable[[str], bool] | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [job.to_dict(False) for job in self._jobs.values() if visible is None or visible(job.collection)]

    def start(self, job: J, work: Callable[[], dict[str, Any] | None]) -> dict[str, Any]:
        """Queue ``job``, run by ``work``: what it returns is the job's result; what it raises, its error."""

        def run() -> None:
            with self._lock:
                job.status = "running"
            try:
                result = work()
            except Exception as exc:  # noqa: BLE001 - a job's failure is its result
                status, code, message = describe(exc)
                if status == 500:
                    log.error("%s on %s failed", self.what, job.collection, exc_info=exc)
                with self._lock:
                    job.status, job.error, job.finished_at = "failed", {"code": code, "message": message}, time.time()
                return
            with self._lock:
                job.status, job.result, job.finished_at = "done", result, time.time()

        with self._lock:
            self._jobs[job.id] = job
            self._forget()
        self._executor.submit(run)
        return job.to_dict()

    def _forget(self) -> None:
        finished = [j.id for j in self._jobs.values() if j.finished]
        for job_id in finished[:max(0, len(finished) - self.keep)]:
            del self._jobs[job_id]

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
