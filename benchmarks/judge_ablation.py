"""A rule of the grounded judge, on and off, paired: the same WiM readings answered under each.

WiM reads each item of a bench run's task once, with the judge as it is (the rule on); the margins it wrote are
judged again with the rule off, and where a verdict differs the same reading answers the question again (the
margins are written anew from the kept reading: greedy decoding writes the same ones). Where no verdict differs
the answer is the same by construction. Reported: right answers under each (`contains`, or set F1 for a list
task), the paired difference with its bootstrap 95% interval, and the items whose kept margins changed.

Each item's record goes to a file in the run's folder as it is made; running the command again goes on from it.

    python benchmarks/judge_ablation.py quality-4k --task multihop --rule clause_share [--limit 50]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import command_line, git_commit, stored_run, write_section  # noqa: E402

#: the grounded judge's rules that can be turned off, each with what it does when on
RULES = {
    "clause_share": "a sentence holding half of one clause's words of a question of several clauses is on the "
                    "question (`grounding.question_clauses`)",
    "link_sentences": "a multi-hop margin may take the question's words from a passage that names its fact's "
                      "subject (`grounding.Reading.linked_topic`)",
}
OFF = {"clause_share": None, "link_sentences": 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a bench run's name (its folder under marginalia's bench runs): its config gives "
                                "the model, the task's items and the wim pattern")
    ap.add_argument("--task", default="multihop", help="the run's task")
    ap.add_argument("--rule", default="clause_share", choices=sorted(RULES), help="the judge's rule to turn off")
    ap.add_argument("--pattern", default="wim", help="the run's wim pattern")
    ap.add_argument("--limit", type=int, default=50, help="at most this many items (default 50)")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave BENCHMARKS.md alone")
    args = ap.parse_args()
    if args.limit < 1:
        ap.error("--limit must be at least 1")

    from marginalia import app
    from marginalia.bench.config import pattern_record
    from marginalia.bench.folder import read_results
    from marginalia.bench.metrics import score_item
    from marginalia.bench.report import bootstrap
    from marginalia.bench.tasks import build_items
    from marginalia.models import load_generator
    from marginalia.patterns.judges import GroundedJudge
    from marginalia.records import Segment

    folder, _, config = stored_run(args.run)
    table = next((p for p in config.patterns if (p.name or p.kind) == args.pattern and p.kind == "wim"), None)
    task = next((t for t in config.tasks if (t.name or t.dataset) == args.task), None)
    if table is None or task is None:
        sys.exit(f"run {args.run!r} has no wim pattern {args.pattern!r} or no task {args.task!r}")
    records = folder / f"judge_ablation-{args.task}-{args.rule}.jsonl"
    done = {r["id"]: r for r in read_results(records)}  # a line cut short by a kill is made again
    gen = load_generator(config.model, backend=config.backend, device=config.device)
    wim = app.pattern(pattern_record(table), gen, None)
    judge = wim.judge
    if not isinstance(judge, GroundedJudge):
        sys.exit(f"pattern {args.pattern!r} uses the {judge.mode} judge; the rules are the grounded judge's")
    on = getattr(judge, args.rule)
    items = build_items(task.spec(min(args.limit, task.limit or args.limit)), gen.tokenizer)[: args.limit]
    t0 = time.perf_counter()
    for n, item in enumerate(items, 1):
        if item.id in done:
            continue
        started = time.perf_counter()
        setattr(judge, args.rule, on)
        reader = wim.reader(item.context, source=item.id)
        with_rule = reader.answer(item.question)
        setattr(judge, args.rule, OFF[args.rule])
        flipped = []
        for m in with_rule.margins:
            if m.read_to is None:
                continue
            read = item.context[: m.read_to]
            verdict = judge.judge(item.question, m.text, Segment(m.segment_index, 0, m.read_to, read, ()), read,
                                  document=item.context)
            if verdict.relevant != m.relevant:
                flipped.append({"margin": m.text[:160], "on": m.relevant, "reason_on": m.reason})
        without = reader.answer(item.question) if flipped else with_rule
        setattr(judge, args.rule, on)
        record = {"id": item.id, "question": item.question, "gold": list(item.answers),
                  "on": with_rule.text, "off": without.text, "flipped": flipped,
                  "seconds": round(time.perf_counter() - started, 1), "commit": git_commit()}
        with records.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")
        done[item.id] = record
        print(f"{n}/{len(items)} {item.id}: {len(flipped)} verdicts differ", file=sys.stderr)
    seconds = time.perf_counter() - t0

    scored = [(it, done[it.id]) for it in items if it.id in done]
    key = "f1" if any(it.scoring == "set" for it, _ in scored) else "contains"
    rows = [r for _, r in scored]
    on_scores = [score_item(it, r["on"])[key] for it, r in scored]
    off_scores = [score_item(it, r["off"])[key] for it, r in scored]
    diffs = [a - b for a, b in zip(on_scores, off_scores, strict=True)]
    k = len(rows)
    lo, hi = bootstrap(diffs) if k else (0.0, 0.0)
    changed = [r for r in rows if r["flipped"]]
    commits = sorted({r["commit"] for r in rows})
    metric = "set F1" if key == "f1" else "`contains`"
    body = "\n".join([
        f"## A judge rule on and off, paired (`benchmarks/judge_ablation.py`): {args.task}, {args.rule}",
        "",
        f"Command: `{command_line()}` · records made at commit {', '.join(commits)} · this report at commit "
        f"{git_commit()} · run `{args.run}`'s config: model `{config.model}`, pattern `{args.pattern}` · "
        f"{seconds / 60:.1f} min this time, {sum(r['seconds'] for r in rows) / 60:.1f} min in all",
        "",
        f"The rule: {RULES[args.rule]}. {k} items of `{args.task}`; each read once by WiM with the rule on, its "
        "margins judged again with the rule off, and answered again from the same reading where a verdict "
        f"differs; right = {metric}.",
        "",
        "| judge | right | mean |",
        "|---|---:|---:|",
        f"| rule on (today's default) | {sum(on_scores):.0f}/{k} | {sum(on_scores) / max(k, 1):.2f} |",
        f"| rule off | {sum(off_scores):.0f}/{k} | {sum(off_scores) / max(k, 1):.2f} |",
        "",
        f"- On minus off: {sum(diffs) / max(k, 1):+.2f} [{lo:+.2f}, {hi:+.2f}] (paired bootstrap 95% interval); "
        f"items whose verdicts differ: {len(changed)} of {k} ({sum(len(r['flipped']) for r in changed)} margins); "
        f"right with the rule on only: {sum(d > 0 for d in diffs)}, off only: {sum(d < 0 for d in diffs)}.",
        *(f"- {r['id']}: gold {r['gold'][0]!r}; on {r['on'][:60]!r}, off {r['off'][:60]!r}; kept only "
          f"{'on' if r['flipped'][0]['on'] else 'off'}: {r['flipped'][0]['margin'][:90]!r}" for r in changed[:8]),
    ])
    print(body)
    if not args.no_write:
        write_section(f"judge_ablation_{args.task}_{args.rule}", body)


if __name__ == "__main__":
    main()
