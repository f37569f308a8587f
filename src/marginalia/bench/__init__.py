"""Benchmarking ways of reading: datasets, task builders, runner, metrics, judge and report.

The harness as a library (what ``marginalia bench`` runs), loaded when a name is first asked for:

- runs: `load_config`, `run_benchmark`, `run_jobs` (the same run on worker processes), `pattern_record` (a
  config's pattern table as its options record);
- run folders: `runs_dir`, `RESULTS`, `read_results`, `read_run_info`, `stored_config` (a run's stored config
  as a config again);
- tasks: `build_items` (a task's items for a tokenizer);
- scores: `score_item` (by the item's metric), `qa_scores`, `holds_answer`, `normalize_answer`, `is_yes_no_gold`,
  `says_neither_yes_nor_no`;
  `bootstrap` and `wilson` intervals;
- judges of answers: `ModelJudge` (a JSON verdict), `ProbabilityJudge` (the model's P(YES)), `yes_no_verdict`
  (a yes/no question settled by rule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import load_config, pattern_record
    from .folder import RESULTS, read_results, read_run_info, runs_dir, stored_config
    from .jobs import run_jobs
    from .judge import ModelJudge, ProbabilityJudge, yes_no_verdict
    from .metrics import (
        holds_answer,
        is_yes_no_gold,
        normalize_answer,
        qa_scores,
        says_neither_yes_nor_no,
        score_item,
    )
    from .runner import run_benchmark
    from .statistics import bootstrap, wilson
    from .tasks import build_items

_LAZY = {
    "load_config": "config",
    "pattern_record": "config",
    "run_benchmark": "runner",
    "run_jobs": "jobs",
    "runs_dir": "folder",
    "RESULTS": "folder",
    "read_results": "folder",
    "read_run_info": "folder",
    "stored_config": "folder",
    "build_items": "tasks",
    "qa_scores": "metrics",
    "score_item": "metrics",
    "holds_answer": "metrics",
    "normalize_answer": "metrics",
    "is_yes_no_gold": "metrics",
    "says_neither_yes_nor_no": "metrics",
    "bootstrap": "statistics",
    "wilson": "statistics",
    "ModelJudge": "judge",
    "ProbabilityJudge": "judge",
    "yes_no_verdict": "judge",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "RESULTS", "ModelJudge", "ProbabilityJudge", "bootstrap", "build_items", "holds_answer", "is_yes_no_gold",
    "load_config", "normalize_answer", "pattern_record", "qa_scores", "read_results", "read_run_info",
    "run_benchmark", "run_jobs", "runs_dir", "says_neither_yes_nor_no", "score_item", "stored_config", "wilson",
    "yes_no_verdict",
]
