"""``bench run --jobs N``: worker processes that share one run folder, each pair answered once, resumable."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from marginalia.bench import jobs as jobs_module
from marginalia.bench.config import load_config
from marginalia.bench.jobs import core_groups, run_jobs
from marginalia.bench.runner import JobLink
from marginalia.cli import main as cli_main
from marginalia.errors import UserError
from marginalia.files import mend_tail

CONFIG = """\
name = "jobs"
model = "scripted:The words are apple, pear and plum."
embedder = "hashing"
max_new_tokens = 16

[[tasks]]
dataset = "cwe"
lengths = [300]
limit = 5

[[patterns]]
kind = "lc"

[[patterns]]
kind = "wim"
segment_tokens = 100
"""

two_cores = pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                               reason="needs two usable cores (Linux)")


def _keys(folder: Path) -> list[tuple[str, str, str]]:
    lines = (folder / "results.jsonl").read_text(encoding="utf-8").splitlines()
    return [(r["task"], r["item_id"], r["pattern"]) for r in map(json.loads, lines)]


@two_cores
def test_two_jobs_answer_every_pair_once_and_resume(tmp_path: Path) -> None:
    config_path = tmp_path / "jobs.toml"
    config_path.write_text(CONFIG, encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    code = cli_main(["bench", "run", str(config_path), "--out", str(tmp_path / "run"), "--jobs", "2",
                     "--no-report"], out=out, err=err)
    assert code == 0, err.getvalue()
    keys = _keys(tmp_path / "run")
    assert len(keys) == 10 and len(set(keys)) == 10  # 5 items x 2 patterns, none twice
    assert "wrote 10 results (10 ok)" in err.getvalue()
    assert err.getvalue().count("loading scripted") == 1  # both workers load it; the parent says it once
    info = json.loads((tmp_path / "run" / "run.json").read_text(encoding="utf-8"))
    assert len(info["invocations"]) == 1  # one worker records the invocation for both
    assert info["invocations"][0]["jobs"] == 2
    assert info["invocations"][0]["machine"]["jobs"] == 2 and info["invocations"][0]["machine"]["usable_cores"] == 1

    summary = run_jobs(load_config(config_path), 2, out=tmp_path / "run", err=io.StringIO())
    assert (summary.planned, summary.resumed, summary.written) == (10, 10, 0)
    assert len(_keys(tmp_path / "run")) == 10


@two_cores
def test_a_failing_worker_is_said_as_its_own_error(tmp_path: Path) -> None:
    config_path = tmp_path / "jobs.toml"
    config_path.write_text(CONFIG.replace('model = "scripted:', 'model = "gguf:/no/such/model.gguf" #'),
                           encoding="utf-8")
    with pytest.raises(UserError, match="model.gguf"):
        run_jobs(load_config(config_path), 2, out=tmp_path / "run", err=io.StringIO())


def test_more_jobs_than_cores_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_path = tmp_path / "jobs.toml"
    config_path.write_text(CONFIG, encoding="utf-8")
    monkeypatch.setattr(jobs_module, "available_cores", lambda: [0])
    with pytest.raises(UserError, match=r"may use 1 core and each job needs one; give --jobs 1"):
        run_jobs(load_config(config_path), 2, out=tmp_path / "run", err=io.StringIO())
    assert not (tmp_path / "run").exists()  # said before anything is written


def test_a_worker_that_died_silently_is_said_by_how_it_ended() -> None:
    assert jobs_module._ended(-9) == "its process was killed by SIGKILL (out of memory?)"
    assert jobs_module._ended(-15) == "its process was killed by SIGTERM"
    assert jobs_module._ended(3) == "its process ended with exit code 3"


def test_core_groups_are_neighbours_as_even_as_they_go() -> None:
    assert core_groups([0, 1], 2) == [[0], [1]]
    assert core_groups([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert core_groups([4, 5, 6, 7], 1) == [[4, 5, 6, 7]]


def test_workers_sharing_a_counter_take_each_item_once(tmp_path: Path) -> None:
    counter = [0]

    def take() -> int:
        counter[0] += 1
        return counter[0] - 1

    links = [JobLink(index=k, count=2, take=take, send=lambda event: None, lock_file=tmp_path / ".lock")
             for k in range(2)]
    first, second = links[0].positions(7), links[1].positions(7)
    taken: dict[int, list[int]] = {0: [], 1: []}
    for k, positions in [(0, first), (1, second), (1, second), (0, first), (1, second), (0, first), (0, first),
                         (1, second)]:
        taken[k].extend(p for p in [next(positions, None)] if p is not None)
    assert sorted(taken[0] + taken[1]) == list(range(7))  # every item once, none past the end
    assert not set(taken[0]) & set(taken[1])


def test_mend_tail_cuts_a_line_a_killed_writer_left(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": ')
    assert mend_tail(path) == len(b'{"c": ')
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    assert mend_tail(path) == 0  # a whole last line stays
    path.write_bytes(b'{"c": ')
    assert mend_tail(path) == 6 and path.read_bytes() == b""
    assert mend_tail(tmp_path / "missing.jsonl") == 0


def test_a_worker_appending_mends_the_file_first(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    results.write_bytes(b'{"a": 1}\n{"half')
    link = JobLink(index=0, count=2, take=lambda: 0, send=lambda event: None, lock_file=tmp_path / ".lock")
    with link.appending(results), results.open("a", encoding="utf-8") as f:
        f.write('{"b": 2}\n')
    assert results.read_text(encoding="utf-8").splitlines() == ['{"a": 1}', '{"b": 2}']


def test_workers_take_the_longest_contexts_first_in_the_runs_order_among_equals() -> None:
    from marginalia.bench.items import Item
    from marginalia.bench.runner import job_order

    def item(name: str, tokens: int) -> tuple[str, Item]:
        return ("t", Item(id=name, task="t", example_id=name, question="q", answers=("a",), context="c",
                          context_tokens=tokens))

    items = [item("a", 4000), item("b", 8000), item("c", 4000), item("d", 16000), item("e", 8000)]
    assert [items[i][1].id for i in job_order(items)] == ["d", "b", "e", "a", "c"]


# A run long enough to be stopped midway: the workers are answering when the signal comes.
LONG_CONFIG = CONFIG.replace("limit = 5", "limit = 3000")


def _start_long_run(tmp_path: Path) -> tuple[subprocess.Popen[bytes], list[psutil.Process]]:
    """`bench run --jobs 2` in a child process, once both workers have written an answer; with its workers."""
    config_path = tmp_path / "jobs.toml"
    config_path.write_text(LONG_CONFIG, encoding="utf-8")
    results = tmp_path / "run" / "results.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "marginalia.cli", "bench", "run", str(config_path), "--out",
                             str(tmp_path / "run"), "--jobs", "2", "--no-report", "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        lines = results.read_text(encoding="utf-8").count("\n") if results.exists() else 0
        workers = [p for p in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(p.cmdline())]
        if lines >= 2 and len(workers) == 2:
            return proc, workers
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"the run ended or never answered: {proc.stderr.read().decode() if proc.stderr else ''}")


def _gone(processes: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    """The processes still running after waiting up to ``seconds`` for them (an ended one that nobody has
    reaped yet, a zombie, has ended)."""
    deadline = time.monotonic() + seconds
    while True:
        alive = []
        for p in processes:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


@two_cores
def test_sigterm_to_the_parent_stops_its_workers_and_keeps_their_answers(tmp_path: Path) -> None:
    proc, workers = _start_long_run(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=90)
    alive = _gone(workers, 5)
    for p in alive:
        p.kill()
    assert not alive, "a worker outlived its parent"
    assert proc.returncode == 130, stderr.decode()
    assert "interrupted; every finished answer is saved" in stderr.decode()
    keys = _keys(tmp_path / "run")  # every line reads back whole, none twice
    assert 2 <= len(keys) < 6000 and len(set(keys)) == len(keys)


@two_cores
def test_workers_stop_themselves_when_their_parent_is_killed(tmp_path: Path) -> None:
    proc, workers = _start_long_run(tmp_path)
    proc.kill()  # SIGKILL: the parent cannot stop them itself
    proc.wait(timeout=10)
    alive = _gone(workers, 30)
    for p in alive:
        p.kill()
    assert not alive, "a worker went on answering after its parent was killed"
    lines = (tmp_path / "run" / "results.jsonl").read_text(encoding="utf-8").splitlines()
    assert 2 <= len(lines) < 6000


def test_a_run_served_over_http_may_have_more_jobs_than_cores(tmp_path: Path) -> None:
    served = CONFIG.replace('model = "scripted:The words are apple, pear and plum."',
                            'model = "openai:http://127.0.0.1:9/v1#smollm2"')
    config_path = tmp_path / "jobs.toml"
    config_path.write_text(served, encoding="utf-8")
    assert jobs_module.worker_cores(load_config(config_path), [0, 1], 5) == [[0, 1]] * 5
    config_path.write_text(served + '\n[judge]\nmodel = "scripted:yes"\n', encoding="utf-8")
    with pytest.raises(UserError, match="serve the model over HTTP"):  # the judge runs in the workers
        jobs_module.worker_cores(load_config(config_path), [0, 1], 5)
