"""Where benchmark runs stand (``marginalia bench runs``): answers per task and pattern, items done of those the
config plans, errors, the last answer, and whether a run is writing now; read from the run folders alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import UserError
from .folder import RESULTS, RUN_INFO, is_running, read_results, read_run_info, runs_dir


@dataclass
class TaskProgress:
    """One task of a run: items every pattern has answered, of those its config plans (None: not known)."""

    task: str
    planned: int | None
    items: int
    answers: dict[str, int] = field(default_factory=dict)  # pattern -> answers written


@dataclass
class RunStatus:
    name: str
    folder: Path
    running: bool  # a `bench run` (or judge) holds the folder's lock now
    answers: int
    statuses: dict[str, int]  # ok / overflow / error
    last: str | None  # when the last answer was written (ISO 8601)
    tasks: list[TaskProgress]
    left_seconds: float | None = None  # answering left at the pace so far (None: nothing to go on, or done)
    problem: str | None = None  # why the folder could not be read (then the counts above are empty)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "folder": str(self.folder), "running": self.running, "answers": self.answers,
                "statuses": self.statuses, "last": self.last,
                "tasks": [{"task": t.task, "planned": t.planned, "items": t.items, "answers": t.answers}
                          for t in self.tasks], "left_seconds": self.left_seconds, "problem": self.problem}


def planned_items(task: dict[str, Any]) -> int | None:
    """Items a task of a resolved config asks for: examples x lengths x depths (or fractions); one depth each
    with ``rotate_depths``. A dataset holding fewer examples than the limit builds fewer."""
    try:
        limit, lengths = int(task["limit"]), len(task.get("lengths") or [])
    except (KeyError, TypeError, ValueError):
        return None
    places = len(task.get("depths") or []) or len(task.get("distractor_fractions") or []) or 1
    if (task.get("options") or {}).get("rotate_depths"):
        places = 1
    return limit * max(lengths, 1) * places


def _task_name(task: dict[str, Any]) -> str:
    return str(task.get("name") or task.get("dataset"))


def run_status(folder: Path) -> RunStatus:
    """Where the run in ``folder`` stands."""
    info = read_run_info(folder)
    records = read_results(folder / RESULTS)
    config = info.get("config") or {}
    patterns = [str(p.get("name") or p.get("kind")) for p in config.get("patterns") or []]
    by_task: dict[str, dict[str, set[str]]] = {}  # task -> pattern -> item ids
    statuses: dict[str, int] = {}
    for r in records:
        by_task.setdefault(str(r.get("task")), {}).setdefault(str(r.get("pattern")), set()).add(str(r.get("item_id")))
        statuses[str(r.get("status"))] = statuses.get(str(r.get("status")), 0) + 1
    tasks = []
    named = [(_task_name(t), planned_items(t)) for t in config.get("tasks") or []]
    for task in dict.fromkeys([*(n for n, _ in named), *by_task]):
        answered = by_task.get(task, {})
        every = set.intersection(*(answered.get(p, set()) for p in patterns)) if patterns else set()
        tasks.append(TaskProgress(task=task, planned=dict(named).get(task), items=len(every),
                                  answers={p: len(answered.get(p, ())) for p in patterns or answered}))
    finished = [str(r["finished"]) for r in records if r.get("finished")]
    invocations = info.get("invocations") or [{}]
    return RunStatus(name=str(config.get("name") or folder.name), folder=folder, running=is_running(folder),
                     answers=len(records), statuses=statuses, last=max(finished) if finished else None, tasks=tasks,
                     left_seconds=time_left(records, tasks, int(invocations[-1].get("jobs") or 1)))


def time_left(records: list[dict[str, Any]], tasks: list[TaskProgress], jobs: int = 1) -> float | None:
    """Answering time left: each task's unanswered answers at that task's mean seconds per answer of that pattern
    (the run's mean for the pattern where the task has none yet), shared by ``jobs`` workers. None when no answer
    gives a pace, or a task's plan is not known."""
    seconds: dict[tuple[str, str], list[float]] = {}
    for r in records:
        if isinstance(r.get("seconds"), (int, float)):
            for key in ((str(r.get("task")), str(r.get("pattern"))), ("", str(r.get("pattern")))):
                seconds.setdefault(key, []).append(float(r["seconds"]))
    left = 0.0
    for t in tasks:
        if t.planned is None:
            return None
        for pattern, done in t.answers.items():
            pace = seconds.get((t.task, pattern)) or seconds.get(("", pattern))
            if pace is None:
                return None
            left += max(0, t.planned - done) * sum(pace) / len(pace)
    return left / max(1, jobs)


def read_status(folder: Path) -> RunStatus:
    """``run_status``, or, when the folder cannot be read (a damaged results file), a status naming the problem,
    so that a listing goes on to the other runs."""
    try:
        return run_status(folder)
    except (UserError, OSError) as exc:
        return RunStatus(name=folder.name, folder=folder, running=is_running(folder), answers=0, statuses={},
                         last=None, tasks=[], problem=str(exc))


def list_runs(home: str | Path | None = None) -> list[RunStatus]:
    """Every run under ``<home>/bench/runs``, by name; one that cannot be read is listed with its problem."""
    root = runs_dir(home)
    if not root.is_dir():
        return []
    return [read_status(p) for p in sorted(root.iterdir())
            if p.is_dir() and ((p / RESULTS).is_file() or (p / RUN_INFO).is_file())]


def ago(stamp: str | None, now: datetime | None = None) -> str:
    """"3 min ago", "2 h ago", "4 days ago" for an ISO 8601 time ("never" for None)."""
    if stamp is None:
        return "never"
    try:
        then = datetime.fromisoformat(stamp)
    except ValueError:
        return stamp
    seconds = ((now or datetime.now(UTC)) - then).total_seconds()
    if seconds < 120:
        return f"{max(0, round(seconds))} s ago"
    if seconds < 2 * 3600:
        return f"{round(seconds / 60)} min ago"
    if seconds < 2 * 86400:
        return f"{round(seconds / 3600)} h ago"
    return f"{round(seconds / 86400)} days ago"


def status_lines(status: RunStatus, now: datetime | None = None) -> list[str]:
    """A run's status as text: its line, then a line per task."""
    if status.problem:
        return [f"{status.name}  {'running' if status.running else 'idle'}  cannot be read: {status.problem}  "
                f"{status.folder}"]
    problems = ", ".join(f"{n} {s}" for s, n in sorted(status.statuses.items()) if s != "ok")
    left = status.left_seconds
    pace = "" if not left else f", about {left / 3600:.1f} h of answering left" if left >= 5400 else \
        f", about {round(left / 60)} min of answering left"
    lines = [f"{status.name}  {'running' if status.running else 'idle'}  {status.answers} answers"
             + (f" ({problems})" if problems else "") + f", the last {ago(status.last, now)}{pace}  {status.folder}"]
    width = max((len(t.task) for t in status.tasks), default=0)
    for t in status.tasks:
        of = f" of {t.planned}" if t.planned is not None else ""
        counts = "  ".join(f"{p} {n}" for p, n in t.answers.items())
        lines.append(f"  {t.task:<{width}}  {t.items}{of} items  {counts}".rstrip())
    return lines
