"""Two values of an answer option, paired: the same readings asked under each.

Each item of a run config's tasks is read once per pattern (wim: one reading, whose margins are written again
for the second ask; lc: one prompt whose context llama.cpp keeps, so the second ask prefills only the question
block), then asked with the option at value A and at value B: `answer_style` by default (`--styles`), or another
of WiM's options (`--option kept_as --values written,sentence`; long context, which has no such option, is then
asked once and its answer stands under both). For answer styles, questions asked for yes or no are left out:
every style but `short` asks them the same way. Reported per task and pattern: right answers under each value
(`contains`), the paired difference B - A with its bootstrap 95% interval, and WiM minus long context under each.

Records go to ``<home>/bench/answer_ablation/<config name>-<A>-<B>.jsonl`` (``<config name>-<option>-<A>-<B>``
for another option) as they are made; running the command again goes on from them.

    python benchmarks/answer_ablation.py configs/bench/answer-style.toml --styles sentence,lead
    python benchmarks/answer_ablation.py configs/bench/answer-style.toml --option kept_as --values written,sentence
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import command_line, git_commit, machine, write_section  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", help="a bench run config (.toml): its model, tasks, and wim and lc patterns")
    ap.add_argument("--styles", "--values", dest="styles", default="sentence,lead",
                    help="the option's two values, A,B (default: the answer styles sentence,lead)")
    ap.add_argument("--option", default="answer_style",
                    help="the option asked at the two values (default: answer_style; or one of WiM's, e.g. kept_as)")
    ap.add_argument("--tasks", help="only these tasks (comma-separated; default: all)")
    ap.add_argument("--limit", type=int, default=50, help="at most this many questions per task (default 50)")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave BENCHMARKS.md alone")
    args = ap.parse_args()
    from pydantic import ValidationError

    from marginalia.options import ANSWER_STYLES, LcOptions, WimOptions

    styles = tuple(s.strip() for s in args.styles.split(","))
    if args.option == "answer_style":
        if len(styles) != 2 or styles[0] == styles[1] or not set(styles) <= set(ANSWER_STYLES):
            ap.error(f"--styles takes two different styles of {', '.join(ANSWER_STYLES)}, e.g. sentence,lead")
    elif args.option not in WimOptions.model_fields:
        ap.error(f"--option {args.option!r} is no WiM option; try answer_style or kept_as")
    else:
        if len(styles) != 2 or styles[0] == styles[1]:
            ap.error(f"--values takes two different values of {args.option}, e.g. written,sentence")
        for value in styles:
            try:
                WimOptions.model_validate({args.option: value})
            except ValidationError as exc:
                ap.error(f"--values: {value!r} is no value of {args.option} "
                         f"({exc.errors()[0]['msg']})")
    if args.limit < 1:
        ap.error("--limit must be at least 1")

    from marginalia import app
    from marginalia.bench.config import load_config, pattern_record
    from marginalia.bench.folder import read_results
    from marginalia.bench.tasks import build_items
    from marginalia.errors import UserError
    from marginalia.home import resolve_home
    from marginalia.models import load_generator
    from marginalia.patterns.base import is_yes_no_question

    try:
        config = load_config(args.config)
    except UserError as exc:
        sys.exit(f"answer_ablation.py: {exc}")
    name = config.name or Path(args.config).stem
    tables = {t.kind: t for t in config.patterns if t.kind in ("wim", "lc") and not getattr(t, "reading", None)}
    if set(tables) != {"wim", "lc"}:
        sys.exit(f"{args.config} needs a wim pattern and an lc pattern that reads the context itself")
    wanted = [t.strip() for t in args.tasks.split(",")] if args.tasks else None
    tasks = [t for t in config.tasks if wanted is None or (t.name or t.dataset) in wanted]
    if not tasks:
        sys.exit(f"no task of {args.config} is named {args.tasks}")
    folder = resolve_home() / "bench" / "answer_ablation"
    folder.mkdir(parents=True, exist_ok=True)
    option = args.option
    tag = "" if option == "answer_style" else f"{option}-"
    records = folder / f"{name}-{tag}{styles[0]}-{styles[1]}.jsonl"
    done = {(r["id"], r["pattern"]): r for r in read_results(records)}  # a line cut short is made again
    gen = load_generator(config.model, backend=config.backend, device=config.device)
    patterns = {kind: app.pattern(pattern_record(table), gen, None) for kind, table in tables.items()}

    def ask(kind: str, item: Any) -> dict[str, Any]:
        pattern = patterns[kind]
        base = pattern.options
        started = time.perf_counter()
        texts = {}
        reader = pattern.reader(item.context, source=item.id) if kind == "wim" else None
        try:
            for style in styles:
                if kind == "lc" and option not in LcOptions.model_fields:  # not long context's: asked once
                    texts[style] = texts[styles[0]] if texts else pattern.answer(item.context, item.question).text
                    continue
                pattern.options = type(base).model_validate({**base.model_dump(), option: style})
                answer = reader.answer(item.question) if reader else pattern.answer(item.context, item.question)
                texts[style] = answer.text
        finally:
            pattern.options = base
        return {"id": item.id, "task": item.task, "pattern": kind, "question": item.question,
                "gold": list(item.answers), "answers": texts,
                "seconds": round(time.perf_counter() - started, 1), "commit": git_commit()}

    t0 = time.perf_counter()
    items_by_task = {}
    for task in tasks:
        built = build_items(task.spec(task.limit), gen.tokenizer)
        asked = [it for it in built if it.answers
                 and not (option == "answer_style" and is_yes_no_question(it.question))][: args.limit]
        items_by_task[task.name or task.dataset] = asked
        for n, item in enumerate(asked, 1):
            for kind in ("wim", "lc"):
                if (item.id, kind) in done:
                    continue
                record = ask(kind, item)
                with records.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(record) + "\n")
                done[(item.id, kind)] = record
            print(f"{n}/{len(asked)} {item.id}", file=sys.stderr)
    seconds = time.perf_counter() - t0
    body = report(items_by_task, done, styles, name, config.model, seconds, option)
    print(body)
    if not args.no_write:
        write_section(f"answer_ablation_{name}" + (f"_{option}" if tag else ""), body)


def report(items_by_task: dict[str, list[Any]], done: dict[tuple[str, str], dict[str, Any]],
           styles: tuple[str, str], name: str, model: str, seconds: float, option: str = "answer_style") -> str:
    from marginalia.bench.metrics import score_item
    from marginalia.bench.report import bootstrap

    a, b = styles
    rows = ["| task | pattern | n | right, " + a + " | right, " + b + " | " + b + " − " + a + " (95% CI) | "
            f"right with {b} only | with {a} only |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    gaps = [f"| task | {'style' if option == 'answer_style' else 'value'} | n | wim − lc (95% CI) |",
            "|---|---|---:|---:|"]
    examples: list[str] = []
    pooled: list[float] = []
    for task, items in items_by_task.items():
        both = [it for it in items if (it.id, "wim") in done and (it.id, "lc") in done]
        score: dict[tuple[str, str], list[float]] = {}
        for kind in ("wim", "lc"):
            for style in styles:
                score[(kind, style)] = [score_item(it, done[(it.id, kind)]["answers"][style])["contains"]
                                        for it in both]
            diffs = [y - x for x, y in zip(score[(kind, a)], score[(kind, b)], strict=True)]
            lo, hi = bootstrap(diffs) if diffs else (0.0, 0.0)
            k = len(diffs)
            pooled += diffs
            rows.append(f"| {task} | {kind} | {k} | {sum(score[(kind, a)]):.0f} | {sum(score[(kind, b)]):.0f} | "
                        f"{sum(diffs) / max(k, 1):+.2f} [{lo:+.2f}, {hi:+.2f}] | {sum(d > 0 for d in diffs)} | "
                        f"{sum(d < 0 for d in diffs)} |")
            for it, d in zip(both, diffs, strict=True):
                if d and len(examples) < 6:
                    r = done[(it.id, kind)]["answers"]
                    examples.append(f"- {it.id} ({kind}): gold {it.answers[0]!r}; {a} {r[a][:110]!r}; "
                                    f"{b} {r[b][:110]!r}")
        for style in styles:
            gap = [w - c for w, c in zip(score[("wim", style)], score[("lc", style)], strict=True)]
            lo, hi = bootstrap(gap) if gap else (0.0, 0.0)
            gaps.append(f"| {task} | {style} | {len(gap)} | {sum(gap) / max(len(gap), 1):+.2f} [{lo:+.2f}, {hi:+.2f}] |")
    lo, hi = bootstrap(pooled) if pooled else (0.0, 0.0)
    rows.append(f"| all | both | {len(pooled)} | | | {sum(pooled) / max(len(pooled), 1):+.2f} [{lo:+.2f}, {hi:+.2f}] | "
                f"{sum(d > 0 for d in pooled)} | {sum(d < 0 for d in pooled)} |")
    records = list(done.values())
    commits = sorted({r["commit"] for r in records})
    spent = sum(r["seconds"] for r in records)
    if option == "answer_style":
        title, how = "Two answer styles", (
            f"Each question read once per pattern and asked under `answer_style = \"{a}\"` and `\"{b}\"` (wim "
            "writes its margins again for the second ask, from the same reading); questions asked for yes or no "
            "are left out (both styles ask them alike), and so are unanswerable ones. Right = `contains`.")
    else:
        title, how = f"Two values of `{option}`", (
            f"Each question read once per pattern; wim asked under `{option} = \"{a}\"` and `\"{b}\"` (it writes "
            "its margins again for the second ask, from the same reading: greedy, the same margins), long context "
            "once (it has no such option: its answer stands under both). Unanswerable questions are left out. "
            "Right = `contains`.")
    return "\n".join([
        f"## {title}, paired (`benchmarks/answer_ablation.py`): {name}, {a} vs {b}",
        "",
        f"Command: `{command_line()}` · records made at commit {', '.join(commits)} · model `{model}` · "
        f"machine: {machine()} · {seconds / 60:.1f} min this time, {spent / 60:.1f} min in all",
        "",
        how,
        "",
        *rows,
        "",
        "WiM against long context on the same items, under each value (paired bootstrap 95% interval):",
        "",
        *gaps,
        "",
        "Answers that differ in score:",
        "",
        *examples,
    ])


if __name__ == "__main__":
    main()
