"""Question-generation jobs: QA pairs about a collection's documents, written in the background one job at a
time, with progress a client can poll or follow and the pairs as they are made.

A job appends to the collection's QA file (`bench.own.collection_pairs_path`), so a job started again after a
restart or a failure resumes where the last one stopped. Each model request of a job goes through the model's
worker like a reading, so readings wait for one request at most, never for a whole job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..bench.own import DocumentStarted, PairWritten, QaEvent, RequestDone
from .boards import BackgroundJob, Board, new_id
from .errors import Busy
from .worker import ModelWorker

#: seconds a job's request waits before it asks the model's worker again when its queue is full
WORKER_RETRY = 1.0


@dataclass
class QaJob(BackgroundJob):
    """One question-generation job (mutated by the job's thread under the board's lock).

    ``events`` keeps every progress event in order (``document``: its sections and requests planned;
    ``request``: one done; ``pair``: one written), so a follower that comes late still sees them all.
    """

    documents: list[str] | None = None
    documents_started: int = 0
    requests_done: int = 0
    requests_total: int = 0
    pairs: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self, detail: bool = True) -> dict[str, Any]:
        """The job; ``detail``: with the pairs made so far."""
        out: dict[str, Any] = {
            "id": self.id, "collection": self.collection, "documents": self.documents, "status": self.status,
            "documents_started": self.documents_started, "requests_done": self.requests_done,
            "requests_total": self.requests_total, "pairs_made": len(self.pairs), "result": self.result,
            "error": self.error, "created_at": self.created_at, "finished_at": self.finished_at}
        if detail:
            out["pairs"] = list(self.pairs)
        return out


def event_record(event: QaEvent) -> dict[str, Any]:
    """A progress event as a client sees it: ``{"event": "document" | "request" | "pair", ...}``."""
    if isinstance(event, DocumentStarted):
        return {"event": "document", "source": event.source, "doc_id": event.doc_id, "sections": event.sections,
                "planned": event.planned, "total": event.total, "done_before": event.done}
    if isinstance(event, RequestDone):
        return {"event": "request", "source": event.source, "request": event.key, "kind": event.kind,
                "done": event.done, "total": event.total, "new_pairs": event.new_pairs, "dropped": event.dropped}
    return {"event": "pair", "pair": event.pair}


class QaJobBoard(Board[QaJob]):
    """Question-generation jobs (see `Board`), with each job's progress events for followers."""

    def __init__(self, keep: int) -> None:
        super().__init__(keep, "question job", "qa-job", "; the pairs stay in the collection's QA file")

    def events_since(self, job_id: str, start: int, visible: Callable[[str], bool] | None = None
                     ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """The job's events from number ``start`` on, and its state (without pairs) once it has finished."""
        with self._lock:
            job = self._find(job_id, visible)
            return list(job.events[start:]), (job.to_dict(False) if job.finished else None)

    def submit(self, collection: str, documents: list[str] | None,
               work: Callable[[Callable[[QaEvent], None]], dict[str, Any]]) -> dict[str, Any]:
        """Queue ``work``, called with the job's event callback; it returns the job's result."""
        job = QaJob(new_id(), collection, documents)

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

        return self.start(job, lambda: work(on_event))


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
