"""Evaluation jobs: the readings a client names, each run on a collection's accepted QA pairs in the
background, scored against the pairs' answers, one job at a time.

A job answers pair by pair, reading by reading; each answer is one job of the model's worker (see
`qa_jobs.worker_gate`), so the page's own questions wait for one answer at most, never for a whole run.
A reading that fails (a context too long for ``lc``, a model error) is marked failed with its message and
the job goes on with the next reading. Each reading's result holds every answer with its scores (token F1
and "contains", `bench.metrics.qa_scores`: an unanswerable pair is right when the reading abstains), the
mean of each score with its 95% interval (`bench.statistics.estimate`) and the seconds per answer, timed
from the moment the worker starts it (waiting in the worker's queue aside).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..bench.metrics import qa_scores
from ..bench.recommend import recommend, score_interval
from ..bench.statistics import bootstrap, estimate
from .boards import BackgroundJob, Board, new_id
from .errors import describe, log

#: the scores kept per answer and summarised per reading
SCORES = ("f1", "contains")


@dataclass(frozen=True)
class Answered:
    """One reading's answer to one pair: its text, the seconds it took, and auto's route (else None)."""

    text: str
    seconds: float
    route: str | None = None


#: answers a question with a reading (by pattern name), in the model's worker
AnswerFn = Callable[[str, str], Answered]


@dataclass
class EvalJob(BackgroundJob):
    """One evaluation job (mutated by the job's thread under the board's lock)."""

    patterns: list[str]
    pairs: list[dict[str, Any]]
    answers_done: int = 0
    readings: list[dict[str, Any]] = field(default_factory=list)
    #: the recommendation lines (`recommendations`), worked out as each answer is scored, not at each poll
    recommended: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.readings = [{"pattern": p, "status": "queued", "n": 0, "answers": [], "error": None,
                          **{s: None for s in SCORES}, "seconds_per_answer": None} for p in self.patterns]

    def to_dict(self, detail: bool = True) -> dict[str, Any]:
        """The job; ``detail``: with every reading's answers."""
        readings = [{**r, "answers": list(r["answers"])} if detail else
                    {k: v for k, v in r.items() if k != "answers"} for r in self.readings]
        return {"id": self.id, "collection": self.collection, "patterns": list(self.patterns), "status": self.status,
                "pairs": len(self.pairs), "answers_done": self.answers_done,
                "answers_total": len(self.pairs) * len(self.patterns),
                "readings": readings, "recommendations": list(self.recommended),
                "error": self.error, "created_at": self.created_at, "finished_at": self.finished_at}


def gold_answers(pair: dict[str, Any]) -> tuple[str, ...]:
    """The answers a pair accepts: none for an unanswerable one (the reading should abstain)."""
    return () if pair.get("kind") == "unanswerable" else (str(pair["answer"]),)


def summary(answers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A reading's scores over its answers: each score's mean with its 95% interval, and seconds per answer."""
    out: dict[str, Any] = {"n": len(answers)}
    for name in SCORES:
        est = estimate([a[name] for a in answers])
        out[name] = {"mean": est.mean, "low": est.low, "high": est.high} if answers else None
    out["seconds_per_answer"] = sum(a["seconds"] for a in answers) / len(answers) if answers else None
    return out


def recommendations(readings: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per kind of question, the cheapest reading whose "contains" score is within the best reading's paired
    95% interval on the pairs both answered (`bench.recommend.recommend`, as `bench report` opens with)."""
    out = []
    kinds = dict.fromkeys(a["kind"] for r in readings for a in r["answers"])
    for kind in kinds:
        answers = {r["pattern"]: [a for a in r["answers"] if a["kind"] == kind] for r in readings}
        scores = {p: {a["pair"]: float(a["contains"]) for a in got} for p, got in answers.items() if got}
        seconds = {p: sum(a["seconds"] for a in got) / len(got) for p, got in answers.items() if got}
        found = recommend(kind, scores, seconds, bootstrap, score_interval)
        if found is not None:
            out.append({"kind": kind, "best": found.best, "reading": found.chosen, "text": found.text()})
    return out


class EvalJobBoard(Board[EvalJob]):
    """Evaluation jobs (see `Board`)."""

    def __init__(self, keep: int) -> None:
        super().__init__(keep, "evaluation job", "eval-job")

    def submit(self, collection: str, patterns: Sequence[str], pairs: Sequence[dict[str, Any]],
               answer: AnswerFn) -> dict[str, Any]:
        """Queue a job that answers every pair with every pattern (``answer`` runs one in the model's worker)."""
        job = EvalJob(new_id(), collection, list(patterns), list(pairs))

        def work() -> None:
            for reading in job.readings:
                self._read(job, reading, answer)

        return self.start(job, work)

    def _read(self, job: EvalJob, reading: dict[str, Any], answer: AnswerFn) -> None:
        """Answer every pair with one reading; its failure is the reading's, the job goes on."""
        with self._lock:
            reading["status"] = "running"
        for pair in job.pairs:
            try:
                got = answer(reading["pattern"], pair["question"])
            except Exception as exc:  # noqa: BLE001 - the reading's failure, shown with its message
                status, code, message = describe(exc)
                if status == 500:
                    log.error("reading %s of an evaluation on %s failed", reading["pattern"], job.collection,
                              exc_info=exc)
                with self._lock:
                    reading.update(status="failed", error={"code": code, "message": message})
                    job.answers_done += len(job.pairs) - len(reading["answers"])
                return
            scores = qa_scores(got.text, gold_answers(pair))
            record = {"pair": pair["id"], "kind": pair.get("kind", "single"), "question": pair["question"],
                      "gold": pair["answer"], "answer": got.text, "route": got.route,
                      "seconds": round(got.seconds, 4), **{s: scores[s] for s in SCORES}}
            with self._lock:
                reading["answers"].append(record)
                reading.update(summary(reading["answers"]))
                job.recommended = recommendations(job.readings)
                job.answers_done += 1
        with self._lock:
            reading["status"] = "done"
