"""Routing (pattern ``auto``): when does RAG's answer stand, and what does routing cost and score?

Two steps.

``signals``: RAG answers every QA item of a quality run's config (the same items, model and options), and the
router's measures are taken on each answer (`Auto.decide`: support and topicality of the answer in its
passages, the best retrieval score), with one the router does not use: the model's P(YES) that the passages
answer. One text-free line per item
goes to benchmarks/measurements/routing/signals.jsonl (resumable: done items are skipped).

``report``: the router worked out offline. For each threshold on each signal, auto's score on an item is RAG's
where the answer stands and the stored run's WiM score where it escalates (a question that gathers over the
whole document goes to WiM at once); its cost, RAG's seconds plus WiM's where it escalates. With ``--live RUN``
(a run whose config added ``[[patterns]] kind = "auto"``) the live auto answers are set beside the same items'
stored rag, wim and lc-own. Writes benchmarks/measurements/routing.json and routing.png.

    python benchmarks/routing.py signals configs/bench/quality.toml
    python benchmarks/routing.py report benchmarks/measurements/quality [--live benchmarks/measurements/quality]
        [--check RUN]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _common import BENCHMARKS, MEASUREMENTS, ROOT, Benchmark, measurement, show, write_measurement
from _markdown import Record, made_by, num, table  # noqa: E402

from marginalia import AutoOptions, RagOptions, app, bench
from marginalia.bench.datasets import load_examples
from marginalia.patterns import make_pattern
from marginalia.patterns.auto import Auto, abstains, gathers_whole

SIGNALS = MEASUREMENTS / "routing" / "signals.jsonl"
#: the score a task is read by: `contains` for QA, set F1 for an aggregate list
METRIC = {"qa": "contains", "set": "f1"}
TASKS = ("hotpotqa", "multihop", "squad", "cwe")
#: the single readings auto is set against
SINGLES = ("rag", "wim", "lc-own")


#: the question put after the passages for the model's own judgement (a measure the router does not use: see
#: the routing section of BENCHMARKS.md)
SUFFICIENT = "\n\n=====\nQuestion: {question}\nDo the passages above hold the answer to this question? Reply YES or NO."


def passages_answer(generator: Any, question: str, passages: list[str]) -> float | None:
    """The model's probability of YES against NO that ``passages`` answer ``question``, where the backend gives
    next-token probabilities (None where it does not, or the prompt does not fit)."""
    if not getattr(generator, "supports_choice_probabilities", False):
        return None
    frame = generator.chat_frame("You answer questions about documents.")
    tok = generator.tokenizer
    prompt = (tok.encode(frame.head, allow_special=True)
              + tok.encode("Read the following passages from a document.\n\n" + "\n\n[...]\n\n".join(passages)
                           + SUFFICIENT.format(question=question))
              + tok.encode(frame.tail, allow_special=True))
    if len(prompt) + 1 > generator.context_window:
        return None
    return round(generator.fork(keep_cache=False).choice_probabilities(prompt, ["YES", "NO"])["YES"], 4)


def rag_of(config: Any) -> RagOptions:
    """The options of a bench config's ``rag`` table."""
    table = next(p for p in config.patterns if p.kind == "rag")
    return RagOptions(max_new_tokens=config.max_new_tokens or RagOptions().max_new_tokens,
                      chunk_tokens=table.chunk_tokens, top_k=table.top_k)


def answered(config: Any, generator: Any, rag: Any, out: Path, limit: int | None
             ) -> Iterator[tuple[str, str, Any, Any, float, Callable[[dict[str, Any]], None]]]:
    """Each QA item of ``config`` not yet in ``out`` (JSON lines, so that a run resumes), answered by ``rag``:
    (progress "task n/N", task, item, answer, seconds, ``keep``: appends the caller's line for the item)."""
    done = set()
    if out.is_file():
        done = {(r["task"], r["item_id"]) for r in map(json.loads, out.read_text().splitlines())}
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a", encoding="utf-8") as sink:

        def keep(line: dict[str, Any]) -> None:
            sink.write(json.dumps(line) + "\n")
            sink.flush()

        for task in config.tasks:
            # the items of the config's own limit (a quality run's ids, depths included), of which ``limit``'s
            # examples: a smaller limit picks other SQuAD items and turns depths otherwise
            spec = task.spec()
            items = bench.build_items(spec, generator.tokenizer)
            if limit and spec.path is not None:
                picked = {e.id for e in load_examples(spec.dataset, spec.path, min(limit, spec.limit))}
                items = [item for item in items if item.example_id in picked]
            for n, item in enumerate(items):
                if (spec.name, item.id) in done or item.scoring != "qa":
                    continue
                t0 = time.perf_counter()
                answer = rag.answer(item.context, item.question, source=item.id)
                yield f"{spec.name} {n + 1}/{len(items)}", spec.name, item, answer, time.perf_counter() - t0, keep


def collect(config_path: str, out: Path, limit: int | None) -> None:
    config = bench.load_config(config_path)
    rag_options = rag_of(config)
    generator = app.load_model(config.model)
    embedder = app.load_embedder(config.embedder)
    rag = make_pattern(rag_options, generator, embedder=embedder)
    auto = make_pattern(AutoOptions(**rag_options.model_dump()), generator, embedder=embedder)
    assert isinstance(auto, Auto)
    for progress, task, item, answer, seconds, keep in answered(config, generator, rag, out, limit):
        t1 = time.perf_counter()
        route = auto.decide(item.question, answer)
        signals = {**route.signals, "passages_answer": passages_answer(
            generator, item.question, [r.text for r in answer.references])}
        line = {"task": task, "item_id": item.id, "scores": bench.score_item(item, answer.text),
                "signals": signals, "abstains": abstains(answer.text),
                "gathers": gathers_whole(item.question), "route": route.taken,
                "rag_seconds": round(seconds, 3), "decide_seconds": round(time.perf_counter() - t1, 3)}
        keep(line)
        print(f"{progress} contains={line['scores']['contains']:.0f} support={signals['support']} "
              f"p={signals['passages_answer']} {seconds:.1f}s", file=sys.stderr)


def stored(run: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """(task, item) -> {pattern: record} from a run folder's results."""
    out: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
    for record in bench.read_results(run / bench.RESULTS):
        if record.get("status") == "ok":
            out[(record["task"], record["item_id"])][record["pattern"]] = record
    return out


def score_of(record: dict[str, Any]) -> float:
    return float(record["scores"][METRIC.get(record.get("scoring", "qa"), "contains")])


def stands(signals: dict[str, Any], abstained: bool, signal: str, threshold: float) -> bool:
    value = signals.get(signal)
    return not abstained and value is not None and value >= threshold


def offline(lines: list[dict[str, Any]], runs: dict[tuple[str, str], dict[str, Any]], signal: str,
            threshold: float) -> dict[str, dict[str, float]]:
    """Per task: auto's mean score, mean seconds and share escalated at this threshold."""
    per: dict[str, list[tuple[float, float, bool]]] = defaultdict(list)
    kept_worse: dict[str, int] = defaultdict(int)  # RAG's answer kept where WiM's was right and RAG's not
    escalated_worse: dict[str, int] = defaultdict(int)  # WiM read where RAG's was right and WiM's not
    for line in lines:
        rec = runs.get((line["task"], line["item_id"]), {})
        if "wim" not in rec or "rag" not in rec:
            continue
        keep = not line["gathers"] and stands(line["signals"], line["abstains"], signal, threshold)
        rag_score, wim_score = score_of(rec["rag"]), score_of(rec["wim"])
        kept_worse[line["task"]] += keep and wim_score > rag_score
        escalated_worse[line["task"]] += not keep and rag_score > wim_score
        rag_seconds = float(rec["rag"]["seconds"])
        if keep:
            per[line["task"]].append((score_of(rec["rag"]), rag_seconds, False))
        else:
            per[line["task"]].append((score_of(rec["wim"]), rag_seconds + float(rec["wim"]["seconds"]), True))
    return {task: {"score": statistics.mean(s for s, _, _ in v), "seconds": statistics.mean(c for _, c, _ in v),
                   "escalated": statistics.mean(e for _, _, e in v), "items": len(v),
                   "kept_worse": kept_worse[task], "escalated_worse": escalated_worse[task]}
            for task, v in per.items()}


def singles(lines: list[dict[str, Any]], runs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    per: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for line in lines:
        rec = runs.get((line["task"], line["item_id"]), {})
        if "wim" not in rec or "rag" not in rec:
            continue
        for name, r in rec.items():
            if name in SINGLES:
                per[line["task"]][name].append((score_of(r), float(r["seconds"])))
    return {task: {name: {"score": statistics.mean(s for s, _ in v), "seconds": statistics.mean(c for _, c in v),
                          "items": len(v)} for name, v in by.items()} for task, by in per.items()}


def live_signals(live: Path) -> list[dict[str, Any]]:
    """Signal lines (as `collect` writes them) from a run's live auto answers: the route's signals; the rule that
    fired read from its reason."""
    lines = []
    for r in bench.read_results(live / bench.RESULTS):
        if r.get("kind") != "auto" or r.get("status") != "ok" or not r.get("route"):
            continue
        reason = r["route"]["reason"]
        lines.append({"task": r["task"], "item_id": r["item_id"], "signals": r["route"]["signals"],
                      "abstains": reason.startswith("the retrieved passages do not answer"),
                      "gathers": reason.startswith("the question gathers"), "route": r["route"]["taken"]})
    return lines


def aggregate_task(name: str) -> dict[str, Any] | None:
    """CWE: a question that gathers over the whole document goes to WiM at once, so auto's reading there is
    WiM's. Its score and seconds come from the live auto answers of the aggregation run's export
    (benchmarks/measurements/NAME/, each checked to have gone to WiM at once), standing for WiM's too; long
    context's from the run's stored summary (benchmarks/measurements/NAME.json). Without live answers, the
    summary's WiM stands for both."""
    path = MEASUREMENTS / f"{name}.json"
    if not path.is_file():
        return None
    numbers = json.loads(path.read_text("utf-8"))["numbers"]
    task = next(t for t in numbers["tasks"] if t["task"] == "cwe")
    wim, lc = task["patterns"][numbers["wim"]], task["patterns"][numbers["lc"]]
    stored_lc = {"score": lc["score"]["mean"], "seconds": lc["cost"]["seconds"], "items": lc["n"]}
    export = MEASUREMENTS / name / bench.RESULTS
    autos = [r for r in bench.read_results(export) if r.get("kind") == "auto" and r.get("status") == "ok"
             and r["task"] == "cwe"] if export.is_file() else []
    if autos:
        routes = {(r["route"]["taken"], r["route"]["reason"].startswith("the question gathers")) for r in autos}
        if routes != {("wim", True)}:
            raise SystemExit(f"{export}: not every CWE question went to WiM at once ({sorted(routes)})")
        reading = {"score": statistics.mean(score_of(r) for r in autos),
                   "seconds": statistics.mean(float(r["seconds"]) for r in autos), "items": len(autos)}
        return {"items": len(autos), "source": f"{name} (live auto)", "singles": {"wim": reading, "lc-own": stored_lc},
                "auto": {**reading, "escalated": 1.0}}
    n = wim["n"]
    reading = {"score": wim["score"]["mean"], "seconds": wim["cost"]["seconds"], "items": n}
    return {"items": n, "source": name, "singles": {"wim": reading, "lc-own": stored_lc},
            "auto": {**reading, "escalated": 1.0}}


def timing_check(check: Path, runs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any] | None:
    """The stored run's WiM seconds against a fresh WiM run's on the same items (``check``: a run folder or
    export made on the machine the live CWE answers were timed on), so that the QA tasks' stored seconds and
    CWE's live ones can be set side by side."""
    pairs = [(float(runs[(r["task"], r["item_id"])]["wim"]["seconds"]), float(r["seconds"]))
             for r in bench.read_results(check / bench.RESULTS)
             if r.get("kind") == "wim" and r.get("status") == "ok" and "wim" in runs.get((r["task"], r["item_id"]), {})]
    if not pairs:
        return None
    where = check.resolve()
    return {"run": str(where.relative_to(ROOT)) if where.is_relative_to(ROOT) else where.name, "items": len(pairs),
            "stored_seconds": statistics.mean(a for a, _ in pairs),
            "fresh_seconds": statistics.mean(b for _, b in pairs),
            "ratio": statistics.median(a / b for a, b in pairs), "lowest": min(a / b for a, b in pairs),
            "highest": max(a / b for a, b in pairs)}


def checked_cost(singles_: dict[str, dict[str, Any]], autos: dict[str, dict[str, Any]], ratio: float) -> float:
    """Auto's seconds over WiM's as `goals` has it, with the QA tasks' stored seconds divided by ``ratio`` (the
    timing check's), so that they and CWE's live ones stand for one machine state."""
    def scaled(task: str, seconds: float) -> float:
        return seconds if task == "cwe" else seconds / ratio
    return (statistics.mean(scaled(t, v["seconds"]) for t, v in autos.items())
            / statistics.mean(scaled(t, singles_[t]["wim"]["seconds"]) for t in autos))


def goals(singles_: dict[str, dict[str, Any]], autos: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Auto's score against the best single pattern's minus 0.02 on each task, and its seconds per answer against
    half of WiM's, each the mean over the tasks of a task's mean (a task counts once, however many items it
    has); the same over the QA tasks alone."""
    per = {}
    for task, auto in autos.items():
        best_name, best = max(((k, v) for k, v in singles_[task].items() if k in ("rag", "wim", "lc-own")),
                              key=lambda kv: kv[1]["score"])
        per[task] = {"auto": round(auto["score"], 4), "best": best_name, "best_score": round(best["score"], 4),
                     "met": auto["score"] >= best["score"] - 0.02 - 1e-9}

    def cost(tasks: list[str]) -> tuple[float, float]:
        return (statistics.mean(autos[t]["seconds"] for t in tasks),
                statistics.mean(singles_[t]["wim"]["seconds"] for t in tasks))

    auto_s, wim_s = cost(list(autos))
    qa_auto, qa_wim = cost([t for t in autos if t != "cwe"])
    return {"tasks": per, "auto_seconds": round(auto_s, 1), "wim_seconds": round(wim_s, 1),
            "cost_ratio": round(auto_s / wim_s, 3), "cost_met": auto_s <= 0.5 * wim_s,
            "qa_cost_ratio": round(qa_auto / qa_wim, 3)}


def report(run: Path, live: Path | None, plot: bool, aggregate: str, check: Path | None = None) -> None:
    # the signals step's lines where there are some (every QA item of the run), else the live run's
    lines = ([json.loads(x) for x in SIGNALS.read_text().splitlines()] if SIGNALS.is_file() or live is None
             else live_signals(live))
    runs = stored(run)
    base = singles(lines, runs)
    sweeps: dict[str, list[dict[str, Any]]] = {}
    for signal in ("support", "passages_answer", "retrieval"):
        values = sorted({line["signals"].get(signal) for line in lines} - {None})
        if not values:
            continue
        grid = sorted({round(q / 20, 2) for q in range(21)})
        sweeps[signal] = [{"threshold": t, "tasks": offline(lines, runs, signal, t)} for t in grid]
    default = AutoOptions().support_threshold
    at_default = offline(lines, runs, "support", default)
    cwe = aggregate_task(aggregate)
    if cwe is not None:
        base["cwe"] = cwe["singles"]
        at_default["cwe"] = cwe["auto"]
    numbers: dict[str, Any] = {"singles": base, "sweeps": sweeps, "items": len(lines),
                               "signals_from": "signals" if SIGNALS.is_file() or live is None else "live",
                               "default": {"signal": "support", "threshold": default, "tasks": at_default},
                               "cwe_from": cwe["source"] if cwe is not None else None,
                               "goals": goals(base, at_default)}
    if live is not None:
        numbers["live"] = live_numbers(live, runs)
    if check is not None:
        numbers["timing_check"] = timing_check(check, runs)
        if numbers["timing_check"] is not None:
            numbers["goals"]["checked_cost_ratio"] = round(
                checked_cost(base, at_default, numbers["timing_check"]["ratio"]), 3)
    result = measurement("routing", numbers)
    write_measurement(result)
    if plot:
        draw(sweeps, base)
    show(result, write=False)


def live_numbers(live: Path, runs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    """Live auto answers beside the stored readings of the same items."""
    autos = [r for r in bench.read_results(live / bench.RESULTS) if r.get("kind") == "auto" and r.get("status") == "ok"]
    per: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    routes: dict[str, list[str]] = defaultdict(list)
    for r in autos:
        key = (r["task"], r["item_id"])
        if not {"rag", "wim"} <= set(runs.get(key, {})):
            continue  # an item the stored run did not answer: not the same items
        per[r["task"]]["auto"].append((score_of(r), float(r["seconds"])))
        routes[r["task"]].append((r.get("route") or {}).get("taken", "?"))
        for name in ("rag", "wim", "lc-own"):
            if name in runs.get(key, {}):
                other = runs[key][name]
                per[r["task"]][name].append((score_of(other), float(other["seconds"])))
    return {task: {"patterns": {name: {"score": statistics.mean(s for s, _ in v),
                                       "seconds": statistics.mean(c for _, c in v), "items": len(v)}
                                for name, v in by.items()},
                   "escalated": routes[task].count("wim") / len(routes[task])}
            for task, by in per.items()}


def draw(sweeps: dict[str, list[dict[str, Any]]], base: dict[str, dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in TASKS if t in base and any(t in row["tasks"] for rows in sweeps.values() for row in rows)]
    fig, axes = plt.subplots(1, len(tasks), figsize=(4 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for signal, rows in sweeps.items():
            xs = [row["tasks"][task]["seconds"] for row in rows if task in row["tasks"]]
            ys = [row["tasks"][task]["score"] for row in rows if task in row["tasks"]]
            ax.plot(xs, ys, marker=".", label=f"auto by {signal}")
        for name, v in base[task].items():
            ax.scatter([v["seconds"]], [v["score"]], marker="s")
            ax.annotate(name, (v["seconds"], v["score"]), fontsize=8)
        ax.set_title(task)
        ax.set_xlabel("seconds per answer")
        ax.set_ylabel("score")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(MEASUREMENTS / "routing.png", dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    s = sub.add_parser("signals", help="RAG answers the config's QA items; the router's measures are stored")
    s.add_argument("config")
    s.add_argument("--limit", type=int, default=None, help="items per task (default: the config's)")
    r = sub.add_parser("report", help="the router worked out offline, and the live run beside it")
    r.add_argument("run", type=Path, help="a run folder (or its text-free export) holding rag and wim answers")
    r.add_argument("--live", default=None,
                   help="a run holding auto's answers: its folder, or its name under <home>/bench/runs")
    r.add_argument("--aggregate", default="aggregation-lists-8k",
                   help="the aggregation run on CWE: its export's live auto answers (WiM's reading there) stand for "
                        "auto and WiM, else its summary's WiM; long context from its summary")
    r.add_argument("--check", type=Path, default=None,
                   help="a run (folder or export) holding fresh WiM answers to some of the same QA items, made on "
                        "the machine the live CWE answers were timed on: the stored seconds are set against them")
    r.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    if args.step == "signals":
        collect(args.config, SIGNALS, args.limit)
    else:
        live = None if args.live is None else Path(args.live) if Path(args.live).is_dir() else bench.runs_dir() / args.live
        report(args.run, live, not args.no_plot, args.aggregate, args.check)


def summary(m: Record) -> list[list[str]]:
    g = m["numbers"]["goals"]
    tasks = ", ".join(f"{t} {num(v['auto'], 2)} (best {num(v['best_score'], 2)})" for t, v in g["tasks"].items())
    return [["Routing (auto: RAG, then WiM where needed), Qwen2.5-Coder-0.5B, 8k",
             f"score {tasks}; {num(g['cost_ratio'], 2)}x WiM's seconds per answer", made_by(m)]]


def live_line(live: dict[str, Any]) -> str:
    """Live auto against the best single pattern of the stored run, on the same items."""
    parts = []
    for task, v in live.items():
        by = v["patterns"]
        best = max((k for k in by if k in ("rag", "wim", "lc-own")), key=lambda k: by[k]["score"])
        parts.append(f"{task} {num(by['auto']['score'], 2)} against {best}'s {num(by[best]['score'], 2)}")
    return "Live auto (its code then) against the stored run's best single pattern: " + ", ".join(parts) + "."


def section(m: Record) -> list[str]:
    n = m["numbers"]
    d = n["default"]
    live = n.get("live", {})
    rows = []
    for task, by in n["singles"].items():
        auto = d["tasks"].get(task, {})
        lv = live.get(task, {}).get("patterns", {}).get("auto")
        cells = [num(by[p]["score"], 2) if p in by else "–" for p in ("rag", "wim", "lc-own")]
        seconds = " · ".join(num(by[p]["seconds"], 0) if p in by else "–" for p in ("rag", "wim"))
        rows.append([f"{task} ({auto.get('items', '–')})", *cells, num(auto.get("score"), 2),
                     f"{num(100 * auto.get('escalated', 0), 0)}%",
                     f"{num(lv['score'], 2)} ({lv['items']}) · {num(lv['seconds'], 0)} s" if lv else "–",
                     f"{seconds} · {num(auto.get('seconds'), 0)}"])
    g = n["goals"]
    missed = [f"{t} {num(v['auto'], 2)} against {v['best']}'s {num(v['best_score'], 2)} (short by "
              f"{num(v['best_score'] - 0.02 - v['auto'], 2)}: RAG's answer kept on {d['tasks'][t]['kept_worse']} "
              f"items WiM had right and RAG wrong, WiM read on {d['tasks'][t]['escalated_worse']} it had wrong and "
              "RAG right)" for t, v in g["tasks"].items() if not v["met"]]
    best, none = [], []
    for signal, sweep in n["sweeps"].items():
        fits = [r for r in sweep if all(r["tasks"][t]["score"] >= g["tasks"][t]["best_score"] - 0.02 - 1e-9
                                       for t in r["tasks"])]
        cheapest = min(fits, key=lambda r: sum(v["seconds"] for v in r["tasks"].values()), default=None)
        if cheapest is None:
            none.append(signal)
        else:
            best.append(f"{signal} ≥ {cheapest['threshold']:g} holds every QA task's goal, escalating "
                        + ", ".join(f"{t} {num(100 * v['escalated'], 0)}%" for t, v in cheapest["tasks"].items()))
    if none:
        best.append(f"no threshold of {' or '.join(none)} holds every QA task's goal")
    cwe = ""
    if n.get("cwe_from"):
        source = n["cwe_from"].removesuffix(" (live auto)")
        cwe = (f" CWE: its questions gather over the whole document and go to WiM at once: the live auto run "
               f"(`{source}`) stands for WiM; LC: its stored summary." if n["cwe_from"] != source else
               f" CWE: `{source}`'s WiM, where such a question goes at once.")
    check = n.get("timing_check")
    timing = (f" Stored WiM seconds: {num(check['ratio'], 2)}x a fresh run's on {check['items']} items (median); "
              f"corrected for that, {num(n['goals'].get('checked_cost_ratio'), 2)}x." if check else "")
    return [f"`auto` keeps RAG's answer where a sentence of its passages supports it (≥ {d['threshold']:g}) and it "
            f"does not say they are silent; else WiM reads. Offline: signals per item ({n['signals_from']} step), "
            f"the stored run's scores and seconds.{cwe} Score: contains (QA), set F1 (CWE); LC: lc-own.", "",
            *table(["task (items)", "RAG", "WiM", "LC", "auto", "escalated", "auto, live",
                    "s / answer (RAG · WiM · auto)"], rows, "lrrrrrrr"), "",
            "Goal, auto ≥ the best single pattern − 0.02 on every task: "
            + ("met." if not missed else f"missed on {'; '.join(missed)}.")
            + " Goal, at most half of WiM's seconds per answer over the tasks (each task's mean): "
            f"{num(g['auto_seconds'], 0)} s against {num(g['wim_seconds'], 0)} s ({num(g['cost_ratio'], 2)}x): "
            + ("met" if g["cost_met"] else "missed"
               + (", as CWE's questions go to WiM, its costliest reading, at once" if "cwe" in g["tasks"] else ""))
            + f"; over the QA tasks alone {num(g['qa_cost_ratio'], 2)}x.{timing}", "",
            *([live_line(live), ""] if live else []),
            (lambda t: t[:1].upper() + t[1:])("; ".join(best))

            + ".", "",
            "![routing: score against seconds per answer as the threshold varies](benchmarks/measurements/routing.png)"]


BENCHMARKS["routing"] = Benchmark("Routing: RAG first, WiM where RAG's answer does not stand", section, summary)


if __name__ == "__main__":
    main()
