"""Question-generation jobs: QA pairs about a collection's documents, written in the background one job at a
time, with progress a client can poll or follow and the pairs as they are made.

A job appends to the collection's QA file (`bench.own.collection_pairs_path`), so a job started again after a
restart or a failure resumes where the last one stopped. Each model request of a job goes through the model's
worker like a reading, so readings wait for one request at most, never for a whole job.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from ..bench.own import DocumentStarted, PairWritten, QaEvent, RequestDone
from ..errors import NotFound
from .errors import Busy, describe, log
from .worker import ModelWorker

Status = Literal["queued", "running", "done", "failed"]
#: seconds a job's request waits before it asks the model's worker again when its queue is full
WORKER_RETRY = 1.0


@dataclass
class QaJob:
    """One question-generation job (mutated by the job's thread under the board's lock).

    ``events`` keeps every progress event in order (``document``: its sections and requests planned;
    ``request``: one done; ``pair``: one written), so a follower that comes late still sees them all.
    """

    id: str
    collection: str
    documents: list[str] | None = None
    status: Status = "queued"
    documents_started: int = 0
    requests_done: int = 0
    requests_total: int = 0
    pairs: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] | None = None
    error: dict[str, str] | None = None
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    def to_dict(self, pairs: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id, "collection": self.collection, "documents": self.documents, "status": self.status,
            "documents_started": self.documents_started, "requests_done": self.requests_done,
            "requests_total": self.requests_total, "pairs_made": len(self.pairs), "result": self.result,
            "error": self.error, "created_at": self.created_at, "finished_at": self.finished_at}
        if pairs:
            out["pairs"] = list(self.pairs)
        return out

    @property
    def finished(self) -> bool:
        return self.status in ("done", "failed")


def event_record(event: QaEvent) -> dict[str, Any]:
    """A progress event as a client sees it: ``{"event": "document" | "request" | "pair", ...}``."""
    if isinstance(event, DocumentStarted):
        return {"event": "document", "source": event.source, "doc_id": event.doc_id, "sections": event.sections,
                "planned": event.planned, "total": event.total, "done_before": event.done}
    if isinstance(event, RequestDone):
        return {"event": "request", "source": event.source, "request": event.key, "kind": event.kind,
                "done": event.done, "total": event.total, "new_pairs": event.new_pairs, "dropped": event.dropped}
    return {"event": "pair", "pair": event.pair}


class QaJobBoard:
    """Question-generation jobs: one thread runs them in order; the last ``keep`` finished ones are remembered."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._jobs: OrderedDict[str, QaJob] = OrderedDict()
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="marginalia-qa")

    def _find(self, job_id: str, visible: Callable[[str], bool] | None = None) -> QaJob:
        """The job; one of a collection ``visible`` says the caller may not see is not found, as a missing one."""
        job = self._jobs.get(job_id)
        if job is None or (visible is not None and not visible(job.collection)):
            raise NotFound(f"no question job {job_id!r} (finished jobs are forgotten after {self.keep} more, and "
                           "when the server restarts; the pairs stay in the collection's QA file)", "qa-job", job_id)
        return job

    def get(self, job_id: str, pairs: bool = True, visible: Callable[[str], bool] | None = None) -> dict[str, Any]:
        with self._lock:
            return self._find(job_id, visible).to_dict(pairs)

    def events_since(self, job_id: str, start: int, visible: Callable[[str], bool] | None = None
                     ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """The job's events from number ``start`` on, and its state (without pairs) once it has finished."""
        with self._lock:
            job = self._find(job_id, visible)
            return list(job.events[start:]), (job.to_dict(pairs=False) if job.finished else None)

    def submit(self, collection: str, documents: list[str] | None,
               work: Callable[[Callable[[QaEvent], None]], dict[str, Any]]) -> dict[str, Any]:
        """Queue ``work``, called with the job's event callback; it returns the job's result."""
        job = QaJob(uuid.uuid4().hex, collection, documents)

        def on_event(event: QaEvent) -> None:
            record = event_record(event)
            with self._lock:
                job.events.append(record)
                if isinstance(event, DocumentStarted):
                    job.documents_started += 1
                    job.requests_total += event.total
                    job.requests_done += event.done
                elif isinstance(event, RequestDone):
                    job.requests_done += 1
                elif isinstance(event, PairWritten):
                    job.pairs.append(event.pair)

        def run() -> None:
            with self._lock:
                job.status = "running"
            try:
                result = work(on_event)
            except Exception as exc:  # noqa: BLE001 - a job's failure is its result
                status, code, message = describe(exc)
                if status == 500:
                    log.error("question job on %s failed", collection, exc_info=exc)
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

    def list(self, visible: Callable[[str], bool] | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [job.to_dict(pairs=False) for job in self._jobs.values()
                    if visible is None or visible(job.collection)]

    def _forget(self) -> None:
        finished = [j.id for j in self._jobs.values() if j.finished]
        for job_id in finished[:max(0, len(finished) - self.keep)]:
            del self._jobs[job_id]

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def worker_gate(worker: ModelWorker) -> Callable[[Callable[[], Any]], Any]:
    """Run each request of a job as a job of the model's worker, and wait for it (a full queue: wait, ask again)."""

    def gate(call: Callable[[], Any]) -> Any:
        result: Future[Any] = Future()

        def job() -> None:
            try:
                result.set_result(call())
            except BaseException as exc:  # noqa: BLE001 - handed to the job's thread
                result.set_exception(exc)

        while True:
            try:
                worker.submit(job)
                break
            except Busy:
                time.sleep(WORKER_RETRY)
        return result.result()

    return gate
