"""The composition client's loop guard (no run of n tokens written twice in one suggestion): how often it would
stop people's own text, and how often the client's suggestions loop, as n varies.

- Human text: random windows of the client's tokens (the suggestion's length, and the utility benchmark's)
  from WikiText articles and Enron e-mail bodies, fed token by token to the client's guard: a window the guard
  would cut is one where it bans a token the text writes next. Beside it, plain n-gram blocking (any run of n
  tokens twice), which would also ban numbers: digits are single tokens in the client's tokenizer, so "from
  2005 to 2006" repeats the run " ", "2", "0".
- The client: greedy suggestions after prefixes cut inside paragraphs, under each n (0: plain greedy); a
  suggestion loops when fewer than 60% of its words are distinct (10 words or more), or when it writes a run of
  four words twice.

The articles are the ones compose_tuning.py cuts (``8:`` by default), not those compose_utility.py measures on.
The texts are read at run time from ../shared/data; nothing of them is kept in the repository.

    python benchmarks/loop_guard.py [--prefixes 40] [--windows 600] [--ngrams 0,3,4,5,6]
    python benchmarks/loop_guard.py --model ~/.cache/marginalia-eval/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        --lengths 44 --ngrams 0,3,4,6 --section loop_guard_labels
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import ROOT, command_line, git_commit, load_note, machine, write_section  # noqa: E402
from compose_items import detokenize_email, email_body, enron_items, wikitext_items  # noqa: E402
from compose_latency import clean  # noqa: E402
from compose_tuning import span  # noqa: E402
from compose_utility import looping  # noqa: E402

DATA = ROOT.parent / "shared" / "data"


def repeats_run(ids: Sequence[int] | Sequence[str], n: int) -> bool:
    """Whether some run of ``n`` items occurs twice (n = 0: never)."""
    if n <= 0:
        return False
    runs = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return len(set(runs)) < len(runs)


def cut_by(guard: Any, window: Sequence[int]) -> bool:
    """Whether ``guard`` (a fresh `NoRepeat`) bans a token of ``window`` as it is written."""
    for token in window:
        if token in guard.banned():
            return True
        guard.feed(token)
    return False


def loops(text: str) -> bool:
    """A suggestion that loops: few distinct words (`looping`), or a run of four words written twice."""
    return looping(text) or repeats_run(text.lower().split(), 4)


def windows(token_lists: list[list[int]], length: int, count: int, rng: random.Random) -> list[list[int]]:
    """``count`` windows of ``length`` tokens at random places in the texts long enough to hold one."""
    long_enough = [t for t in token_lists if len(t) > length]
    if not long_enough:
        return []
    picks = []
    for _ in range(count):
        tokens = rng.choice(long_enough)
        at = rng.randrange(len(tokens) - length + 1)
        picks.append(tokens[at:at + length])
    return picks


def pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "–"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--articles", default="8:", help="WikiText articles (a:b) the text and prefixes come from")
    ap.add_argument("--prefixes", type=int, default=40, help="prefixes per data set the client completes")
    ap.add_argument("--windows", type=int, default=600, help="human-text windows per data set and length")
    ap.add_argument("--lengths", default="15,44", help="suggestion lengths in tokens (the compose default, the "
                                                       "utility benchmark's)")
    ap.add_argument("--ngrams", default="0,3,4,5,6", help="guard lengths (0: no guard)")
    ap.add_argument("--model", default="smollm2",
                    help="the model that writes the suggestions: smollm2 (the client) or a GGUF file, e.g. the eval "
                         "model that writes compose_utility.py's labels")
    ap.add_argument("--section", default="loop_guard", help="the BENCHMARKS.md section written")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true", help="print the section, leave BENCHMARKS.md alone")
    args = ap.parse_args()
    wiki_path, enron_path = args.data / "wikitext-test-articles.part1.jsonl", args.data / "enron-ham.part1.jsonl"
    for path in (wiki_path, enron_path):
        if not path.is_file():
            sys.exit(f"{path} is missing; give --data")
    lengths = [int(x) for x in args.lengths.split(",")]
    ngrams = [int(x) for x in args.ngrams.split(",")]

    from marginalia.compose import CompletionClient
    from marginalia.models.llamacpp_backend import LlamaCppGenerator
    from marginalia.models.loaders import embedded_gguf

    t_start = time.perf_counter()
    load_before = os.getloadavg()
    articles = [json.loads(line) for line in wiki_path.read_text("utf-8").splitlines() if line.strip()]
    emails = [json.loads(line) for line in enron_path.read_text("utf-8").splitlines() if line.strip()]
    chosen = span(args.articles, len(articles))
    if args.model == "smollm2":
        gen = LlamaCppGenerator(embedded_gguf(), name="smollm2", n_threads=args.threads, n_branches=0)
        model_name = "SmolLM2-135M (the client)"
    else:
        model_path = Path(args.model).expanduser()
        if not model_path.is_file():
            sys.exit(f"no GGUF file at {model_path}; give --model smollm2 or a GGUF path")
        gen = LlamaCppGenerator(model_path, name=f"gguf:{model_path.name}", n_ctx=4096, n_threads=args.threads,
                                n_branches=0)
        model_name = model_path.name
    tok = gen.tokenizer
    texts = {"WikiText": [clean(articles[i]["text"]) for i in chosen],
             "Enron": [email_body(detokenize_email(row["text"])) for row in emails]}
    rng = random.Random(args.seed)
    human: dict[tuple[str, int], list[list[int]]] = {}
    for name, docs in texts.items():
        tokens = [tok.encode(t) for t in docs]
        for length in lengths:
            human[name, length] = windows(tokens, length, args.windows, rng)

    items = {"WikiText": wikitext_items(articles, [Path(f"wiki-{i}") for i in range(len(articles))], chosen,
                                        args.prefixes, args.seed),
             "Enron": enron_items(emails, args.prefixes, args.seed)}
    client = CompletionClient(gen.fork(keep_cache=False), standby=gen.fork(keep_cache=False),
                              suggestion_tokens=max(lengths))
    base = client.params
    looped: dict[tuple[str, int, int], int] = {}
    for name, its in items.items():
        for it in its:  # every guard and length in turn on one prefix: its prompt is prefilled once
            for length in lengths:
                for n in ngrams:
                    client.params = replace(base, max_new_tokens=length, no_repeat_ngram=n)
                    text = client.complete(it.prefix, max_new_tokens=length).text()
                    looped[name, length, n] = looped.get((name, length, n), 0) + loops(text)
        print(f"{name}: " + ", ".join(f"{length} tokens n={n} {looped[name, length, n]}" for length in lengths
                                      for n in ngrams) + f" of {len(its)} loop", flush=True)
    load_after = os.getloadavg()

    from marginalia.models.base import GenerationParams

    def human_cell(name: str, length: int, n: int) -> str:
        ws = human[name, length]
        guarded = sum(cut_by(gen.repeat_guard(GenerationParams(no_repeat_ngram=n)), w) for w in ws)
        return f"{pct(sum(repeats_run(w, n) for w in ws), len(ws))} / {pct(guarded, len(ws))}"

    header = "| | tokens | " + " | ".join(f"n = {n}" if n else "no guard" for n in ngrams) + " |"
    rule = "|---|---:|" + "---:|" * len(ngrams)
    guards = [n for n in ngrams if n > 0]
    human_rows = [f"| {name} | {length} | " + " | ".join(human_cell(name, length, n) for n in guards) + " |"
                  for name in texts for length in lengths]
    client_rows = [f"| {name} | {length} | " + " | ".join(
        pct(looped[name, length, n], len(its)) for n in ngrams) + " |"
        for name, its in items.items() for length in lengths]
    body = "\n".join([
        "## The composition client's loop guard (`benchmarks/loop_guard.py`)"
        + (f": {model_name}" if args.model != "smollm2" else ""),
        "",
        f"Command: `{command_line()}` · commit {git_commit()} · model: {model_name} on llama.cpp, greedy, the "
        "client's prompt · "
        f"WikiText articles {args.articles} (those compose_tuning.py cuts), Enron e-mail bodies · machine: "
        f"{machine()} · {load_note(load_before[0], load_after[0])} · total "
        f"{(time.perf_counter() - t_start) / 60:.1f} min",
        "",
        f"**People's own text the guard would cut**: of {args.windows} random windows of the model's tokens per "
        "row, the share holding a run of n tokens twice (plain n-gram blocking would ban that run's last token "
        "the second time) / the share where the guard (as the client has it), which lets numbers repeat, bans a "
        "token the text writes:",
        "",
        "| | tokens | " + " | ".join(f"n = {n}" for n in guards) + " |", "|---|---:|" + "---:|" * len(guards),
        *human_rows,
        "",
        f"**Suggestions that loop** (fewer than 60% of their words distinct, or a run of four words twice), of "
        f"{args.prefixes} greedy suggestions per row after prefixes cut inside paragraphs:",
        "",
        header, rule, *client_rows,
    ])
    if not args.no_write:
        write_section(args.section, body)
    print(body)


if __name__ == "__main__":
    main()
