"""Indexing jobs: an uploaded document is saved to a private temporary copy and indexed in the background,
one job at a time, with progress a client can poll or follow.

Jobs live in memory. A server killed mid-job loses the job's record but never the collection: the store
commits each document as it is added, so the collection stays at its last good state (a retry completes
it, reusing what was embedded). The model is not needed to index, only its tokenizer (chunk sizes are
counted in its tokens), so indexing does not wait for readings, nor they for it.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .. import app
from ..errors import BadInput, EmptyDocument, NotFound
from ..options import ChunkingOptions
from ..records import Document
from .errors import UnsupportedType, describe, log

if TYPE_CHECKING:
    from ..app import Collection

Status = Literal["queued", "running", "done", "failed"]
_UNSAFE = re.compile(r"[^A-Za-z0-9._ -]+")
#: the longest name an upload is known by, and the longest suffix kept when a longer one is cut
MAX_NAME = 120
MAX_SUFFIX = 12


def display_name(filename: str | None) -> str:
    """The name an upload is known by: its last path part, with only plain characters (never a path), cut
    to `MAX_NAME` characters keeping its suffix (which says how to read it)."""
    base = re.split(r"[\\/]", filename or "")[-1]
    base = _UNSAFE.sub("_", base).strip(" .")
    if len(base) > MAX_NAME:
        suffix = Path(base).suffix if len(Path(base).suffix) <= MAX_SUFFIX else ""
        base = base[:MAX_NAME - len(suffix)].rstrip(" .") + suffix
    return base or "upload"


def check_upload(name: str, data: bytes) -> str:
    """Check an upload by its content, not only its name; return the suffix its saved copy takes.

    Raises:
        UnsupportedType: a type marginalia does not read, a '.pdf' that is not a PDF, a text that is
            binary or not UTF-8.
        EmptyDocument: a text with nothing but whitespace in it (an unreadable document, not a wrong type).
    """
    try:
        return app.upload_suffix(name, data)
    except EmptyDocument:
        raise
    except BadInput as exc:
        raise UnsupportedType(str(exc)) from None


@dataclass
class Job:
    """One upload being indexed (mutated by the indexing thread under the board's lock)."""

    id: str
    collection: str
    document: str
    status: Status = "queued"
    stage: str = "queued"  # queued | loading | embedding | optimizing | finished
    chunks_done: int = 0
    chunks_total: int = 0
    result: dict[str, Any] | None = None
    error: dict[str, str] | None = None
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    version: int = 0  # bumped on every change, so a follower knows when to send

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "collection": self.collection, "document": self.document, "status": self.status,
                "stage": self.stage, "chunks_done": self.chunks_done, "chunks_total": self.chunks_total,
                "result": self.result, "error": self.error, "created_at": self.created_at,
                "finished_at": self.finished_at}

    @property
    def finished(self) -> bool:
        return self.status in ("done", "failed")


class JobBoard:
    """The indexing jobs: one thread runs them in order; the last ``keep`` finished ones are remembered."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="marginalia-index")

    def get(self, job_id: str) -> dict[str, Any]:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise NotFound(f"no job {job_id!r} (finished jobs are forgotten after {self.keep} more, and "
                               "when the server restarts)", "job", job_id)
            return {**job.to_dict(), "version": job.version}

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            return [job.to_dict() for job in self._jobs.values()]

    def update(self, job: Job, **changes: Any) -> None:
        """Change a job's fields (from the indexing thread) and bump its version."""
        with self._lock:
            for key, value in changes.items():
                setattr(job, key, value)
            job.version += 1

    def submit(self, collection: str, document: str, data: bytes, suffix: str,
               work: Callable[[Job, Path, JobBoard], None]) -> dict[str, Any]:
        """Save ``data`` to a private temporary copy and queue ``work`` on it; the copy goes when it ends."""
        folder = Path(tempfile.mkdtemp(prefix="marginalia-upload-"))
        copy = folder / f"document{suffix}"  # our own name: the client's never becomes a path
        copy.write_bytes(data)
        job = Job(uuid.uuid4().hex, collection, document)
        with self._lock:
            self._jobs[job.id] = job
            self._forget()

        def run() -> None:
            try:
                work(job, copy, self)
            except Exception as exc:  # noqa: BLE001 - a job's failure is its result
                status, code, message = describe(exc)
                if status == 500:
                    log.error("indexing %s failed", document, exc_info=exc)
                self.update(job, status="failed", stage="finished", error={"code": code, "message": message},
                             finished_at=time.time())
            finally:
                shutil.rmtree(folder, ignore_errors=True)

        self._executor.submit(run)
        return job.to_dict()

    def _forget(self) -> None:
        finished = [j.id for j in self._jobs.values() if j.finished]
        for job_id in finished[:max(0, len(finished) - self.keep)]:
            del self._jobs[job_id]

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def index_upload(job: Job, copy: Path, board: JobBoard, *, store: Callable[[], Collection],
                 count_tokens: Callable[[str], int], chunking: ChunkingOptions) -> None:
    """Index the saved copy into the collection under the upload's name (`app.index_paths`), reporting each
    stage on the job: loading, embedding (chunks done of total), optimizing, finished."""
    board.update(job, status="running", stage="loading")

    def on_document(doc: Document, n_chunks: int) -> Callable[[int, int], None]:
        board.update(job, stage="embedding", chunks_total=n_chunks)
        return lambda done, total: board.update(job, chunks_done=done, chunks_total=total)

    def on_indexed(item: app.Indexed) -> None:
        if item.result.status in ("added", "replaced"):
            board.update(job, stage="optimizing")  # index_paths folds the new rows into its indices next

    report = app.index_paths([copy], store(), count_tokens=count_tokens, chunking=chunking, source=job.document,
                             on_document=on_document, on_indexed=on_indexed)
    (item,) = report.indexed  # one file, loaded or raised
    result = item.result
    outcome = {"status": result.status, "doc_id": result.doc_id, "source": result.source, "chunks": result.n_chunks,
               "embedded": result.n_embedded, "sections": len(item.sections) - 1,
               "notes": [note.message for note in report.notes]}
    if result.status == "duplicate":  # a collection holds each text once: the upload's name is not added
        outcome["message"] = (
            f"the same text is already in collection {job.collection!r} as {result.source!r}, so nothing was "
            f"added as {job.document!r}; ask about {result.source!r}, or delete it and upload this again to keep "
            "the text under the new name")
    board.update(job, status="done", stage="finished", finished_at=time.time(), chunks_done=result.n_chunks,
                 result=outcome)
