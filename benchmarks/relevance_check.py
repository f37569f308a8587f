"""How well WiM's relevance checks keep the margins that hold the answer (development data only).

Two steps. ``collect`` reads SQuAD and HotpotQA development items (the gold passage among distractors, about
--context-tokens model tokens) with WiM and the combined judge, and stores every margin as written (its text,
where its segment ends, the model's P(YES)) with the item's context and gold answers in a JSONL file outside
the repository. ``evaluate`` judges those same margins again with each check, offline: kept-margin precision
(of the margins kept, the share that contain a gold answer, SQuAD-normalised), recall (of the margins that
contain one, the share kept), by question, the share of questions where a margin with the answer was
written and one was kept, and the share of kept margins that hold an answer or draw on a gold passage (a
multi-hop question's bridge). ``--baseline REF`` also judges them with the grounded judge of git commit REF.

    python benchmarks/relevance_check.py collect --out /tmp/margins.jsonl [--limit 20] [--model smollm2]
    python benchmarks/relevance_check.py evaluate --margins /tmp/margins.jsonl [--baseline b32f016]

``from-run`` writes the same file from the margins a `marginalia bench` run kept (its WiM pattern's results,
each item's context rebuilt from the run's stored config), so the margins of a large run with the eval model
can be judged again without writing them anew:

    python benchmarks/relevance_check.py from-run quality-4k --out /tmp/margins.jsonl [--pattern wim]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import ROOT, command_line, git_commit, write_section  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
SOURCES = {"squad": "squad-v1.1-dev.part1.json", "hotpotqa": "hotpotqa-dev-distractor.part1.json"}
NAMES = {"squad": "SQuAD", "hotpotqa": "HotpotQA", "multihop": "MultiHop-RAG"}
Judge = Callable[[str, str, Any, str, "float | None", "str | None"], Any]  # q, margin, segment, read, P(YES), doc


def collect(args: argparse.Namespace) -> None:
    from marginalia.bench.items import TaskSpec
    from marginalia.bench.tasks import build_items
    from marginalia.models import load_generator
    from marginalia.patterns.wim import WiM
    from marginalia.records import Done, MarginJudged, MarginWritten

    gen = load_generator(args.model)
    # the answer is not judged here: one token of it is enough
    wim = WiM(gen, segment_tokens=args.segment_tokens, judge="combined", max_new_tokens=1)
    out = Path(args.out)
    with out.open("w") as f:
        for dataset, name in SOURCES.items():
            spec = TaskSpec(dataset=dataset, path=str(DATA / name), limit=args.limit,
                            lengths=(args.context_tokens,), depths=(0.25, 0.75), seed=1)
            for item in build_items(spec, gen.tokenizer)[: args.limit]:
                t0 = time.perf_counter()
                segments = wim.segments(item.context)
                written: dict[int, str] = {}
                margins = []
                for event in wim.run(item.context, item.question):
                    if isinstance(event, MarginWritten):
                        written[event.segment_index] = event.text
                    elif isinstance(event, MarginJudged):
                        m = event.margin
                        margins.append({"segment": m.segment_index, "end": segments[m.segment_index].end,
                                        "raw": written[m.segment_index], "p_yes": m.p_yes})
                    elif isinstance(event, Done):
                        answer = event.answer.text
                f.write(json.dumps({"task": dataset, "id": item.id, "question": item.question,
                                    "answers": list(item.answers), "context": item.context,
                                    "gold_spans": [list(span) for span in item.gold_spans],
                                    "margins": margins, "answer": answer}) + "\n")
                f.flush()
                print(f"{dataset} {item.id}: {len(margins)} margins, {time.perf_counter() - t0:.1f}s", flush=True)


def from_run(args: argparse.Namespace) -> None:
    from marginalia import app
    from marginalia.bench.config import pattern_record
    from marginalia.bench.runner import read_results, runs_dir, stored_config
    from marginalia.bench.tasks import build_items
    from marginalia.models import load_generator
    from marginalia.patterns.wim import WiM

    folder = runs_dir() / args.run
    if not (folder / "run.json").is_file():
        sys.exit(f"no run {args.run!r} under {runs_dir()} (marginalia bench runs lists them)")
    info = json.loads((folder / "run.json").read_text())
    config = stored_config(info["config"])
    # --limit changes which examples a task picks (and so the depth each is given): build the items of every
    # limit the run was invoked with
    limits = sorted({inv.get("limit") for inv in info.get("invocations", [])} or {None}, key=lambda n: n or 0)
    table = next((p for p in config.patterns if (p.name or p.kind) == args.pattern), None)
    if table is None or table.kind != "wim":
        sys.exit(f"run {args.run!r} has no wim pattern named {args.pattern!r}")
    results = [r for r in read_results(folder / "results.jsonl") if r["pattern"] == args.pattern
               and r.get("status") == "ok" and isinstance(r.get("margins"), list) and r["margins"]]
    if not results:
        sys.exit(f"run {args.run!r} kept no margins of {args.pattern!r}")
    gen = load_generator(config.model, backend=config.backend, device=config.device)
    wim = app.pattern(pattern_record(table), gen, None)
    assert isinstance(wim, WiM)
    wanted = {r["task"] for r in results}
    items = {it.id: (task.name or task.dataset, it) for task in config.tasks if (task.name or task.dataset) in wanted
             for limit in limits for it in build_items(task.spec(limit), gen.tokenizer)}
    written = 0
    with Path(args.out).open("w") as f:
        for r in results:
            found = items.get(r["item_id"])
            if found is None:
                print(f"skipped {r['item_id']}: not among the items the stored config builds", file=sys.stderr)
                continue
            task, item = found
            segments = wim.segments(item.context)
            margins = [{"segment": m["segment"], "end": segments[m["segment"]].end, "raw": m["text"],
                        "p_yes": m.get("p_yes"), "kept_in_run": m["kept"]} for m in r["margins"]]
            f.write(json.dumps({"task": task, "id": item.id, "question": item.question,
                                "answers": list(item.answers), "context": item.context,
                                "gold_spans": [list(span) for span in item.gold_spans],
                                "margins": margins, "answer": r.get("prediction"),
                                "written": f"by {Path(config.model).name} in the bench run {args.run!r}, "
                                           f"at {item.target_tokens} tokens"}) + "\n")
            written += 1
    print(f"{written} items, {sum(len(r['margins']) for r in results)} margins -> {args.out}")


def _git_show(ref: str, path: str) -> str:
    """The text of ``path`` (from the repository's root) at commit ``ref``."""
    return subprocess.run(["git", "show", f"{ref}:{path}"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def _baseline_module(ref: str, name: str, replace: tuple[str, str] | None = None) -> Any:
    """``src/marginalia/patterns/<name>.py`` of commit ``ref``, loaded as a module beside today's."""
    source = _git_show(ref, f"src/marginalia/patterns/{name}.py")
    if replace:
        source = source.replace(*replace)
    spec = importlib.util.spec_from_loader(f"marginalia.patterns._baseline_{name}", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "marginalia.patterns"
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"{name}.py@{ref}", "exec"), module.__dict__)
    return module


def _baseline_judge(ref: str) -> Judge:
    """The grounded judge of commit ``ref`` (its judges and grounding modules, loaded from git)."""
    _baseline_module(ref, "grounding")
    module = _baseline_module(ref, "judges", ("from .grounding import", "from ._baseline_grounding import"))
    options = _git_show(ref, "src/marginalia/options.py")
    default = re.search(r"^TOPIC_THRESHOLD = ([0-9.]+)", options, re.MULTILINE)  # its own default, not today's
    judge = module.GroundedJudge(**({"topic_threshold": float(default.group(1))} if default else {}))
    takes_document = "document" in inspect.signature(judge.judge).parameters
    return lambda q, m, s, r, p, d: judge.judge(q, m, s, r, document=d) if takes_document else judge.judge(q, m, s, r)


def _grounded(judge: Any) -> Judge:
    """A grounded judge as a check: it takes no P(YES)."""
    return lambda q, m, s, r, p, d: judge.judge(q, m, s, r, document=d)


def _judges(baseline: str | None) -> dict[str, Judge]:
    from marginalia.patterns.judges import CombinedJudge, GroundedJudge

    judges: dict[str, Judge] = {}
    if baseline:
        judges[f"grounded @ {baseline}"] = _baseline_judge(baseline)

    def combined(judge: CombinedJudge) -> Judge:
        return lambda q, m, s, r, p, d: judge.judge(q, m, s, r, p, d)

    for topic in (0.2, 0.25, 0.3, 0.4):
        judges[f"grounded, topicality >= {topic}"] = _grounded(GroundedJudge(topic_threshold=topic))
    for weight in (0.25, 0.5):
        judges[f"combined, P(YES) weight {weight}"] = combined(CombinedJudge(weight=weight))
    judges["the model's P(YES) >= 0.5 alone"] = \
        lambda q, m, s, r, p, d: type("V", (), {"relevant": (p or 0) >= 0.5})
    return judges


def evaluate(args: argparse.Namespace) -> None:
    from marginalia.bench.metrics import bearing_is_telling, holds_answer
    from marginalia.records import Segment

    rows = [json.loads(line) for line in Path(args.margins).read_text().splitlines() if line.strip()]
    rows = [row for row in rows if bearing_is_telling(row["question"], row["answers"])]
    judges = _judges(args.baseline)
    tasks = sorted({row["task"] for row in rows})
    lines = ["| check | task | kept | precision | recall | questions with a kept answer "
             "| precision, answer or gold passage |", "|---|---|---:|---:|---:|---:|---:|"]
    for label, judge in judges.items():
        for task in [*tasks, "all"]:
            kept = hits = bearing = asked = found = located = on_gold = 0
            for row in rows:
                if task != "all" and row["task"] != task:
                    continue
                any_bearing = any_kept = False
                for m in row["margins"]:
                    read = row["context"][: m["end"]]
                    v = judge(row["question"], m["raw"], Segment(m["segment"], 0, m["end"], read, ()), read,
                              m["p_yes"], row["context"])
                    evidence = getattr(v, "evidence", None)
                    has = holds_answer(m["raw"], row["answers"])
                    if v.relevant and row.get("gold_spans"):
                        located += 1
                        on_gold += has or bool(evidence and any(evidence[0] < b and a < evidence[1]
                                                                for a, b in row["gold_spans"]))
                    kept += v.relevant
                    hits += v.relevant and has
                    bearing += has
                    any_bearing |= has
                    any_kept |= bool(v.relevant and has)
                asked += any_bearing
                found += any_kept
            precision = f"{hits / kept:.2f}" if kept else "-"
            recall = f"{hits / bearing:.2f}" if bearing else "-"
            by_question = f"{found}/{asked}"
            gold = f"{on_gold / located:.2f}" if located else "-"
            lines.append(f"| {label} | {task} | {kept} | {precision} | {recall} | {by_question} | {gold} |")
    n = {t: sum(r["task"] == t for r in rows) for t in tasks}
    margins = sum(len(r["margins"]) for r in rows)
    written = "; ".join(sorted({row["written"] for row in rows if row.get("written")}))
    sources = " and ".join(f"{count} {NAMES.get(t, t)}" for t, count in n.items())
    body = "\n".join([
        "## Relevance checks on written margins (`benchmarks/relevance_check.py`)"
        + ("" if args.section == "relevance_check" else f": {args.section}"),
        "",
        f"Command: `{command_line()}` · commit {git_commit()}",
        "",
        f"Margins written by WiM ({margins}, from {sources} development items, the gold passage among "
        "distractors" + (f", written {written}" if written else "") + "; questions answered yes or no, or "
        "naming their own answer (comparisons), left out) are judged again, "
        "offline, by each check. Precision: of the kept "
        "margins, the share holding a gold answer (SQuAD-normalised); recall: of the margins holding one, the "
        "share kept; the next column counts questions where an answer-bearing margin was written and one was "
        "kept. A multi-hop question's bridge fact holds no gold answer, yet the answer needs it: the last "
        "column counts a kept margin as right when it holds a gold answer or its evidence lies in a gold "
        "passage.",
        "",
        *lines,
    ])
    if args.write:
        write_section(args.section, body)
    print(body)


KINDS = {  # margin kind -> whether it holds the answer
    "bare gold answer": True, "the answer's sentence, copied": True, "the question's words, then the answer": True,
    "the answer's sentence, another answer put in": False, "another sentence of the gold paragraph": False,
    "a distractor sentence sharing a question word": False, "a distractor sentence": False,
}


def _controlled_items(limit: int, seed: int = 7) -> list[dict[str, Any]]:
    """Margins of known kinds (`KINDS`) for SQuAD questions: the gold paragraph among six others."""
    import random

    from marginalia.patterns.grounding import sentence_spans, units

    data = json.loads((DATA / SOURCES["squad"]).read_text())["data"]
    paragraphs = [(a["title"], p) for a in data for p in a["paragraphs"]]
    rng = random.Random(seed)
    picks = rng.sample(range(len(paragraphs)), min(limit, len(paragraphs)))
    items = []
    for k in picks:
        title, para = paragraphs[k]
        qa = para["qas"][0]
        answer = qa["answers"][0]
        others = [p for t, p in rng.sample(paragraphs, 12) if t != title][:6]
        context_parts = [o["context"] for o in others[:3]] + [para["context"]] + [o["context"] for o in others[3:]]
        context = "\n\n".join(context_parts)
        gold_at = context.index(para["context"])
        start = gold_at + answer["answer_start"]
        spans = sentence_spans(context)
        gold_sentences = [(a, b) for a, b in spans if gold_at <= a < gold_at + len(para["context"])]
        own = next(((a, b) for a, b in gold_sentences if a <= start < b), None)
        if own is None or answer["text"] not in context[own[0]:own[1]]:
            continue
        sentence = context[own[0]:own[1]]
        margins = {"bare gold answer": answer["text"], "the answer's sentence, copied": sentence,
                   "the question's words, then the answer": f"{qa['question'].strip().rstrip('?')}: {answer['text']}."}
        swap = next((o["qas"][0]["answers"][0]["text"] for o in others
                     if o["qas"][0]["answers"][0]["text"] not in sentence), None)
        if swap:
            margins["the answer's sentence, another answer put in"] = sentence.replace(answer["text"], swap, 1)
        rest = [context[a:b] for a, b in gold_sentences if (a, b) != own and answer["text"] not in context[a:b]]
        if rest:
            margins["another sentence of the gold paragraph"] = rng.choice(rest)
        distract = [context[a:b] for a, b in spans if not gold_at <= a < gold_at + len(para["context"])
                    and answer["text"] not in context[a:b]]
        asked = set(units(qa["question"]))
        sharing = [d for d in distract if asked & set(units(d))]
        if sharing:
            margins["a distractor sentence sharing a question word"] = rng.choice(sharing)
        margins["a distractor sentence"] = rng.choice(distract)
        items.append({"question": qa["question"], "context": context, "margins": margins})
    return items


def controlled(args: argparse.Namespace) -> None:
    """Keep rates by margin kind (SQuAD, margins made from the data) and bare answers kept (the demo)."""
    from marginalia.app import demo
    from marginalia.records import Segment

    judges = {k: v for k, v in _judges(args.baseline).items() if not k.startswith(("combined", "the model"))}
    items = _controlled_items(args.limit)
    text, questions = demo()
    header = "| check | " + " | ".join(KINDS) + " | demo: bare answer kept |"
    lines = [header, "|---|" + "---:|" * (len(KINDS) + 1)]
    for label, judge in judges.items():
        cells = []
        for kind in KINDS:
            rows = [it for it in items if kind in it["margins"]]
            kept = sum(bool(judge(it["question"], it["margins"][kind], Segment(0, 0, len(it["context"]),
                                                                                it["context"], ()),
                                  it["context"], None, it["context"]).relevant) for it in rows)
            cells.append(f"{kept}/{len(rows)}")
        demo_kept = sum(bool(judge(q["question"], q["answer"], Segment(0, 0, len(text), text, ()), text,
                                   None, text).relevant) for q in questions)
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {demo_kept}/{len(questions)} |")
    body = "\n".join([
        "## Relevance checks on margins of known kinds (`benchmarks/relevance_check.py controlled`)",
        "",
        f"Command: `{command_line()}` · commit {git_commit()}",
        "",
        f"{len(items)} SQuAD development questions, each with its gold paragraph among six others; for each, "
        "margins made from the data: the first three hold the answer and should be kept (the third restates the "
        "question, as small models do, then gives the answer), the others should not. "
        "Last column: the bare gold answer of each bundled demo question, judged against the demo report.",
        "",
        *lines,
    ])
    if args.write:
        write_section("relevance_check_controlled", body)
    print(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    c = sub.add_parser("collect", help="write margins with the real model")
    r = sub.add_parser("from-run", help="the margins file from a marginalia bench run's WiM results")
    r.add_argument("run", help="the run's name (its folder under marginalia's bench runs)")
    r.add_argument("--out", required=True, help="the margins JSONL to write (keep it outside the repository)")
    r.add_argument("--pattern", default="wim", help="the run's wim pattern")
    c.add_argument("--out", required=True, help="the margins JSONL to write (keep it outside the repository)")
    c.add_argument("--model", default="smollm2")
    c.add_argument("--limit", type=int, default=20, help="items per dataset")
    c.add_argument("--context-tokens", type=int, default=1024)
    c.add_argument("--segment-tokens", type=int, default=512)
    e = sub.add_parser("evaluate", help="judge the collected margins with each check")
    e.add_argument("--margins", required=True)
    e.add_argument("--baseline", help="also judge with the grounded judge of this git commit")
    e.add_argument("--write", action="store_true", help="write the table to BENCHMARKS.md")
    e.add_argument("--section", default="relevance_check",
                   help="the BENCHMARKS.md section to write (another keeps the margins of another source apart)")
    k = sub.add_parser("controlled", help="keep rates of margins made from the data, no model")
    k.add_argument("--limit", type=int, default=200, help="SQuAD questions")
    k.add_argument("--baseline", help="also judge with the grounded judge of this git commit")
    k.add_argument("--write", action="store_true", help="write the table to BENCHMARKS.md")
    args = ap.parse_args()
    if not DATA.is_dir():
        sys.exit(f"no development data at {DATA}")
    steps = {"collect": collect, "from-run": from_run, "evaluate": evaluate, "controlled": controlled}
    steps[args.step](args)


if __name__ == "__main__":
    main()
