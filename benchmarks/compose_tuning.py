"""Instruction tuning of the composition client: the eval model labels WikiText article prefixes (with memory
retrieved from WikiText paragraphs and written by the memory model, as the composer would), then SmolLM2 is
tuned with LoRA on CPU on those labels; reported: examples made, time, training loss, held-out label loss and
perplexity before and after.

The retrieval corpus is every article of the data file, indexed into a collection; each prefix's own article
is never among its memory's sources. Only the articles of ``--articles`` are cut (by default
all but the first eight, which are left unseen for evaluating the tuned client). ``--squad FILE`` adds
more Wikipedia text to tune on: the articles of a SQuAD JSON file (each one's paragraphs in order) are cut
too and join the retrieval collection. The examples file is resumable: run the same command again after a
crash and it goes on (or with a larger ``--limit`` to add examples).

    python benchmarks/compose_tuning.py [--limit 69] [--steps 30] [--memory-model smollm2] [--out DIR]

The tuned model's spec is printed at the end and stored with the numbers in
benchmarks/measurements/compose_tuning.json (see benchmarks/report.py). The texts are read at run time from
../shared/data (``--data``); nothing of them is kept in the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, get_args

from _common import BENCHMARKS, ROOT, Benchmark, load_note, measurement, show, write_if_changed
from _markdown import Record, made_by, num, table
from compose_latency import clean

from marginalia.options import TuneOptions

DATA = ROOT.parent / "shared" / "data" / "wikitext-test-articles.part1.jsonl"
EVAL_MODEL = Path("~/.cache/marginalia-eval/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf").expanduser()
COLLECTION = "compose-tuning-wikitext"


def span(text: str, count: int) -> range:
    """``a:b`` (either end may be left out) as a range over ``count`` articles."""
    a, _, b = text.partition(":")
    return range(int(a or 0), int(b) if b else count)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--label-model", default=f"gguf:{EVAL_MODEL}", help="the larger model that writes the labels")
    ap.add_argument("--memory-model", default="smollm2",
                    help="the model that writes memory (as in the composer's default: the client's own model)")
    ap.add_argument("--client", default="smollm2", help="the client to tune (run on transformers)")
    ap.add_argument("--articles", default="8:", help="which articles are cut (a:b)")
    ap.add_argument("--cuts", type=int, default=3, help="prefixes per article")
    ap.add_argument("--max-words", type=int, default=120,
                    help="the most words before a cut kept as its context (after the article's title)")
    ap.add_argument("--hits", type=int, default=2, help="retrieved chunks per memory request")
    ap.add_argument("--limit", type=int, default=69, help="at most this many examples")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--modules", default="q_proj,k_proj,v_proj,o_proj",
                    help="the layers that get adapters, comma-separated, or all-linear")
    ap.add_argument("--learning-rate", type=float, default=3e-4)
    schedule = TuneOptions.model_fields["schedule"]
    ap.add_argument("--schedule", choices=get_args(schedule.annotation), default=schedule.default,
                    help=f"the learning rate over the steps (default: {schedule.default})")
    ap.add_argument("--warmup-steps", type=int, default=0)
    ap.add_argument("--held-out", type=float, default=0.15)
    ap.add_argument("--label-tokens", type=int, default=44,
                    help="the most tokens of a label (compose_utility.py's --tokens, so the client learns the "
                         "length it is measured on)")
    ap.add_argument("--label-guard", type=int, default=0,
                    help="the label model writes no run of this many tokens twice in a label (numbers apart; 0: "
                         "plain greedy); a new guard labels the prefixes and memory of the largest examples file "
                         "again into a file of its own")
    ap.add_argument("--eval-every", type=int, default=25,
                    help="measure the held-out label loss every N steps and keep the best step (0: keep the last)")
    ap.add_argument("--home", type=Path, default=None, help="marginalia's home (default: the usual one)")
    ap.add_argument("--squad", type=Path, default=None,
                    help="also cut the articles of this SQuAD JSON file (paragraphs joined), e.g. "
                         "../shared/data/squad-v1.1-dev.part1.json")
    ap.add_argument("--out", type=Path, default=None,
                    help="the tuned model's folder (default: <home>/tuned/compose-client-wikitext)")
    precision = TuneOptions.model_fields["precision"]
    ap.add_argument("--precision", choices=get_args(precision.annotation), default=precision.default,
                    help="the training steps' number format (default: auto, bf16 where the processor has it)")
    ap.add_argument("--data-only", action="store_true", help="make (or extend) the examples, do not train")
    ap.add_argument("--no-write", action="store_true", help="print the section, store nothing")
    args = ap.parse_args()
    if not args.data.is_file():
        sys.exit(f"no data at {args.data}; give --data")
    if args.squad is not None and not args.squad.is_file():
        sys.exit(f"no SQuAD file at {args.squad}; check --squad")

    from marginalia import app
    from marginalia.compose.tuning import read_examples, relabel_examples
    from marginalia.home import resolve_home
    from marginalia.models.llamacpp.lora_gguf import TUNED_RECORD
    from marginalia.options import ComposeOptions, TuneDataOptions

    t_start = time.perf_counter()
    load_before = os.getloadavg()
    home = resolve_home(args.home)
    work = home / "bench" / "compose_tuning"
    docs = work / "articles"
    docs.mkdir(parents=True, exist_ok=True)
    articles = [json.loads(line) for line in args.data.read_text("utf-8").splitlines() if line.strip()]
    paths = []
    for i, article in enumerate(articles):
        paths.append(write_if_changed(docs / f"article-{i:02d}.md", f"# {article['title']}\n\n{clean(article['text'])}"))
    chosen = span(args.articles, len(articles))
    tuning_paths = [paths[i] for i in chosen]
    squad, squad_texts = [], []
    if args.squad is not None:
        try:
            squad = json.loads(args.squad.read_text("utf-8"))["data"]
            squad_texts = [f"# {article['title'].replace('_', ' ')}\n\n"
                           + "\n\n".join(p["context"] for p in article["paragraphs"]) for article in squad]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            sys.exit(f"{args.squad} is not a SQuAD JSON file (UTF-8, data[].title and data[].paragraphs[].context): "
                     f"{type(exc).__name__}: {exc}")
    for i, text in enumerate(squad_texts):
        path = write_if_changed(docs / f"squad-{i:02d}.md", text)
        paths.append(path)
        tuning_paths.append(path)

    def load(spec: str) -> Any:
        return app.load_model(spec, home=home, backend="llamacpp" if spec.startswith(("gguf:", "smollm2")) else "auto")

    label_model = load(args.label_model)
    memory_model = load(args.memory_model) if args.memory_model != args.label_model else None
    t0 = time.perf_counter()
    app.index_paths(paths, COLLECTION, count_tokens=label_model.tokenizer.count, home=home)
    index_s = time.perf_counter() - t0
    store = app.open_collection(COLLECTION, home=home)
    n_chunks = sum(d.n_chunks for d in store.documents())
    print(f"collection {COLLECTION}: {len(store.documents())} articles, {n_chunks} chunks ({index_s:.0f} s)",
          flush=True)

    # one file per label length; a new length first relabels the largest file of the same label model (the
    # same prefixes and memory, only the labels written again), then cuts more as any run does
    guard_name = f"-guard{args.label_guard}" if args.label_guard else ""
    examples_path = work / f"examples-{args.label_tokens}tok{guard_name}.jsonl"
    relabelled_from, relabelled = None, 0
    t0 = time.perf_counter()
    last = [t0]

    def progress(done: int, total: int) -> None:
        if time.perf_counter() - last[0] > 30:
            last[0] = time.perf_counter()
            print(f"  example {done}/{total} ({last[0] - t0:.0f} s)", flush=True)

    others = {path: found for path in sorted(work.glob("examples*.jsonl")) if path != examples_path
              and (found := read_examples(path)) and found[0].label_model == label_model.name}
    from_other: set[str] = set()  # the ids relabelled from another file
    if others:
        relabelled_from = max(others, key=lambda path: len(others[path]))
        from_other = {e.id for e in others[relabelled_from]}
        report = relabel_examples(relabelled_from, label_model, examples_path, args.label_tokens,
                                  label_guard=args.label_guard, limit=args.limit, progress=progress)
        relabelled = report.written
        if relabelled:
            print(f"{relabelled} examples of {relabelled_from.name} labelled again with at most "
                  f"{args.label_tokens} tokens in {report.seconds:.0f} s", flush=True)
    data_options = TuneDataOptions(cuts=args.cuts, min_words=20, max_words=args.max_words,
                                   label_tokens=args.label_tokens, reference_words=15, label_guard=args.label_guard)
    compose = ComposeOptions(hits=args.hits)
    t0 = time.perf_counter()

    data = app.tuning_data(tuning_paths, examples_path, data_options, compose, label_model=label_model,
                           collection=store, memory_generator=memory_model, home=home, limit=args.limit,
                           progress=progress)
    data_s = time.perf_counter() - t0
    examples = read_examples(examples_path)
    # a relabelled example's seconds count its new label only (its memory was made for the other file)
    per_example = [e.seconds for e in examples if e.id not in from_other] or [0.0]
    per_label = [e.seconds for e in examples if e.id in from_other]
    print(f"{data.written} examples made ({data.kept} kept from before) in {data_s:.0f} s; "
          f"{len(examples)} in {examples_path}; median {statistics.median(per_example):.1f} s each", flush=True)
    if args.data_only:
        return
    del label_model, memory_model

    client = app.load_model(args.client, home=home, device="cpu", backend="transformers")
    options = TuneOptions(rank=args.rank, alpha=2.0 * args.rank, steps=args.steps, batch_size=args.batch_size,
                          learning_rate=args.learning_rate, schedule=args.schedule, warmup_steps=args.warmup_steps,
                          held_out=args.held_out, eval_every=args.eval_every,
                          modules=args.modules, precision=args.precision)
    out = args.out or home / "tuned" / "compose-client-wikitext"
    t0 = time.perf_counter()

    def on_step(step: int, steps: int, loss: float) -> None:
        if step == 1 or step % 5 == 0 or step == steps:
            print(f"  step {step}/{steps}: loss {loss:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)

    report = app.tune_client(examples_path, out, options, generator=client, home=home, on_step=on_step, log=print)
    train_s = time.perf_counter() - t0
    steps_in = json.loads((out / TUNED_RECORD).read_text("utf-8"))["options"]["precision"]
    load_after = os.getloadavg()
    losses = report.losses
    k = min(5, len(losses))
    memory_items = [len(e.memory) for e in examples]
    per_article = Counter(e.source for e in examples)
    blank = sum(1 for e in examples if not e.label.strip())

    numbers = {
        "label_model": args.label_model.split("/")[-1], "label_guard": args.label_guard,
        "label_tokens": data_options.label_tokens, "memory_mode": compose.memory_mode,
        "memory_model": args.memory_model.split("/")[-1], "hits": compose.hits,
        "articles": f"WikiText articles {chosen.start}-{chosen.stop - 1}"
                    + (f" and the {len(squad)} Wikipedia articles of {args.squad.name}" if args.squad is not None else ""),
        "collection_articles": len(articles) + len(squad), "chunks": n_chunks,
        "cuts": data_options.cuts, "max_words": data_options.max_words, "min_words": data_options.min_words,
        "examples": len(examples), "relabelled_from": relabelled_from.name if relabelled_from is not None else None,
        "relabelled": relabelled, "relabelled_examples": len(per_label), "relabel_minutes": sum(per_label) / 60,
        "made": data.written, "kept": data.kept,
        "per_article": [min(per_article.values()), max(per_article.values())],
        "median_example_s": statistics.median(per_example), "label_minutes": sum(per_example) / 60,
        "memory_items_median": statistics.median(memory_items), "no_memory": memory_items.count(0),
        "blank_labels": blank, "client": args.client, "precision": steps_in,
        "lora": {"rank": options.rank, "alpha": options.alpha, "dropout": options.dropout, "modules": options.modules,
                 "steps": options.steps, "batch_size": options.batch_size, "learning_rate": options.learning_rate,
                 "schedule": options.schedule, "warmup_steps": options.warmup_steps},
        "label_tokens_trained": report.label_tokens, "train_examples": report.train_examples,
        "held_out_examples": report.held_out_examples, "train_s": train_s,
        "loss_steps": k, "loss_first": statistics.mean(losses[:k]), "loss_last": statistics.mean(losses[-k:]),
        "held_out_before": report.held_out_before, "held_out_after": report.held_out_after,
        "perplexity_before": report.perplexity_before, "perplexity_after": report.perplexity_after,
        "eval_every": options.eval_every, "held_out_curve": report.held_out_curve, "kept_step": report.kept_step,
        "spec": report.spec, "load": load_note(load_before[0], load_after[0]),
        "total_min": (time.perf_counter() - t_start) / 60,
    }
    show(measurement("compose_tuning", numbers), write=not args.no_write)
    print(f"\ntuned model spec: {report.spec}")


def summary(m: Record) -> list[list[str]]:
    n = m["numbers"]
    return [["Tuning the composition client (LoRA, CPU)",
             f"held-out label perplexity {num(n['perplexity_before'], 2)} → {num(n['perplexity_after'], 2)}",
             made_by(m)]]


def section(m: Record) -> list[str]:
    n = m["numbers"]
    lo = n["lora"]
    curve = ", ".join(f"{step}: {loss:.3f}" for step, loss in n.get("held_out_curve") or [])
    return [f"Labels by {n['label_model']} (at most {n['label_tokens']} tokens) for prefixes of {n['articles']} (not "
            f"those the utility benchmark cuts), each with memory ({n['memory_mode']} by {n['memory_model']}); "
            f"{num(n['examples'], 0)} examples. LoRA on {n['client']} (CPU, {n['precision']}): rank {lo['rank']} on "
            f"{lo['modules']}; {lo['steps']} steps of {lo['batch_size']} examples, lr {lo['learning_rate']:g} "
            f"({lo['schedule']}), loss on the label tokens; {n['train_examples']} training examples, "
            f"{n['held_out_examples']} held out (whole articles); {num(n['train_s'] / 60)} min.", "",
            *table(["", "before", "after"], [
                [f"training loss (mean of the first / last {n['loss_steps']} steps)", num(n["loss_first"], 3),
                 num(n["loss_last"], 3)],
                ["held-out label loss (nats per token)", num(n["held_out_before"], 3), num(n["held_out_after"], 3)],
                ["held-out label perplexity", num(n["perplexity_before"], 2), num(n["perplexity_after"], 2)]]), "",
            (f"Held-out loss every {n['eval_every']} steps: {curve}; step {n['kept_step']} kept (the lowest, so "
             "'after' is a little optimistic)." if curve else "The last step's model is kept.")
            + f" The tuned client loads as `{n['spec']}` (e.g. `marginalia compose --model <spec>`)."]


BENCHMARKS["compose_tuning"] = Benchmark("Instruction tuning of the composition client", section, summary)


if __name__ == "__main__":
    main()
