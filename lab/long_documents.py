"""Documents longer than the window: summarise a `marginalia bench run configs/bench/long.toml` run.

Per task and length: each pattern's answers (right by `contains`, or overflowed), WiM's peak cache tokens
against the window, the context tokens it dropped to make room, and seconds per answer. The goals: NIAH
at least 0.8 at every length, BABILong answered at lengths where long context can only overflow.

    marginalia bench run configs/bench/long.toml
    python lab/long_documents.py [RUN]      (default: the run named "long" under the home directory)
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from typing import Any

from _lab_common import finish, load_run


def bucket(tokens: int) -> str:
    """A length label: the power-of-two thousands a context was built for (7.6k -> 8k, 63k -> 64k)."""
    k = 8
    while k * 1024 < tokens and k < 1024:
        k *= 2
    return f"{k}k"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default=None, help="a run folder (default: <home>/bench/runs/long)")
    ap.add_argument("--note", action="append", default=[], help="a line to add under the table (e.g. how busy "
                    "the machine was while the run was timed)")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave lab/findings alone")
    args = ap.parse_args()
    records, info, commit = load_run(args.run, "long", "configs/bench/long.toml")
    window = info["models"]["generator"]["context_window"]
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        cells[(r["task"], bucket(r["context_tokens"]), r["pattern"])].append(r)
    patterns = sorted({r["pattern"] for r in records})
    rows = []
    for task, length in sorted({(t, n) for t, n, _ in cells}, key=lambda x: (x[0], int(x[1][:-1]))):
        parts = [task, length]
        for p in patterns:
            rs = cells.get((task, length, p), [])
            ok = [r for r in rs if r["status"] == "ok"]
            right = sum(r["scores"]["contains"] >= 1.0 for r in ok)
            over = sum(r["status"] == "overflow" for r in rs)
            parts.append(f"{right}/{len(rs)}" + (f" ({over} overflow)" if over else "") if rs else "not yet")
        wim = [r for r in cells.get((task, length, "wim"), []) if r["status"] == "ok"]
        peak = max((r["stats"]["peak_cache_tokens"] for r in wim), default=0)
        dropped = statistics.median(r["stats"]["dropped_context_tokens"] for r in wim) if wim else 0
        seconds = statistics.median(r["seconds"] for r in wim) if wim else 0
        parts += [str(peak), f"{dropped:.0f}", f"{seconds:.0f}"] if wim else ["–", "–", "–"]
        rows.append("| " + " | ".join(parts) + " |")
    niah = [r for r in records if r["task"] == "niah" and r["pattern"] == "wim"]
    by_length: dict[str, list[float]] = defaultdict(list)
    for r in niah:
        by_length[bucket(r["context_tokens"])].append(r["scores"]["contains"] if r["status"] == "ok" else 0.0)
    niah_line = ", ".join(f"{k}: {statistics.mean(v):.2f} ({len(v)} items)" for k, v in sorted(
        by_length.items(), key=lambda kv: int(kv[0][:-1])))
    goal_lengths = sorted({bucket(n) for t in info["config"]["tasks"] if t["dataset"] == "niah"
                           for n in t["lengths"]}, key=lambda k: int(k[:-1]))
    unmeasured = [k for k in goal_lengths if k not in by_length]
    niah_met = bool(by_length) and not unmeasured and all(statistics.mean(v) >= 0.8 for v in by_length.values())
    niah_verdict = ("not decided: no answer yet at " + ", ".join(unmeasured) + " (the run was stopped before; "
                    "run it again to go on)") if unmeasured else ("met" if niah_met else "NOT met")
    babilong_beyond = [r for r in records if r["task"] == "babilong" and r["pattern"] == "wim"
                       and r["context_tokens"] > window]
    bab_right = sum(r["status"] == "ok" and r["scores"]["contains"] >= 1.0 for r in babilong_beyond)
    body = "\n".join([
        "## Documents longer than the window (`lab/long_documents.py`)",
        "",
        f"Run: `marginalia bench run configs/bench/long.toml` then `python lab/long_documents.py` · run "
        f"commit {commit} · SmolLM2-135M, window {window} tokens, llama.cpp in process; WiM with 512-token "
        f"segments. {len(records)} answers. Few items per cell: a check that long documents are read to the "
        "end, not a quality estimate (no intervals at these counts).",
        "",
        "| task | length | " + " | ".join(f"{p} right" for p in patterns)
        + " | wim peak cache tokens | wim context tokens dropped (median) | wim s/answer |",
        "|---|---|" + "---:|" * (len(patterns) + 3),
        *rows,
        "",
        f"- WiM's cache never held more than the window: peak {max((r['stats']['peak_cache_tokens'] for r in records if r['pattern'] == 'wim' and r['status'] == 'ok'), default=0)} "
        f"of {window} tokens.",
        f"- NIAH with WiM, share right by length: {niah_line or 'no items'} (goal at least 0.8 at every "
        f"length: {niah_verdict}).",
        f"- BABILong beyond the window (long context can only overflow there): WiM right on {bab_right} of "
        f"{len(babilong_beyond)}.",
        *(f"- {note}" for note in args.note),
    ])
    finish("long_documents", body, write=not args.no_write)


if __name__ == "__main__":
    main()
