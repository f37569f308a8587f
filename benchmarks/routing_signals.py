"""The router's signals set against each other offline: when should RAG's answer stand?

Three steps.

``answers``: RAG answers every QA item of a quality run's config (the same items, model and options); its answer,
the passages it read and the model's P(YES) that they answer the question are kept in a file OUTSIDE the
repository (``--keep``, default ``~/.cache/marginalia-routing/<config>.jsonl``: they hold the datasets' texts).
Resumable.

``signals``: today's router measures (`patterns.signals.measure`) on each kept answer, as one text-free line
per item (``--out``, default benchmarks/measurements/routing/signals-<config>.jsonl): run again after changing
the measures, no model needed.

``compare``: each rule (today's single-sentence support; support from one or two sentences; with the question's
share around the supporting sentences; with the model's P(YES)) worked out on the stored run's answers: auto's
score on an item is the fresh RAG answer's where it stands and the stored WiM answer's where it does not, its
seconds the stored run's RAG seconds plus its WiM seconds where it escalates; the oracle takes the better of
RAG and WiM on each item. Writes benchmarks/measurements/routing_signals-<name>.json.

    python benchmarks/routing_signals.py answers configs/bench/quality-smollm2.toml --limit 30
    python benchmarks/routing_signals.py signals configs/bench/quality-smollm2.toml
    python benchmarks/routing_signals.py compare benchmarks/measurements/quality-smollm2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import BENCHMARKS, MEASUREMENTS, Benchmark, measurement, write_measurement
from _markdown import Record, made_by, provenance, table
from routing import answered, passages_answer, rag_of, score_of, stored

from marginalia import app, bench
from marginalia.patterns import make_pattern
from marginalia.patterns.auto import abstains, gathers_whole
from marginalia.patterns.signals import measure

ROUTING = MEASUREMENTS / "routing"


def keep_path(config: str) -> Path:
    return Path.home() / ".cache" / "marginalia-routing" / f"{Path(config).stem}.jsonl"


def answers(config_path: str, keep: Path, limit: int | None) -> None:
    config = bench.load_config(config_path)
    generator = app.load_model(config.model)
    rag = make_pattern(rag_of(config), generator, embedder=app.load_embedder(config.embedder))
    for progress, task, item, answer, seconds, write in answered(config, generator, rag, keep, limit):
        passages = [r.text for r in answer.references]
        line = {"task": task, "item_id": item.id, "question": item.question, "answer": answer.text,
                "passages": passages, "scores": bench.score_item(item, answer.text),
                "passages_answer": passages_answer(generator, item.question, passages),
                "rag_seconds": round(seconds, 3)}
        write(line)
        print(f"{progress} contains={line['scores']['contains']:.0f} {seconds:.1f}s", file=sys.stderr)


def signals(keep: Path, out: Path) -> None:
    """Text-free signal lines from the kept answers, with today's measures."""
    lines = []
    for kept in map(json.loads, keep.read_text().splitlines()):
        measured = measure(kept["question"], kept["answer"], kept["passages"])
        lines.append({"task": kept["task"], "item_id": kept["item_id"], "scores": kept["scores"],
                      "signals": {**measured.signals(), "sentences": measured.sentences,
                                  "passages_answer": kept.get("passages_answer")},
                      "abstains": abstains(kept["answer"]), "gathers": gathers_whole(kept["question"]),
                      "rag_seconds": kept["rag_seconds"]})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(line) + "\n" for line in lines), "utf-8")
    print(f"wrote {len(lines)} lines to {out}", file=sys.stderr)


Rule = Callable[[dict[str, Any]], bool]


def rules(lines: list[dict[str, Any]]) -> dict[str, Rule]:
    """The rules compared, each on the signals its lines hold."""
    has = set.intersection(*(set(k for k, v in line["signals"].items() if v is not None) for line in lines))
    single = "single_support" if "single_support" in has else "support"
    out: dict[str, Rule] = {"one sentence, support >= 0.5": lambda s: s[single] >= 0.5}
    if "single_support" in has:
        out["one or two sentences, support >= 0.5"] = lambda s: s["support"] >= 0.5
        for q in (0.3, 0.4, 0.5, 0.6):
            out[f"one or two sentences, support >= 0.5, question share >= {q}"] = \
                lambda s, q=q: s["support"] >= 0.5 and s["topic"] >= q
        out["one or two sentences, support >= 0.5, the question's names in their passages"] = \
            lambda s: s["support"] >= 0.5 and s["names"] >= 0.99
    else:
        for q in (0.3, 0.5):
            out[f"one sentence, support >= 0.5, question share >= {q}"] = \
                lambda s, q=q: s["support"] >= 0.5 and s["topic"] >= q
    if "passages_answer" in has:
        for p in (0.4, 0.5):
            out[f"{'one or two sentences' if 'single_support' in has else 'one sentence'}, support >= 0.5, "
                f"P(YES) >= {p}"] = lambda s, p=p: s["support"] >= 0.5 and s["passages_answer"] >= p
    return out


def compare(run: Path, signals_path: Path, name: str) -> dict[str, Any]:
    lines = [json.loads(x) for x in signals_path.read_text().splitlines()]
    runs = stored(run)
    per_task: dict[str, Any] = {}
    for task in sorted({line["task"] for line in lines}):
        rows = [(line, runs[(task, line["item_id"])]) for line in lines
                if line["task"] == task and {"rag", "wim"} <= set(runs.get((task, line["item_id"]), {}))]
        if not rows:
            continue
        # RAG's score is the fresh answer's (the one the signals were measured on); WiM's the stored run's
        rag = [float(line["scores"]["contains"]) for line, _ in rows]
        wim = [score_of(rec["wim"]) for _, rec in rows]
        # seconds from the stored run for both readings: the same machine state (the fresh answers' times are not)
        rag_s = [float(rec["rag"]["seconds"]) for _, rec in rows]
        wim_s = [float(rec["wim"]["seconds"]) for _, rec in rows]
        differ = [k for k in range(len(rows)) if rag[k] != wim[k]]
        oracle = [max(a, b) for a, b in zip(rag, wim, strict=True)]
        result: dict[str, Any] = {
            "items": len(rows), "rag": statistics.mean(rag), "wim": statistics.mean(wim),
            "oracle": statistics.mean(oracle), "items_where_they_differ": len(differ),
            "rag_seconds": statistics.mean(rag_s), "wim_seconds": statistics.mean(wim_s),
            "stored_rag_agrees": statistics.mean(float(score_of(rec["rag"]) == r) for (_, rec), r in zip(rows, rag,
                                                                                                      strict=True)),
            "rules": {}}
        for label, rule in rules(lines).items():
            keep = [not line["gathers"] and not line["abstains"] and rule(line["signals"]) for line, _ in rows]
            score = [r if k else w for r, w, k in zip(rag, wim, keep, strict=True)]
            seconds = [a + (0.0 if k else b) for a, b, k in zip(rag_s, wim_s, keep, strict=True)]
            result["rules"][label] = {
                "score": statistics.mean(score), "seconds": statistics.mean(seconds),
                "escalated": sum(not k for k in keep),
                # of the items where RAG and WiM differ, how often the rule took the better one
                "picked_better": sum(score[k] == oracle[k] for k in differ),
                "kept_wrong_rag": sum(k and w > r for r, w, k in zip(rag, wim, keep, strict=True)),
                "escalated_right_rag": sum(not k and r > w for r, w, k in zip(rag, wim, keep, strict=True))}
        per_task[task] = result
    record = measurement("routing_signals", {"run": run.name, "signals": signals_path.name, "tasks": per_task},
                         name=f"routing_signals-{name}")
    write_measurement(record)
    return per_task


def show(per_task: dict[str, Any]) -> None:
    for task, r in per_task.items():
        print(f"\n{task}: {r['items']} items; rag {r['rag']:.2f} ({r['rag_seconds']:.1f}s), wim {r['wim']:.2f} "
              f"({r['wim_seconds']:.1f}s), oracle {r['oracle']:.2f}; they differ on {r['items_where_they_differ']}; "
              f"fresh RAG scores as stored on {r['stored_rag_agrees']:.0%}")
        for label, v in r["rules"].items():
            print(f"  {v['score']:.2f} {v['seconds']:6.1f}s esc {v['escalated']:2d} better {v['picked_better']:2d}/"
                  f"{r['items_where_they_differ']} kept-wrong {v['kept_wrong_rag']} esc-right "
                  f"{v['escalated_right_rag']}  {label}")


#: the rules BENCHMARKS.md shows, by their labels in `rules`
SHOWN = {"one sentence, support >= 0.5": "one sentence", "one or two sentences, support >= 0.5": "one or two"}


def _cell(rule: dict[str, Any] | None, differ: int) -> str:
    if rule is None:
        return "–"
    return f"{rule['score']:.2f} · {rule['seconds']:.0f} s · {rule['picked_better']}/{differ}"


def summary(m: Record) -> list[list[str]]:
    tasks = m["numbers"]["tasks"]
    one, two = SHOWN
    change = ", ".join(f"{t} {r['rules'][one]['score']:.2f}→{r['rules'][two]['score']:.2f}" for t, r in tasks.items()
                       if two in r["rules"])
    oracle = ", ".join(f"{r['oracle']:.2f}" for r in tasks.values())
    return [[f"auto, support from two sentences vs one ({m['numbers']['run']})", f"{change} (oracle {oracle})",
             made_by(m)]]


def together(runs: list[Record]) -> list[str]:
    lines = ["## The router's support signal", "",
             "auto on a quality run's items, offline: RAG's fresh answer where its support (≥ 0.5; one sentence, "
             "or two together) lets it stand, else the stored WiM answer; seconds: stored RAG's, plus WiM's where "
             "escalated. Oracle: the better of the two per item. Cells: contains · s/answer · better picked / "
             "items where RAG and WiM differ.", ""]
    rows = []
    made = {provenance({**m, "command": m["command"].replace(m["numbers"]["run"], "RUN")}) for m in runs}
    if len(made) == 1:  # one command for every run, at one commit: said once
        lines.append(made.pop().replace("RUN`", "RUN` for each run").rstrip(".") + ": "
                     + ", ".join(f"`{m['numbers']['run']}`" for m in runs) + ".")
    else:
        lines += [f"- `{m['numbers']['run']}`: {provenance(m)[0].lower()}{provenance(m)[1:]}" for m in runs]
    for m in runs:
        n = m["numbers"]
        rows += [[f"{n['run']}: {task} ({r['items']})", f"{r['rag']:.2f}", f"{r['wim']:.2f}", f"{r['oracle']:.2f}",
                  *(_cell(r["rules"].get(label), r["items_where_they_differ"]) for label in SHOWN)]
                 for task, r in n["tasks"].items()]
    return [*lines, "", *table(["run: task (items)", "RAG", "WiM", "oracle", *SHOWN.values()], rows, "lrrrrr"), ""]


BENCHMARKS["routing_signals"] = Benchmark("The router's support signal", summary=summary, together=together,
                                          first=("routing_signals-quality", "routing_signals-quality-smollm2"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    a = sub.add_parser("answers", help="RAG answers the config's QA items; answers and passages kept outside the repo")
    a.add_argument("config")
    a.add_argument("--limit", type=int, default=None, help="items per task (default: the config's)")
    a.add_argument("--keep", type=Path, default=None, help="where the answers are kept (default: ~/.cache/...)")
    s = sub.add_parser("signals", help="today's measures on the kept answers, one text-free line per item")
    s.add_argument("config")
    s.add_argument("--keep", type=Path, default=None)
    s.add_argument("--out", type=Path, default=None)
    c = sub.add_parser("compare", help="each rule worked out on a stored run's rag and wim answers")
    c.add_argument("run", type=Path)
    c.add_argument("--signals", type=Path, default=None,
                   help="the signals step's lines (default: measurements/routing/signals-<run>.jsonl)")
    c.add_argument("--name", default=None, help="the measurement's name (default: the run's)")
    args = parser.parse_args(argv)
    if args.step == "answers":
        answers(args.config, args.keep or keep_path(args.config), args.limit)
    elif args.step == "signals":
        signals(args.keep or keep_path(args.config),
                args.out or ROUTING / f"signals-{Path(args.config).stem}.jsonl")
    else:
        show(compare(args.run, args.signals or ROUTING / f"signals-{args.run.name}.jsonl", args.name or args.run.name))


if __name__ == "__main__":
    main()
