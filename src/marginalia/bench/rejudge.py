"""Judging a run's answers again (``marginalia bench judge``): another judge replaces the stored verdicts,
resumably, and the disagreements with the lexical scores are written anew."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..errors import UserError
from ..files import atomic_write_json, atomic_write_lines
from .folder import DISAGREEMENTS, JUDGE_ADVICE, RESULTS, RUN_INFO, locked, read_results, timestamp
from .judge import Judge, disagreement_line, judges
from .progress import Progress


@dataclass(frozen=True)
class RejudgeSummary:
    folder: Path
    judged: int  # results judged by this call
    kept: int  # results this judge had judged before (left as they were)
    verdicts: dict[str, int]
    disagreements: int
    seconds: float


def rejudge(folder: Path, judge: Judge, *, err: TextIO | None = None, progress: bool = True,
            save_every: int = 20) -> RejudgeSummary:
    """Judge every answered result of a run folder again with ``judge``, replacing the stored verdicts; answers
    scored as a set (a word list, CWE) are not judged, and a verdict stored on one is removed.

    Results this judge already judged (its name in the verdict) are kept, so an interrupted call resumes;
    results.jsonl is rewritten atomically every ``save_every`` verdicts and at the end (a kill loses at
    most those), and disagreements.jsonl is written anew from all verdicts.

    Raises:
        UserError: a benchmark run is writing to the folder, or the folder holds no results.
    """
    stream = err or sys.stderr
    t0 = time.perf_counter()
    with locked(folder, JUDGE_ADVICE):
        path = folder / RESULTS
        records = read_results(path, repair=True)
        if not records:
            raise UserError(f"{folder} has no results to judge; run the benchmark first")
        for r in records:  # a verdict on a word list (from before `judges`) goes
            if not judges(r.get("scoring")) and r.get("judge"):
                r["judge"] = None
        judged = [i for i, r in enumerate(records) if r.get("status") == "ok" and judges(r.get("scoring"))]
        todo = [i for i in judged if (records[i].get("judge") or {}).get("by") != judge.name]
        textless = [i for i in todo if "text_free" in records[i]]
        if textless:  # judging only the rest would score the run's two parts differently
            raise UserError(f"{len(textless)} answers of {folder} were imported without their texts and not "
                            f"judged by {judge.name}, which cannot judge them now; judge a run with this judge "
                            "before exporting it, on the machine that has its texts")
        kept = len(judged) - len(todo)
        bar = Progress(len(todo), 0, stream, progress)
        bar.log(f"judging {len(todo)} answers in {folder} with {judge.name} ({kept} judged by it before)")
        try:
            for n, i in enumerate(todo, 1):
                r = records[i]
                t_judge = time.perf_counter()
                verdict = judge.judge(r["question"], r.get("answers") or [], r.get("prediction") or "")
                r["judge"] = {**verdict.to_dict(), "by": judge.name,
                              "seconds": round(time.perf_counter() - t_judge, 3)}
                if n % save_every == 0:
                    atomic_write_lines(path, records)
                bar.step(f"{r['task']}/{r['pattern']} {verdict.status}")
        finally:
            atomic_write_lines(path, records)
            lines = [line for line in map(disagreement_line, records) if line is not None]
            atomic_write_lines(folder / DISAGREEMENTS, lines)
            bar.close()
        info_path = folder / RUN_INFO
        if info_path.is_file():
            info = json.loads(info_path.read_text("utf-8"))
            info.setdefault("models", {})["judge"] = {"name": judge.name, "engine": type(judge.generator).__name__}
            info.setdefault("rejudged", []).append({"at": timestamp(), "judge": judge.name, "judged": len(todo)})
            atomic_write_json(info_path, info)
    verdicts: dict[str, int] = {}
    for r in records:
        v = (r.get("judge") or {}).get("verdict")
        if v:
            verdicts[v] = verdicts.get(v, 0) + 1
    return RejudgeSummary(folder, len(todo), kept, verdicts, len(lines), round(time.perf_counter() - t0, 3))
