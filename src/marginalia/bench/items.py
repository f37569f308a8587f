"""The benchmark item: one question over one built context, given to every pattern alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Passage:
    """A titled piece of text from a dataset: a gold paragraph or a distractor."""

    text: str
    title: str = ""
    gold: bool = False


@dataclass(frozen=True)
class Example:
    """A dataset question before a context is built around it.

    ``passages`` holds the item's own paragraphs (gold and, where the dataset has them, distractors);
    a task builder adds more distractors from a pool to reach a target length.
    """

    id: str
    dataset: str  # squad | squad2 | hotpotqa | nq | multihop | babilong | niah | cwe | own
    question: str
    answers: tuple[str, ...]  # any of these is right; empty for an unanswerable question
    passages: tuple[Passage, ...] = ()
    context: str | None = None  # datasets that come with a ready context (BABILong)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Item:
    """A question over a context built to a target length, with the gold placed at a depth.

    ``passage_spans`` are the character spans of the passages joined into ``context`` (in order);
    ``gold_spans`` the subset that holds the gold. ``scoring`` names the metric family:
    ``qa`` (exact match / F1 against any of ``answers``) or ``set`` (set F1: ``answers`` is the set).
    """

    id: str  # stable across runs: dataset, example id, target length, depth, seed
    task: str
    example_id: str
    question: str
    answers: tuple[str, ...]
    context: str
    context_tokens: int
    target_tokens: int | None = None
    depth: float | None = None  # where the (first) gold passage starts, 0.0 (top) .. 1.0 (bottom)
    distractor_fraction: float | None = None  # size sweeps: the share of the budget filled with distractors
    gold_spans: tuple[tuple[int, int], ...] = ()
    passage_spans: tuple[tuple[int, int], ...] = ()
    scoring: str = "qa"
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskSpec:
    """What to build for one task in a run config (the ``[[tasks]]`` tables of the TOML).

    ``dataset`` is one of: squad, squad2, hotpotqa, nq, multihop, babilong, niah, cwe, own.
    ``path`` is the dataset file (for niah: the filler haystack JSONL; for cwe: unused; for own: the reviewed
    QA file). ``pool`` optionally names a JSONL of texts used as extra distractors. Contexts are built for every
    target length x depth (or x distractor fraction, for a size sweep); ``limit`` caps examples per task.
    """

    dataset: str
    path: str | None = None
    pool: str | None = None
    limit: int = 10
    lengths: tuple[int, ...] = (4096,)
    depths: tuple[float, ...] = (0.5,)
    distractor_fractions: tuple[float, ...] = ()  # non-empty: a size sweep instead of a depth sweep
    seed: int = 0
    name: str = ""  # how results and reports call this task; defaults to ``dataset``
    options: dict[str, Any] = field(default_factory=dict)  # dataset-specific knobs (e.g. cwe word counts)

    def depths_of(self, number: int) -> tuple[float, ...]:
        """The depths example ``number`` (0-based, in build order) is built at: all of them, or with the option
        ``rotate_depths`` one, the depths taken in turn."""
        if self.options.get("rotate_depths") and self.depths:
            return (self.depths[number % len(self.depths)],)
        return self.depths
