"""How far a model judge can be trusted: its verdicts on answers whose rightness is known.

Answers of known kinds are made from SQuAD development questions (the gold answer, bare and in the sentence of
the paragraph that holds it; another question's answer from the same paragraph, bare and in its sentence; a
refusal) and HotpotQA yes/no questions (the gold word in a short reply, and the opposite one). Each answer is
judged by:

- ``verdict``: the benchmark's model judge (`marginalia.bench.ModelJudge`, a JSON verdict);
- ``P(YES)`` (`marginalia.bench.ProbabilityJudge`): the model's probability of YES for "does the reply
  give the reference answer?", read from the first token (no decoding): at 0.5, and at the threshold that fits
  best on one half of the questions (the fitting half), scored on the other half (the checking half), which
  is the threshold to give ``marginalia bench judge RUN --method probability --threshold P``; and its AUC;
- ``contains``: the lexical score (the normalised gold answer appears in the answer);
- each judge with a yes/no question answered yes or no settled by rule (`marginalia.bench.yes_no_verdict`,
  what ``marginalia bench judge`` does unless told ``--yes-no model``), its threshold fitted again.

    python lab/judge_check.py [--model SPEC] [--limit N] [--no-write]

The default model is the stronger eval model (``../shared/tools/eval-model`` assembles it).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from _lab_common import DATA, EVAL_GGUF, auc, command_line, git_commit, write_finding

KINDS = ("gold, bare", "gold sentence", "other answer, bare", "other answer's sentence", "a refusal",
         "a hedge between the gold and another answer", "gold number in words",
         "yes/no: the gold word", "yes/no: the opposite")
RIGHT = {KINDS[0], KINDS[1], KINDS[6], KINDS[7]}
NUMBER_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
                "sixteen seventeen eighteen nineteen twenty").split()
REFUSAL = "The document does not say."



def candidates(limit: int, seed: int = 0) -> list[dict[str, Any]]:
    """Answers of known rightness: ``{question, answers, prediction, right, kind}``."""
    import pysbd

    from marginalia.bench import normalize_answer

    rng = random.Random(seed)
    segmenter = pysbd.Segmenter(language="en", clean=False)
    squad = json.loads((DATA / "squad-v1.1-dev.part1.json").read_text("utf-8"))["data"]
    paragraphs = [p for article in squad for p in article["paragraphs"] if len(p["qas"]) >= 2]
    rng.shuffle(paragraphs)
    out: list[dict[str, Any]] = []
    used = 0
    for paragraph in paragraphs:
        if used >= limit:
            break
        first, second = paragraph["qas"][0], paragraph["qas"][1]
        gold, other = first["answers"][0]["text"], second["answers"][0]["text"]
        ng, no = normalize_answer(gold), normalize_answer(other)
        if not ng or not no or ng in no or no in ng:
            continue
        used += 1
        golds = [a["text"] for a in first["answers"]]
        sentences = [s.strip() for s in segmenter.segment(paragraph["context"])]
        with_gold = next((s for s in sentences if gold in s and other not in s), None)
        with_other = next((s for s in sentences if other in s and gold not in s), None)
        made = [(f"{gold}.", True, KINDS[0]), (with_gold, True, KINDS[1]), (f"{other}.", False, KINDS[2]),
                (with_other, False, KINDS[3]), (REFUSAL, False, KINDS[4]),
                (f"Either {other} or {gold}; the text is not clear.", False, KINDS[5])]
        if gold.strip().isdigit() and int(gold) < len(NUMBER_WORDS):  # right, though it holds no gold string
            made.append((f"{NUMBER_WORDS[int(gold)].capitalize()}.", True, KINDS[6]))
        out += [{"question": first["question"], "answers": golds, "prediction": p, "right": r, "kind": k,
                 "group": f"squad/{first['id']}"} for p, r, k in made if p]
    hotpot = json.loads((DATA / "hotpotqa-dev-distractor.part1.json").read_text("utf-8"))
    yes_no = [item for item in hotpot if str(item["answer"]).strip().lower() in ("yes", "no")]
    for item in yes_no[:limit]:
        answer = str(item["answer"]).strip().lower()
        opposite = "no" if answer == "yes" else "yes"
        for word, right, kind in ((answer, True, KINDS[7]), (opposite, False, KINDS[8])):
            out.append({"question": item["question"], "answers": [item["answer"]],
                        "prediction": f"{word.capitalize()}, according to the text.", "right": right, "kind": kind,
                        "group": f"hotpotqa/{item['id']}"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=f"gguf:{EVAL_GGUF}", help="the judge model's spec (default: the eval model)")
    ap.add_argument("--limit", type=int, default=40, help="SQuAD paragraphs to make answers from")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave lab/findings alone")
    ap.add_argument("--rows", metavar="FILE", default=None,
                    help="also write every answer with its checks' results as JSON lines to FILE")
    args = ap.parse_args()
    if not DATA.is_dir():
        sys.exit(f"{DATA} is missing: the development data must sit beside the checkout")

    from marginalia import load_model
    from marginalia.bench import ModelJudge, ProbabilityJudge, holds_answer, wilson, yes_no_verdict

    spec = args.model
    gen = load_model(spec)
    judge = ModelJudge(gen)
    prob = ProbabilityJudge(gen) if getattr(gen, "supports_choice_probabilities", False) else None
    t0 = time.perf_counter()
    rows = candidates(args.limit)
    timing = {"verdict": 0.0, "P(YES)": 0.0}
    for n, c in enumerate(rows, 1):
        t = time.perf_counter()
        c["verdict"] = judge.judge(c["question"], c["answers"], c["prediction"]).correct
        timing["verdict"] += time.perf_counter() - t
        if prob is not None:
            t = time.perf_counter()
            c["p_yes"] = prob.p_yes(c["question"], c["answers"], c["prediction"])
            timing["P(YES)"] += time.perf_counter() - t
        c["contains"] = holds_answer(c["prediction"], c["answers"])
        settled = yes_no_verdict(c["answers"], c["prediction"])
        c["rule"] = settled.correct if settled else None
        print(f"{n}/{len(rows)} {c['kind']}: verdict {c['verdict']}, P(YES) {c.get('p_yes', float('nan')):.2f}",
              file=sys.stderr, flush=True)

    has_p = all("p_yes" in c for c in rows)
    # the threshold is fitted on the questions of one half and scored on the others (split by question, seeded)
    groups = sorted({c["group"] for c in rows})
    random.Random(1).shuffle(groups)
    fitting = set(groups[: len(groups) // 2])
    fit = [c for c in rows if c["group"] in fitting]
    held = [c for c in rows if c["group"] not in fitting]
    def ruled(c: dict[str, Any], model: Any) -> Any:
        return c["rule"] if c["rule"] is not None else model
    best_t = rule_t = 0.5
    if has_p:
        grid = [t / 100 for t in range(5, 96)]
        best_t = max(grid, key=lambda t: (sum((c["p_yes"] >= t) == c["right"] for c in fit), -abs(t - 0.5)))
        rule_t = max(grid, key=lambda t: (sum(ruled(c, c["p_yes"] >= t) == c["right"] for c in fit),
                                          -abs(t - 0.5)))
    checks: list[tuple[str, Any]] = [("verdict (JSON)", lambda c: c["verdict"])]
    if has_p:
        checks += [("P(YES) >= 0.5", lambda c: c["p_yes"] >= 0.5),
                   (f"P(YES) >= {best_t:.2f} (fitted on the fitting half)", lambda c: c["p_yes"] >= best_t)]
    checks.append(("verdict (JSON), yes/no by rule", lambda c: ruled(c, c["verdict"])))
    if has_p:
        checks.append((f"P(YES) >= {rule_t:.2f} (fitted), yes/no by rule", lambda c: ruled(c, c["p_yes"] >= rule_t)))
    checks.append(("contains", lambda c: c["contains"]))
    counts = {k: sum(c["kind"] == k for c in rows) for k in KINDS}
    header = "| check | " + " | ".join(f"{k} ({'right' if k in RIGHT else 'wrong'})" for k in KINDS) + " | all |"
    header = header.replace(" | all |", " | all, checking half | all, fitting half |")
    lines = [header, "|---|" + "---:|" * (len(KINDS) + 2)]
    for name, check in checks:
        cells = []
        for k in KINDS:
            group = [c for c in held if c["kind"] == k]
            cells.append(f"{sum(check(c) == c['right'] for c in group)}/{len(group)}" if group else "–")
        for half in (held, fit):
            good = sum(check(c) == c["right"] for c in half)
            lo, hi = wilson(good, len(half))
            cells.append(f"{good}/{len(half)} ({lo:.2f}–{hi:.2f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    unjudged = sum(c["verdict"] is None for c in rows)
    body = [
        "## How far the model judge can be trusted (`lab/judge_check.py`)", "",
        f"Command: `{command_line()}` · commit {git_commit()} · judge model `{spec}` · "
        f"{time.perf_counter() - t0:.0f} s", "",
        f"{len(rows)} answers whose rightness is known, made from {counts[KINDS[0]]} SQuAD development questions "
        f"(the gold answer bare and in its sentence; another question's answer from the same paragraph, bare and in "
        f"its sentence; a refusal; a hedge naming both; a small gold number written as a word) and {counts[KINDS[7]]} HotpotQA yes/no questions (the gold word, the opposite). "
        f"The questions are split in two halves at random (by question, seed 1): P(YES)'s threshold is fitted on "
        f"the fitting half ({len(fit)} answers); the cells by kind and the first total are on the checking half "
        f"({len(held)} answers), which the threshold never saw. Each cell: answers the check got right, of that "
        "kind.", "",
        *lines, "",
        f"- Unreadable verdicts (retried, then counted as not right): {unjudged}.",
    ]
    if has_p:
        body.append(f"- P(YES) ranks right above wrong answers with AUC "
                    f"{auc([(c['p_yes'], c['right']) for c in held]):.2f} on the checking half. To judge a run with "
                    f"it, yes/no questions answered yes or no settled by rule (the default): `marginalia bench judge "
                    f"RUN --model {spec} --method probability --threshold {rule_t:.2f}`.")
    body.append(f"- Seconds per answer: verdict {timing['verdict'] / len(rows):.2f}, "
                f"P(YES) {timing['P(YES)'] / len(rows):.2f}.")
    text = "\n".join(body)
    if args.rows:
        Path(args.rows).write_text("".join(json.dumps({**c, "fitting": c["group"] in fitting}) + "\n" for c in rows),
                                   "utf-8")
    print(text)
    if not args.no_write:
        write_finding("judge_check", text)


if __name__ == "__main__":
    main()
