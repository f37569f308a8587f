"""One model per process, used by one reading at a time (or by as many side by side as the model allows):
the worker threads, a bounded queue before them, and the bridge that relays a reading's events from its
thread to the request that waits for them.

The core is synchronous, so a reading runs in a worker thread and the event loop only relays what it
yields. A model computed in this process reads one request at a time, on one thread; a server that batches
requests and shares its prefix cache across them (`Generator.parallel_readings`) reads several side by side,
each reading on its own view of the model (`Generator.fork_reading`). A request that cannot even wait (the
queue is full) is refused at once with `Busy` (HTTP 429).
A request whose client goes away cancels its reading: a queued one leaves the queue at once (its place is
free for the next request), a running one is stopped (`Run.stop()`) and dropped at its next event, so the
model is free again within one segment. A client that
only wants it to stop reading asks for that by the reading's id (`ModelWorker.reading`, then `Reading.stop`):
the run stops after its current step and still answers, from what it has read.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..app import close_stream
from ..errors import MarginaliaError, NotFound
from ..records import Answer, Done, Event, Margin, MarginJudged
from .errors import Busy

if TYPE_CHECKING:
    from ..app import Run

#: seconds between checks that a waiting client is still there
DISCONNECT_POLL = 0.25
#: seconds a caller with as many readings as it may have is told to wait
READINGS_RETRY_AFTER = 5


class TooManyReadings(Busy):
    """A key has as many readings waiting or running as the server allows one key (HTTP 429)."""

    def __init__(self, limit: int) -> None:
        MarginaliaError.__init__(self, f"this key has {limit} readings waiting or running, as many as the server "
                                 "allows one key at once (--key-readings); wait for one to finish, or stop one "
                                 "(POST /v1/readings/ID/stop)")
        self.retry_after = READINGS_RETRY_AFTER


class ModelWorker:
    """Runs blocking jobs in its own threads, ``parallel`` at once (`allow` changes it once the model is
    known); at most ``queue_size`` more may wait, and run in the order they came."""

    def __init__(self, queue_size: int, parallel: int = 1) -> None:
        self.queue_size = queue_size
        self._lock = threading.Lock()
        self._parallel = 1
        self._threads = 1  # the executor's
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="marginalia-model")
        self._waiting: deque[tuple[Future[None], Callable[[], None]]] = deque()
        self._admitted = 0  # running + waiting
        self._running = 0
        self._closed = False
        self._durations: deque[float] = deque(maxlen=16)
        self._readings: dict[str, Reading] = {}  # admitted and not yet over, by id
        self.allow(parallel)

    def allow(self, parallel: int) -> None:
        """Run up to ``parallel`` jobs at once from now on (the model says how many: `parallel_readings`);
        jobs waiting start at once where that leaves room."""
        if parallel < 1:
            raise ValueError(f"parallel must be at least 1, got {parallel}")
        with self._lock:
            if self._closed:
                return
            if parallel > self._threads:
                # a pool as wide as the limit; the narrower one ends its threads once their jobs are done
                old, self._executor = self._executor, ThreadPoolExecutor(max_workers=parallel,
                                                                         thread_name_prefix="marginalia-model")
                self._threads = parallel
                old.shutdown(wait=False)
            self._parallel = parallel
            self._dispatch()

    @property
    def parallel(self) -> int:
        """How many jobs run at once."""
        return self._parallel

    def submit(self, job: Callable[[], None]) -> Future[None]:
        """Queue ``job`` for the model's threads; the future `withdraw` takes back.

        Raises:
            Busy: the queue is full (the error says when to try again).
        """
        queued: Future[None] = Future()
        with self._lock:
            if self._admitted >= self.queue_size + self._parallel:
                raise Busy(self._retry_after(), self._admitted - self._running)
            self._admitted += 1
            self._waiting.append((queued, job))
            self._dispatch()
        return queued

    def withdraw(self, queued: Future[None]) -> bool:
        """Take a job that has not started out of the queue, so that its place is free at once; False when
        it has started (or ended) already."""
        with self._lock:
            for k, (future, _) in enumerate(self._waiting):
                if future is queued:
                    del self._waiting[k]
                    self._admitted -= 1
                    break
            else:
                return False
        queued.cancel()  # still pending: it never runs
        return True

    def _dispatch(self) -> None:
        """Start waiting jobs, oldest first, while fewer than ``parallel`` run (under the lock)."""
        while self._waiting and self._running < self._parallel and not self._closed:
            future, job = self._waiting.popleft()
            future.set_running_or_notify_cancel()
            self._running += 1
            try:
                self._executor.submit(self._timed, future, job)
            except BaseException as exc:  # the interpreter is shutting down: it never runs
                self._running -= 1
                self._admitted -= 1
                future.set_exception(exc)
                raise

    def _timed(self, future: Future[None], job: Callable[[], None]) -> None:
        t0 = time.monotonic()
        try:
            job()
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(None)
        finally:
            with self._lock:
                self._running -= 1
                self._admitted -= 1
                self._durations.append(time.monotonic() - t0)
                self._dispatch()

    def _retry_after(self) -> int:
        """Seconds until a place in the queue is likely free: one typical reading shared among those that
        run at once (5 s before any ran)."""
        if not self._durations:
            return 5
        typical = sorted(self._durations)[len(self._durations) // 2]
        return max(1, min(600, math.ceil(typical / self._parallel)))

    def track(self, reading: Reading, limit: int | None = None) -> None:
        """Know ``reading`` by its id until it is over (`forget`).

        Raises:
            TooManyReadings: its owner has ``limit`` readings waiting or running already.
        """
        with self._lock:
            if limit is not None:
                held = sum(1 for r in self._readings.values() if r.owner == reading.owner)
                if held >= limit:
                    raise TooManyReadings(limit)
            self._readings[reading.id] = reading

    def forget(self, reading: Reading) -> None:
        with self._lock:
            self._readings.pop(reading.id, None)

    def reading(self, reading_id: str, owner: str | None = None) -> Reading:
        """A reading that is waiting or running, by its id; with ``owner``, only one that caller started.

        Raises:
            NotFound: no such reading, it is over, or it is another caller's.
        """
        with self._lock:
            found = self._readings.get(reading_id)
        if found is not None and owner is not None and found.owner != owner:
            found = None
        if found is None:
            raise NotFound(f"no reading {reading_id!r} is waiting or running (it may be over already)",
                           "reading", reading_id)
        return found

    def status(self) -> dict[str, int]:
        """Readings running and waiting, the queue's bound, and how many may run at once (``parallel``)."""
        with self._lock:
            return {"running": self._running, "waiting": self._admitted - self._running,
                    "queue_size": self.queue_size, "parallel": self._parallel}

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
            self._admitted -= len(waiting)
            executor = self._executor
        for future, _ in waiting:
            future.cancel()
        executor.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class Prepared:
    """A reading ready to start: ``start`` builds its run in the model's thread; ``finish`` (if any) is
    applied to the answer before ``done`` is sent."""

    start: Callable[[], Run]
    finish: Callable[[Answer], Answer] | None = None


@dataclass(frozen=True)
class Failed:
    """A reading that raised."""

    error: BaseException


_END = object()


class Reading:
    """One request's reading on the model's thread, its events relayed to the event loop as they come.

    ``id`` names it while it waits or runs, so that a client can stop it (`stop`) and still get its answer.

    Args:
        worker: the model's worker (raises `Busy` here when its queue is full).
        prepared: what starts the run, in the model's thread, and what finishes its answer.
        owner: the caller that started it (only it may stop it; None: anyone).
        limit: the most readings its owner may have waiting or running (`TooManyReadings` past it).
    """

    def __init__(self, worker: ModelWorker, prepared: Prepared, owner: str | None = None,
                 limit: int | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._cancelled = threading.Event()
        self._stop = threading.Event()
        self._run: Run | None = None
        self._run_lock = threading.Lock()
        self._start = prepared.start
        self._finish = prepared.finish
        self.finished = False
        self._asked = 0.0  # when the client was last asked whether it is still there
        self.margins: list[Margin] = []  # judged so far, for an error that ends the reading early
        self.id = uuid.uuid4().hex
        self.owner = owner
        self._worker = worker
        worker.track(self, limit)  # before it can run, and so end
        try:
            self._queued = worker.submit(self._work)
        except BaseException:
            worker.forget(self)
            raise

    # -- the model's thread ---------------------------------------------------------------------------

    def _emit(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone (the server is shutting down): nobody listens
            self._cancelled.set()

    def _work(self) -> None:
        if self._cancelled.is_set():  # the client left while this waited in the queue
            self._worker.forget(self)
            self._emit(_END)
            return
        run: Run | None = None
        events = None
        try:
            run = self._start()
            with self._run_lock:
                self._run = run
                if self._cancelled.is_set() or self._stop.is_set():
                    run.stop()
            events = iter(run)
            for event in events:
                if isinstance(event, Done) and self._finish is not None:
                    event = Done(self._finish(event.answer))
                self._emit(event)
                if self._cancelled.is_set():  # nobody reads the rest: free the model now
                    break
        except Exception as exc:  # noqa: BLE001 - relayed to the request, which answers it
            self._emit(Failed(exc))
        finally:
            if events is not None:
                close_stream(events)
            with self._run_lock:
                self._run = None
            self._worker.forget(self)
            # the last reference: the pattern's own generator is finalised here, in this thread, so its
            # streams are closed and its caches rolled back before the next reading starts
            run = events = None
            self._emit(_END)

    # -- the event loop -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop reading after the current step; the run still answers from what it has read (and a reading
        still queued answers from nothing read)."""
        self._stop.set()
        with self._run_lock:
            if self._run is not None:
                self._run.stop()

    def cancel(self) -> None:
        """Stop reading: a reading still queued leaves the queue now; a running one stops after its current
        step, and its events are dropped."""
        self._cancelled.set()
        if self._worker.withdraw(self._queued):  # it never starts: nothing else will end it
            self._worker.forget(self)
            self._emit(_END)
            return
        with self._run_lock:
            if self._run is not None:
                self._run.stop()

    async def next(self, gone: Callable[[], Awaitable[bool]] | None = None) -> Event | Failed | None:
        """The next event, a `Failed`, or None at the end. With ``gone``, whether the client has left is
        asked every `DISCONNECT_POLL` seconds (events may come faster); if it has, the reading is cancelled
        and `ClientGone` raised."""
        while True:
            if gone is not None and time.monotonic() - self._asked >= DISCONNECT_POLL:
                self._asked = time.monotonic()
                if await gone():
                    self.cancel()
                    raise ClientGone()
            try:
                if gone is None:
                    item = await self._queue.get()
                else:
                    item = await asyncio.wait_for(self._queue.get(), DISCONNECT_POLL)
            except TimeoutError:
                continue
            except asyncio.CancelledError:  # the request's task was cancelled (e.g. the server stops)
                self.cancel()
                raise
            if item is _END:
                self.finished = True
                return None
            if isinstance(item, MarginJudged):
                self.margins.append(item.margin)
            return item  # type: ignore[no-any-return]


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""
