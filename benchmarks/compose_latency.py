"""Composition latency: SmolLM2 suggests as a WikiText article's lead is typed keystroke by keystroke, with
memory refreshed in the background, against a synchronous "retrieve, then the larger model writes the
completion" baseline measured in the same run.

The collection holds the article's body (its sections after the lead), a few other articles as
distractors, and the whole article as the draft being written (excluded: memory must never come from it).
A typist types the lead's first words one character at a time (``--char-delay``, with a pause after each
word); every keystroke starts a suggestion and cancels the one in progress. Reported: time to the first
suggestion token, time to a full 15-token suggestion, and both while a memory refresh is in flight or
being prepared; then, at every ``--baseline-every``-th word end, the baseline retrieves chunks for the
text and has the memory model write the 15 tokens from them, stateless.

    python benchmarks/compose_latency.py [--article 0] [--words 80] [--distractors 6] [--memory-mode takeaways]
        [--memory-model gguf:~/.cache/marginalia-eval/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf]

The texts are read at run time from ../shared/data (``--data``); nothing of them is kept in the repository.
Stores benchmarks/measurements/compose_latency.json (see benchmarks/report.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _common import BENCHMARKS, ROOT, Benchmark, load_note, measurement, show
from _markdown import Record, made_by, num, table

DATA = ROOT.parent / "shared" / "data" / "wikitext-test-articles.part1.jsonl"
_HEADING = re.compile(r"^\s*(=(?: =)*) (.+?) \1\s*$")


def clean(text: str) -> str:
    """WikiText's tokenised text as markdown: its ``@-@`` markers and spaced punctuation undone, ``= = X = =``
    lines as headings."""
    lines = []
    for line in text.split("\n"):
        m = _HEADING.match(line)
        if m:
            lines.append("#" * (m.group(1).count("=") + 1) + " " + m.group(2).strip())
            continue
        line = line.strip()
        for a, b in ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), (" ,", ","), (" .", "."), (" ;", ";"),
                     (" :", ":"), (" 's", "'s"), ("( ", "("), (" )", ")")):
            line = line.replace(a, b)
        lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n\n".join(lines)).strip() + "\n"


def split_lead(markdown: str) -> tuple[str, str]:
    """The text before the first heading, and the rest."""
    at = markdown.find("\n#")
    return (markdown, "") if at < 0 else (markdown[:at].strip(), markdown[at:].strip() + "\n")


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


@dataclass
class Measured:
    chars: int
    first: float | None
    total: float
    tokens: int
    cancelled: bool
    refreshing: bool


def full_times(measured: list[Measured], refreshing: bool | None = None) -> list[float]:
    """Seconds of the suggestions that ran to their full 15 tokens (only those during a memory refresh, or only
    those outside one, when ``refreshing`` says)."""
    return [m.total for m in measured if not m.cancelled and m.tokens >= 15
            and (refreshing is None or m.refreshing == refreshing)]


def replay(composer: Any, text: str, char_delay: float, word_pause: float) -> tuple[list[Measured], list[str]]:
    """Type ``text`` one character at a time; a worker suggests for each newest text (cancelled by the next
    keystroke). Returns every suggestion's measurements and the texts at word ends."""
    latest: list[str | None] = [None]
    done = threading.Event()
    cond = threading.Condition()
    measured: list[Measured] = []

    def refreshing() -> bool:
        return composer.coordinator.busy() or composer.client.preparing()

    def suggest() -> None:
        seen = None
        while True:
            with cond:
                while latest[0] == seen and not done.is_set():
                    cond.wait()
                if latest[0] == seen:
                    return
                seen = latest[0]
            assert seen is not None
            busy = refreshing()
            completion = composer.stream(seen)
            for _ in completion:
                pass
            completion.close()
            r = completion.result
            if r is not None:
                measured.append(Measured(r.context_chars, r.first_token_seconds, r.seconds, r.generated_tokens,
                                         r.cancelled, busy or refreshing()))

    worker = threading.Thread(target=suggest, name="suggest")
    worker.start()
    ends = []
    for i in range(1, len(text) + 1):
        typed = text[:i]
        composer.edit(typed)
        with cond:
            latest[0] = typed
            cond.notify_all()
        time.sleep(char_delay)
        if text[i - 1] == " ":
            ends.append(typed)
            time.sleep(word_pause)
    time.sleep(word_pause)
    done.set()
    with cond:
        cond.notify_all()
    worker.join()
    return measured, ends


def baseline(store: Any, memory_gen: Any, client: Any, texts: list[str], hits: int, tokens: int,
             exclude: set[str]) -> list[tuple[float, float, int]]:
    """Retrieve for each text, then the memory model writes the continuation from the chunks (stateless):
    (time to first token, total, tokens) per text."""
    from marginalia.compose import MemoryItem
    from marginalia.models.base import GenerationParams

    out = []
    params = GenerationParams(max_new_tokens=tokens, stop=("\n",))
    for text in texts:
        t0 = time.perf_counter()
        query = " ".join(text.split()[-60:])
        found = [h for h in store.search(query, k=hits + 4, kinds=("chunk",)) if h.source not in exclude][:hits]
        passages = tuple(MemoryItem(h.text, h.source, h.doc_id, h.section_path, h.start, h.end, "margin")
                         for h in found)
        ids = client.prompt_ids(client.encode(text), memory=passages)
        first, n = None, 0
        generated = memory_gen.usage.generated_tokens
        for _ in memory_gen.stream_prompt(ids, params):
            if first is None:
                first = time.perf_counter() - t0
        n = memory_gen.usage.generated_tokens - generated
        total = time.perf_counter() - t0
        out.append((first if first is not None else total, total, n))  # an empty completion arrives at its end
    return out


def compare_give_way(args: Any, app: Any, store: Any, options: Any, client: Any, memory_gen: Any, load: Any,
                     draft: Path, typed: str, article: dict[str, Any], n_chunks: int, load_before: tuple[float, ...],
                     t_start: float) -> None:
    """Replay the typing ``2 * args.alternate`` times, with and without the memory model giving way (ABBA
    order, so a drift of the machine's speed falls on both alike), one standby for all; write both."""
    standby = load("smollm2")
    runs: dict[bool, list[list[Measured]]] = {True: [], False: []}
    updates: dict[bool, list[float]] = {True: [], False: []}
    order = [bool(i % 4 in (0, 3)) for i in range(2 * args.alternate)]
    for n, give_way in enumerate(order, 1):
        composer = app.compose(store, options.model_copy(update={"give_way": give_way}), generator=client, standby=standby.fork(keep_cache=False), memory_generator=memory_gen,
                               exclude=[str(draft)])
        measured, _ = replay(composer, typed, args.char_delay, args.word_pause)
        composer.wait_idle(300)
        composer.close()
        composer.join(60)
        runs[give_way].append(measured)
        updates[give_way] += [e.seconds for e in composer.events if e.kind == "memory_updated"]
        full = full_times(measured)
        print(f"replay {n}/{len(order)} ({'gives way' if give_way else 'does not give way'}): "
              f"full suggestion p50 {pct(full, 50) * 1000:.0f} ms over {len(full)}", flush=True)
    load_after = os.getloadavg()

    def cells(give_way: bool) -> dict[str, Any]:
        every = [m for r in runs[give_way] for m in r]
        full = full_times(every)
        during = full_times(every, refreshing=True)
        calm = full_times(every, refreshing=False)
        firsts = [m.first for m in every if m.first is not None]
        return {"first_p50_ms": pct(firsts, 50) * 1000, "full_p50_ms": pct(full, 50) * 1000, "full_n": len(full),
                "per_replay_p50_ms": [pct(full_times(r), 50) * 1000 for r in runs[give_way]],
                "full_p99_ms": pct(full, 99) * 1000, "refresh_full_p50_ms": pct(during, 50) * 1000,
                "refresh_n": len(during), "calm_full_p50_ms": pct(calm, 50) * 1000, "calm_n": len(calm),
                "update_p50_s": pct(updates[give_way], 50)}

    numbers = {
        "setup": {"client": "SmolLM2-135M on llama.cpp in process",
                  "memory_model": Path(args.memory_model).name if args.memory_model != "smollm2"
                  else "SmolLM2, loaded again", "memory_mode": args.memory_mode, "threshold": args.threshold,
                  "words": args.words, "article": article["title"], "keystrokes": len(typed),
                  "char_delay_ms": args.char_delay * 1000, "word_pause_ms": args.word_pause * 1000,
                  "replays": 2 * args.alternate, "chunks": n_chunks},
        "give_way": {"gives way": cells(True), "shares the CPU": cells(False)},
        "load": load_note(load_before[0], load_after[0]), "total_min": (time.perf_counter() - t_start) / 60,
    }
    show(measurement("compose_latency", numbers, name=f"{args.name}_give_way"), write=not args.no_write)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--article", type=int, default=0, help="which article's lead is typed")
    ap.add_argument("--words", type=int, default=80, help="how many words of the lead are typed")
    ap.add_argument("--distractors", type=int, default=6, help="other articles in the collection")
    ap.add_argument("--char-delay", type=float, default=0.05, help="seconds between keystrokes")
    ap.add_argument("--word-pause", type=float, default=0.6, help="extra seconds after each word")
    ap.add_argument("--memory-mode", choices=("takeaways", "margins"), default="takeaways")
    ap.add_argument("--memory-model", default="smollm2",
                    help="the larger model that writes the memory and the baseline's completion (a model spec, "
                         "e.g. gguf:~/.cache/marginalia-eval/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf)")
    ap.add_argument("--memory-threads", type=int, default=None,
                    help="CPU threads of the memory model (default: every core, as for any model loaded by spec)")
    ap.add_argument("--name", default="compose_latency", help="the measurement's name")
    ap.add_argument("--no-write", action="store_true", help="print the section, store nothing")
    ap.add_argument("--threshold", type=int, default=20)
    ap.add_argument("--alternate", type=int, default=0, metavar="N",
                    help="instead: replay the typing 2N times in one process, the memory model giving way and not "
                         "in turn (ABBA order), and store the two side by side (as <name>_give_way)")
    ap.add_argument("--dump", type=Path, default=None,
                    help="also write every suggestion's record (JSON lines: tokens prefilled and written, times) here")
    ap.add_argument("--no-give-way", dest="give_way", action="store_false",
                    help="the memory model does not pause while a suggestion is written (both share the CPU)")
    ap.add_argument("--no-repeat-ngram", type=int, default=None, metavar="N",
                    help="the client's loop guard (default: the compose default; 0: plain greedy)")
    ap.add_argument("--background", choices=("idle", "nice"), default="idle",
                    help="the scheduling of composition's background threads: the idle class (the default), or "
                         "only nicer in the normal class (to compare)")
    ap.add_argument("--embedder", default="minilm")
    ap.add_argument("--baseline-every", type=int, default=2, help="a baseline completion at every n-th word end")
    args = ap.parse_args()
    if not args.data.is_file():
        sys.exit(f"no data at {args.data}; give --data")
    memory_file = None
    if args.memory_threads is not None:
        from marginalia.models.registry import gguf_file

        memory_file = gguf_file(args.memory_model)
        if args.memory_threads < 1:
            ap.error("--memory-threads must be at least 1")
        if memory_file is None:
            ap.error(f"--memory-threads runs a GGUF memory model on llama.cpp: give --memory-model smollm2 or "
                     f"gguf:FILE, not {args.memory_model!r}")
        if not memory_file.is_file():
            ap.error(f"no GGUF file at {memory_file}; check --memory-model")

    from marginalia import app, openmp
    from marginalia.compose import threads
    from marginalia.options import ComposeOptions

    threads.IDLE_CLASS = args.background == "idle"

    t_start = time.perf_counter()
    load_before = os.getloadavg()
    articles = [json.loads(line) for line in args.data.read_text("utf-8").splitlines() if line.strip()]
    article = articles[args.article]
    markdown = clean(article["text"])
    lead, body = split_lead(markdown)
    typed = " ".join(lead.split()[: args.words]) + " "
    home = Path(tempfile.mkdtemp(prefix="compose-latency-"))
    docs = home / "docs"
    docs.mkdir()
    draft = docs / "draft.md"
    draft.write_text(f"# {article['title']}\n\n{markdown}")
    (docs / "reference.md").write_text(f"# {article['title']}\n\n{body}")
    others = [a for i, a in enumerate(articles) if i != args.article][: args.distractors]
    for i, other in enumerate(others):
        (docs / f"other-{i}.md").write_text(f"# {other['title']}\n\n{clean(other['text'])}")

    def load(spec: str) -> Any:
        return app.load_model(spec, home=home, backend="llamacpp")

    client = load("smollm2")
    t0 = time.perf_counter()
    report = app.index_paths([docs], "sources", count_tokens=client.tokenizer.count, home=home,
                             embedder=args.embedder)
    index_s = time.perf_counter() - t0
    store = app.open_collection("sources", home=home)
    n_chunks = sum(d.n_chunks for d in store.documents())
    print(f"indexed {len(report.indexed)} documents, {n_chunks} chunks in {index_s:.0f} s", flush=True)
    options = ComposeOptions(threshold=args.threshold, memory_mode=args.memory_mode, suggestion_tokens=15,
                             give_way=args.give_way, no_repeat_ngram=args.no_repeat_ngram,
                             debounce=0.0)
    if memory_file is None:
        memory_gen = load(args.memory_model)
    else:
        from marginalia.models.llamacpp.backend import LlamaCppGenerator

        memory_gen = LlamaCppGenerator(memory_file, name=args.memory_model, n_threads=args.memory_threads)
    if args.alternate:
        compare_give_way(args, app, store, options, client, memory_gen, load, draft, typed, article, n_chunks,
                         load_before, t_start)
        return
    composer = app.compose(store, options, generator=client, memory_generator=memory_gen, loader=load,
                           exclude=[str(draft)])
    t_replay = time.perf_counter()
    measured, ends = replay(composer, typed, args.char_delay, args.word_pause)
    composer.wait_idle(300)
    composer.close()
    replay_s = time.perf_counter() - t_replay
    events = list(composer.events)
    if args.dump is not None:
        import dataclasses

        with args.dump.open("w", encoding="utf-8") as f:
            for e in events:
                if e.kind == "suggested":
                    f.write(json.dumps({k: v for k, v in dataclasses.asdict(e).items() if k != "text"}) + "\n")
    drafted = [i for e in events if e.kind == "memory_updated" for i in e.added if i.source == str(draft)]
    kinds = [e.kind for e in events]
    replaced = sum(1 for e in events if e.kind == "memory_requested" and e.replaces is not None)
    updates = [e for e in events if e.kind == "memory_updated"]
    print(f"replayed {len(typed)} keystrokes in {replay_s:.0f} s: {len(measured)} suggestions, "
          f"{kinds.count('memory_updated')} memory updates", flush=True)

    picks = ends[args.baseline_every - 1:: args.baseline_every]
    base = baseline(store, memory_gen, composer.client, picks, options.hits, 15, {str(draft)})
    load_after = os.getloadavg()

    firsts = [m.first for m in measured if m.first is not None]
    full = full_times(measured)
    refresh_full = full_times(measured, refreshing=True)
    refresh_first = [m.first for m in measured if m.first is not None and m.refreshing]
    calm_full = full_times(measured, refreshing=False)
    base_first = [b[0] for b in base]
    base_full = [b[1] for b in base if b[2] >= 15]

    def row(values: list[float]) -> dict[str, Any]:
        return {"p50_ms": pct(values, 50) * 1000, "p90_ms": pct(values, 90) * 1000, "p99_ms": pct(values, 99) * 1000,
                "n": len(values)}

    guard = composer.client.params.no_repeat_ngram
    numbers = {
        "setup": {
            "client": "SmolLM2-135M on llama.cpp in process, "
                      + (f"no run of {guard} tokens twice per suggestion" if guard else "plain greedy"),
            "memory_model": ("the same weights, loaded again" if args.memory_model == "smollm2" else
                             Path(args.memory_model).name)
            + " (in the same process, sharing its CPU"
            + (f", {args.memory_threads} thread{'s' if args.memory_threads > 1 else ''}" if args.memory_threads else "")
            + "; " + ("it pauses while a suggestion is written" if args.give_way else "it does not pause for suggestions")
            + ")",
            "background": "idle scheduling class" if threads.IDLE_CLASS else f"nice {threads.BACKGROUND_NICE}, normal class",
            "openmp": {"set": "marginalia's", "user": "the environment's", "late": "libgomp's (set too late)"}[openmp.state],
            "memory_mode": args.memory_mode, "threshold": args.threshold, "hits": options.hits, "embedder": args.embedder,
            "words": args.words, "article": article["title"], "keystrokes": len(typed),
            "char_delay_ms": args.char_delay * 1000, "word_pause_ms": args.word_pause * 1000, "others": len(others),
            "chunks": n_chunks, "give_way": args.give_way,
        },
        "counts": {"suggestions": len(measured), "finished": sum(not m.cancelled for m in measured),
                   "memory_requested": kinds.count("memory_requested"), "memory_started": kinds.count("memory_started"),
                   "replaced": replaced, "memory_updates": len(updates), "memory_failed": kinds.count("memory_failed"),
                   "swaps": kinds.count("memory_swapped"), "drafted": len(drafted), "baseline_texts": len(picks)},
        "rows": {"first": row(firsts), "full": row(full), "first_refresh": row(refresh_first),
                 "full_refresh": row(refresh_full), "full_calm": row(calm_full), "baseline_first": row(base_first),
                 "baseline_full": row(base_full)},
        "baseline_first_ratio": pct(base_first, 50) / pct(firsts, 50),
        "baseline_full_ratio": pct(base_full, 50) / pct(full, 50),
        "memory_update_p50_s": pct([u.seconds for u in updates], 50),
        "load": load_note(load_before[0], load_after[0]), "total_min": (time.perf_counter() - t_start) / 60,
    }
    show(measurement("compose_latency", numbers, name=args.name), write=not args.no_write)


COMPOSE_LATENCY_ROWS = {
    "first": "first suggestion token",
    "full": "full 15-token suggestion",
    "first_refresh": "first token, memory refreshing",
    "full_refresh": "full suggestion, memory refreshing",
    "full_calm": "full suggestion, no refresh",
    "baseline_first": "baseline: first token",
    "baseline_full": "baseline: 15 tokens",
}


def summary(m: Record) -> list[list[str]]:
    n = m["numbers"]
    if "give_way" in n:
        return []
    r = n["rows"]
    return [["Composition latency (SmolLM2 suggesting as one types)",
             f"first suggestion token p50 {num(r['first']['p50_ms'], 0)} ms (p99 {num(r['first']['p99_ms'], 0)}), "
             f"full suggestion p50 {num(r['full']['p50_ms'], 0)} ms; retrieve-then-write "
             f"{num(n['baseline_first_ratio'])}x slower to its first token", made_by(m)]]


def section(m: Record) -> list[str]:
    n = m["numbers"]
    if "give_way" in n:
        return compose_give_way_section(n)
    s, r, c = n["setup"], n["rows"], n["counts"]
    return [f"Client: {s['client']}; memory model: {s['memory_model']}; memory: {s['memory_mode']}, threshold "
            f"{s['threshold']} token edits. {s['words']} words of WikiText's {s['article']!r} typed "
            f"({s['keystrokes']} keystrokes, {s['char_delay_ms']:g} ms apart, {s['word_pause_ms']:g} ms more after "
            f"each word), each keystroke starting a suggestion; {c['memory_updates']} memory updates, "
            f"{c['memory_failed']} failures. Baseline at {c['baseline_texts']} word ends: retrieve, then the memory "
            "model writes the 15 tokens.", "",
            *table(["ms", "p50", "p90", "p99", "n"],
                   [[label, num(r[k]["p50_ms"], 0), num(r[k]["p90_ms"], 0), num(r[k]["p99_ms"], 0), str(r[k]["n"])]
                    for k, label in COMPOSE_LATENCY_ROWS.items() if k in r]), "",
            f"The baseline takes {num(n['baseline_first_ratio'])}x compose's median time to the first token and "
            f"{num(n['baseline_full_ratio'])}x its median full suggestion. Memory updates took "
            f"{num(n['memory_update_p50_s'])} s (median); suggestions never wait for them."]


def compose_give_way_section(n: dict[str, Any]) -> list[str]:
    s = n["setup"]
    return [f"The first {s['words']} words of WikiText's {s['article']!r} typed {s['replays']} times in one process "
            f"({s['keystrokes']} keystrokes each), the memory model ({s['memory_model']}) pausing before each of its "
            "steps while a suggestion is written, and not, in ABBA order; times pooled over the replays of each "
            "kind (n in brackets).", "",
            *table(["memory model", "first token p50 (ms)", "full suggestion p50 (ms)", "full p99", "full p50 during "
                    "a refresh", "full p50, no refresh", "memory update p50 (s)"],
                   [[kind, num(c["first_p50_ms"], 0), f"{num(c['full_p50_ms'], 0)} ({c['full_n']})",
                     num(c["full_p99_ms"], 0), f"{num(c['refresh_full_p50_ms'], 0)} ({c['refresh_n']})",
                     f"{num(c['calm_full_p50_ms'], 0)} ({c['calm_n']})", num(c["update_p50_s"])]
                    for kind, c in n["give_way"].items()])]


BENCHMARKS["compose_latency"] = Benchmark("Composition latency", section, summary)


if __name__ == "__main__":
    main()
