"""Calibration end to end on documents that no development run read: does a reading profile pay?

Four steps, each resumable (the files live OUTSIDE the repository, under ``--work``, default
``~/.cache/marginalia-calibration``: they hold the documents' texts).

``docs``: WikiText test articles (read before only as composition and index-speed text, never by a QA or
routing run) written as markdown documents, headings as sections.

``pairs``: ``marginalia bench qa-generate`` on them; then every pair whose evidence is found verbatim in its
document and whose question is not a near duplicate of an earlier one is accepted (the rule stands in for a
person's review); the accepted pairs are split in two halves, each kind dealt in turn: ``calibrate.jsonl``
and ``score.jsonl``.

``run --model SPEC``: ``marginalia bench run`` answers both halves with rag, wim and lc; ``bench calibrate``'s
choice (`marginalia.bench.calibrate`) is made from one half's run, and the other half is answered with auto
with the chosen options (as a collection's profile would read), then the other way round: two folds, so that
every pair is scored by a profile not made from it. The profile is set against each fixed reading on the held
half and on both: the goal is a score within 0.02 of the best fixed reading at no more than half of WiM's
seconds per answer. One measurement per model: benchmarks/measurements/calibration-<model>.json.

    python benchmarks/calibration.py docs
    python benchmarks/calibration.py pairs --model gguf:~/.cache/marginalia-eval/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    python benchmarks/calibration.py run --model smollm2
    python benchmarks/calibration.py run --model gguf:~/.cache/marginalia-eval/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import re
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from _common import BENCHMARKS, ROOT, Benchmark, measurement, show
from _markdown import Record, made_by, model_name, num, provenance, ratio, table

from marginalia import bench

DATA = ROOT.parent / "shared" / "data"
WORK = Path.home() / ".cache" / "marginalia-calibration"
#: the articles read: a few thousand tokens each, with sections
ARTICLES = ("Robert Boulter", "Osbert de Bayeux", "Josepha Petrick Kemarre", "Constant k filter", "Dick Rifenburg",
            "2010 Claxton Shield")
HEADING = re.compile(r"^ (=(?: =)*) (.+?) \1 $")
#: WikiText's tokenised punctuation, put back as written
MARKERS = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), (" , ", ", "), (" . ", ". "), (" ; ", "; "),
           (" : ", ": "), ("( ", "("), (" )", ")"), (" 's ", "'s "))
#: the readings compared, as run config tables
READINGS = (
    {"kind": "rag", "top_k": 4, "chunk_tokens": 128},
    {"kind": "wim", "segment_tokens": 512, "judge": "grounded", "margin_tokens": 48},
    {"kind": "lc"},
)
#: the fixed readings, by pattern name
FIXED = tuple(r["kind"] for r in READINGS)
#: the two halves of the accepted pairs (files <half>.jsonl)
HALVES = ("calibrate", "score")
LENGTH = 1536
#: the goal: the profile's score at most this far under the best fixed reading's ...
SCORE_GOAL = 0.02
#: ... at no more than this share of WiM's seconds per answer
SECONDS_GOAL = 0.5


def _clean(line: str) -> str:
    for a, b in MARKERS:
        line = line.replace(a, b)
    return line.strip()


def docs(work: Path) -> list[Path]:
    folder = work / "docs"
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    with open(DATA / "wikitext-test-articles.part1.jsonl", encoding="utf-8") as fh:
        articles = {a["title"]: a for a in map(json.loads, fh)}
    for title in ARTICLES:
        lines = [f"# {_clean(title)}", ""]
        for raw in articles[title]["text"].split("\n"):
            heading = HEADING.match(raw)
            if heading:
                lines += ["#" * heading.group(1).count("=") + " " + _clean(heading.group(2)), ""]
            elif raw.strip():
                lines += [_clean(raw), ""]
        path = folder / (re.sub(r"\W+", "-", title).strip("-").lower() + ".md")
        if not path.is_file() or path.read_text("utf-8") != "\n".join(lines):
            path.write_text("\n".join(lines), "utf-8")
        out.append(path)
    print(f"{len(out)} documents in {folder}", file=sys.stderr)
    return out


def _marginalia(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "marginalia.cli", *args], check=True)


def accept(pairs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Counter[str]]:
    """The pairs the rule accepts: each evidence span found verbatim at its offsets in the document as it is
    now, and a question that is not a near duplicate of one accepted before (qa-generate's own test, here
    across documents too); and why the others were not."""
    from marginalia.bench.qa_writer import similar

    text_of = functools.cache(lambda source: Path(source).read_text("utf-8"))
    kept: list[dict[str, Any]] = []
    refused: Counter[str] = Counter()
    for pair in pairs:
        text = text_of(pair["source"])
        spans = pair.get("evidence_spans") or []
        if not all(text[s["start"]:s["end"]] == s["text"] and s["text"].strip() for s in spans) or (
                pair.get("kind") != "unanswerable" and not spans):
            refused["evidence not found verbatim"] += 1
        elif any(similar(pair["question"], k["question"]) for k in kept):
            refused["near duplicate"] += 1
        else:
            kept.append({**pair, "status": "accepted"})
    return kept, refused


def halves(pairs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Two halves with each kind dealt in turn, in an order fixed by the pairs' ids."""
    a: list[dict[str, Any]] = []
    b: list[dict[str, Any]] = []
    for kind in sorted({p.get("kind", "single") for p in pairs}):
        of_kind = sorted((p for p in pairs if p.get("kind", "single") == kind),
                         key=lambda p: hashlib.sha256(p["id"].encode()).hexdigest())
        for pair in of_kind:
            (a if (len(a) + len(b)) % 2 == 0 else b).append(pair)
    return a, b


def pairs(work: Path, model: str) -> dict[str, Any]:
    paths = docs(work)
    generated = work / "qa.jsonl"
    _marginalia("bench", "qa-generate", *map(str, paths), "--model", model, "--out", str(generated))
    made = [json.loads(line) for line in generated.read_text("utf-8").splitlines() if line.strip()]
    kept, refused = accept(made)
    first, second = halves(kept)
    for name, half in zip(HALVES, (first, second), strict=True):
        (work / f"{name}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in half), "utf-8")
    summary = {"generated": len(made), "accepted": len(kept), "refused": dict(refused),
               "kinds": dict(Counter(p["kind"] for p in kept)), "calibrate": len(first), "score": len(second),
               "generated_by": model, "documents": len(paths), "articles": list(ARTICLES)}
    (work / "pairs.json").write_text(json.dumps(summary, indent=1), "utf-8")
    print(json.dumps(summary), file=sys.stderr)
    return summary


def _toml(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _config(path: Path, name: str, model: str, qa: Path, readings: list[dict[str, Any]]) -> Path:
    lines = [f"name = {_toml(name)}", "seed = 0", f"model = {_toml(model)}", 'embedder = "minilm"',
             "max_new_tokens = 48", "", "[[tasks]]", 'dataset = "own"', f"path = {_toml(str(qa))}",
             "limit = 1000", f"lengths = [{LENGTH}]", "depths = [0.0, 0.5, 1.0]",
             "options = { rotate_depths = true }"]
    for table_ in readings:
        lines += ["", "[[patterns]]", *(f"{k} = {_toml(v)}" for k, v in table_.items())]
    path.write_text("\n".join(lines) + "\n", "utf-8")
    return path


def _slug(model: str) -> str:
    return re.sub(r"\W+", "-", Path(model.split(":", 1)[-1]).stem).strip("-").lower() or "model"


def _per_item(folder: Path) -> dict[str, dict[str, tuple[float, float]]]:
    """pattern -> item -> (contains, seconds) of a finished run."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for r in bench.read_results(folder / bench.RESULTS):
        if r.get("error") or r.get("prediction") is None:
            continue
        seconds = float((r.get("stats") or {}).get("total_seconds", r.get("seconds", 0.0)))
        out.setdefault(r["pattern"], {})[r["item_id"]] = (float(r["scores"]["contains"]), seconds)
    return out


def compared(results: dict[str, dict[str, tuple[float, float]]]) -> dict[str, Any]:
    """The profile against each fixed reading on the items all of them answered: each reading's mean score and
    seconds, the best fixed reading, the profile's paired difference from it, its share of WiM's seconds, and
    whether the goals hold."""
    items = sorted(set.intersection(*(set(v) for v in results.values())))
    readings = {name: {"score": statistics.mean(per[i][0] for i in items),
                       "seconds": statistics.mean(per[i][1] for i in items)} for name, per in results.items()}
    best = max(FIXED, key=lambda k: (readings[k]["score"], -readings[k]["seconds"]))
    diffs = [results["profile"][i][0] - results[best][i][0] for i in items]
    low, high = bench.bootstrap(diffs)
    gap = statistics.mean(diffs)
    share = readings["profile"]["seconds"] / readings["wim"]["seconds"]
    return {"items": len(items), "readings": readings, "best_fixed": best,
            "difference": {"mean": gap, "low": low, "high": high}, "wim_share": share,
            "score_goal_met": gap >= -SCORE_GOAL, "seconds_goal_met": share <= SECONDS_GOAL}


def run(work: Path, model: str) -> dict[str, Any]:
    """Both halves answered with each fixed reading; each half then calibrates the profile the other half is
    answered with (two folds: every pair is scored by a profile not made from it)."""
    from marginalia.bench.calibrate import calibrate

    slug = _slug(model)
    runs = work / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    fixed = [dict(r) for r in READINGS]
    folder = {half: runs / f"{slug}-{half}" for half in HALVES}

    def answer(half: str, readings: list[dict[str, Any]]) -> None:
        # a run keeps its patterns: the profile a finished fold added stays in its config
        named = {r.get("name", r["kind"]) for r in readings}
        stored = (bench.read_run_info(folder[half]).get("config") or {}).get("patterns", [])
        readings = [*readings, *({k: v for k, v in t.items() if v is not None} for t in stored
                                 if (t.get("name") or t["kind"]) not in named)]
        config = _config(work / f"{slug}-{half}.toml", f"{slug}-{half}", model, work / f"{half}.jsonl", readings)
        _marginalia("bench", "run", str(config), "--out", str(folder[half]))

    for half in HALVES:
        answer(half, fixed)
    folds = []
    pooled: dict[str, dict[str, tuple[float, float]]] = {}
    for fit, held in zip(HALVES, reversed(HALVES), strict=True):
        chosen = calibrate(folder[fit])
        answer(held, [*fixed, {"kind": "auto", "name": "profile", **chosen.options}])
        results = _per_item(folder[held])
        for name, per in results.items():
            pooled.setdefault(name, {}).update(per)
        folds.append({"fit": fit, "held": held, "fit_items": chosen.items, "fit_best": chosen.best,
                      "chosen": chosen.chosen.describe(), "options": chosen.options, **compared(results)})
    numbers = {"model": model, "pairs": json.loads((work / "pairs.json").read_text("utf-8")), "length": LENGTH,
               "folds": folds, "both": compared(pooled)}
    record = measurement("calibration", numbers, name=f"calibration-{slug}")
    show(record)
    return numbers


def summary(m: Record) -> list[list[str]]:
    b = m["numbers"]["both"]
    r = b["readings"]
    return [[f"Reading profile, held-out own pairs ({model_name(m['numbers']['model'])})",
             f"profile {num(r['profile']['score'], 2)} vs best fixed ({b['best_fixed']}) "
             f"{num(r[b['best_fixed']]['score'], 2)}, {ratio(r['profile']['seconds'], r['wim']['seconds'])} "
             "WiM's seconds", made_by(m)]]


def _cell(reading: dict[str, Any]) -> str:
    return f"{num(reading['score'], 2)} · {num(reading['seconds'], 0)} s"


def _row(label: str, c: dict[str, Any]) -> list[str]:
    r = c["readings"]
    d = c["difference"]
    return [label, *(_cell(r[k]) for k in (*FIXED, "profile")),
            f"{d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] ({c['best_fixed']}): "
            f"{'met' if c['score_goal_met'] else 'not met'}",
            f"{c['wim_share']:.2f}x: {'met' if c['seconds_goal_met'] else 'not met'}"]


def together(runs: list[Record]) -> list[str]:
    first = runs[0]["numbers"]
    p = first["pairs"]
    kinds = ", ".join(f"{v} {k}" for k, v in sorted(p["kinds"].items()))
    lines = ["## Calibration on your own documents", "",
             f"{p['documents']} WikiText articles no development run read; `bench qa-generate` "
             f"({model_name(p['generated_by'])}): {p['generated']} pairs, {p['accepted']} accepted by rule "
             f"(evidence verbatim, no near duplicate: {kinds}), halves A ({p['calibrate']}), B ({p['score']}), "
             f"answered with rag, wim, lc ({first['length']}-token contexts); `bench calibrate` on one half makes "
             "the profile the other is answered with. Cells: contains · s/answer. Goal: within "
             f"{SCORE_GOAL} of the best fixed reading at ≤ {SECONDS_GOAL}x WiM's seconds.",
             ""]
    rows = []
    for m in runs:
        n = m["numbers"]
        name = model_name(n["model"])
        chose = []
        for fold in n["folds"]:
            arrow = "A→B" if fold["fit"] == HALVES[0] else "B→A"
            rows.append(_row(f"{name} {arrow}", fold))
            chose.append(f"{arrow} {fold['chosen'].split(':')[0].removesuffix(' (escalate rag)')} "
                         f"({fold['fit_best']} best where fitted)")
        rows.append(_row(f"{name} both", n["both"]))
        lines.append(f"- {name}: {'; '.join(chose)}; {provenance(m)[0].lower()}{provenance(m)[1:]}")
    return [*lines, "", *table(["model, fold", *FIXED, "profile", "profile − best", "× WiM's s"], rows,
                               "lrrrrrr"), ""]


BENCHMARKS["calibration"] = Benchmark("Calibration on your own documents", summary=summary, together=together)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=WORK, help="where documents, pairs and runs are kept")
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("docs", help="the articles as markdown documents")
    g = sub.add_parser("pairs", help="generate pairs, accept by rule, split in halves")
    g.add_argument("--model", required=True)
    r = sub.add_parser("run", help="calibrate on one half, score on the other")
    r.add_argument("--model", required=True)
    args = parser.parse_args(argv)
    if args.step == "docs":
        docs(args.work)
    elif args.step == "pairs":
        pairs(args.work, args.model)
    else:
        run(args.work, args.model)


if __name__ == "__main__":
    main()
