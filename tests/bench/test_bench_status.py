"""``marginalia bench runs``: where each run stands, read from its folder alone."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path

from filelock import FileLock

from marginalia.bench.folder import is_running
from marginalia.bench.status import ago, list_runs, planned_items, run_status, status_lines
from marginalia.cli import main as cli_main

TASKS = [{"dataset": "squad", "name": "squad", "limit": 3, "lengths": [4096], "depths": [0.0, 0.5, 1.0],
          "distractor_fractions": [], "options": {"rotate_depths": True}},
         {"dataset": "cwe", "name": "cwe", "limit": 2, "lengths": [4096, 8192], "depths": [0.5],
          "distractor_fractions": [], "options": {}}]


def make_run(folder: Path) -> None:
    folder.mkdir(parents=True)
    config = {"name": folder.name, "tasks": TASKS, "patterns": [{"kind": "lc", "name": "lc"},
                                                                {"kind": "wim", "name": "wim"}]}
    (folder / "run.json").write_text(json.dumps({"config": config}), encoding="utf-8")
    lines = [("squad", "a", "lc", "ok", "2026-11-27T10:00:00+00:00"),
             ("squad", "a", "wim", "ok", "2026-11-27T10:01:00+00:00"),
             ("squad", "b", "lc", "error", "2026-11-27T10:02:00+00:00")]
    (folder / "results.jsonl").write_text("".join(
        json.dumps({"task": t, "item_id": i, "pattern": p, "status": s, "finished": f}) + "\n"
        for t, i, p, s, f in lines), encoding="utf-8")


def test_a_run_says_items_every_pattern_answered_of_those_planned(tmp_path: Path) -> None:
    make_run(tmp_path / "runs" / "demo")
    status = run_status(tmp_path / "runs" / "demo")
    assert (status.answers, status.statuses, status.running) == (3, {"ok": 2, "error": 1}, False)
    assert status.last == "2026-11-27T10:02:00+00:00"
    squad, cwe = status.tasks
    assert (squad.task, squad.items, squad.planned, squad.answers) == ("squad", 1, 3, {"lc": 2, "wim": 1})
    assert (cwe.items, cwe.planned, cwe.answers) == (0, 4, {"lc": 0, "wim": 0})  # 2 examples x 2 lengths
    now = datetime(2026, 11, 27, 10, 5, tzinfo=UTC)
    assert status_lines(status, now)[0].startswith("demo  idle  3 answers (1 error), the last 3 min ago")
    assert status_lines(status, now)[1:] == ["  squad  1 of 3 items  lc 2  wim 1", "  cwe    0 of 4 items  lc 0  wim 0"]


def test_a_run_holding_its_lock_is_running(tmp_path: Path) -> None:
    make_run(tmp_path / "demo")
    lock = FileLock(tmp_path / "demo" / ".lock", thread_local=False, is_singleton=False)
    with lock:
        assert is_running(tmp_path / "demo")
    assert not is_running(tmp_path / "demo")


def test_planned_items_and_ago() -> None:
    assert planned_items(TASKS[0]) == 3  # one depth each in turn
    assert planned_items({**TASKS[0], "options": {}}) == 9
    assert planned_items({"dataset": "x"}) is None
    now = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
    assert ago("2026-11-27T11:30:00+00:00", now) == "30 min ago"
    assert ago("2026-11-25T12:00:00+00:00", now) == "2 days ago"
    assert ago(None, now) == "never"


def test_bench_runs_lists_every_named_run(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert cli_main(["bench", "runs", "--home", str(tmp_path)], out=out, err=err) == 0
    assert out.getvalue() == "" and "no runs under" in err.getvalue()
    make_run(tmp_path / "bench" / "runs" / "demo")
    assert [s.name for s in list_runs(tmp_path)] == ["demo"]
    out = io.StringIO()
    assert cli_main(["bench", "runs", "--home", str(tmp_path), "--json"], out=out, err=io.StringIO()) == 0
    record = json.loads(out.getvalue())
    assert record["name"] == "demo" and record["tasks"][0]["items"] == 1
    out = io.StringIO()
    assert cli_main(["bench", "runs", "demo", "--home", str(tmp_path)], out=out, err=io.StringIO()) == 0
    assert out.getvalue().startswith("demo  idle  3 answers")


def test_time_left_goes_at_each_task_and_patterns_pace() -> None:
    from marginalia.bench.status import TaskProgress, time_left

    records = [{"task": "squad", "pattern": "lc", "seconds": 10.0},
               {"task": "squad", "pattern": "wim", "seconds": 30.0},
               {"task": "squad", "pattern": "wim", "seconds": 50.0}]
    tasks = [TaskProgress("squad", planned=3, items=1, answers={"lc": 1, "wim": 2}),
             TaskProgress("cwe", planned=2, items=0, answers={"lc": 0, "wim": 0})]
    # squad: 2 lc x 10 s + 1 wim x 40 s; cwe has no pace of its own: the run's, 2 x 10 s + 2 x 40 s
    assert time_left(records, tasks) == 60.0 + 100.0
    assert time_left(records, tasks, jobs=2) == 80.0
    assert time_left([], tasks) is None  # no answer to go by
    assert time_left(records, [TaskProgress("x", planned=None, items=0)]) is None


def test_a_damaged_run_is_listed_with_its_problem_and_the_others_still_are(tmp_path: Path) -> None:
    runs = tmp_path / "bench" / "runs"
    make_run(runs / "damaged")
    make_run(runs / "fine")
    results = runs / "damaged" / "results.jsonl"
    results.write_text("not json\n" + results.read_text(encoding="utf-8"), encoding="utf-8")
    damaged, fine = list_runs(tmp_path)
    assert damaged.problem is not None and "line 1 is not a JSON result" in damaged.problem
    assert fine.problem is None and fine.answers == 3
    assert status_lines(damaged)[0].startswith("damaged  idle  cannot be read: ")
    out, err = io.StringIO(), io.StringIO()
    assert cli_main(["bench", "runs", "--home", str(tmp_path)], out=out, err=err) == 1
    assert "fine  idle  3 answers" in out.getvalue()
    assert "could not read 1 of 2 runs (damaged)" in err.getvalue()
    out = io.StringIO()
    assert cli_main(["bench", "runs", "--home", str(tmp_path), "--json"], out=out, err=io.StringIO()) == 1
    assert [json.loads(line)["problem"] is None for line in out.getvalue().splitlines()] == [False, True]


def test_a_run_waits_out_a_probes_instant_hold_of_the_lock(tmp_path: Path) -> None:
    """``bench runs`` takes a run folder's lock for an instant; a run starting then waits instead of failing."""
    import threading

    from marginalia.bench.folder import locked

    lock = FileLock(tmp_path / ".lock", thread_local=False, is_singleton=False)
    lock.acquire()
    threading.Timer(0.05, lock.release).start()
    with locked(tmp_path):
        assert is_running(tmp_path)  # the run holds it now
    assert not is_running(tmp_path)
