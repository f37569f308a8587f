"""A benchmark run's folder: where it lives, its files (``run.json``, ``results.jsonl``,
``disagreements.jsonl``), the lock that keeps two processes from writing to it, and whether a config may
resume it (the same run, or the same run grown by patterns or by raised limits)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from pydantic import ValidationError

from ..errors import UserError
from ..files import atomic_write_lines
from ..home import resolve_home
from .config import RunConfig

RESULTS = "results.jsonl"
RUN_INFO = "run.json"
DISAGREEMENTS = "disagreements.jsonl"
Key = tuple[str, str, str]  # (task, item id, pattern)


def runs_dir(home: str | Path | None = None) -> Path:
    """Where named runs live: ``<home>/bench/runs``."""
    return resolve_home(home) / "bench" / "runs"


def run_folder(config: RunConfig, home: str | Path | None = None, out: str | Path | None = None) -> Path:
    """The run's folder: ``out`` when given, else ``<home>/bench/runs/<config name>``."""
    if out is not None:
        return Path(out).expanduser().resolve()
    if config.name is None:
        raise UserError("the run config has no name; load it with load_config, which names it after its file")
    return runs_dir(home) / config.name


def read_results(path: Path, repair: bool = False, log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The records of a results file, in order.

    A last line cut short by a kill (no newline, or not JSON) is ignored, and with ``repair`` cut off the
    file. A damaged line before the last is an error: the file was edited or the disk failed.
    """
    if not path.is_file():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    records: list[dict[str, Any]] = []
    good_end = 0
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError:
            if number == len(lines) and not tail:
                break  # a damaged last line: treat like a truncated one
            raise UserError(f"{path}, line {number} is not a JSON result; fix or delete that line "
                            "(every line must be one JSON object)") from None
        records.append(record)
        good_end += len(line) + 1
    if good_end < len(data):
        if log:
            log(f"ignoring a truncated last line in {path} ({len(data) - good_end} bytes, from an interrupted run)")
        if repair:
            with path.open("r+b") as f:
                f.truncate(good_end)
    return records


def read_run_info(folder: Path) -> dict[str, Any]:
    """A run folder's ``run.json`` for reading it back ({} when it is missing or damaged; `check_compatible`
    says a damaged one out loud before a run writes to it)."""
    if not (folder / RUN_INFO).is_file():
        return {}
    try:
        info: dict[str, Any] = json.loads((folder / RUN_INFO).read_text("utf-8"))
    except ValueError:
        return {}
    return info


def result_key(record: Mapping[str, Any]) -> Key:
    return (str(record["task"]), str(record["item_id"]), str(record["pattern"]))


LOCK = ".lock"  # a run folder's lock file
LOCK_WAIT_SECONDS = 1.0  # long beside a probe's hold of the lock, short beside a run's


def _folder_lock(folder: Path, timeout: float) -> FileLock:
    return FileLock(folder / LOCK, timeout=timeout, thread_local=False, is_singleton=False)


def is_running(folder: Path) -> bool:
    """Whether another process holds the run folder's lock (a run or a judge writing to it)."""
    if not (folder / LOCK).exists():
        return False
    lock = _folder_lock(folder, 0)
    try:
        lock.acquire()
    except Timeout:
        return True
    lock.release()
    return False


@contextmanager
def locked(folder: Path, advice: str = "wait for it to finish or give --out DIR for a separate folder"
            ) -> Iterator[None]:
    """Hold the run folder's lock, so two processes never append to one results file. It waits a moment for the
    lock: ``bench runs`` takes it for an instant to see whether a run holds it."""
    lock = _folder_lock(folder, LOCK_WAIT_SECONDS)
    try:
        lock.acquire()
    except Timeout:
        raise UserError(f"another benchmark run is writing to {folder}; {advice}") from None
    try:
        yield
    finally:
        lock.release()


JUDGE_ADVICE = "judge its answers once it has finished or been stopped (Ctrl-C; it resumes later)"


def check_unlocked(folder: Path) -> None:
    """Raise the same `UserError` as a locked folder would, before anything slow (loading a model) is done."""
    with locked(folder, JUDGE_ADVICE):
        pass


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new)):
            out += _differences(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        out = []
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            out += _differences(a, b, f"{prefix}[{i}]")
        return out
    return [] if old == new else [prefix or "(everything)"]


def _pattern_label(p: dict[str, Any]) -> str:
    return str(p.get("name") or p.get("kind"))


def added_patterns(stored: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    """The names of the patterns ``new`` adds to ``stored`` when it keeps every stored one unchanged (else
    none: a changed or removed pattern is a different config)."""
    by_name = {_pattern_label(p): p for p in new}
    if len(new) <= len(stored) or any(by_name.get(_pattern_label(p)) != p for p in stored):
        return []
    kept = {_pattern_label(p) for p in stored}
    return [name for name in by_name if name not in kept]


def raised_limits(stored: list[dict[str, Any]], new: list[dict[str, Any]]) -> dict[str, list[int]]:
    """``{task: [old limit, new limit]}`` for the tasks whose limit ``new`` raises while keeping everything
    else of every task unchanged (else {}: any other change is a different config)."""
    if len(stored) != len(new):
        return {}
    raised: dict[str, list[int]] = {}
    for old, task in zip(stored, new, strict=True):
        if {**old, "limit": None} != {**task, "limit": None}:
            return {}
        if task.get("limit", 0) > old.get("limit", 0):
            raised[str(task.get("name") or task.get("dataset"))] = [old["limit"], task["limit"]]
        elif task.get("limit") != old.get("limit"):
            return {}
    return raised


#: pattern options that are no longer choices, each with the one behaviour left: a stored pattern that chose
#: it read as a pattern reads now, so it is read without them
SETTLED_OPTIONS: dict[str, Any] = {
    "answer_style": "sentence", "answer_decoding": "free", "split": "paragraphs", "margin_style": "sentence",
    "instructions": "intro", "tally_lists": True, "tally_only": True, "margin_decoding": "lists",
    "kept_as": "written",
}


def stored_config(stored: Mapping[str, Any]) -> RunConfig:
    """The config a run stored in its run.json (``info["config"]``), validated again; its patterns' settled
    options (`SETTLED_OPTIONS`) are left out where they hold the behaviour left.

    Raises:
        ValidationError: it no longer validates (an option since renamed or removed, or a settled option that
            chose a behaviour no longer offered).
    """
    data = {k: v for k, v in stored.items() if k != "schema"}
    if isinstance(data.get("patterns"), list):
        data["patterns"] = [{k: v for k, v in p.items() if k not in SETTLED_OPTIONS or SETTLED_OPTIONS[k] != v}
                            if isinstance(p, dict) else p for p in data["patterns"]]
    return RunConfig.model_validate(data)


def check_compatible(folder: Path, config: RunConfig) -> dict[str, Any] | None:
    """The folder's stored run info, after checking it was made by the same resolved config.

    A config that adds patterns and keeps the stored ones unchanged is the same run grown: the info then
    names them under ``added_patterns`` (`_record_invocation` stores the new config). So is one that raises
    tasks' limits and changes nothing else (``raised_limits``; `check_items_kept` then checks that the items
    already answered are still among the items built).

    Raises:
        UserError: the folder holds a run of a different config (the message lists what differs).
    """
    info_path = folder / RUN_INFO
    if not info_path.is_file():
        return None
    try:
        info = json.loads(info_path.read_text("utf-8"))
    except ValueError:
        raise UserError(f"{info_path} is damaged; delete the folder {folder} to start over") from None
    stored = dict(info.get("config") or {})
    try:  # options added since the run began take their defaults, which change nothing it did
        stored = json.loads(json.dumps(stored_config(stored).resolved()))
    except ValidationError:
        pass  # compared as stored: the differences are then listed
    new = json.loads(json.dumps(config.resolved()))
    # the judge does not change the answers: another judge may take over (`rejudge` judges them all again)
    stored.pop("judge", None)
    new.pop("judge", None)
    added = added_patterns(stored.get("patterns") or [], new.get("patterns") or [])
    if added:  # patterns added to the config answer the same items; the stored ones are unchanged
        stored["patterns"] = new["patterns"]
        info["added_patterns"] = added
    raised = raised_limits(stored.get("tasks") or [], new.get("tasks") or [])
    if raised:  # more examples of the same tasks: the answered items must still be built (check_items_kept)
        stored["tasks"] = new["tasks"]
        info["raised_limits"] = raised
    if stored != new:
        diffs = _differences(stored, new)
        shown = ", ".join(diffs[:6]) + (f" and {len(diffs) - 6} more" if len(diffs) > 6 else "")
        raise UserError(
            f"{folder} holds results of a different config (differs in: {shown}); to keep both, run with "
            f"--out DIR or change name = \"...\" in the config; to start over, delete {folder}")
    return dict(info)


def drop_errors(results_path: Path, records: list[dict[str, Any]], say: Callable[[str], None]
                ) -> list[dict[str, Any]]:
    """``--retry-errors``: rewrite the results without the answers that ended in an error."""
    kept = [r for r in records if r.get("status") != "error"]
    if len(kept) < len(records):
        say(f"retrying {len(records) - len(kept)} errored results")
        atomic_write_lines(results_path, kept)
    return kept


def timestamp() -> str:
    return datetime.now(UTC).astimezone().isoformat(timespec="seconds")
