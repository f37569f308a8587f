"""The recommendation a run gives: for each kind of question, the cheapest reading whose score is within the
best reading's paired 95% interval, beside each reading's score and seconds per answer.

"Within" means the paired bootstrap interval of the reading's score minus the best one's, on the items both
answered, reaches zero: on these items the run cannot tell it apart from the best. Of those, the one with the
fewest seconds per answer is named.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .analysis import RunData, cost_rows, in_order, metric_value, primary_metric
from .statistics import bootstrap, estimate

#: a percentile interval of the mean of some values
Interval = Callable[[Sequence[float]], tuple[float, float]]


@dataclass(frozen=True)
class Scored:
    """One reading of one kind of question: its mean score and that score's 95% interval, seconds per answer,
    and its paired difference from the best reading (mean, low, high; None for the best itself)."""

    reading: str
    items: int
    score: float
    low: float
    high: float
    seconds: float | None
    difference: tuple[float, float, float] | None = None

    @property
    def within(self) -> bool:
        """Within the best reading's paired interval (the best itself is)."""
        return self.difference is None or self.difference[2] >= 0.0


@dataclass(frozen=True)
class Recommendation:
    """The cheapest reading within the best one's interval for one kind of question."""

    kind: str
    best: str
    chosen: str
    readings: tuple[Scored, ...]

    def line(self) -> str:
        """One line of markdown: the choice, then each reading's score and seconds per answer."""
        return "- " + self.text(lambda name: f"**{name}**")

    def text(self, strong: Callable[[str], str] = str) -> str:
        """The line as plain text (``strong`` marks the kind and the reading chosen)."""
        chosen = next(r for r in self.readings if r.reading == self.chosen)
        if self.chosen == self.best:
            why = "the best score"
        else:
            mean, low, high = chosen.difference or (math.nan, math.nan, math.nan)
            why = f"within {self.best}'s interval ({mean:+.2f} [{low:+.2f}, {high:+.2f}] paired)"
        each = "; ".join(f"{r.reading} {r.score:.2f} at {_seconds(r.seconds)}" for r in self.readings)
        return (f"{strong(self.kind)}: read with {strong(self.chosen)} ({why}). Each reading: {each} "
                f"({chosen.items} items).")


def _seconds(value: float | None) -> str:
    return "? s" if value is None else f"{value:.1f} s"


def recommend(kind: str, scores: Mapping[str, Mapping[str, float]], seconds: Mapping[str, float | None],
              paired_interval: Interval, score_interval: Interval) -> Recommendation | None:
    """The recommendation for one kind of question.

    Args:
        kind: the kind's name.
        scores: reading -> item -> score.
        seconds: reading -> mean seconds per answer (None where unknown: such a reading is never the cheapest).
        paired_interval: the 95% interval of a mean difference (a paired bootstrap).
        score_interval: the 95% interval of a mean score.

    Returns:
        None when no reading has a score.
    """
    readings = [name for name, values in scores.items() if values]
    if not readings:
        return None
    means = {name: sum(scores[name].values()) / len(scores[name]) for name in readings}
    best = max(readings, key=lambda name: (means[name], -(seconds.get(name) or math.inf)))
    scored = []
    for name in readings:
        low, high = score_interval(list(scores[name].values()))
        difference = None
        if name != best:
            shared = [item for item in scores[name] if item in scores[best]]
            diffs = [scores[name][item] - scores[best][item] for item in shared]
            if diffs:
                d_low, d_high = paired_interval(diffs) if len(diffs) > 1 else (diffs[0], diffs[0])
                difference = (sum(diffs) / len(diffs), d_low, d_high)
            else:
                difference = (math.nan, -math.inf, -math.inf)  # no shared item: not within
        scored.append(Scored(name, len(scores[name]), means[name], low, high, seconds.get(name), difference))
    candidates = [s for s in scored if s.within and s.seconds is not None] or [s for s in scored if s.reading == best]
    chosen = min(candidates, key=lambda s: (s.seconds if s.seconds is not None else math.inf, -s.score))
    return Recommendation(kind, best, chosen.reading, tuple(scored))


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
    for kind in in_order(question_kind(r) for r in records):
        group = [r for r in records if question_kind(r) == kind]
        metric = primary_metric(group)
        scores = {p: {f"{r['item_id']}": v for r in group if r["pattern"] == p
                      for v in [metric_value(r, metric)] if v is not None} for p in patterns}
        own = {c["pattern"]: c["seconds"] for c in cost_rows(group, patterns)}
        seconds = {p: (v + (own.get(shared[p]) or 0.0) if v is not None and p in shared else v)
                   for p, v in own.items()}

        found = recommend(kind, scores, seconds, bootstrap, score_interval)
        if found is not None:
            out.append(found)
    return out


def score_interval(values: Sequence[float]) -> tuple[float, float]:
    """The 95% interval of a mean score (`statistics.estimate`)."""
    est = estimate(values)
    return est.low, est.high


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
