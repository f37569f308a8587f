"""Calibration: auto's thresholds and its second reading chosen from a run's per-item results, and stored as a
collection's reading profile for the run's model (`app.profiles`).

The run answered the same items with rag and with the readings auto may escalate to (wim, lc); each rag answer
keeps the signals the router reads on it (`patterns.auto.answer_signals`). For each candidate (what to escalate
to, the least support, from one sentence or two, the least share of the question around the supporting
sentences) auto's answer on an item is worked out offline: rag's where its answer stands, the second reading's
where it does not, at rag's seconds plus the second's. Of the candidates whose score is within the best single
reading's paired 95% interval, the one with the fewest seconds per answer is chosen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import product
from pathlib import Path
from typing import Any

from ..app import AutoOptions
from ..errors import UserError
from .analysis import find_run, load_run, metric_value, pattern_order, primary_metric
from .statistics import bootstrap

#: the least support a RAG answer needs to stand, tried in turn
SUPPORT_GRID = (0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
#: the least share of the question around the supporting sentences, tried in turn
QUESTION_GRID = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6)
#: how many sentences may support RAG's answer together, tried in turn (the default first)
SENTENCES = (1, 2)
#: the readings auto may escalate to, by pattern kind
SECOND = ("wim", "lc")


@dataclass(frozen=True)
class Outcome:
    """One reading's result on one item: its score, seconds, and (rag) the router's signals."""

    score: float
    seconds: float
    signals: dict[str, Any]


@dataclass(frozen=True)
class Candidate:
    """Auto with one setting, worked out on the run's items."""

    escalate: str
    support_threshold: float
    question_threshold: float
    support_sentences: int
    score: float
    seconds: float
    escalated: int
    difference: tuple[float, float, float]  # minus the best single reading: mean, 95% interval

    @property
    def within(self) -> bool:
        return self.difference[2] >= 0.0

    def describe(self) -> str:
        if self.escalate == "rag":
            rule = "rag alone (escalate rag)"
        else:
            rule = (f"escalate to {self.escalate} below support {self.support_threshold:g}"
                    + (" from two sentences" if self.support_sentences == 2 else "")
                    + (f" or question share {self.question_threshold:g}" if self.question_threshold else ""))
        mean, low, high = self.difference
        return (f"{rule}: score {self.score:.2f} ({mean:+.2f} [{low:+.2f}, {high:+.2f}] against the best), "
                f"{self.seconds:.1f} s per answer, {self.escalated} escalated")


@dataclass(frozen=True)
class Calibration:
    """What `calibrate` chose, and from what."""

    run: str
    model: str
    items: int
    metric: str
    singles: dict[str, tuple[float, float]]  # kind -> (score, seconds per answer)
    best: str
    chosen: Candidate
    options: dict[str, Any]


#: how far below the best reading a choice may be, at its paired interval's low end, before calibrate says the
#: items are too few to tell
CAUTION = 0.05


def caution(calibration: Calibration) -> str | None:
    """What the run's items cannot rule out about the choice, when its paired interval against the best single
    reading reaches further below than `CAUTION`; with how many items would narrow it to that (the interval
    shrinks as one over the root of the items)."""
    c = calibration.chosen
    mean, low, high = c.difference
    if c.escalate == calibration.best or not math.isfinite(low) or low >= -CAUTION:
        return None
    half = (high - low) / 2
    needed = math.ceil(calibration.items * (half / CAUTION) ** 2) if half > 0 else calibration.items
    return (f"on {calibration.items} items the choice may score as much as {-low:.2f} below {calibration.best} "
            f"(its paired interval is {mean:+.2f} [{low:+.2f}, {high:+.2f}]); about {needed} accepted pairs would "
            f"narrow that to ±{CAUTION:g}")


def _outcomes(records: Sequence[dict[str, Any]], metric: str, patterns: Sequence[str]
              ) -> dict[str, dict[str, Outcome]]:
    """item -> kind -> outcome, each kind's first pattern in the run's order."""
    first: dict[str, str] = {}
    for name in patterns:
        kind = next((str(r.get("kind")) for r in records if r["pattern"] == name), "")
        first.setdefault(kind, name)
    out: dict[str, dict[str, Outcome]] = {}
    for r in records:
        kind = str(r.get("kind"))
        value = metric_value(r, metric)
        if first.get(kind) != r["pattern"] or value is None or kind not in ("rag", *SECOND):
            continue
        seconds = float((r.get("stats") or {}).get("total_seconds", r.get("seconds", 0.0)))
        out.setdefault(f"{r['task']}\t{r['item_id']}", {})[kind] = Outcome(value, seconds, r.get("signals") or {})
    return out


def _stands(signals: dict[str, Any], support: float, question: float, sentences: int = 1) -> bool:
    if signals.get("abstains") or signals.get("gathers"):
        return False
    held = signals.get("support") if sentences == 2 else signals.get("single_support", signals.get("support"))
    return (held or 0.0) >= support and (signals.get("topic") or 0.0) >= question


def _difference(values: Sequence[float], best: Sequence[float]) -> tuple[float, float, float]:
    diffs = [a - b for a, b in zip(values, best, strict=True)]
    low, high = bootstrap(diffs) if len(diffs) > 1 else (diffs[0], diffs[0])
    return sum(diffs) / len(diffs), low, high


def candidates(items: list[dict[str, Outcome]], second_kinds: Sequence[str], best: str) -> list[Candidate]:
    """Every setting worked out on ``items`` (each holding rag and every kind of ``second_kinds``)."""
    best_scores = [item[best].score for item in items]
    rag = [item["rag"] for item in items]
    out = [Candidate("rag", 0.0, 0.0, 1, sum(o.score for o in rag) / len(rag),
                     sum(o.seconds for o in rag) / len(rag), 0,
                     _difference([o.score for o in rag], best_scores))]
    for second in second_kinds:
        for support, question, sentences in product(SUPPORT_GRID, QUESTION_GRID, SENTENCES):
            keep = [_stands(o.signals, support, question, sentences) for o in rag]
            scores = [o.score if k else item[second].score for o, k, item in zip(rag, keep, items, strict=True)]
            seconds = [o.seconds + (0.0 if k else item[second].seconds)
                       for o, k, item in zip(rag, keep, items, strict=True)]
            out.append(Candidate(second, support, question, sentences, sum(scores) / len(scores),
                                 sum(seconds) / len(seconds), keep.count(False), _difference(scores, best_scores)))
    return out


def _table_options(info: dict[str, Any], kinds: Sequence[str]) -> dict[str, Any]:
    """The options of the run's pattern tables of ``kinds`` (the first of each) that auto takes: the readings
    were measured with them."""
    fields = set(AutoOptions.model_fields)
    out: dict[str, Any] = {}
    for kind in reversed(kinds):  # rag's own last: its answer length is the one that stands
        tables: list[dict[str, Any]] = (info.get("config") or {}).get("patterns", [])
        table = next((t for t in tables if t.get("kind") == kind), {})
        out.update({k: v for k, v in table.items() if k in fields})
    return out


def calibrate(run: str | Path, home: str | Path | None = None) -> Calibration:
    """Choose auto's setting from a run (see the module doc).

    Raises:
        UserError: no such run, no rag answers with the router's signals, or no reading to escalate to.
    """
    folder = find_run(run, home)
    data = load_run(folder)
    model = ((data.info.get("models") or {}).get("generator") or {}).get("name")
    if not model:
        raise UserError(f"{folder} does not say which model answered (run.json has no models.generator.name); "
                        "calibrate a run made by 'marginalia bench run'")
    records = [r for r in data.records if r.get("scoring", "qa") == "qa"]
    metric = primary_metric(records) if records else "contains"

    table = _outcomes(records, metric, pattern_order(data))
    second_kinds = [k for k in SECOND if any(k in item for item in table.values())]
    items = [item for item in table.values() if "rag" in item and all(k in item for k in second_kinds)]
    if not any(item["rag"].signals for item in items):
        raise UserError(f"{folder}'s rag answers keep no router signals; answer the run's items again with rag "
                        "on this version ('marginalia bench run' keeps them) and calibrate that run")
    if not second_kinds:
        raise UserError(f"{folder} has no wim or lc answers on its rag items; add a wim (and an lc) pattern to "
                        "the run's config so that calibration can weigh escalating to it")
    singles = {k: (sum(i[k].score for i in items) / len(items), sum(i[k].seconds for i in items) / len(items))
               for k in ("rag", *second_kinds)}
    best = max(singles, key=lambda k: (singles[k][0], -singles[k][1]))
    found = candidates(items, second_kinds, best)
    within = [c for c in found if c.within] or [max(found, key=lambda c: c.score)]
    chosen = min(within, key=lambda c: (c.seconds, -c.score, c.support_threshold, c.question_threshold,
                                        c.support_sentences))
    options = {**_table_options(data.info, ["rag", chosen.escalate]), "escalate": chosen.escalate}
    if chosen.escalate != "rag":
        options.update(support_threshold=chosen.support_threshold, question_threshold=chosen.question_threshold,
                       support_sentences=chosen.support_sentences)
    AutoOptions.build(**options)  # a profile that could not be read back is refused here
    return Calibration(folder.name, str(model), len(items), metric, singles, best, chosen, options)


def profile_of(calibration: Calibration) -> Any:
    """The reading profile a calibration makes (`app.profiles.Profile`)."""
    from ..app.profiles import Profile

    c = calibration
    return Profile(model=c.model, run=c.run, made=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                   options=c.options,
                   measured={"items": c.items, "metric": c.metric, "best": c.best,
                             "singles": {k: {"score": round(s, 4), "seconds": round(t, 3)}
                                         for k, (s, t) in c.singles.items()},
                             "auto": {"score": round(c.chosen.score, 4), "seconds": round(c.chosen.seconds, 3),
                                      "escalated": c.chosen.escalated,
                                      "difference": [round(x, 4) if math.isfinite(x) else None
                                                     for x in c.chosen.difference]}})
