"""Yes/no questions asked again: a bench run's questions whose gold answer is yes or no, answered anew by one of
its patterns with this checkout's prompts, beside that pattern's stored answers on the same items.

Small models often answer "Does the article suggest X, while the other implies Y?" by restating the claim,
which `contains` scores wrong whatever it means. Reported: answers that say neither yes nor no, and answers
right by `contains`, stored and anew, with the paired difference; the stored answers' commit is the run's.

    python lab/yes_no.py quality-4k [--task multihop] [--pattern lc-own] [--limit 20]
"""

from __future__ import annotations

import argparse
import sys
import time

from _lab_common import command_line, git_commit, stored_run, write_finding


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a bench run's name (its folder under marginalia's bench runs)")
    ap.add_argument("--task", default="multihop", help="the run's task")
    ap.add_argument("--pattern", default="lc-own", help="the run's pattern to answer with again")
    ap.add_argument("--limit", type=int, default=None, help="at most this many questions")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave lab/findings alone")
    args = ap.parse_args()
    if args.limit is not None and args.limit < 1:
        ap.error("--limit must be at least 1")

    from marginalia import load_model, make_pattern
    from marginalia.bench import (
        RESULTS,
        bootstrap,
        build_items,
        is_yes_no_gold,
        normalize_answer,
        pattern_record,
        qa_scores,
        read_results,
        says_neither_yes_nor_no,
    )

    folder, info, config = stored_run(args.run)
    table = next((p for p in config.patterns if (p.name or p.kind) == args.pattern), None)
    task = next((t for t in config.tasks if (t.name or t.dataset) == args.task), None)
    if table is None or task is None:
        sys.exit(f"run {args.run!r} has no pattern {args.pattern!r} or no task {args.task!r}")
    stored = {r["item_id"]: r for r in read_results(folder / RESULTS)
              if r["task"] == args.task and r["pattern"] == args.pattern and r.get("status") == "ok"
              and is_yes_no_gold(r["answers"])}
    if not stored:
        sys.exit(f"run {args.run!r} has no answered yes/no question of {args.task!r} by {args.pattern!r}")
    gen = load_model(config.model, backend=config.backend, device=config.device)
    pattern = make_pattern(pattern_record(table), gen)
    items = [it for it in build_items(task.spec(), gen.tokenizer) if it.id in stored]
    if not items:
        sys.exit(f"the run's stored config no longer builds the items of its {args.task!r} answers")
    items = items[: args.limit]
    t0 = time.perf_counter()
    rows = []
    for n, item in enumerate(items, 1):
        old = stored[item.id]["prediction"]
        new = pattern.answer(item.context, item.question).text
        rows.append((item, old, new))
        print(f"{n}/{len(items)} {item.answers[0]!r}: {new[:90]!r}", file=sys.stderr)
    seconds = time.perf_counter() - t0

    before = [qa_scores(old, it.answers)["contains"] for it, old, _ in rows]
    after = [qa_scores(new, it.answers)["contains"] for it, _, new in rows]
    diffs = [a - b for a, b in zip(after, before, strict=True)]
    diff = sum(diffs) / max(1, len(diffs))
    lo, hi = bootstrap(diffs)
    neither = [(says_neither_yes_nor_no(old, it.answers), says_neither_yes_nor_no(new, it.answers))
               for it, old, new in rows]
    k = len(rows)
    gold_yes = sum(normalize_answer(it.answers[0]) == "yes" for it, _, _ in rows)
    said_yes = sum(normalize_answer(new).split()[:1] == ["yes"] for _, _, new in rows)
    body = "\n".join([
        "## Yes/no questions asked again (`lab/yes_no.py`)",
        "",
        f"Command: `{command_line()}` · commit {git_commit()} (stored answers: run `{args.run}`, started at commit "
        f"{str((info.get('commit') or {}).get('commit', '?'))[:10]}) · model `{config.model}` · pattern `{args.pattern}` · "
        f"{seconds / 60:.1f} min",
        "",
        f"The {k} questions of `{args.task}` whose gold answer is yes or no, answered again by `{args.pattern}` "
        "on the same items with this checkout's prompts; right = `contains`.",
        "",
        "| answers | say neither yes nor no | right |",
        "|---|---:|---:|",
        f"| stored | {sum(a for a, _ in neither)}/{k} | {sum(before):.0f}/{k} |",
        f"| anew | {sum(b for _, b in neither)}/{k} | {sum(after):.0f}/{k} |",
        "",
        f"- Right, anew minus stored: {diff:+.2f} [{lo:+.2f}, {hi:+.2f}] (paired bootstrap 95% interval).",
        f"- Gold answer yes: {gold_yes}/{k}; answers anew that open with yes: {said_yes}/{k} (where they are all "
        "yes, the gain is what `contains` can now read, not better reading: answering yes to every question "
        "scores the gold yes share).",
        "- Examples, stored → anew: " + "; ".join(f"{old[:70]!r} → {new[:70]!r} (gold {it.answers[0]})"
                                                    for it, old, new in rows[:3]),
    ])
    print(body)
    if not args.no_write:
        write_finding("yes_no", body)


if __name__ == "__main__":
    main()
