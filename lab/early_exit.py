"""Automatic early exit: summarise a `marginalia bench run lab/configs/early_exit.toml` run.

The run answers the same items twice with WiM: reading to the end (`wim`) and stopping once a margin is
judged relevant with at least the options' ``stop_at_score`` (`wim-exit`). Per task: answers right (by
`contains`, with a 95% Wilson interval), context tokens prefilled and segments read per answer, seconds
per answer, and the paired view on the same items (how many answers changed from right to wrong and back).
A second table reads the full readings' margins again: for other thresholds, where reading would have stopped
(the first margin kept with at least that score) and whether that margin holds a gold answer; the answers at
those stops are not written, so that table says what a threshold saves, not how it answers.

    marginalia bench run lab/configs/early_exit.toml
    python lab/early_exit.py [RUN]      (default: the run named "early_exit" under the home directory)
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from typing import Any

from _lab_common import finish, load_run

FULL, EXIT = "wim", "wim-exit"


def right(r: dict[str, Any]) -> bool:
    return r["status"] == "ok" and r["scores"]["contains"] >= 1.0


THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9)


def stop_at(record: dict[str, Any], threshold: float) -> int | None:
    """The index of the margin a reading would have stopped after at ``threshold``, or None: the first margin
    kept with a score of at least ``threshold``, as WiM's ``stop_at_score`` stops."""
    return next((i for i, m in enumerate(record["margins"]) if m["kept"] and (m.get("score") or 0.0) >= threshold),
                None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default=None, help="a run folder (default: <home>/bench/runs/early_exit)")
    ap.add_argument("--note", action="append", default=[], help="a line to add under the tables (e.g. how far "
                    "the run got)")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave lab/findings alone")
    args = ap.parse_args()
    from marginalia.bench import holds_answer, wilson

    records, info, commit = load_run(args.run, "early_exit", "lab/configs/early_exit.toml")
    threshold = next((p.get("stop_at_score") for p in info.get("config", {}).get("patterns", [])
                      if p.get("name") == EXIT), None)
    by: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in records:
        by[(r["task"], r["pattern"])][r["item_id"]] = r
    rows, notes = [], []
    for task in sorted({t for t, _ in by}):
        full, early = by[(task, FULL)], by[(task, EXIT)]
        items = sorted(set(full) & set(early))
        if not items:
            continue
        for name, cell in ((FULL, full), (EXIT, early)):
            rs = [cell[i] for i in items]
            ok = [r for r in rs if r["status"] == "ok"]
            k = sum(right(r) for r in rs)
            lo, hi = wilson(k, len(rs))
            known = [r["stats"]["prefilled_context_tokens"] for r in ok
                     if r["stats"]["prefilled_context_tokens"] is not None]  # None: a server that did not say
            tokens = f"{statistics.median(known):.0f}" if known else "–"
            read = statistics.mean(r["segments_read"] / max(1, r["segments_total"]) for r in ok) if ok else 0
            stopped = sum(r["segments_read"] < r["segments_total"] for r in ok)
            seconds = statistics.median(r["seconds"] for r in ok) if ok else 0
            rows.append(f"| {task} | {name} | {k}/{len(rs)} ({lo:.2f}–{hi:.2f}) | {tokens} | {read:.2f} | "
                        f"{stopped} | {seconds:.0f} |")
        lost = sum(right(full[i]) and not right(early[i]) for i in items)
        gained = sum(right(early[i]) and not right(full[i]) for i in items)
        saved = [1 - early[i]["stats"]["prefilled_context_tokens"] / full[i]["stats"]["prefilled_context_tokens"]
                 for i in items if full[i]["status"] == "ok" and early[i]["status"] == "ok"
                 and full[i]["stats"]["prefilled_context_tokens"]
                 and early[i]["stats"]["prefilled_context_tokens"] is not None]
        notes.append(f"- {task}, {len(items)} items: early exit read {statistics.mean(saved) * 100 if saved else 0:.0f}% "
                     f"fewer context tokens on average; answers right with full reading and wrong with early exit: "
                     f"{lost}; the other way round: {gained}.")
    sweep = []
    for task in sorted({t for t, _ in by}):
        readings = [r for r in by[(task, FULL)].values() if r["status"] == "ok" and r.get("margins")]
        for t in THRESHOLDS:
            stops = [stop_at(r, t) for r in readings]
            fired = [(r, s) for r, s in zip(readings, stops, strict=True) if s is not None]
            read = statistics.mean((r["margins"][s]["segment"] + 1 if s is not None else r["segments_total"])
                                   / max(1, r["segments_total"])
                                   for r, s in zip(readings, stops, strict=True)) if readings else 0
            on_answer = sum(holds_answer(r["margins"][s]["text"], r["answers"]) for r, s in fired)
            sweep.append(f"| {task} | {t:.2f} | {len(fired)}/{len(readings)} | {on_answer}/{len(fired)} | {read:.2f} |")
    cfg = info.get("config", {})
    lengths = sorted({n for t in cfg.get("tasks", []) for n in t.get("lengths", [])})
    segment = next((p.get("segment_tokens") for p in cfg.get("patterns", []) if p.get("name") == EXIT), None)
    model = info.get("models", {}).get("generator", {}).get("spec", "?")
    body = "\n".join([
        "## Automatic early exit (`lab/early_exit.py`)",
        "",
        f"Run: `marginalia bench run lab/configs/early_exit.toml` then `python lab/early_exit.py` · run "
        f"commit {commit} · model `{model}` on llama.cpp in process, WiM with {segment}-token segments and the "
        f"default `grounded` judge; `wim-exit` stops reading once a margin is judged relevant with a score of at "
        f"least {threshold}. Contexts of {', '.join(map(str, lengths))} tokens, gold at several depths. "
        f"{len(records)} answers. Right = the gold answer is contained in the answer; intervals are 95% Wilson "
        "intervals.",
        "",
        "| task | pattern | right | context tokens prefilled (median) | share of segments read (mean) | "
        "stopped early | s/answer (median) |",
        "|---|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
        *notes,
        "",
        "Other thresholds, read from the full readings' margins (the judge's scores as written; no answers "
        "written at these stops): readings that would have stopped, how many of those stops are on a margin "
        "holding a gold answer, and the share of segments read.",
        "",
        "| task | stop at score | stopped | on a margin with the answer | share of segments read (mean) |",
        "|---|---:|---:|---:|---:|",
        *sweep,
        *([""] if args.note else []),
        *(f"- {note}" for note in args.note),
    ])
    finish("early_exit", body, write=not args.no_write)


if __name__ == "__main__":
    main()
