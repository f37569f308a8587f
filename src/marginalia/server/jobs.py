"""Indexing jobs: an uploaded document is staged as a private copy under the home and indexed in the
background, one job at a time, with progress a client can poll or follow.

Jobs live in memory. A server killed mid-job loses the job's record but never the collection: the store
commits each document as it is added, so the collection stays at its last good state (a retry completes
it, reusing what was embedded). Its staged copies stay behind, and the next server on that home sweeps
them away when it starts. The model is not needed to index, only its tokenizer (chunk sizes are counted in
its tokens), so indexing does not wait for readings, nor they for it.
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

from filelock import FileLock, Timeout

from .. import app
from ..errors import BadInput, EmptyDocument, MarginaliaError, NotFound
from ..options import ChunkingOptions, IngestOptions
from ..records import Document
from .errors import Busy, UnsupportedType, describe, log

if TYPE_CHECKING:
    from ..app import Collection

Status = Literal["queued", "running", "done", "failed"]
_UNSAFE = re.compile(r"[^A-Za-z0-9._ -]+")
#: the longest name an upload is known by, and the longest suffix kept when a longer one is cut
MAX_NAME = 120
MAX_SUFFIX = 12
#: seconds a client is told to wait when too many uploads wait to be indexed
RETRY_AFTER = 10
MIB = 1024 * 1024
#: the folder under the home where uploads wait for their jobs: a folder per server, locked by it while it lives
#: (`StagingArea`), one folder per upload inside it; a server sweeps what servers that are gone left
STAGING = "staging"
#: the lock file of a server's folder under `STAGING`
OWNER_LOCK = ".owner.lock"


class StagingArea:
    """A server's own folder under the staging ``root``, which it holds an exclusive lock on (``flock``, which
    the kernel lets go of when the process ends, however it ends) while it lives. Folders whose lock anyone can
    take are left over by servers that are gone, and swept when another starts: unlike a process id, the lock
    tells a live server from a dead one in a container too, where every server is process 1."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(prefix="server-", dir=root))
        self._lock = FileLock(self.folder / OWNER_LOCK, thread_local=False)
        self._lock.acquire()
        self.swept = sweep_staging(root)

    def close(self) -> None:
        """Remove the folder and let go of its lock (what is left of it is swept by a later server)."""
        shutil.rmtree(self.folder, ignore_errors=True)
        self._lock.release()


def sweep_staging(root: Path) -> list[Path]:
    """Remove what servers that are gone left in the staging ``root``: every entry but the folders whose lock
    is held (by a live server, this one included). Returns what was removed."""
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            if _owned(entry):
                continue
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def _owned(folder: Path) -> bool:
    """Whether a live server holds ``folder``'s lock."""
    if not (folder / OWNER_LOCK).is_file():
        return False
    probe = FileLock(folder / OWNER_LOCK, thread_local=False)
    try:
        probe.acquire(timeout=0)
    except Timeout:
        return True
    probe.release()
    return False


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
    size: int = 0  # bytes of the upload's saved copy (not sent: counted against the board's bound)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "collection": self.collection, "document": self.document, "status": self.status,
                "stage": self.stage, "chunks_done": self.chunks_done, "chunks_total": self.chunks_total,
                "result": self.result, "error": self.error, "created_at": self.created_at,
                "finished_at": self.finished_at}

    @property
    def finished(self) -> bool:
        return self.status in ("done", "failed")


class UploadsWaiting(Busy):
    """Too many uploads, or too many bytes of them, wait to be indexed already (HTTP 429)."""

    def __init__(self, message: str) -> None:
        MarginaliaError.__init__(self, message)
        self.retry_after = RETRY_AFTER


class JobBoard:
    """The indexing jobs: ``workers`` threads run them in the order they came, each converting its upload in a
    process of its own, and adding to a collection one after another (`writing`); the last ``keep`` finished
    ones are remembered.

    Uploads wait in a folder of this board's own under ``staging`` (`StagingArea`; what servers that are gone
    left there is swept when the board is made). At most ``max_waiting`` jobs wait or run at once, and the
    copies they wait on hold at most ``max_waiting_bytes`` (one upload alone always gets in, whatever its
    size); more are refused with `UploadsWaiting`.
    """

    def __init__(self, keep: int, staging: Path, max_waiting: int = 16, max_waiting_bytes: int = 256 * MIB,
                 workers: int = 2) -> None:
        self.keep = keep
        self.max_waiting = max_waiting
        self.max_waiting_bytes = max_waiting_bytes
        self.area = StagingArea(staging)
        self.staging = self.area.folder
        if self.area.swept:
            log.info("removed %d uploads stopped servers left in %s", len(self.area.swept), staging)
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._lock = threading.Lock()
        self._writers: dict[str, threading.Lock] = {}
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="marginalia-index")

    def writing(self, collection: str) -> threading.Lock:
        """The lock a job holds while it adds to ``collection`` (its conversion runs outside it)."""
        with self._lock:
            return self._writers.setdefault(collection, threading.Lock())

    def room_for(self, size: int) -> UploadsWaiting | None:
        """Why an upload of ``size`` bytes could not wait now, or None (asked before its body is read)."""
        with self._lock:
            return self._refusal(size)

    def get(self, job_id: str, visible: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """A job with its version; ``visible``: whether the caller may see a collection's jobs.

        Raises:
            NotFound: no such job (or one of a collection the caller may not see: the same reply).
        """
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None and visible is not None and not visible(job.collection):
                job = None
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
        """Stage ``data`` as a private copy and queue ``work`` on it; the copy goes when the job ends, fails or
        is cancelled (at shutdown).

        Raises:
            UploadsWaiting: too many uploads, or bytes of them, wait already.
        """
        self._check_room(len(data))  # before anything is written
        folder = Path(tempfile.mkdtemp(prefix="upload-", dir=self.staging))
        copy = folder / f"document{suffix}"  # our own name: the client's never becomes a path
        job = Job(uuid.uuid4().hex, collection, document, size=len(data))

        def run() -> None:
            try:
                work(job, copy, self)
            except Exception as exc:  # noqa: BLE001 - a job's failure is its result
                status, code, message = describe(exc)
                if status == 500:
                    log.error("indexing %s failed", document, exc_info=exc)
                self.update(job, status="failed", stage="finished", error={"code": code, "message": message},
                             finished_at=time.time())

        try:
            copy.write_bytes(data)
            with self._lock:
                refused = self._refusal(job.size)  # again: another upload may have come in meanwhile
                if refused is None:
                    self._jobs[job.id] = job
                    self._forget()
            if refused is not None:
                raise refused
            future = self._executor.submit(run)
        except BaseException:  # refused, a full disk, a board shut down: nothing is left staged
            shutil.rmtree(folder, ignore_errors=True)
            raise
        future.add_done_callback(lambda _: shutil.rmtree(folder, ignore_errors=True))
        return job.to_dict()

    def waiting(self) -> tuple[int, int]:
        """Jobs queued or running, and the bytes of their uploads."""
        with self._lock:
            return self._waiting()

    def _waiting(self) -> tuple[int, int]:
        unfinished = [job for job in self._jobs.values() if not job.finished]
        return len(unfinished), sum(job.size for job in unfinished)

    def _check_room(self, size: int) -> None:
        with self._lock:
            refused = self._refusal(size)
        if refused is not None:
            raise refused

    def _refusal(self, size: int) -> UploadsWaiting | None:
        """Why an upload of ``size`` bytes cannot wait now (under the lock), or None."""
        count, held = self._waiting()
        if count >= self.max_waiting:
            return UploadsWaiting(f"{count} uploads are waiting to be indexed already, as many as this server "
                                  f"keeps (its --upload-queue); try again once some are done (GET /v1/jobs)")
        if count and held + size > self.max_waiting_bytes:
            return UploadsWaiting(f"the uploads waiting to be indexed hold {held / MIB:.1f} MiB already, and this "
                                  f"one ({size / MIB:.1f} MiB) would pass this server's bound of "
                                  f"{self.max_waiting_bytes / MIB:.0f} MiB (its --upload-queue-mb); try again "
                                  "once some are done (GET /v1/jobs)")
        return None

    def _forget(self) -> None:
        finished = [j.id for j in self._jobs.values() if j.finished]
        for job_id in finished[:max(0, len(finished) - self.keep)]:
            del self._jobs[job_id]

    def shutdown(self) -> None:
        """Cancel the jobs waiting, stop the conversions running (their processes are killed), and give up
        the staging folder."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        stopped = app.stop_conversions()
        if stopped:
            log.info("stopped %d conversions of uploads at shutdown", stopped)
        self.area.close()


def index_upload(job: Job, copy: Path, board: JobBoard, *, store: Callable[[], Collection],
                 count_tokens: Callable[[str], int], chunking: ChunkingOptions, ingest: IngestOptions) -> None:
    """Index the saved copy into the collection under the upload's name (`app.index_paths`, converting it
    within ``ingest``), reporting each stage on the job: loading, embedding (chunks done of total),
    optimizing, finished."""
    board.update(job, status="running", stage="loading")

    def on_document(doc: Document, n_chunks: int) -> Callable[[int, int], None]:
        board.update(job, stage="embedding", chunks_total=n_chunks)
        return lambda done, total: board.update(job, chunks_done=done, chunks_total=total)

    def on_indexed(item: app.Indexed) -> None:
        if item.result.status in ("added", "replaced"):
            board.update(job, stage="optimizing")  # index_paths folds the new rows into its indices next

    report = app.index_paths([copy], store(), count_tokens=count_tokens, chunking=chunking, ingest=ingest,
                             source=job.document, on_document=on_document, on_indexed=on_indexed,
                             write_lock=board.writing(job.collection))
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
