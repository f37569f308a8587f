"""How fast a tuned composition client suggests: SmolLM2 on llama.cpp, the tuned client on llama.cpp (its GGUF
base with the tuned LoRA adapter, ``tuned:<folder>``) and the same tuned client's merged model on
transformers, each completing the same typed text word by word, in one run on one machine.

Each client types the first ``--words`` words of the leads of WikiText articles 0.. (``--articles``), word by
word; at every word end it writes a 15-token suggestion (no stop string: only the end of a turn ends it early) with
the same two memory items in its prompt (two sentences of the article's body), its KV cache reused from word
to word as the composer reuses it. Reported per client: time to the first suggestion token and to the whole
suggestion (p50, p90), and how often the tuned client's suggestion on llama.cpp is the one its merged model
writes on transformers (greedy both: the adapter is applied to quantised weights on llama.cpp, so near-ties
may go the other way).

    python lab/tuned_client_speed.py --tuned tuned:<folder> [--articles 3] [--words 30]

The tuned folder is what ``marginalia tune train`` or ``benchmarks/compose_tuning.py`` writes. The texts are
read at run time from ../shared/data; nothing of them is kept in the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(1, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from _lab_common import DATA, command_line, finish, git_commit, load_note, machine
from compose_latency import clean, pct, split_lead

WIKITEXT = DATA / "wikitext-test-articles.part1.jsonl"
TOKENS = 15
Row = tuple[float, float, str, int]


def type_words(client: Any, lead: str, words: int) -> list[Row]:
    """(seconds to the first token, seconds to the whole suggestion, its text, its tokens) at each word end."""
    out = []
    split = lead.split()[:words]
    for n in range(1, len(split) + 1):
        text = " ".join(split[:n]) + " "
        t0 = time.perf_counter()
        first = None
        completion = client.complete(text, max_new_tokens=TOKENS)
        try:
            for _ in completion:
                if first is None:
                    first = time.perf_counter() - t0
        finally:
            completion.close()
        result = completion.result
        out.append((first if first is not None else float("nan"), time.perf_counter() - t0,
                    result.text if result else "", result.generated_tokens if result else 0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=WIKITEXT)
    ap.add_argument("--tuned", required=True,
                    help="the tuned client's spec, tuned:<folder> (e.g. tuned:<home>/tuned/compose-client-wikitext)")
    ap.add_argument("--articles", type=int, default=3, help="how many articles' leads are typed")
    ap.add_argument("--words", type=int, default=30, help="words typed per lead (a suggestion at each)")
    ap.add_argument("--home", type=Path, default=None, help="marginalia's home (default: its own default)")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave lab/findings alone")
    args = ap.parse_args()
    if not args.data.is_file():
        sys.exit(f"no data at {args.data}; give --data")

    from marginalia import load_model
    from marginalia.compose import CompletionClient, MemoryItem

    home = args.home
    tuned = args.tuned
    folder = Path(tuned.partition(":")[2]).expanduser()
    if not tuned.startswith("tuned:") or not (folder / "tuning.json").is_file():
        sys.exit(f"no tuned client at {tuned}; make one with 'marginalia tune train' or "
                 "benchmarks/compose_tuning.py, and give it as --tuned tuned:<folder>")
    if not (folder / "adapter.gguf").is_file():
        sys.exit(f"{folder} has no llama.cpp adapter (adapter.gguf): tune a GGUF client (smollm2) again")
    record = json.loads((folder / "tuning.json").read_text("utf-8"))
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    articles = [json.loads(line) for line in args.data.read_text("utf-8").splitlines() if line.strip()]
    texts = []
    for article in articles[: args.articles]:
        lead, body = split_lead(clean(article["text"]))
        sentences = [s.strip() + "." for s in body.replace("\n", " ").split(". ") if len(s.split()) > 8][:2]
        memory = tuple(MemoryItem(s, "body", "body", (article["title"],), 0, len(s), "takeaway") for s in sentences)
        texts.append((lead, memory))

    clients = [("SmolLM2-135M (untuned), llama.cpp", "smollm2", "llamacpp"),
               ("tuned client, llama.cpp + LoRA adapter", tuned, "llamacpp"),
               ("tuned client, merged model on transformers", tuned, "transformers")]
    results: dict[str, list[Row]] = {}
    for label, spec, backend in clients:
        gen = load_model(spec, home=home, backend=backend, device="cpu")
        standby = load_model(spec, home=home, backend=backend, device="cpu") if backend == "llamacpp" else None
        client = CompletionClient(gen, standby=standby, suggestion_tokens=TOKENS, stop=())
        rows: list[Row] = []
        for version, (lead, memory) in enumerate(texts, 1):
            client.set_memory(memory, version)
            client.wait_prepared(120)
            type_words(client, lead, 1)  # swaps the memory in; not measured
            rows += type_words(client, lead, args.words)
        client.close()
        results[label] = rows
        print(f"{label}: {len(rows)} suggestions", flush=True)
        del client, gen, standby

    def ms(values: list[float], q: float) -> str:
        return f"{pct(values, q) * 1000:.0f}"

    table = ["| client | suggestions (of 15 tokens) | first token p50 | p90 | 15 tokens p50 | p90 | tokens/s (p50) |",
             "|---|---:|---:|---:|---:|---:|---:|"]

    def whole(rows: list[Row]) -> list[float]:  # suggestions the end of a turn cut short are left out
        return [r[1] for r in rows if r[3] == TOKENS]

    for label, rows in results.items():
        firsts = [r[0] for r in rows if r[3] > 0]
        table.append(f"| {label} | {len(rows)} ({len(whole(rows))}) | {ms(firsts, 50)} | {ms(firsts, 90)} | "
                     f"{ms(whole(rows), 50)} | {ms(whole(rows), 90)} | {TOKENS / pct(whole(rows), 50):.0f} |")
    _, lora, merged = (results[c[0]] for c in clients)
    median = {label: pct(whole(rows), 50) for label, rows in results.items()}
    same = sum(a[2] == b[2] for a, b in zip(lora, merged, strict=True))
    same_first = sum(a[2].split()[:1] == b[2].split()[:1] for a, b in zip(lora, merged, strict=True))
    body = "\n".join([
        "## A tuned client's speed on llama.cpp (`lab/tuned_client_speed.py`)",
        "",
        f"Command: `{command_line()}` · commit {git_commit()} · tuned client: `{tuned}` (base "
        f"{record.get('base_model')}, LoRA rank {record.get('options', {}).get('rank')} on "
        f"{record.get('options', {}).get('modules')}, {record.get('steps')} steps on "
        f"{record.get('train_examples')} examples: its quality does not enter here, only its shape) · "
        f"machine: {machine()} · {load_note(load_before[0], os.getloadavg()[0])} · total "
        f"{(time.perf_counter() - t_start) / 60:.1f} min",
        "",
        f"Each client typed the first {args.words} words of the leads of {len(texts)} WikiText articles word by "
        f"word, writing a {TOKENS}-token suggestion (greedy, no stop string: only the end of a turn ends one "
        "early, and those are left out of the 15-token columns) at each word end with two memory "
        "items in its prompt and its KV cache reused from word to word. Times in ms.",
        "",
        *table,
        "",
        f"- The tuned client on llama.cpp takes {median[clients[1][0]] / median[clients[0][0]]:.2f}x the untuned "
        f"client's median time for a whole suggestion; its merged model on transformers takes "
        f"{median[clients[2][0]] / median[clients[1][0]]:.2f}x the llama.cpp time.",
        f"- The same suggestion on llama.cpp as on transformers, word for word: {same} of {len(lora)}; the same "
        f"first word: {same_first} of {len(lora)} (the adapter on quantised weights against the merged fp32 "
        "model: near-ties can go the other way, and a suggestion that differs in one token differs after it).",
    ])
    finish("tuned_client_speed", body, write=not args.no_write)


if __name__ == "__main__":
    main()
