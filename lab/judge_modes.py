"""Which margin classification mode works best: grounded vs separate (and LC).

For each bundled demo question, the context is the run of whole paragraphs around its
evidence, grown to about --context-tokens model tokens, so the fact sits at varying
depths. Each mode reads it with WiM; LC reads it once as a reference.

Measured per mode: answer accuracy (the gold answer appears in the answer, SQuAD-style
normalised); margin precision (of the margins kept, the share that contain the gold
answer); recall by question (of the questions where some margin contained the gold
answer, the share where at least one such margin was kept: a correct margin dropped
as a repeat of an earlier kept one is not a miss); generated tokens and wall time.

    python lab/judge_modes.py [--context-tokens 2048] [--segment-tokens 512]
"""

from __future__ import annotations

import argparse
import re
import statistics
import string
import time

from _lab_common import command_line, finish, git_commit, machine


def normalise(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def contains(text: str, gold: str) -> bool:
    return normalise(gold) in normalise(text)


def window(doc: str, evidence: str, tokenizer, budget: int) -> str:
    paras = doc.split("\n\n")
    at = next(i for i, p in enumerate(paras) if evidence in p)
    lo, hi = at, at + 1
    size = tokenizer.count(paras[at])
    grow_left = True
    while size < budget and (lo > 0 or hi < len(paras)):
        if (grow_left and lo > 0) or hi >= len(paras):
            lo -= 1
            size += tokenizer.count(paras[lo])
        else:
            size += tokenizer.count(paras[hi])
            hi += 1
        grow_left = not grow_left
    return "\n\n".join(paras[lo:hi])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--context-tokens", type=int, default=2048)
    ap.add_argument("--segment-tokens", type=int, default=512)
    ap.add_argument("--questions", type=int, default=0, help="use the first N questions (0: all)")
    ap.add_argument("--modes", default="grounded,separate,lc", help="WiM judges, and lc")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave lab/findings alone")
    args = ap.parse_args()

    from marginalia import demo as demo_files
    from marginalia import load_model, make_pattern

    doc, items = demo_files()
    if args.questions:
        items = items[: args.questions]
    gen = load_model(args.model)
    modes = args.modes.split(",")
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for n, item in enumerate(items, 1):
        context = window(doc, item["evidence"], gen.tokenizer, args.context_tokens)
        for mode in modes:
            if mode == "lc":
                pattern = make_pattern("lc", gen)
            else:
                pattern = make_pattern("wim", gen, judge=mode, segment_tokens=args.segment_tokens)
            t0 = time.perf_counter()
            answer = pattern.answer(context, item["question"])
            s = answer.stats
            row = {
                "correct": contains(answer.text, item["answer"]),
                "seconds": time.perf_counter() - t0,
                "generated": s.generated_margin_tokens + s.generated_answer_tokens + s.generated_other_tokens,
                "tp": sum(m.relevant and contains(m.text, item["answer"]) for m in answer.margins),
                "fp": sum(m.relevant and not contains(m.text, item["answer"]) for m in answer.margins),
                "found": any(contains(m.text, item["answer"]) for m in answer.margins),
            }
            results[mode].append(row)
            print(f"[{n}/{len(items)}] {mode:9s} correct={row['correct']!s:5s} "
                  f"tp={row['tp']} fp={row['fp']} found={row['found']!s:5s} {row['seconds']:.1f}s  "
                  f"{answer.text[:70]!r}", flush=True)

    lines = ["| mode | answer accuracy | margin precision | recall (questions) | generated tokens / q | seconds / q (median) |",
             "|---|---:|---:|---:|---:|---:|"]
    for mode, rows in results.items():
        acc = sum(r["correct"] for r in rows) / len(rows)
        tp, fp = (sum(r[k] for r in rows) for k in ("tp", "fp"))
        prec = f"{tp / (tp + fp):.2f} ({tp}/{tp + fp})" if tp + fp else "-"
        found = [r for r in rows if r["found"]]
        kept = sum(r["tp"] > 0 for r in found)
        rec = f"{kept / len(found):.2f} ({kept}/{len(found)})" if found else "-"
        if mode == "lc":
            prec = rec = "n/a"
        gen_tokens = statistics.mean(r["generated"] for r in rows)
        secs = statistics.median(r["seconds"] for r in rows)
        lines.append(f"| {mode} | {acc:.2f} ({sum(r['correct'] for r in rows)}/{len(rows)}) | "
                     f"{prec} | {rec} | {gen_tokens:.0f} | {secs:.1f} |")
    body = "\n".join([
        "## Margin classification modes (`lab/judge_modes.py`)",
        "",
        f"Command: `{command_line()}` · commit {git_commit()} · model `{args.model}` · machine: {machine()}",
        "",
        f"{len(items)} questions on the bundled demo report; each context is the whole paragraphs "
        f"around the evidence, about {args.context_tokens} tokens; WiM segments of <= "
        f"{args.segment_tokens} tokens; greedy decoding. A margin counts as truly relevant when "
        "it contains the gold answer.",
        "",
        *lines,
    ])
    finish("judge_modes", body, write=not args.no_write)


if __name__ == "__main__":
    main()
