"""The benchmark runner: every pattern on the same items, one result line each, resumable after a crash.

Each (task, item, pattern) answered becomes one line of the run folder's ``results.jsonl``, appended and
fsynced as it finishes (`bench.folder` keeps the folder: its files, its lock, and whether a config may
resume it). Running the same config again resumes: finished pairs are skipped, a truncated last line from a
kill is repaired.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from filelock import FileLock

from ..app import (
    CachedEmbedder,
    Embedder,
    Generator,
    LongContext,
    Pattern,
    SharedReading,
    Tokenizer,
    WiM,
    answer_signals,
)
from ..errors import ContextOverflow, MarginaliaError, UserError
from ..files import append_line, atomic_write_json, mend_tail
from ..options import RunSettings
from ..records import Answer, Margin, Stats
from .config import PatternConfig, RunConfig, VotingConfig, pattern_record
from .folder import (
    DISAGREEMENTS,
    RESULTS,
    RUN_INFO,
    check_compatible,
    drop_errors,
    locked,
    read_results,
    result_key,
    run_folder,
    timestamp,
)
from .items import Item, TaskSpec
from .judge import Judge, disagreement_line, judges, make_model_judge, medoid
from .progress import Progress
from .provenance import git_commit, machine_info

RESULT_SCHEMA = 2  # 2: "margins" holds each margin (1: their count)

BuildItems = Callable[[TaskSpec, Tokenizer], list[Item]]
ScoreItem = Callable[[Item, str], dict[str, float]]


# -- environment ---------------------------------------------------------------------------------------


def model_ids(config: RunConfig, generator: Generator, embedder: Embedder | None,
              judge: Judge | None) -> dict[str, Any]:
    device = getattr(generator, "device", None)
    ids: dict[str, Any] = {
        "generator": {"spec": config.model, "name": generator.name, "engine": type(generator).__name__,
                      "backend": config.backend, "device": str(device) if device is not None else config.device,
                      "context_window": generator.context_window},
        "embedder": getattr(embedder, "name", None),
        "judge": None,
    }
    if judge is not None and config.judge is not None:
        ids["judge"] = {"spec": config.judge.model, "name": judge.generator.name,
                        "engine": type(judge.generator).__name__}
    return ids


# -- running -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    """What one invocation of `run_benchmark` did."""

    folder: Path
    planned: int  # (item, pattern) pairs in the run
    resumed: int  # of those, already in results.jsonl
    written: int  # result lines this invocation wrote
    statuses: dict[str, int] = field(default_factory=dict)  # ok / overflow / error among those written
    disagreements: int = 0
    seconds: float = 0.0


@dataclass
class JobLink:
    """What one worker of ``bench run --jobs N`` shares with the others (`bench.jobs` makes it): the parent
    holds the run folder's lock; the workers take items in turn from one counter, so each item is answered by
    one worker, and append their lines under one lock."""

    index: int  # this worker, 0..count-1
    count: int
    take: Callable[[], int]  # the next item's position in the run's list of items (shared by the workers)
    send: Callable[[tuple[Any, ...]], None]  # progress and logs for the parent
    lock_file: Path  # locked while a worker appends (an OS file lock: a killed worker's lock goes with it)

    def positions(self, n: int) -> Iterator[int]:
        """The positions of the items this worker answers, until the run's ``n`` items are taken."""
        while (i := self.take()) < n:
            yield i

    @contextmanager
    def appending(self, *paths: Path) -> Iterator[None]:
        """Hold the append lock, first cutting off a line that a killed worker left unfinished."""
        with FileLock(self.lock_file, thread_local=False, is_singleton=False):
            for path in paths:
                mend_tail(path)
            yield


class _JobProgress:
    """`Progress`'s calls, sent to the parent of ``--jobs``, which shows one bar for every worker."""

    def __init__(self, link: JobLink) -> None:
        self.link = link

    def log(self, message: str) -> None:
        self.link.send(("log", self.link.index, message))

    def step(self, label: str) -> None:
        self.link.send(("step", self.link.index, label))

    def close(self) -> None:
        pass


def build_pattern(cfg: PatternConfig, generator: Generator, embedder: Callable[[], Embedder]) -> Pattern:
    """A pattern from its config table (the embedder is fetched only for a pattern that needs one)."""
    from .. import app

    return app.pattern(pattern_record(cfg), generator, embedder() if app.needs_embedder(cfg.kind) else None)


def share_readings(built: list[tuple[str, PatternConfig, Pattern]],
                   wims: Mapping[str, Pattern]) -> list[tuple[str, PatternConfig, Pattern]]:
    """The patterns, those on a shared reading (`patterns.wim.SharedReading`) answering through it, and the lc
    ones moved after the wim pattern whose reading they answer from (so, per item, the reading exists when
    they run). ``wims``: the wim patterns named as a reading, by name (built even when not run themselves)."""
    if not wims:
        return built
    shared: dict[str, SharedReading] = {}
    for label, wim in wims.items():
        if not isinstance(wim, WiM):
            raise UserError(f"pattern {label!r} is named as a reading, but it is no wim pattern")
        shared[label] = SharedReading(wim)
    out: list[tuple[str, PatternConfig, Pattern]] = []
    for label, p, pattern in built:
        reading = getattr(p, "reading", None)
        if label in shared:
            pattern = shared[label].answering()
        elif reading is not None:
            if not isinstance(pattern, LongContext):
                raise UserError(f"pattern {label!r} answers from a reading, but it is no lc pattern")
            pattern = shared[reading].answering(pattern)
        out.append((label, p, pattern))
    return sorted(out, key=lambda entry: getattr(entry[1], "reading", None) is not None)


def _sum_stats(stats: Sequence[Stats]) -> Stats:
    """Counts and times added up over sampled runs (first-token times from the first run); a count that one
    run does not know (None: the server did not say) is not known for the sum."""
    first = asdict(stats[0])

    def total_of(key: str) -> Any:
        values = [getattr(s, key) for s in stats]
        return None if any(v is None for v in values) else sum(values)

    total = {k: (total_of(k) if k not in ("time_to_first_margin", "time_to_first_answer_token") else v)
             for k, v in first.items()}
    total = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in total.items()}
    return Stats(**total)


def answer_item(pattern: Pattern, item: Item, voting: VotingConfig | None = None,
                seed: int = 0) -> tuple[Answer, list[dict[str, Any]] | None]:
    """Run a pattern on an item; with voting, sample ``voting.samples`` answers and keep the medoid.

    With voting the answer's stats are the sums over all samples (what the item really cost), and the
    samples come back as ``[{"seed", "text", "mean_f1"}]``.
    """
    if voting is None:
        return pattern.answer(item.context, item.question, source=item.id), None
    answers = [pattern.answer(item.context, item.question, source=item.id,
                              settings=RunSettings(temperature=voting.temperature, seed=seed + i))
               for i in range(voting.samples)]
    best, means = medoid([a.text for a in answers])
    samples = [{"seed": seed + i, "text": a.text, "mean_f1": round(m, 4)}
               for i, (a, m) in enumerate(zip(answers, means, strict=True))]
    return replace(answers[best], stats=_sum_stats([a.stats for a in answers])), samples


def margin_fields(margin: Margin) -> dict[str, Any]:
    """One margin as results.jsonl keeps it: enough to read a wrong answer back, and to score the judge."""
    return {"segment": margin.segment_index, "text": margin.text, "kept": margin.relevant,
            "reason": margin.reason, "score": margin.score,
            "evidence": list(margin.evidence) if margin.evidence else None, "read_to": margin.read_to}


def _item_fields(task: str, item: Item, pattern: PatternConfig) -> dict[str, Any]:
    return {
        "schema": RESULT_SCHEMA, "task": task, "item_id": item.id, "example_id": item.example_id,
        "pattern": pattern.name, "kind": pattern.kind,
        "target_tokens": item.target_tokens, "context_tokens": item.context_tokens,
        "depth": item.depth, "distractor_fraction": item.distractor_fraction, "scoring": item.scoring,
        "question": item.question, "answers": list(item.answers),
        "gold_spans": [list(span) for span in item.gold_spans],  # where the gold passages sit in the context
        # the kind of question of a pair generated from one's own documents: the report recommends per kind
        **({"question_kind": kind} if (kind := item.meta.get("example", {}).get("kind")) else {}),
    }


def _default_build() -> BuildItems:
    from .tasks import build_items

    return build_items


def _default_score() -> ScoreItem:
    from .metrics import score_item

    return score_item


def _make_judge(config: RunConfig, generator: Generator, judge_generator: Generator | None,
                home: str | Path | None, say: Callable[[str], None]) -> Judge | None:
    """The model judge of ``[judge]``; the run's own generator serves when the judge names the same model."""
    if config.judge is None:
        return None
    jgen = judge_generator
    if jgen is None:
        if (config.judge.model, config.judge.backend, config.judge.device) == \
                (config.model, config.backend, config.device):
            jgen = generator
        else:
            from ..app import load_model

            say(f"loading judge {config.judge.model}")
            jgen = load_model(config.judge.model, home=home, device=config.judge.device, backend=config.judge.backend,
                              log=say)
    return make_model_judge(jgen, config.judge, seed=config.seed)


def _build_tasks(config: RunConfig, build: BuildItems, tokenizer: Tokenizer, limit: int | None,
                 say: Callable[[str], None], only: Sequence[str] | None = None) -> list[tuple[str, list[Item]]]:
    """Every task's items (or those of the tasks named in ``only``, in that order), built once with the
    model's tokenizer (the same items for every pattern)."""
    tasks: list[tuple[str, list[Item]]] = []
    by_name = dict(zip(config.task_names(), config.tasks, strict=True))
    for task in [by_name[name] for name in only] if only else config.tasks:
        spec = task.spec(limit)
        items = build(spec, tokenizer)
        ids = [item.id for item in items]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise MarginaliaError(f"task {spec.name!r} built two items with the id {dup!r}; "
                                  "item ids must be unique within a task")
        if not items:
            say(f"task {spec.name!r} built no items")
        examples = len({item.example_id for item in items})
        if 0 < examples < spec.limit:
            say(f"task {spec.name!r}: limit {spec.limit}, but its data gives {examples} examples; all of them "
                "are used")
        tasks.append((spec.name, items))
    return tasks


def check_items_kept(records: Sequence[Mapping[str, Any]], built: Sequence[tuple[str, list[Item]]],
                     raised: Mapping[str, Sequence[int]]) -> None:
    """After a task's limit was raised: every answered item of that task must be among its items as built now.

    Raises:
        UserError: the task's first items changed with its limit (a dataset that spreads its picks, such as
            SQuAD, picks others).
    """
    ids = {task: {item.id for item in items} for task, items in built}
    for task, (old, new) in raised.items():
        if task not in ids:
            continue
        lost = sorted({r["item_id"] for r in records if r.get("task") == task} - ids[task])
        if lost:
            raise UserError(
                f"raising task {task!r}'s limit from {old} to {new} changes the items it already answered "
                f"({len(lost)} of them, e.g. {lost[0]!r}, are no longer built: its dataset spreads its picks); "
                f"keep the limit at {old}, or give the config another name (or --out DIR) for a new run")


def _record_invocation(folder: Path, info: dict[str, Any] | None, config: RunConfig, limit: int | None,
                       patterns: Sequence[str] | None, models: dict[str, Any], say: Callable[[str], None],
                       tasks: Sequence[str] | None = None, jobs: int = 1) -> None:
    """Write run.json: on the first run everything; later runs add an entry to its ``invocations``."""
    now = timestamp()
    commit = git_commit()
    machine = machine_info(jobs)
    invocation = {"started": now, "commit": commit, "models": models, "machine": machine, "limit": limit,
                  "patterns": list(patterns or []),
                  "tasks": list(tasks or []), "argv": sys.argv[1:], **({"jobs": jobs} if jobs > 1 else {})}
    if info is None:
        info = {"schema": RESULT_SCHEMA, "config": config.resolved(), "commit": commit, "models": models,
                "machine": machine, "started": now, "invocations": [invocation]}
    else:
        first = info.get("commit")
        old = first.get("commit") if isinstance(first, dict) else None
        if commit and old and commit.get("commit") != old:
            say(f"note: this run was started at commit {old[:12]}; resuming at {commit['commit'][:12]}")
        added = info.pop("added_patterns", None)
        if added:
            say(f"patterns added to the run: {', '.join(added)} (they answer the same items)")
            invocation["added_patterns"] = added
        raised = info.pop("raised_limits", None)
        if raised:
            say("limits raised: " + ", ".join(f"{task} {a} -> {b}" for task, (a, b) in raised.items())
                + " (the items answered so far are kept)")
            invocation["raised_limits"] = raised
        if added or raised:  # the run grew: the grown config is stored
            judge = (info.get("config") or {}).get("judge")  # the stored verdicts are still that judge's
            info["config"] = {**config.resolved(), "judge": judge}
        info.setdefault("invocations", []).append(invocation)
    atomic_write_json(folder / RUN_INFO, info)


def run_benchmark(
    config: RunConfig,
    *,
    home: str | Path | None = None,
    out: str | Path | None = None,
    limit: int | None = None,
    patterns: Sequence[str] | None = None,
    tasks: Sequence[str] | None = None,
    retry_errors: bool = False,
    generator: Generator | None = None,
    embedder: Embedder | None = None,
    judge_generator: Generator | None = None,
    build_items: BuildItems | None = None,
    score_item: ScoreItem | None = None,
    err: TextIO | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    job: JobLink | None = None,
) -> RunSummary:
    """Run (or resume) a benchmark: every selected pattern on every task's items.

    Args:
        config: a loaded config (`load_config`).
        home: marginalia's home (models cache, default run folders).
        out: the run folder; default ``<home>/bench/runs/<config name>``.
        limit: cap examples per task below the config's ``limit`` (a selection: not part of the config).
        patterns: run only these pattern names (a selection: not part of the config).
        tasks: run only these task names, in the order given (a selection: not part of the config).
        retry_errors: run again the pairs whose stored result is an error (their old lines are dropped).
        generator, embedder, judge_generator: already-loaded models to use instead of loading the config's.
        build_items, score_item: the data side's functions (default: `bench.tasks.build_items`,
            `bench.metrics.score_item`).
        err: where progress and logs go (default stderr).
        progress: show progress on ``err``.
        log: where load messages go (default: ``err`` when ``progress``).
        job: set in a worker of `bench.jobs.run_jobs` (``--jobs``): the run folder is its parent's to lock.

    Raises:
        UserError: the folder holds a different config, another run holds it, or an unknown pattern or task
            name.
        KeyboardInterrupt: passed on after every finished result is on disk.
    """
    stream = err or sys.stderr
    say = sayer(log, progress, stream)
    t_start = time.perf_counter()
    build = build_items or _default_build()
    from . import tasks as tasks_module

    selected, folder, info = prepare(config, home, out, patterns, tasks,
                                     check_specs=build is tasks_module.build_items)
    with locked(folder) if job is None else nullcontext():
        results_path = folder / RESULTS
        records = read_results(results_path, repair=job is None, log=say)
        if retry_errors:
            records = drop_errors(results_path, records, say)
        done = {result_key(r) for r in records}

        if generator is None:
            from ..app import load_model

            say(f"loading {config.model}")
            generator = load_model(config.model, home=home, device=config.device, backend=config.backend,
                                       log=say)
        cached: list[Embedder] = []

        def get_embedder() -> Embedder:
            if not cached:
                inner = embedder
                if inner is None:
                    from ..app import load_embedder

                    say(f"loading embedder {config.embedder}")
                    inner = load_embedder(config.embedder)
                cached.append(inner if isinstance(inner, CachedEmbedder) else CachedEmbedder(inner))
            return cached[0]

        built = [(p.name or p.kind, p, build_pattern(p, generator, get_embedder)) for p in selected]
        needed = {getattr(p, "reading", None) for p in selected} - {None}
        wims = {label: pattern for label, _, pattern in built if label in needed}
        wims.update({p.name or p.kind: build_pattern(p, generator, get_embedder) for p in config.patterns
                     if (p.name or p.kind) in needed - set(wims)})
        built = share_readings(built, wims)
        judge = _make_judge(config, generator, judge_generator, home, say)
        score = score_item or _default_score()
        built_tasks = _build_tasks(config, build, generator.tokenizer, limit, say,
                                   only=tasks)
        if info and info.get("raised_limits"):  # every raised task, whole, whichever this invocation runs
            raised = info["raised_limits"]
            whole = dict(built_tasks) if limit is None else {}  # built whole already: not built again
            missing = [task for task in raised if task not in whole]
            if missing:
                whole.update(_build_tasks(config, build, generator.tokenizer, None, say,
                                          only=missing))
            check_items_kept(records, list(whole.items()), raised)

        if job is None or job.index == 0:  # one worker of --jobs speaks for them all
            _record_invocation(folder, info, config, limit, patterns,
                               model_ids(config, generator, cached[0] if cached else None, judge), say, tasks,
                               jobs=1 if job is None else job.count)

        items = [(task, item) for task, task_items in built_tasks for item in task_items]
        planned = len(items) * len(built)
        resumed = sum((task, item.id, label) in done for task, item in items for label, _, _ in built)
        bar: Progress | _JobProgress
        if job is None:
            bar = Progress(planned, resumed, stream, progress)
        else:
            bar = _JobProgress(job)
            job.send(("plan", job.index, planned, resumed, items_fingerprint(items)))
        bar.log(f"run folder {folder}: {planned} answers "
                f"({len(items)} items x {len(built)} patterns), {resumed} done before")
        statuses: dict[str, int] = {}
        n_disagree = 0
        written = 0
        try:
            with results_path.open("a", encoding="utf-8") as results, \
                    (folder / DISAGREEMENTS).open("a", encoding="utf-8") as disagreements:
                order = range(len(items)) if job is None else job_order(items)
                for position in order if job is None else (order[k] for k in job.positions(len(items))):
                    task, item = items[position]
                    for label, p, pattern in built:
                        key = (task, item.id, label)
                        if key in done:
                            continue
                        record = _run_one(task, item, p, pattern, config, score, judge)
                        line = disagreement_line(record)
                        with nullcontext() if job is None else job.appending(results_path, folder / DISAGREEMENTS):
                            append_line(results, record)
                            if line is not None:
                                append_line(disagreements, line)
                        done.add(key)
                        written += 1
                        statuses[record["status"]] = statuses.get(record["status"], 0) + 1
                        n_disagree += line is not None
                        if record["status"] != "ok":
                            bar.log(f"{task} {item.id} {label}: {record['status']}: {record.get('error', '')}")
                        bar.step(f"{task}/{label} {record['status']}")
        finally:
            bar.close()
    return RunSummary(folder=folder, planned=planned, resumed=resumed, written=written, statuses=statuses,
                      disagreements=n_disagree, seconds=round(time.perf_counter() - t_start, 3))


def sayer(log: Callable[[str], None] | None, progress: bool, stream: TextIO) -> Callable[[str], None]:
    """Where a run's messages go: ``log`` when given, else ``stream`` when ``progress``, else nowhere."""
    def say(message: str) -> None:
        if log is not None:
            log(message)
        elif progress:
            print(message, file=stream, flush=True)

    return say


def prepare(config: RunConfig, home: str | Path | None, out: str | Path | None, patterns: Sequence[str] | None,
            tasks: Sequence[str] | None, check_specs: bool = True
            ) -> tuple[list[PatternConfig], Path, dict[str, Any] | None]:
    """What a run checks before anything slow (loading a model): the selected patterns, its folder (made) and
    its stored run info (`check_compatible`).

    Raises:
        UserError: an unknown pattern, task or dataset (``check_specs``: our own datasets), or a folder that
            holds a different config.
    """
    selected = check_selection(config, patterns, tasks)
    if check_specs:
        from .tasks import check_spec

        for table in config.tasks:
            check_spec(table.spec())
    folder = run_folder(config, home, out)
    info = check_compatible(folder, config)
    folder.mkdir(parents=True, exist_ok=True)
    return selected, folder, info


def check_selection(config: RunConfig, patterns: Sequence[str] | None, tasks: Sequence[str] | None
                    ) -> list[PatternConfig]:
    """The patterns selected by name (all when none are named), after checking every named task exists.

    Raises:
        UserError: a pattern or task name the config does not have.
    """
    names = config.pattern_names()
    if patterns:
        unknown = [p for p in patterns if p not in names]
        if unknown:
            raise UserError(f"no pattern called {', '.join(map(repr, unknown))} in the config; "
                            f"its patterns are: {', '.join(names)}")
    if tasks:
        unknown = [t for t in tasks if t not in config.task_names()]
        if unknown:
            raise UserError(f"no task called {', '.join(map(repr, unknown))} in the config; "
                            f"its tasks are: {', '.join(config.task_names())}")
    return [p for p in config.patterns if not patterns or p.name in patterns]


def job_order(items: Sequence[tuple[str, Item]]) -> list[int]:
    """The order in which the workers of ``--jobs`` take the items: the longest contexts first (in the run's
    order among equals), so that no worker is left reading a long one alone while the others have finished."""
    return sorted(range(len(items)), key=lambda i: -items[i][1].context_tokens)


def items_fingerprint(items: Sequence[tuple[str, Item]]) -> str:
    """A short hash of a run's item list: the workers of ``--jobs`` must agree on it, position by position."""
    return hashlib.sha256("\n".join(f"{task}\t{item.id}" for task, item in items).encode()).hexdigest()[:16]


def _run_one(task: str, item: Item, p: PatternConfig, pattern: Pattern, config: RunConfig,
             score: ScoreItem, judge: Judge | None) -> dict[str, Any]:
    """One result line: the answer, its scores and verdict, or what went wrong."""
    record = _item_fields(task, item, p)
    t0 = time.perf_counter()
    try:
        answer, samples = answer_item(pattern, item, config.voting, seed=config.seed)
    except ContextOverflow as exc:
        record.update(status="overflow", error=str(exc), needed=exc.needed, window=exc.window,
                      prediction=None, scores=None, judge=None, stats=None)
    except MarginaliaError as exc:
        record.update(status="error", error=f"{type(exc).__name__}: {exc}", prediction=None, scores=None,
                      judge=None, stats=None)
    else:
        scores = {k: float(v) for k, v in score(item, answer.text).items()}
        # "answer" is the answer's document as every answer leaves the program (`Answer.to_dict`); the fields
        # beside it are what the reports read
        record.update(status="ok", prediction=answer.text, answer=answer.to_dict(), scores=scores, judge=None,
                      stats=asdict(answer.stats),
                      segments_read=answer.segments_read, segments_total=answer.segments_total,
                      margins=[margin_fields(m) for m in answer.margins],
                      margins_kept=sum(m.relevant for m in answer.margins))
        if answer.route is not None:
            record["route"] = asdict(answer.route)
        elif p.kind == "rag":  # what auto would read on this answer, for `bench calibrate`
            record["signals"] = answer_signals(item.question, answer)
        if samples is not None:
            record["samples"] = samples
        if judge is not None and judges(item.scoring):
            t_judge = time.perf_counter()
            verdict = judge.judge(item.question, item.answers, answer.text)
            record["judge"] = {**verdict.to_dict(), "by": judge.name,
                               "seconds": round(time.perf_counter() - t_judge, 3)}
    record["seconds"] = round(time.perf_counter() - t0, 3)
    record["finished"] = timestamp()
    return record
