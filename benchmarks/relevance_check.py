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

``controlled`` judges margins made from the data, of known kinds, without a model (SQuAD; HotpotQA's
multi-hop questions with ``--dataset hotpotqa``; MultiHop-RAG's with ``--dataset multihop``).
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
from _common import ROOT, auc, command_line, git_commit, stored_run, write_section  # noqa: E402

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
                                    "margins": margins, "answer": answer,
                                    "written": f"by {Path(gen.name).name} (collect, {args.context_tokens} tokens)"})
                        + "\n")
                f.flush()
                print(f"{dataset} {item.id}: {len(margins)} margins, {time.perf_counter() - t0:.1f}s", flush=True)


def from_run(args: argparse.Namespace) -> None:
    from marginalia import app
    from marginalia.bench.config import pattern_record
    from marginalia.bench.folder import read_results
    from marginalia.bench.tasks import build_items
    from marginalia.models import load_generator
    from marginalia.patterns.wim import WiM

    folder, info, config = stored_run(args.run)
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
    for weight in (0.25, 0.5, 0.75, 1.0):
        judges[f"combined, P(YES) weight {weight}"] = combined(CombinedJudge(weight=weight))
    judges["the model's P(YES) >= 0.5 alone"] = \
        lambda q, m, s, r, p, d: type("V", (), {"relevant": (p or 0) >= 0.5})
    return judges


def evaluate(args: argparse.Namespace) -> None:
    from marginalia.bench.metrics import bearing_is_telling, holds_answer
    from marginalia.records import Segment

    path = Path(args.margins)
    if not path.is_file():
        sys.exit(f"no margins file at {path}; write one with `collect --out {path}` or `from-run RUN --out {path}`")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [row for row in rows if bearing_is_telling(row["question"], row["answers"])]
    if not rows:
        sys.exit(f"{path} holds no margins of questions with a telling gold answer (yes/no and comparison "
                 "questions are left out)")
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
    ranking = _p_yes_ranking(rows, tasks)
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
        *([""] + ranking if ranking else []),
    ])
    if args.write:
        write_section(args.section, body)
    print(body)


def _p_yes_ranking(rows: list[dict[str, Any]], tasks: list[str]) -> list[str]:
    """Per task, how well the model's stored P(YES) ranks the margins holding a gold answer above the others
    (ROC AUC: 0.5 is chance), and the range it spans; nothing where no margin has one."""
    from marginalia.bench.metrics import holds_answer

    out = []
    for task in tasks:
        scored = [(m["p_yes"], holds_answer(m["raw"], r["answers"])) for r in rows if r["task"] == task
                  for m in r["margins"] if m.get("p_yes") is not None]
        bearing = sum(has for _, has in scored)
        if not 0 < bearing < len(scored):
            continue
        probs = [p for p, _ in scored]
        out.append(f"- {NAMES.get(task, task)}: the model's P(YES) ranks the {bearing} margins holding a gold "
                   f"answer above the other {len(scored) - bearing} with ROC AUC {auc(scored):.2f} (0.5 is "
                   f"chance); it spans {min(probs):.2f}-{max(probs):.2f}.")
    return out


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


MULTIHOP_KINDS = {  # margin kind -> whether it holds the answer
    "the question's words, then the answer": True,
    "the question's words, then the answer's supporting sentence": True,
    "the question's words, then the bridge passage's supporting sentence": False,
    "the question's words, then a distractor sentence": False,
    "the question's words, then a distractor sentence sharing a name with a gold passage": False,
}


def _multihop_items(seed: int = 7) -> list[dict[str, Any]]:
    """Margins of known kinds (`MULTIHOP_KINDS`) for HotpotQA's bridge questions: the question restated, as
    small models write a multi-hop margin, then a sentence of a gold or a distractor passage. Only the first
    two hold the answer; the bridge passage's sentence is needed but answers nothing."""
    import random

    from marginalia.bench.datasets import load_hotpotqa
    from marginalia.bench.metrics import holds_answer
    from marginalia.bench.tasks import render
    from marginalia.patterns.grounding import question_names, units

    rng = random.Random(seed)
    raw = {str(r.get("_id", r.get("id", i))): r
           for i, r in enumerate(json.loads((DATA / SOURCES["hotpotqa"]).read_text()))}
    items = []
    for example in load_hotpotqa(DATA / SOURCES["hotpotqa"]):
        record = raw[example.id]
        answer = example.answers[0]
        if record.get("type") != "bridge" or answer.lower() in ("yes", "no"):
            continue
        sentences = {title: sents for title, sents in record["context"]}
        facts = [(t, k) for t, k in example.meta["supporting_facts"] if k < len(sentences[t])]
        holds = {(t, k): holds_answer(sentences[t][k], [answer]) for t, k in facts}
        answer_titles = {t for (t, _), held in holds.items() if held}
        holding = [sentences[t][k].strip() for t, k in facts if holds[t, k]]
        bridge = [sentences[t][k].strip() for t, k in facts if t not in answer_titles]
        if not holding:
            continue
        gold_names = set().union(*(question_names(s) for t, _ in facts for s in sentences[t]))
        distract = [s.strip() for t, sents in record["context"] if t not in {f[0] for f in facts} for s in sents
                    if s.strip() and not holds_answer(s, [answer])]
        said = example.question.strip().rstrip("?")
        margins = {"the question's words, then the answer": f"{said}: {answer}.",
                   "the question's words, then the answer's supporting sentence": f"{said}: {holding[0]}"}
        if bridge:
            margins["the question's words, then the bridge passage's supporting sentence"] = f"{said}: {bridge[0]}"
        if distract:
            margins["the question's words, then a distractor sentence"] = f"{said}: {rng.choice(distract)}"
        sharing = [d for d in distract if set(units(d)) & gold_names - set(units(example.question))]
        if sharing:
            margins["the question's words, then a distractor sentence sharing a name with a gold passage"] = \
                f"{said}: {rng.choice(sharing)}"
        context = "\n\n".join(render(p, titles=True) for p in example.passages)
        items.append({"question": example.question, "context": context, "margins": margins})
    return items


RAG_KINDS = {  # margin kind -> whether it holds the answer
    "the question's words, then the answer": True,
    "the question's words, then the answer's evidence": True,
    "the question's words, then other evidence": False,
    "the question's words, then a distractor's fact": False,
}


def _multihop_rag_items(seed: int = 3) -> list[dict[str, Any]]:
    """Margins of known kinds (`RAG_KINDS`) for MultiHop-RAG's inference questions whose answer an evidence fact
    holds: the question restated, then the answer, an evidence fact (the answer's or another), or the fact of
    another question (a distractor). Each item's context: its evidence among twelve distractor facts, each under
    its article's title."""
    import random

    from marginalia.bench.datasets import load_multihop
    from marginalia.bench.metrics import holds_answer
    from marginalia.bench.tasks import render

    examples = load_multihop(DATA / "multihop-rag-queries.part1.jsonl")
    rng = random.Random(seed)
    pool = [(example.id, passage) for example in examples for passage in example.passages]
    items = []
    for example in examples:
        if not example.answers or example.meta.get("question_type") != "inference_query":
            continue
        answer = example.answers[0]
        holding = [p for p in example.passages if holds_answer(p.text, [answer])]
        if not holding:
            continue
        others = [p for p in example.passages if p not in holding]
        distract = [p for owner, p in rng.sample(pool, 40)
                    if owner != example.id and not holds_answer(p.text, [answer])][:12]
        passages = distract[:6] + list(example.passages) + distract[6:]
        said = example.question.rstrip("?")
        margins = {"the question's words, then the answer": f"{said}: {answer}.",
                   "the question's words, then the answer's evidence": f"{said}: {holding[0].text}",
                   "the question's words, then a distractor's fact": f"{said}: {distract[0].text}"}
        if others:
            margins["the question's words, then other evidence"] = f"{said}: {others[0].text}"
        context = "\n\n".join(render(p, titles=True) for p in passages)
        items.append({"question": example.question, "context": context, "margins": margins})
    return items


def controlled(args: argparse.Namespace) -> None:
    """Keep rates by margin kind (margins made from the data) and, for SQuAD, bare answers kept (the demo)."""
    from marginalia.app import demo
    from marginalia.records import Segment

    judges = {k: v for k, v in _judges(args.baseline).items() if not k.startswith(("combined", "the model"))}
    squad = args.dataset == "squad"
    kinds = {"squad": KINDS, "hotpotqa": MULTIHOP_KINDS, "multihop": RAG_KINDS}[args.dataset]
    items = {"squad": lambda: _controlled_items(args.limit), "hotpotqa": _multihop_items,
             "multihop": _multihop_rag_items}[args.dataset]()
    text, questions = demo()
    header = "| check | " + " | ".join(kinds) + (" | demo: bare answer kept |" if squad else " |")
    lines = [header, "|---|" + "---:|" * (len(kinds) + squad)]
    for label, judge in judges.items():
        cells = []
        for kind in kinds:
            rows = [it for it in items if kind in it["margins"]]
            kept = sum(bool(judge(it["question"], it["margins"][kind], Segment(0, 0, len(it["context"]),
                                                                                it["context"], ()),
                                  it["context"], None, it["context"]).relevant) for it in rows)
            cells.append(f"{kept}/{len(rows)}")
        if squad:
            demo_kept = sum(bool(judge(q["question"], q["answer"], Segment(0, 0, len(text), text, ()), text,
                                       None, text).relevant) for q in questions)
            cells.append(f"{demo_kept}/{len(questions)}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if squad:
        title = "## Relevance checks on margins of known kinds (`benchmarks/relevance_check.py controlled`)"
        about = (f"{len(items)} SQuAD development questions, each with its gold paragraph among six others; for "
                 "each, margins made from the data: the first three hold the answer and should be kept (the third "
                 "restates the question, as small models do, then gives the answer), the others should not. "
                 "Last column: the bare gold answer of each bundled demo question, judged against the demo report.")
    elif args.dataset == "multihop":
        title = ("## Relevance checks on MultiHop-RAG margins of known kinds "
                 "(`benchmarks/relevance_check.py controlled --dataset multihop`)")
        about = (f"The {len(items)} MultiHop-RAG development questions of the inference type whose answer an "
                 "evidence fact holds, each judged against its evidence among twelve facts of other questions, "
                 "each under its article's title. Each margin restates the question, then adds the answer, the "
                 "evidence fact holding it, another evidence fact (needed, answers nothing), or a distractor's "
                 "fact. The clause rule's share (`judges.CLAUSE_SHARE`) was chosen on these questions; no other "
                 "part of the judge was tuned on them.")
    else:
        title = ("## Relevance checks on multi-hop margins of known kinds "
                 "(`benchmarks/relevance_check.py controlled --dataset hotpotqa`)")
        about = (f"The {len(items)} HotpotQA development questions of the bridge type (the answer lies in a "
                 "passage the question names only through another one), each judged against its ten passages "
                 "(two gold, eight distractors; about a thousand tokens). Each margin restates the question, as "
                 "small models write a multi-hop margin, then adds the answer, or a sentence: a supporting "
                 "sentence of the answer's passage, of the bridge passage, or of a distractor (any, or one "
                 "sharing a name with the gold passages). The first two hold the answer and should be kept; the "
                 "bridge passage's sentence is needed but answers nothing; the distractors' should be dropped. "
                 "These questions overlap the written margins' HotpotQA items.")
    body = "\n".join([title, "", f"Command: `{command_line()}` · commit {git_commit()}", "", about, "", *lines])
    if args.write:
        write_section("relevance_check_controlled" + ("" if squad else f"_{args.dataset}"), body)
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
    k.add_argument("--dataset", choices=("squad", "hotpotqa", "multihop"), default="squad",
                   help="squad: single-hop margins of seven kinds; hotpotqa: multi-hop margins (bridge questions); "
                        "multihop: MultiHop-RAG's inference questions")
    k.add_argument("--baseline", help="also judge with the grounded judge of this git commit")
    k.add_argument("--write", action="store_true", help="write the table to BENCHMARKS.md")
    args = ap.parse_args()
    if not DATA.is_dir():
        sys.exit(f"no development data at {DATA}")
    steps = {"collect": collect, "from-run": from_run, "evaluate": evaluate, "controlled": controlled}
    steps[args.step](args)


if __name__ == "__main__":
    main()
