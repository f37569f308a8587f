"""What a run's results say: the run folder read back, the primary score of its answers, patterns compared
on the same items, the cost per answer, and the margins WiM kept (`margin_counts`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..app import REPEAT_REASON
from ..errors import UserError
from .folder import DISAGREEMENTS, RESULTS, RUN_INFO, read_results, read_run_info, result_key, runs_dir
from .judge import judges
from .metrics import METRICS, bearing_is_telling, holds_answer, is_yes_no_gold, same_words, says_neither_yes_nor_no
from .statistics import bootstrap

PREFERRED = {"qa": ("contains", "f1", "em"), "set": ("f1", "set_f1", "contains", "em")}


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


def values_of(records: Iterable[dict[str, Any]], metric: str) -> list[float]:
    return [v for v in (metric_value(r, metric) for r in records) if v is not None]


def in_order(values: Iterable[Any]) -> list[Any]:
    seen: list[Any] = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def pattern_order(data: RunData) -> list[str]:
    configured = [p.get("name") or p.get("kind") for p in (data.info.get("config") or {}).get("patterns", [])]
    found = in_order(r["pattern"] for r in data.records)
    return [p for p in configured if p in found] + [p for p in found if p not in configured]


def sort_key(value: Any) -> tuple[int, float]:
    return (1, 0.0) if value is None else (0, float(value))


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
    items = in_order(item for item, _ in by_key)
    pairs = [(by_key[(item, a)], by_key[(item, b)]) for item in items if (item, a) in by_key and (item, b) in by_key]
    if not pairs:
        return None
    diffs = [x - y for x, y in pairs]
    low, high = bootstrap(diffs) if len(diffs) > 1 else (math.nan, math.nan)
    return Paired(len(pairs), sum(diffs) / len(diffs), low, high, sum(x > y for x, y in pairs),
                  sum(x < y for x, y in pairs))


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


# What the analyses need of a result's texts: worked out from them, or read from a text-free result
# (`marginalia.bench.export`), which keeps these answers in place of the texts.


def _text_free(record: dict[str, Any], key: str) -> Any:
    return (record.get("text_free") or {}).get(key)


def is_yes_no(record: dict[str, Any]) -> bool:
    if "text_free" in record:
        return bool(_text_free(record, "yes_no"))
    return is_yes_no_gold(record.get("answers") or [])


def says_neither(record: dict[str, Any]) -> bool:
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
