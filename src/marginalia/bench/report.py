"""The benchmark report: score tables with 95% confidence intervals, cost per pattern, and plots.

`write_report` reads a run folder (``run.json``, ``results.jsonl``, ``disagreements.jsonl``) and writes
``report.md`` and PNG plots. The primary score of a task is the judge's accuracy where a judge gave
verdicts, else the lenient ``contains`` score (or set F1, F1, EM: the first the metrics gave).
Scores average over answered items; overflow and error results are counted apart.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import MissingDependency, UserError
from ..files import atomic_write_text
from ..patterns.wim import REPEAT_REASON
from .folder import DISAGREEMENTS, RESULTS, RUN_INFO, read_results, read_run_info, result_key, runs_dir
from .judge import judges
from .metrics import (
    METRICS,
    bearing_is_telling,
    holds_answer,
    is_yes_no_gold,
    same_words,
    says_neither_yes_nor_no,
)
from .recommend import Recommendation, plot_recommendations, recommend

REPORT = "report.md"
PREFERRED = {"qa": ("contains", "f1", "em"), "set": ("f1", "set_f1", "contains", "em")}
SECONDARY = ("em", "f1", "contains", "set_f1")
Z95 = 1.959964


# -- statistics ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """A mean with its 95% interval over ``n`` values."""

    n: int
    mean: float
    low: float
    high: float

    def format(self) -> str:
        if self.n == 0:
            return "–"
        return f"{self.mean:.2f} [{self.low:.2f}, {self.high:.2f}]"


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (``n`` > 0)."""
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap(values: Sequence[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of the mean (deterministic for a seed)."""
    import numpy as np

    data = np.asarray(values, dtype=float)
    if len(data) == 1:
        return float(data[0]), float(data[0])
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(resamples, len(data)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def estimate(values: Sequence[float]) -> Estimate:
    """Mean and 95% interval: Wilson for 0/1 values, a bootstrap for anything else."""
    n = len(values)
    if n == 0:
        return Estimate(0, math.nan, math.nan, math.nan)
    mean = sum(values) / n
    if all(v in (0.0, 1.0) for v in values):
        low, high = wilson(sum(values), n)
    else:
        low, high = bootstrap(values)
    return Estimate(n, mean, low, high)


# -- reading a run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunData:
    """A run folder's contents, with at most one record per (task, item, pattern) (the last)."""

    folder: Path
    info: dict[str, Any]
    records: list[dict[str, Any]]
    disagreements: int
    rescored: int = 0


def find_run(run: str | Path, home: str | Path | None = None) -> Path:
    """A run folder from a path or a run name under ``<home>/bench/runs``."""
    path = Path(run).expanduser()
    if (path / RESULTS).is_file() or (path / RUN_INFO).is_file():
        return path.resolve()
    named = runs_dir(home) / str(run)
    if (named / RESULTS).is_file() or (named / RUN_INFO).is_file():
        return named
    raise UserError(f"no benchmark run at {path} or {named}; give a run folder (one with {RESULTS}) "
                    "or the name of a run under the home's bench/runs")


def rescore(record: dict[str, Any]) -> bool:
    """Score an answered record again with today's metric for its ``scoring`` (the stored scores were
    computed by the code of the day it was answered); True when that changed them."""
    metric = METRICS.get(str(record.get("scoring")))
    prediction = record.get("prediction")
    if record.get("status") != "ok" or metric is None or not isinstance(prediction, str):
        return False
    scores = {k: float(v) for k, v in metric.score(prediction, record.get("answers") or []).items()}
    if scores == record.get("scores"):
        return False
    record["stored_scores"] = record.get("scores")
    record["scores"] = scores
    return True


def load_run(folder: Path, rescore_answers: bool = False) -> RunData:
    """Read a run folder (a truncated last result line is ignored); with ``rescore_answers`` the answers are
    scored again with today's metrics (`RunData.rescored` counts the records whose stored scores changed)."""
    info = read_run_info(folder)
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for record in read_results(folder / RESULTS):
        latest[result_key(record)] = record
    rescored = sum(rescore(record) for record in latest.values()) if rescore_answers else 0
    keys: set[tuple[str, ...]] = set()
    for record in read_results(folder / DISAGREEMENTS):
        keys.add((str(record.get("task")), str(record.get("item_id")), str(record.get("pattern"))))
    return RunData(folder, info, list(latest.values()), len(keys), rescored)


def position(record: dict[str, Any]) -> float | None:
    """Where the gold sits (depth), or for a size sweep the distractor share."""
    depth = record.get("depth")
    return depth if depth is not None else record.get("distractor_fraction")


def primary_metric(records: Iterable[dict[str, Any]]) -> str:
    """``judge`` when any answered QA record has a verdict, else the first preferred score the metrics gave:
    ``contains`` for QA items, F1 for set items (word lists), whose ``contains`` is only recall."""
    keys: list[str] = []
    scoring = "qa"
    for r in records:
        if r.get("status") != "ok":
            continue
        if judges(r.get("scoring")) and (r.get("judge") or {}).get("verdict") in ("correct", "wrong"):
            return "judge"  # (a verdict on a word list, from an older run, is not read)
        if r.get("scoring") == "set":
            scoring = "set"
        for k in r.get("scores") or {}:
            if k not in keys:
                keys.append(k)
    for k in PREFERRED[scoring]:
        if k in keys:
            return k
    return keys[0] if keys else "contains"


def cores_text(machine: dict[str, Any]) -> str:
    """"2 cores", "1 of 2 cores" for a run held to fewer than the machine has (``taskset``), or "2 cores, as 2
    jobs of 1 core" for ``bench run --jobs 2`` (each answer's seconds are then one job's)."""
    cores, usable = machine.get("cores") or "?", machine.get("usable_cores")  # os.cpu_count() may be None
    jobs = machine.get("jobs")
    if jobs:
        return f"{cores} cores, as {jobs} jobs of {usable or '?'} core{'s' * (usable != 1)}"
    return f"{usable} of {cores} cores" if usable is not None and usable != cores else f"{cores} cores"


def run_machines(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The distinct machines a run's invocations were answered on (`machine_info` records), in order."""
    machines: list[dict[str, Any]] = []
    for invocation in info.get("invocations") or []:
        m = invocation.get("machine")
        if isinstance(m, dict):  # a run held to all its cores reads as one recorded before usable_cores was
            m = {k: v for k, v in m.items() if not (k == "usable_cores" and v == m.get("cores"))}
            if m not in machines:
                machines.append(m)
    return machines


def metric_value(record: dict[str, Any], metric: str) -> float | None:
    if record.get("status") != "ok":
        return None
    if metric == "judge":
        verdict = str((record.get("judge") or {}).get("verdict"))
        return {"correct": 1.0, "wrong": 0.0}.get(verdict)
    value = (record.get("scores") or {}).get(metric)
    return None if value is None else float(value)


def _values(records: Iterable[dict[str, Any]], metric: str) -> list[float]:
    return [v for v in (metric_value(r, metric) for r in records) if v is not None]


def _order(values: Iterable[Any]) -> list[Any]:
    seen: list[Any] = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def pattern_order(data: RunData) -> list[str]:
    configured = [p.get("name") or p.get("kind") for p in (data.info.get("config") or {}).get("patterns", [])]
    found = _order(r["pattern"] for r in data.records)
    return [p for p in configured if p in found] + [p for p in found if p not in configured]


def _sort_key(value: Any) -> tuple[int, float]:
    return (1, 0.0) if value is None else (0, float(value))


# -- tables -----------------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _score_row(group: list[dict[str, Any]], metric: str, extra: Sequence[str]) -> list[str]:
    ok = [r for r in group if r.get("status") == "ok"]
    est = estimate(_values(ok, metric))
    row = [str(est.n), est.format()]
    for key in extra:
        vals = _values(ok, key)
        row.append(_fmt(sum(vals) / len(vals)) if vals else "–")
    if metric == "judge":
        row.append(str(sum((r.get("judge") or {}).get("verdict") == "unjudged" for r in ok)))
    row.append(str(sum(r.get("status") == "overflow" for r in group)))
    row.append(str(sum(r.get("status") == "error" for r in group)))
    return row


def task_tables(records: list[dict[str, Any]], patterns: Sequence[str]) -> tuple[str, str, list[str]]:
    """Markdown for one task: the pattern x length x position table and the pooled pattern x length table."""
    metric = primary_metric(records)
    keys = _order(k for r in records for k in (r.get("scores") or {}))
    extra = [k for k in SECONDARY if k in keys and k != metric] + \
        [k for k in keys if k not in SECONDARY and k != metric]
    pos_name = "depth" if any(r.get("depth") is not None for r in records) else \
        "distractors" if any(r.get("distractor_fraction") is not None for r in records) else "position"
    tail = [*extra, *(["unjudged"] if metric == "judge" else []), "overflow", "error"]
    label = "judge accuracy" if metric == "judge" else metric
    lengths = sorted(_order(r.get("target_tokens") for r in records), key=_sort_key)
    positions = sorted(_order(position(r) for r in records), key=_sort_key)
    rows = []
    pooled = []
    for p in patterns:
        for length in lengths:
            group = [r for r in records if r["pattern"] == p and r.get("target_tokens") == length]
            if not group:
                continue
            pooled.append([p, str(length), *_score_row(group, metric, extra)])
            for pos in positions:
                cell = [r for r in group if position(r) == pos]
                if cell:
                    rows.append([p, str(length), _fmt(pos), *_score_row(cell, metric, extra)])
    detail = _table(["pattern", "length", pos_name, "n", f"{label} (95% CI)", *tail], rows)
    summary = _table(["pattern", "length", "n", f"{label} (95% CI)", *tail], pooled)
    return detail, summary, [label, pos_name]


def _mean(values: Sequence[float | None]) -> float | None:
    """The mean, or None when there is nothing to average or one value is unknown (a count the model server
    did not report: the mean of the rest would pass for the whole)."""
    if not values or any(v is None for v in values):
        return None
    known = [v for v in values if v is not None]
    return sum(known) / len(known)


@dataclass
class Paired:
    """Two patterns' scores on the items both answered (`paired`): the mean difference (first minus second)
    with a paired bootstrap 95% interval, and how often each scored higher."""

    items: int
    mean: float
    low: float
    high: float
    first_higher: int
    second_higher: int

    @property
    def reading(self) -> str:
        return "higher" if self.low > 0 else "lower" if self.high < 0 else "no clear difference"


def paired(records: Iterable[dict[str, Any]], a: str, b: str, metric: str, length: Any = ...) -> Paired | None:
    """Patterns ``a`` and ``b`` compared on the items both answered (at ``length``, or at any); None: none."""
    by_key: dict[tuple[str, str], float] = {}
    for r in records:
        if r["pattern"] in (a, b) and (length is ... or r.get("target_tokens") == length):
            value = metric_value(r, metric)
            if value is not None:
                by_key[(str(r["item_id"]), r["pattern"])] = value
    items = _order(item for item, _ in by_key)
    pairs = [(by_key[(item, a)], by_key[(item, b)]) for item in items if (item, a) in by_key and (item, b) in by_key]
    if not pairs:
        return None
    diffs = [x - y for x, y in pairs]
    low, high = bootstrap(diffs) if len(diffs) > 1 else (math.nan, math.nan)
    return Paired(len(pairs), sum(diffs) / len(diffs), low, high, sum(x > y for x, y in pairs),
                  sum(x < y for x, y in pairs))


def paired_rows(records: list[dict[str, Any]], patterns: Sequence[str], metric: str) -> list[list[str]]:
    """Each pair of patterns compared on the items both answered (`paired`), per length (wim patterns first)."""
    lengths = sorted(_order(r.get("target_tokens") for r in records), key=_sort_key)
    kinds = {r["pattern"]: r.get("kind") for r in records}
    patterns = sorted(patterns, key=lambda p: kinds.get(p) != "wim")  # wim first: "wim − lc", "wim − rag"
    rows = []
    for length in lengths:
        for i, a in enumerate(patterns):
            for b in patterns[i + 1:]:
                d = paired(records, a, b, metric, length)
                if d is None:
                    continue
                rows.append([f"{a} − {b}", str(length), str(d.items), f"{d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}]",
                             str(d.first_higher), str(d.second_higher),
                             f"{a} {d.reading}" if d.reading != "no clear difference" else d.reading])
    return rows


def agreement_rows(records: list[dict[str, Any]], patterns: Sequence[str]) -> list[list[str]]:
    """Where the judge and ``contains`` both scored an answer: how often they disagree, each way."""
    rows = []
    for p in patterns:
        both = [(metric_value(r, "judge"), metric_value(r, "contains")) for r in records if r["pattern"] == p]
        both = [(j, c) for j, c in both if j is not None and c is not None]
        if not both:
            continue
        judge_only = sum(j == 1.0 and c == 0.0 for j, c in both)
        contains_only = sum(j == 0.0 and c == 1.0 for j, c in both)
        rows.append([p, str(len(both)), f"{(judge_only + contains_only) / len(both):.2f}",
                     str(judge_only), str(contains_only)])
    return rows


# What the report needs of a result's texts: worked out from them, or read from a text-free result
# (`marginalia.bench.export`), which keeps these answers in place of the texts.


def _text_free(record: dict[str, Any], key: str) -> Any:
    return (record.get("text_free") or {}).get(key)


def _yes_no(record: dict[str, Any]) -> bool:
    if "text_free" in record:
        return bool(_text_free(record, "yes_no"))
    return is_yes_no_gold(record.get("answers") or [])


def _says_neither(record: dict[str, Any]) -> bool:
    if "text_free" in record:
        return bool(_text_free(record, "neither"))
    return says_neither_yes_nor_no(record.get("prediction") or "", record.get("answers") or [])


def _telling(record: dict[str, Any]) -> bool:
    if "text_free" in record:
        return bool(_text_free(record, "telling"))
    return bearing_is_telling(record.get("question") or "", record.get("answers") or [])


def _holds_answer(margin: dict[str, Any], record: dict[str, Any]) -> bool:
    if "holds_answer" in margin:
        return bool(margin["holds_answer"])
    return holds_answer(margin["text"], record.get("answers") or [])


def note_keys(margins: Sequence[dict[str, Any]]) -> list[int]:
    """Each margin's note, as the index of the first margin written with the same words (`same_words`); a
    text-free margin carries it (``same_as``), and one exported before that was kept is a note of its own."""
    if all("text" in m for m in margins):
        return same_words([str(m["text"]) for m in margins])
    return [m["same_as"] if isinstance(m.get("same_as"), int) and 0 <= m["same_as"] < i else i
            for i, m in enumerate(margins)]


def _repeat(margin: dict[str, Any]) -> bool:
    return bool(margin.get("repeat")) or margin.get("reason") == REPEAT_REASON


def yes_no_rows(records: list[dict[str, Any]], patterns: Sequence[str]) -> list[list[str]]:
    """Per pattern: answers to yes/no questions, and those saying neither yes nor no (which ``contains``
    cannot score: they count as wrong)."""
    rows = []
    for p in patterns:
        group = [r for r in records if r["pattern"] == p and r.get("status") == "ok" and r.get("scoring") == "qa"
                 and _yes_no(r)]
        if group:
            unscored = sum(_says_neither(r) for r in group)
            rows.append([p, str(len(group)), str(unscored), f"{unscored / len(group):.2f}"])
    return rows


def task_cost_rows(records: list[dict[str, Any]], patterns: Sequence[str]) -> list[list[str]]:
    """Tokens and seconds per answer, per pattern and length, for one task."""
    rows = []
    for length in sorted(_order(r.get("target_tokens") for r in records), key=_sort_key):
        for c in cost_rows([r for r in records if r.get("target_tokens") == length], patterns):
            if c["n"]:
                rows.append([c["pattern"], str(length), str(c["n"]), _fmt(c["prefilled_context"], 0),
                             _fmt(c["prefilled_other"], 0), _fmt(c["generated"], 1), _fmt(c["seconds"], 2)])
    return rows


def cost_rows(records: list[dict[str, Any]], patterns: Sequence[str]) -> list[dict[str, Any]]:
    """Mean tokens and seconds per answered item, per pattern."""
    out = []
    for p in patterns:
        ok = [r for r in records if r["pattern"] == p and r.get("status") == "ok" and r.get("stats")]
        stats = [r["stats"] for r in ok]
        out.append({
            "pattern": p, "n": len(ok),
            "prefilled_context": _mean([s.get("prefilled_context_tokens", 0) for s in stats]),
            "prefilled_other": _mean([s.get("prefilled_other_tokens", 0) for s in stats]),
            "generated": _mean([s.get("generated_margin_tokens", 0) + s.get("generated_answer_tokens", 0)
                                + s.get("generated_other_tokens", 0) for s in stats]),
            "seconds": _mean([s.get("total_seconds", 0.0) for s in stats]),
            "judge_seconds": _mean([(r.get("judge") or {}).get("seconds", 0.0) for r in ok if r.get("judge")]),
            "overflow": sum(r["pattern"] == p and r.get("status") == "overflow" for r in records),
            "error": sum(r["pattern"] == p and r.get("status") == "error" for r in records),
        })
    return out


@dataclass
class MarginCounts:
    """Kept-margin counts of one pattern's answers (`margin_counts`)."""

    answers: int = 0  # answers with gold answers and margins, yes/no questions left out
    kept: int = 0  # margins kept
    hits: int = 0  # kept and answer-bearing
    bearing: int = 0  # answer-bearing notes (margins of the same words count once per answer)
    noted: int = 0  # ... of which a copy was kept
    copies: int = 0  # answer-bearing margins, each copy counted
    copies_kept: int = 0  # ... kept
    asked: int = 0  # questions where an answer-bearing margin was written
    found: int = 0  # ... and one was kept
    located: int = 0  # kept margins with evidence, where the gold passages are known
    on_gold: int = 0  # ... whose evidence lies in a gold passage
    relevant: int = 0  # kept and answer-bearing, or, for a question of several gold passages, drawn from one

    @property
    def precision(self) -> float | None:
        return self.hits / self.kept if self.kept else None

    @property
    def recall(self) -> float | None:
        """Of the answer-bearing notes, the share kept (one copy will do)."""
        return self.noted / self.bearing if self.bearing else None

    @property
    def copy_recall(self) -> float | None:
        """Of the answer-bearing margins, each copy counted, the share kept."""
        return self.copies_kept / self.copies if self.copies else None

    @property
    def relevant_precision(self) -> float | None:
        """Of the kept margins, the share `relevant`: a multi-hop question's bridge fact counts."""
        return self.relevant / self.kept if self.kept else None


def margin_counts(records: Iterable[dict[str, Any]], pattern: str) -> MarginCounts:
    """Kept-margin precision and recall of ``pattern``, for results with gold answers and their margins.

    A margin is answer-bearing when it contains a gold answer (SQuAD-normalised). Precision: of the kept
    margins, the share answer-bearing; recall: of the answer-bearing notes, the share kept, a note being the
    margins written with the same words (`note_keys`: a small model writes "1999" after every part once it has
    read it; keeping one copy loses nothing, and each copy dropped is not a note lost), leaving out margins
    dropped only for repeating a kept note (nothing new was lost) and those dropped that were written
    before any gold passage was read (where results say what each margin's segment had read: the answer then
    came from the model's own memory, which a grounded judge is right to drop); and the questions where an
    answer-bearing margin was written, and where one was kept. Questions answered yes or no, or naming their own
    answer, are left out (`bearing_is_telling`), as are results written before margins were kept (schema
    1: a count). Where results keep the gold passages' spans and each margin's evidence, also: of the kept
    margins, the share whose evidence lies in a gold passage (a multi-hop question's bridge fact bears no
    gold answer, yet it is what the answer needs).
    """
    c = MarginCounts()
    for r in records:
        margins = r.get("margins")
        if r["pattern"] != pattern or r.get("status") != "ok" or r.get("scoring", "qa") != "qa" \
                or not isinstance(margins, list) or not margins \
                or not _telling(r):
            continue
        c.answers += 1
        keyed = [(m, k) for m, k in zip(margins, note_keys(margins), strict=True) if m["kept"] or not _repeat(m)]
        spans = r.get("gold_spans") or []
        if spans:  # a margin written before any gold passage was read has the answer from the model's memory
            first_gold = min(start for start, _ in spans)
            keyed = [(m, k) for m, k in keyed if m["kept"] or m.get("read_to") is None or m["read_to"] > first_gold]
        margins = [m for m, _ in keyed]
        has = [_holds_answer(m, r) for m in margins]
        c.kept += sum(m["kept"] for m in margins)
        c.hits += sum(m["kept"] and h for m, h in zip(margins, has, strict=True))
        notes: dict[int, bool] = {}
        for (m, key), h in zip(keyed, has, strict=True):
            if h:
                notes[key] = notes.get(key, False) or bool(m["kept"])
        c.bearing += len(notes)
        c.noted += sum(notes.values())
        c.copies += sum(has)
        c.copies_kept += sum(m["kept"] and h for m, h in zip(margins, has, strict=True))
        c.asked += any(has)
        c.found += any(m["kept"] and h for m, h in zip(margins, has, strict=True))
        for m, h in zip(margins, has, strict=True):
            if not m["kept"]:
                continue
            on_gold = False
            if spans and m.get("evidence"):
                start, end = m["evidence"]
                on_gold = any(start < gold_end and gold_start < end for gold_start, gold_end in spans)
                c.located += 1
                c.on_gold += on_gold
            c.relevant += h or (on_gold and len(spans) > 1)
    return c


def margin_rows(records: list[dict[str, Any]], patterns: Sequence[str]) -> list[list[str]]:
    """`margin_counts` of each pattern that has any, as table rows."""
    rows = []
    for p in patterns:
        c = margin_counts(records, p)
        if c.answers:
            rows.append([p, str(c.answers), str(c.kept), _fmt(c.precision), _fmt(c.recall), _fmt(c.copy_recall),
                         f"{c.found} of {c.asked}", _fmt(c.on_gold / c.located if c.located else None),
                         _fmt(c.relevant_precision)])
    return rows


def _header(data: RunData) -> list[str]:
    info = data.info
    config = info.get("config") or {}
    models = info.get("models") or {}
    gen = models.get("generator") or {}
    commit = info.get("commit")
    commit_text = "unknown (not a git checkout)" if not commit else \
        commit.get("commit", "?")[:12] + (" (with uncommitted changes)" if commit.get("dirty") else "")
    machine = info.get("machine") or {}
    statuses = {s: sum(r.get("status") == s for r in data.records) for s in ("ok", "overflow", "error")}
    lines = [
        f"# Benchmark report: {config.get('name') or data.folder.name}",
        "",
        f"- **model**: {gen.get('name', config.get('model', '?'))} ({gen.get('engine', '?')}, "
        f"device {gen.get('device', '?')}, window {gen.get('context_window', '?')} tokens)",
    ]
    if models.get("embedder"):
        lines.append(f"- **embedder** (rag): {models['embedder']}")
    judge = models.get("judge")
    if judge:
        lines.append(f"- **judge**: {judge.get('name')} ({judge.get('engine')})")
    if config.get("voting"):
        v = config["voting"]
        lines.append(f"- **voting**: medoid of {v['samples']} answers sampled at temperature {v['temperature']}")
    lines += [
        f"- **commit**: {commit_text}",
        f"- **started**: {info.get('started', '?')}",
        f"- **machine**: {cores_text(machine)} ({machine.get('cpu', '?')}), "
        f"{machine.get('ram_gb', '?')} GB RAM" + (f", GPU: {'; '.join(machine['gpus'])}" if machine.get("gpus")
                                                 else ""),
    ]
    machines = run_machines(info)
    if len(machines) > 1:  # a run carried from machine to machine (bench export / import)
        lines.append(f"- **machines**: answered on {len(machines)} machines ("
                     + "; ".join(f"{cores_text(m)}, {m.get('cpu', '?')}"
                                 + (f" ({m['vectors']})" if m.get("vectors") else "") for m in machines)
                     + "): its seconds per answer mix them")
    lines += [
        f"- **results**: {len(data.records)} ({statuses['ok']} answered, {statuses['overflow']} overflow, "
        f"{statuses['error']} error)",
    ]
    if data.rescored:
        lines.append(f"- **scores**: {data.rescored} answers scored again with today's metrics (their stored "
                     f"scores were computed by an older version; {RESULTS} keeps those)")
    judged = [r for r in data.records if r.get("judge")]
    if judged:
        unjudged = sum(r["judge"].get("verdict") == "unjudged" for r in judged)
        lines.append(f"- **judge verdicts**: {len(judged) - unjudged} judged, {unjudged} unjudged; "
                     f"{data.disagreements} disagreements with the lexical scores (see {DISAGREEMENTS})")
    lines += ["", "Scores average over answered items (95% confidence intervals: Wilson for 0/1 scores, "
              "bootstrap otherwise); overflow (the context did not fit the model's window) and error results "
              "are counted apart. Length is the target context size in the model's tokens."]
    return lines


def _subsection(level: str, title: str, text: str, header: Sequence[str], rows: list[list[str]]) -> list[str]:
    """A heading, a line saying what the table shows, and the table; nothing when there are no rows."""
    return ["", f"{level} {title}", "", text, "", _table(header, rows)] if rows else []


def task_sections(records: list[dict[str, Any]], patterns: Sequence[str], level: str = "###") -> list[str]:
    """Markdown for one task beyond its score tables: patterns compared on the same items, judge against
    contains, cost per answer, margins kept (each where the records give it), under ``level`` headings."""
    metric = primary_metric(records)
    label = "judge accuracy" if metric == "judge" else metric
    lines = _subsection(
        level, f"Patterns compared on the same items ({label})",
        "The mean difference of the two patterns' scores on the items both answered, with a paired bootstrap 95% "
        "interval; a difference is clear when its interval excludes zero.",
        ["patterns", "length", "items", "difference (95% CI)", "first right, second not", "second right, first not",
         "reading"], paired_rows(records, patterns, metric))
    lines += _subsection(
        level, "Judge and contains",
        "Answers scored by both: the share where they disagree; the judge accepting an answer that holds no gold "
        "answer, and rejecting one that holds it.",
        ["pattern", "answers", "disagree", "judge right, contains wrong", "judge wrong, contains right"],
        agreement_rows(records, patterns))
    lines += _subsection(
        level, "Yes/no questions",
        "Answers to questions whose gold answer is yes or no, and those that say neither word: `contains` counts "
        "them wrong whatever they state.",
        ["pattern", "answers", "say neither yes nor no", "share"], yes_no_rows(records, patterns))
    lines += ["", f"{level} Cost per answer", "",
              _table(["pattern", "length", "n", "prefilled context tokens", "prefilled other tokens",
                      "generated tokens", "seconds"], task_cost_rows(records, patterns))]
    lines += _subsection(
        level, "Margins kept",
        "Of the kept margins, the share holding a gold answer (precision); of the notes holding one, the share "
        "kept (recall: margins written with the same words are one note, kept when one copy is); the same for each "
        "copy apart; questions where one was written, and kept; of the kept margins, the share drawn from a "
        "gold passage (where results keep where each was found); of the kept margins, the share relevant: holding "
        "a gold answer or, for a question that needs several gold passages, drawn from one of them (a bridge "
        "fact). A dropped margin written before a gold passage "
        "was read (its answer from the model's memory) is not counted. Questions answered yes or no, or naming their "
        "own answer (\"who is older, A or B?\"), are left out: a margin holding their gold answer tells nothing.",
        ["pattern", "n", "kept", "precision", "recall", "recall, each copy", "questions with a kept answer",
         "kept from a gold passage", "precision, bridge facts counted"],
        margin_rows(records, patterns))
    return lines


def question_kind(record: dict[str, Any]) -> str:
    """The kind of question a record answers: its pair's kind where its item says one, else its task."""
    return str(record.get("question_kind") or record["task"])


def shared_readings(data: RunData) -> dict[str, str]:
    """Pattern -> the pattern whose reading it answers from (a config's ``reading = NAME``)."""
    tables = (data.info.get("config") or {}).get("patterns", [])
    return {str(t.get("name") or t.get("kind")): str(t["reading"]) for t in tables if t.get("reading")}


def recommendations(records: list[dict[str, Any]], patterns: Sequence[str],
                    shared: dict[str, str] | None = None) -> list[Recommendation]:
    """Per kind of question, the cheapest reading within the best one's paired interval (`recommend`). A
    pattern that answers from another's reading (``shared``) costs its own seconds and that reading's."""
    shared = shared or {}
    out = []
    for kind in _order(question_kind(r) for r in records):
        group = [r for r in records if question_kind(r) == kind]
        metric = primary_metric(group)
        scores = {p: {f"{r['item_id']}": v for r in group if r["pattern"] == p
                      for v in [metric_value(r, metric)] if v is not None} for p in patterns}
        own = {c["pattern"]: c["seconds"] for c in cost_rows(group, patterns)}
        seconds = {p: (v + (own.get(shared[p]) or 0.0) if v is not None and p in shared else v)
                   for p, v in own.items()}

        def score_interval(values: Sequence[float]) -> tuple[float, float]:
            est = estimate(values)
            return est.low, est.high

        found = recommend(kind, scores, seconds, bootstrap, score_interval)
        if found is not None:
            out.append(found)
    return out


def recommendation_lines(found: Sequence[Recommendation], plots: Sequence[str] = ()) -> list[str]:
    """The report's opening: a line per kind of question naming the reading to use."""
    if not found:
        return []
    lines = ["", "## Recommendation", "",
             "Per kind of question, the cheapest reading (seconds per answer) whose score is within the best "
             "reading's paired 95% interval (a paired bootstrap over the items both answered); a pattern that "
             "answers from another's reading costs that reading's seconds too.", ""]
    lines += [r.line() for r in found]
    return lines + [f"\n![{name}]({name})" for name in plots]


def render_markdown(data: RunData, plots: dict[str, list[str]] | None = None) -> str:
    """The report's markdown; ``plots`` maps a section (task name, ``cost`` or ``recommendation``) to PNG file
    names."""
    plots = plots or {}
    patterns = pattern_order(data)
    lines = _header(data) + recommendation_lines(recommendations(data.records, patterns, shared_readings(data)),
                                                 plots.get("recommendation", []))
    for task in _order(r["task"] for r in data.records):
        records = [r for r in data.records if r["task"] == task]
        detail, summary, (label, pos_name) = task_tables(records, patterns)
        lines += ["", f"## Task {task}", "", f"Primary score: **{label}**.", "",
                  f"### {label} by pattern and length", "", summary, "",
                  f"### {label} by pattern, length and {pos_name}", "", detail]
        lines += task_sections(records, patterns)
        for name in plots.get(task, []):
            lines += ["", f"![{name}]({name})"]
    costs = cost_rows(data.records, patterns)
    lines += ["", "## Cost per pattern", "", "Means per answered item (all tasks).", "",
              _table(["pattern", "n", "prefilled context tokens", "prefilled other tokens", "generated tokens",
                      "seconds", "judge seconds", "overflow", "error"],
                     [[c["pattern"], str(c["n"]), _fmt(c["prefilled_context"], 0), _fmt(c["prefilled_other"], 0),
                       _fmt(c["generated"], 1), _fmt(c["seconds"], 2), _fmt(c["judge_seconds"], 2),
                       str(c["overflow"]), str(c["error"])] for c in costs])]
    for name in plots.get("cost", []):
        lines += ["", f"![{name}]({name})"]
    return "\n".join(lines) + "\n"


# -- plots ----------------------------------------------------------------------------------------------


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _figure(**kwargs: Any) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingDependency("matplotlib (for the report's plots)", "pip install 'marginalia[bench]'") from exc
    return Figure(**kwargs)


def plot_task(records: list[dict[str, Any]], task: str, patterns: Sequence[str], out: Path) -> list[str]:
    """Score vs position (a panel per length, a line per pattern) and a position x length heatmap per pattern."""
    import numpy as np

    metric = primary_metric(records)
    label = "judge accuracy" if metric == "judge" else metric
    pos_name = "depth" if any(r.get("depth") is not None for r in records) else "distractor share"
    lengths = sorted(_order(r.get("target_tokens") for r in records), key=_sort_key)
    positions = sorted(_order(position(r) for r in records), key=_sort_key)
    names = []

    def at(p: str, length: Any, pos: Any = ...) -> Estimate:
        return estimate(_values([r for r in records if r["pattern"] == p and r.get("target_tokens") == length
                                 and (pos is ... or position(r) == pos)], metric))

    def mean_at(p: str, length: Any, pos: Any) -> float:
        return at(p, length, pos).mean

    def bars(ax: Any, ests: list[Estimate], xs: Any, label: str | None) -> None:
        means = [e.mean for e in ests]
        errors = [[max(e.mean - e.low, 0.0) for e in ests], [max(e.high - e.mean, 0.0) for e in ests]]
        ax.bar(xs, means, width=0.8 / len(patterns), yerr=errors, capsize=3, label=label)

    xs = [x if x is not None else 0.0 for x in positions]
    if len(positions) == 1:  # one position: bars per length with their 95% intervals, not lone points
        fig = _figure(figsize=(2.2 + 1.4 * len(lengths) * max(len(patterns), 1) / 2, 3.4), layout="constrained")
        ax = fig.subplots()
        for k, p in enumerate(patterns):
            ests = [at(p, length) for length in lengths]
            if any(e.n for e in ests):
                bars(ax, ests, [i + (k - (len(patterns) - 1) / 2) * 0.8 / len(patterns)
                                for i in range(len(lengths))], p)
        ax.set_xticks(range(len(lengths)), [f"{v} tokens" if v is not None else task for v in lengths])
        ax.set_title(task + (f", {pos_name} {_fmt(positions[0])}" if positions[0] is not None else ""))
        ax.set_ylabel(f"{label} (95% CI)")
        ax.set_ylim(0.0, 1.03)
        ax.grid(alpha=0.3, axis="y")
        if ax.patches:
            ax.legend(loc="best", fontsize="small")
        else:
            ax.text(0.5, 0.5, "no answers\n(overflow or error)", ha="center", va="center", transform=ax.transAxes,
                    color="gray")
    else:  # a line per pattern over the positions, each point with its 95% interval (nudged apart)
        fig = _figure(figsize=(4.2 * len(lengths), 3.4), layout="constrained")
        axes = fig.subplots(1, len(lengths), squeeze=False)[0]
        span = (max(xs) - min(xs)) or 1.0
        for ax, length in zip(axes, lengths, strict=True):
            for k, p in enumerate(patterns):
                ests = [at(p, length, pos) for pos in positions]
                if all(e.n == 0 for e in ests):
                    continue
                nudge = (k - (len(patterns) - 1) / 2) * 0.012 * span
                ax.errorbar([x + nudge for x in xs], [e.mean for e in ests],
                            yerr=[[max(e.mean - e.low, 0.0) if e.n else math.nan for e in ests],
                                  [max(e.high - e.mean, 0.0) if e.n else math.nan for e in ests]],
                            marker="o", capsize=3, label=p)
            if not ax.lines:
                ax.text(0.5, 0.5, "no answers\n(overflow or error)", ha="center", va="center",
                        transform=ax.transAxes, color="gray")
            ax.set_title(f"{task}, {length} tokens" if length is not None else task)
            ax.set_xlabel(pos_name)
            ax.set_ylabel(f"{label} (95% CI)")
            ax.set_ylim(-0.03, 1.03)
            ax.grid(alpha=0.3)
        axes[0].legend(loc="best", fontsize="small")
    name = f"score-{_safe(task)}.png"
    fig.savefig(out / name, dpi=110)
    names.append(name)
    if len(positions) == 1 or len(lengths) == 1:  # a heatmap of one row or column says nothing more
        return names

    for p in patterns:
        grid = np.array([[mean_at(p, length, pos) for length in lengths] for pos in positions], dtype=float)
        if np.isnan(grid).all():
            continue
        fig = _figure(figsize=(1.6 + 1.3 * len(lengths), 1.2 + 0.55 * len(positions)), layout="constrained")
        ax = fig.subplots()
        image = ax.imshow(np.ma.masked_invalid(grid), vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(lengths)), [str(v) for v in lengths])
        ax.set_yticks(range(len(positions)), [_fmt(v) for v in positions])
        ax.set_xlabel("length (tokens)")
        ax.set_ylabel(pos_name)
        ax.set_title(f"{task}: {p}")
        for i, pos in enumerate(positions):
            for j, length in enumerate(lengths):
                if not math.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center",
                            color="white" if grid[i, j] < 0.6 else "black", fontsize="small")
                elif any(r["pattern"] == p and r.get("target_tokens") == length and position(r) == pos
                         and r.get("status") == "overflow" for r in records):
                    ax.text(j, i, "overflow", ha="center", va="center", color="gray", fontsize="small")
        fig.colorbar(image, ax=ax, label=label)
        name = f"heatmap-{_safe(task)}-{_safe(p)}.png"
        fig.savefig(out / name, dpi=110)
        names.append(name)
    return names


def plot_cost(records: list[dict[str, Any]], patterns: Sequence[str], out: Path) -> list[str]:
    """Bars per pattern: mean prefilled and generated tokens, and mean seconds per item."""
    costs = [c for c in cost_rows(records, patterns) if c["n"]]
    if not costs:
        return []
    fig = _figure(figsize=(4 + 1.2 * len(costs), 3.4), layout="constrained")
    tokens, seconds = fig.subplots(1, 2)
    xs = range(len(costs))
    labels = [c["pattern"] for c in costs]
    bottom = [0.0] * len(costs)
    for key, text in (("prefilled_context", "prefilled context"), ("prefilled_other", "prefilled other"),
                      ("generated", "generated")):
        if any(c[key] is None for c in costs):  # a model server that did not say: no bar, not a zero
            text += " (not reported by the server for some)"
        vals = [c[key] or 0.0 for c in costs]
        tokens.bar(xs, vals, bottom=bottom, label=text)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    tokens.set_xticks(list(xs), labels)
    tokens.set_ylabel("tokens per item")
    tokens.legend(fontsize="small")
    seconds.bar(xs, [c["seconds"] or 0.0 for c in costs], color="tab:gray")
    seconds.set_xticks(list(xs), labels)
    seconds.set_ylabel("seconds per item")
    name = "cost.png"
    fig.savefig(out / name, dpi=110)
    return [name]


# -- the report -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportFiles:
    report: Path
    plots: tuple[Path, ...]


def write_report(run: str | Path, out: str | Path | None = None, home: str | Path | None = None,
                 plots: bool = True, rescore: bool = False) -> ReportFiles:
    """Render ``report.md`` and the plots for a run folder (or a run name under the home).

    Args:
        run: a run folder, or a run's name under ``<home>/bench/runs``.
        out: where to write (default: the run folder).
        home: marginalia's home, for run names.
        plots: draw the PNG plots (needs matplotlib).
        rescore: score the stored answers again with today's metrics (see `load_run`).

    Raises:
        UserError: no such run, or it has no results yet.
        MissingDependency: matplotlib is missing and plots were asked for.
    """
    folder = find_run(run, home)
    data = load_run(folder, rescore_answers=rescore)
    if not data.records:
        raise UserError(f"{folder} has no results yet; run the benchmark first (marginalia bench run CONFIG)")
    target = Path(out).expanduser() if out is not None else folder
    target.mkdir(parents=True, exist_ok=True)
    patterns = pattern_order(data)
    drawn: dict[str, list[str]] = {}
    if plots:
        for task in _order(r["task"] for r in data.records):
            drawn[task] = plot_task([r for r in data.records if r["task"] == task], task, patterns, target)
        drawn["cost"] = plot_cost(data.records, patterns, target)
        drawn["recommendation"] = plot_recommendations(
            recommendations(data.records, patterns, shared_readings(data)), target, _figure)
    text = render_markdown(data, drawn)
    path = target / REPORT
    atomic_write_text(path, text)
    return ReportFiles(path, tuple(target / n for names in drawn.values() for n in names))
