"""``bench run --jobs N``: one run answered by N worker processes, each held to its own share of the cores.

(A run whose models are served over HTTP gives every worker all the cores, and may have more workers than
cores: they wait on the server, which batches what they send side by side.)

On a CPU, llama.cpp gains little from a second thread on a small model, so N one-core workers answer more
per hour than one process on N cores. The parent holds the run folder's lock, drops errored lines for
``--retry-errors``, splits its cores into N groups and spawns the workers. Each worker loads its own models
(N copies in memory), builds the same items and takes them in turn from one shared counter (the longest
contexts first), so every item, with all its patterns (which may share a reading), is answered by one
worker; lines are appended under a file lock. Progress, logs and each worker's summary come back over a
queue, and the parent draws one progress bar.

Stopping: Ctrl-C or SIGTERM to the parent stops the workers the same way (each ends at once, keeping the
answers it finished), and a worker whose parent is gone (killed with SIGKILL, say) stops itself.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..errors import MarginaliaError, UserError
from .config import RunConfig
from .folder import RESULTS, drop_errors, locked, read_results
from .progress import Progress
from .runner import JobLink, RunSummary, prepare, run_benchmark, sayer

#: how long the parent waits for its workers to stop after Ctrl-C before it ends them
STOP_SECONDS = 60.0
#: how often a worker checks that its parent is still there
ORPHAN_CHECK_SECONDS = 1.0


def available_cores() -> list[int]:
    """The cores this process may run on (``taskset`` narrows them)."""
    return sorted(os.sched_getaffinity(0))


def served_over_http(config: RunConfig) -> bool:
    """Whether every model the run generates with is a server's (``openai:``): its workers then mostly wait on
    that server, so any number of them may share this process's cores, each with items in flight."""
    specs = [config.model] + ([config.judge.model] if config.judge is not None else [])
    return all(spec.startswith("openai:") for spec in specs)


def worker_cores(config: RunConfig, cores: Sequence[int], jobs: int) -> list[list[int]]:
    """The cores each of ``jobs`` workers is held to: a share each (`core_groups`), or all of them for a run
    served over HTTP.

    Raises:
        UserError: more jobs than cores, for a run whose models run in the workers.
    """
    if served_over_http(config):
        return [list(cores)] * jobs
    if jobs > len(cores):
        raise UserError(f"--jobs {jobs}: this process may use {len(cores)} core{'s' * (len(cores) != 1)} and "
                        f"each job needs one; give --jobs {len(cores)} or fewer (or serve the model over HTTP, "
                        "where workers need no core of their own)")
    return core_groups(cores, jobs)


def core_groups(cores: Sequence[int], jobs: int) -> list[list[int]]:
    """``cores`` split into ``jobs`` runs of neighbours, as even as they go (the first take any extra)."""
    size, extra = divmod(len(cores), jobs)
    groups, start = [], 0
    for k in range(jobs):
        n = size + (k < extra)
        groups.append(list(cores[start:start + n]))
        start += n
    return groups


@dataclass
class _Outcome:
    """What the workers reported."""

    planned: int = 0
    resumed: int = 0
    fingerprint: str | None = None
    summaries: dict[int, dict[str, Any]] = field(default_factory=dict)
    failures: dict[int, tuple[str, str]] = field(default_factory=dict)  # worker -> (kind, message)
    stopped: set[int] = field(default_factory=set)

    def ended(self, k: int) -> bool:
        return k in self.summaries or k in self.failures or k in self.stopped


def run_jobs(config: RunConfig, jobs: int, *, home: str | Path | None = None, out: str | Path | None = None,
             limit: int | None = None, patterns: Sequence[str] | None = None, tasks: Sequence[str] | None = None,
             retry_errors: bool = False, err: TextIO | None = None, progress: bool = True,
             log: Callable[[str], None] | None = None) -> RunSummary:
    """`run_benchmark` (the same arguments) with ``jobs`` worker processes (see the module's docstring); each
    loads the config's models and builds its datasets itself.

    Raises:
        UserError: as `run_benchmark`; also more jobs than this process has cores (for models run in the
            workers), a system that cannot hold a process to its cores, or a worker's own `UserError`.
        MarginaliaError: a worker failed (the answers written so far are kept: run again to resume).
        KeyboardInterrupt: passed on once the workers have stopped, every finished answer on disk.
    """
    stream = err or sys.stderr
    say = sayer(log, progress, stream)
    if not hasattr(os, "sched_setaffinity"):
        raise UserError("--jobs needs Linux, where each worker can be held to its own cores; run without it")
    groups = worker_cores(config, available_cores(), jobs)
    _, folder, _ = prepare(config, home, out, patterns, tasks)
    t_start = time.perf_counter()
    with locked(folder):
        results_path = folder / RESULTS
        records = read_results(results_path, repair=True, log=say)
        if retry_errors:
            drop_errors(results_path, records, say)
        say(f"{jobs} jobs, on cores {' | '.join(','.join(map(str, g)) for g in groups)}; each loads its own models")
        ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
        counter = ctx.Value("q", 0)
        events = ctx.Queue()
        options = {"home": home, "out": str(folder), "limit": limit, "patterns": patterns, "tasks": tasks}
        lock_file = str(folder / ".append.lock")
        workers = [ctx.Process(target=_work, name=f"marginalia-bench-job-{k}",
                               args=(k, jobs, groups[k], config, options, counter, events, lock_file,
                                     os.getpid()))
                   for k in range(jobs)]
        for worker in workers:
            worker.start()
        try:
            with _terminate_as_interrupt():
                outcome = _follow(workers, events, stream, progress, say)
        except BaseException:
            _stop(workers)
            raise
        finally:
            for worker in workers:
                worker.join(timeout=STOP_SECONDS)
    for k, (kind, message) in sorted(outcome.failures.items()):
        if kind == "user":
            raise UserError(message)
        raise MarginaliaError(f"bench job {k} failed: {message}; the answers written so far are kept: run the "
                              "same command again to resume")
    if outcome.stopped:
        raise KeyboardInterrupt
    statuses: dict[str, int] = {}
    for summary in outcome.summaries.values():
        for status, n in summary["statuses"].items():
            statuses[status] = statuses.get(status, 0) + n
    return RunSummary(folder=folder, planned=outcome.planned, resumed=outcome.resumed,
                      written=sum(s["written"] for s in outcome.summaries.values()), statuses=statuses,
                      disagreements=sum(s["disagreements"] for s in outcome.summaries.values()),
                      seconds=round(time.perf_counter() - t_start, 3))


def _follow(workers: Sequence[Any], events: Any, stream: TextIO, progress: bool,
            say: Callable[[str], None]) -> _Outcome:
    """Show the workers' progress and logs until every one has ended; what they reported."""
    outcome = _Outcome()
    bar: Progress | None = None
    said: set[str] = set()  # the workers say the same things (loading a model, the run folder): once each
    gone: dict[int, float] = {}  # when a worker was first seen dead
    try:
        while not all(outcome.ended(k) for k in range(len(workers))):
            try:
                event = events.get(timeout=0.5)
            except queue.Empty:
                now = time.monotonic()
                for k, worker in enumerate(workers):  # killed (out of memory, a signal): it reports nothing
                    if outcome.ended(k) or worker.is_alive():
                        continue
                    if now - gone.setdefault(k, now) > 2.0:  # time enough for its last words to arrive
                        outcome.failures[k] = ("crash", _ended(worker.exitcode))
                continue
            kind, k, *rest = event
            if kind == "plan":
                planned, resumed, fingerprint = rest
                if outcome.fingerprint is None:
                    outcome.planned, outcome.resumed, outcome.fingerprint = planned, resumed, fingerprint
                    bar = Progress(planned, resumed, stream, progress)
                elif fingerprint != outcome.fingerprint:
                    raise MarginaliaError("the bench jobs built different items from one config (a dataset that "
                                          "does not build the same items twice); run without --jobs")
            elif kind == "log":
                if rest[0] not in said:
                    said.add(rest[0])
                    if bar is not None:
                        bar.log(rest[0])
                    else:
                        say(rest[0])
            elif kind == "step":
                if bar is not None:
                    bar.step(f"job {k} {rest[0]}")
            elif kind == "done":
                outcome.summaries[k] = rest[0]
            elif kind == "failed":
                outcome.failures[k] = (rest[0], rest[1])
            elif kind == "stopped":
                outcome.stopped.add(k)
    finally:
        if bar is not None:
            bar.close()
    return outcome


def _ended(code: int | None) -> str:
    """How a worker that said nothing ended: its exit code, or the signal that killed it."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"its process was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    return f"its process ended with exit code {code}"


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt (as Ctrl-C does), so the parent stops its workers
    before it ends instead of leaving them running. Only the main thread can set a handler: elsewhere
    (a caller's thread) SIGTERM keeps its own behaviour."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop(workers: Sequence[Any]) -> None:
    """Ctrl-C or SIGTERM reached the parent (Ctrl-C from a terminal reaches the workers too): let each worker
    stop as a run does on Ctrl-C (its finished answers are on disk), then end any that do not."""
    deadline = time.monotonic() + 2.0
    for worker in workers:
        worker.join(timeout=max(0.0, deadline - time.monotonic()))
    for worker in workers:
        if worker.is_alive() and worker.pid is not None:
            try:
                os.kill(worker.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + STOP_SECONDS
    for worker in workers:
        worker.join(timeout=max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            worker.terminate()


def _watch_parent(parent: int, orphaned: threading.Event) -> None:
    """Interrupt this worker (as Ctrl-C would) once its parent process ``parent`` is gone: a worker whose
    parent was killed outright stops instead of answering on alone."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK_SECONDS)
    orphaned.set()
    os.kill(os.getpid(), signal.SIGINT)


def _work(index: int, count: int, cores: list[int], config: RunConfig, options: dict[str, Any], counter: Any,
          events: Any, lock_file: str, parent: int) -> None:
    """One worker: held to its cores (and as many threads), it answers the items it takes until they run out,
    Ctrl-C, or its parent (process id ``parent``) is gone."""
    # the parent stops a worker with SIGINT: a run started in the background (`nohup ... &`) hands its
    # workers SIGINT ignored, so take Python's own handler back
    signal.signal(signal.SIGINT, signal.default_int_handler)
    orphaned = threading.Event()
    threading.Thread(target=_watch_parent, args=(parent, orphaned), name="marginalia-bench-parent-watch",
                     daemon=True).start()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # before torch is imported
        os.environ[var] = str(len(cores))
    os.sched_setaffinity(0, cores)  # llama.cpp takes a thread per core this process may use

    def take() -> int:
        with counter.get_lock():
            position = int(counter.value)
            counter.value += 1
        return position

    link = JobLink(index=index, count=count, take=take, send=events.put, lock_file=Path(lock_file))
    try:
        summary = run_benchmark(config, **options, log=lambda message: events.put(("log", index, message)),
                                job=link)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the report short
        if orphaned.is_set():  # nobody reads the queue: do not wait at exit to flush it
            events.cancel_join_thread()
        else:
            events.put(("stopped", index))
    except UserError as exc:
        events.put(("failed", index, "user", str(exc)))
    except MarginaliaError as exc:
        events.put(("failed", index, "error", f"{type(exc).__name__}: {exc}"))
    except Exception as exc:  # noqa: BLE001 - said to the parent, which says it to the user
        events.put(("failed", index, "crash",
                    f"{type(exc).__name__}: {exc}\n{''.join(traceback.format_exception(exc)[-3:])}"))
    else:
        events.put(("done", index, {"written": summary.written, "statuses": summary.statuses,
                                    "disagreements": summary.disagreements}))
