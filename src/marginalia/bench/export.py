"""Runs without their texts: `export_run` copies a run folder's results keeping every number, verdict and
id but no text of the documents, questions, gold answers, answers or margins; `import_run` makes such a copy
a run folder again, so that ``bench run`` resumes it (skipping what it holds) and ``bench report`` reports
it with the answers added since.

What it is for: sharing or publishing the results of a run on documents that may not be passed on, and
carrying a long run from one machine to the next (the text-free copy can live in a repository; the data
cannot). What the report needs of the texts is worked out before they are dropped and kept under
``text_free`` (is the question's gold telling, is it a yes/no question, does the answer say neither) and,
per margin, ``holds_answer``, ``repeat`` and ``same_as`` (the first margin written with the same words).
The report reads those where the texts are missing; a model
judge cannot judge a text-free answer again (its verdict is kept as exported, and `rejudge` refuses a judge
that has not judged it), nor can a later metric fix score it again (its scores stay as exported).

Fields are kept by name (a new text field added to results one day stays out until it is named here).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..app import REPEAT_REASON
from ..errors import UserError
from ..files import append_line, atomic_write_json, atomic_write_lines
from .folder import DISAGREEMENTS, RESULTS, RUN_INFO, Key, locked, read_results, result_key
from .metrics import bearing_is_telling, holds_answer, is_yes_no_gold, same_words, says_neither_yes_nor_no

#: the key a text-free record carries (what the report reads in place of the texts)
TEXT_FREE = "text_free"

#: the record fields kept as they are: ids, positions, counts, scores, costs, times
KEPT = ("schema", "task", "item_id", "example_id", "pattern", "kind", "target_tokens", "context_tokens", "depth",
        "distractor_fraction", "scoring", "gold_spans", "status", "needed", "window", "scores", "stored_scores",
        "stats", "segments_read", "segments_total", "margins_kept", "route", "signals", "seconds", "finished")
#: each margin's fields kept as they are
MARGIN_KEPT = ("segment", "kept", "score", "evidence", "read_to")
#: a verdict's fields kept (its reason may quote the answer)
JUDGE_KEPT = ("verdict", "attempts", "by", "seconds")


def is_text_free(record: Mapping[str, Any]) -> bool:
    return TEXT_FREE in record


def strip_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record without its texts, with what the report needs of them (see the module doc); a record
    already text-free comes back as it is."""
    if is_text_free(record):
        return dict(record)
    answers = [str(a) for a in record.get("answers") or []]
    question = str(record.get("question") or "")
    prediction = record.get("prediction")
    out = {k: record[k] for k in KEPT if k in record}
    out[TEXT_FREE] = {
        "telling": bearing_is_telling(question, answers),
        "yes_no": is_yes_no_gold(answers),
        "neither": says_neither_yes_nor_no(prediction, answers) if isinstance(prediction, str) else None,
    }
    if isinstance(record.get("error"), str):  # the exception's name; its message may quote the input
        out["error"] = record["error"].split(":", 1)[0]
    if isinstance(record.get("judge"), Mapping):
        out["judge"] = {k: record["judge"][k] for k in JUDGE_KEPT if k in record["judge"]}
    elif "judge" in record:
        out["judge"] = record["judge"]
    if isinstance(record.get("margins"), list):
        texts = [str(m.get("text") or "") for m in record["margins"]]
        out["margins"] = [{**{k: m[k] for k in MARGIN_KEPT if k in m},
                           "holds_answer": holds_answer(text, answers),
                           "repeat": m.get("reason") == REPEAT_REASON,
                           **({"same_as": first} if first != i else {})}
                          for i, (m, text, first) in enumerate(zip(record["margins"], texts, same_words(texts),
                                                                   strict=True))]
    elif "margins" in record:
        out["margins"] = record["margins"]  # schema 1: a count
    if isinstance(record.get("samples"), list):
        out["samples"] = [{k: s[k] for k in ("seed", "mean_f1") if k in s} for s in record["samples"]]
    return out


def _latest(records: Iterable[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    latest: dict[Key, dict[str, Any]] = {}
    for record in records:
        latest[result_key(record)] = record
    return latest


def _disagreements(folder: Path) -> list[dict[str, Any]]:
    """The folder's judge disagreements, each without its texts (which result, and how they disagree)."""
    path = folder / DISAGREEMENTS
    lines = read_results(path) if path.is_file() else []
    return [{k: line[k] for k in ("kind", "task", "item_id", "pattern", "scores") if k in line} for line in lines]


def _info_of(folder: Path) -> dict[str, Any]:
    path = folder / RUN_INFO
    if not path.is_file():
        return {}
    try:
        info = json.loads(path.read_text("utf-8"))
    except ValueError as exc:
        raise UserError(f"{path} is not JSON ({exc}); it is not a run folder's {RUN_INFO}") from None
    return info if isinstance(info, dict) else {}


def _check_same_run(ours: Mapping[str, Any], theirs: Mapping[str, Any], a: Path, b: Path) -> None:
    """Refuse to merge two folders whose runs were made from different configs."""
    mine, other = ours.get("config"), theirs.get("config")
    if mine and other and _essentials(mine) != _essentials(other):
        raise UserError(f"{a} and {b} hold runs of different configs (their tasks or model differ); "
                        "export to an empty folder, or import into a run of another name (--name)")


def _essentials(config: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes two runs' answers one run's: the model and the tasks' data and sizes (not their limits, which a
    resumed run may raise, nor the patterns, which a config may add to)."""
    tasks = [{k: v for k, v in t.items() if k not in ("limit", "path")} for t in config.get("tasks", [])]
    return config.get("model"), tasks


def export_run(folder: Path, dest: Path, say: Callable[[str], None] = lambda _: None) -> int:
    """Write the text-free copy of the run in ``folder`` to ``dest`` (results.jsonl and run.json). Results
    ``dest`` already holds and the run lacks are kept (a run imported from there and resumed here adds to
    it). Returns the number of results written."""
    if not (folder / RESULTS).is_file():
        raise UserError(f"{folder} holds no {RESULTS}; nothing to export")
    if dest.exists() and not dest.is_dir():
        raise UserError(f"{dest} is a file; give a folder to write the copy in")
    dest.mkdir(parents=True, exist_ok=True)
    info = _info_of(folder)
    there = _info_of(dest)
    _check_same_run(info, there, folder, dest)
    # no lock: a run appends whole lines, and a line it is still writing is left out (read_results), so a run
    # in progress can be exported as far as it got
    ours = _latest(read_results(folder / RESULTS))
    our_lines = _disagreements(folder)
    theirs = _latest(read_results(dest / RESULTS)) if (dest / RESULTS).is_file() else {}
    merged = {**theirs, **ours}
    records = [strip_record(r) for r in merged.values()]
    atomic_write_lines(dest / RESULTS, records)
    kept_lines = [line for line in _disagreements(dest) if result_key(line) not in ours]
    atomic_write_lines(dest / DISAGREEMENTS, [*kept_lines, *our_lines])
    atomic_write_json(dest / RUN_INFO, info or there)  # config, commits, models, machine: no data text
    say(f"{len(records)} results written to {dest / RESULTS} without their texts "
        f"({len(ours)} from {folder}, {len(set(theirs) - set(ours))} kept from the earlier copy)")
    return len(records)


def _check_export(source: Path) -> None:
    if not (source / RESULTS).is_file():
        raise UserError(f"{source} holds no {RESULTS}; give the folder 'marginalia bench export' wrote")


def exported_name(source: Path) -> str:
    """The name of the run a text-free copy was exported from (its config's)."""
    _check_export(source)
    name = (_info_of(source).get("config") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise UserError(f"{source / RUN_INFO} does not name the run; give --name NAME or --out DIR")
    return name


def import_run(source: Path, folder: Path, say: Callable[[str], None] = lambda _: None) -> int:
    """Add the results of a text-free copy (``source``) to the run folder ``folder`` (made if missing), so
    that ``bench run`` skips them; the run's own results win over the copy's. Returns how many were added."""
    _check_export(source)
    theirs = _latest(read_results(source / RESULTS))
    folder.mkdir(parents=True, exist_ok=True)
    info, there = _info_of(folder), _info_of(source)
    _check_same_run(info, there, folder, source)
    with locked(folder, "wait for the run to finish or stop it, then import"):
        ours = _latest(read_results(folder / RESULTS, repair=True)) if (folder / RESULTS).is_file() else {}
        added = [strip_record(r) for key, r in theirs.items() if key not in ours]
        atomic_write_lines(folder / RESULTS, [*ours.values(), *added])
        new_lines = [line for line in _disagreements(source) if result_key(line) not in ours]
        if new_lines:
            with (folder / DISAGREEMENTS).open("a", encoding="utf-8") as f:
                for line in new_lines:
                    append_line(f, line)
        if not info and there:
            atomic_write_json(folder / RUN_INFO, dict(there))
    say(f"{len(added)} results added to {folder / RESULTS} from {source} ({len(ours)} were there)")
    return len(added)
