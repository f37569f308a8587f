"""Does torch, run earlier in the same process, slow composition's suggestions down?

torch computes on an OpenMP team of intra-op threads that stays with the thread that first used it; llama.cpp
(the client model) computes on its own OpenMP runtime. This replays the typing of `compose_latency.py` (no
memory model, so only the client works) in one process, four times:

1. as the process starts (torch imported, the embedder loaded, nothing computed);
2. after the embedder embedded documents (`SentenceTransformerEmbedder` does it on a thread of its own,
   which ends with the call);
3. after a query was embedded (on the calling thread, with one torch thread);
4. after torch multiplied two matrices on the main thread with its default threads (last: what it leaves
   behind stays for the life of the process).

    python benchmarks/torch_team.py [--article 0] [--words 40]

The text is read at run time from ../shared/data; nothing of it is kept in the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import command_line, git_commit, load_note, machine, write_section  # noqa: E402
from compose_latency import DATA, clean, full_times, pct, replay, split_lead  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--article", type=int, default=0)
    ap.add_argument("--words", type=int, default=40)
    ap.add_argument("--char-delay", type=float, default=0.05)
    ap.add_argument("--word-pause", type=float, default=0.6)
    args = ap.parse_args()

    import torch

    from marginalia.compose import CompletionClient, Composer
    from marginalia.index.embedders import load_embedder
    from marginalia.models import load_generator

    t_start = time.perf_counter()
    load_before = os.getloadavg()
    articles = [json.loads(line) for line in args.data.read_text("utf-8").splitlines() if line.strip()]
    article = articles[args.article]
    lead, _ = split_lead(clean(article["text"]))
    typed = " ".join(lead.split()[: args.words]) + " "
    client_gen = load_generator("smollm2", backend="llamacpp")
    standby = load_generator("smollm2", backend="llamacpp")
    embedder = load_embedder("minilm")

    def typing(label: str) -> tuple[str, float, int]:
        client = CompletionClient(client_gen.fork(keep_cache=False), standby=standby.fork(keep_cache=False),
                                  suggestion_tokens=15)
        composer = Composer(client, lambda request: [], threshold=10**9, memory_size=1)
        measured, _ = replay(composer, typed, args.char_delay, args.word_pause)
        composer.close()
        composer.join(30)
        full = full_times(measured)
        print(f"{label}: full suggestion p50 {pct(full, 50) * 1000:.0f} ms over {len(full)}", flush=True)
        return label, pct(full, 50), len(full)

    rows = [typing("1. torch loaded, nothing computed")]
    embedder.embed_documents([" ".join(lead.split()[i:i + 60]) for i in range(0, 600, 20)])
    rows.append(typing("2. after embedding documents (a thread of their own)"))
    embedder.embed_query(typed)
    rows.append(typing("3. after embedding a query (one torch thread)"))
    a = torch.randn(512, 512)
    float((a @ a).sum())
    rows.append(typing(f"4. after a matrix product on the main thread ({torch.get_num_threads()} torch threads)"))
    load_after = os.getloadavg()
    first = rows[0][1]
    body = "\n".join([
        "## torch's threads and composition latency (`benchmarks/torch_team.py`)",
        "",
        f"Command: `{command_line()}` · commit {git_commit()} · client: SmolLM2-135M on llama.cpp in process, no "
        f"memory model · machine: {machine()} · {load_note(load_before[0], load_after[0])} · total "
        f"{(time.perf_counter() - t_start) / 60:.1f} min",
        "",
        f"The first {args.words} words of the lead of WikiText's {article['title']!r} typed four times in one "
        f"process ({len(typed)} keystrokes, {args.char_delay * 1000:.0f} ms apart, {args.word_pause * 1000:.0f} ms "
        "more after each word), torch doing more before each replay (in this order: what torch leaves behind "
        "stays).",
        "",
        "| before the replay | full 15-token suggestion p50 (ms) | against the first | n |",
        "|---|---:|---:|---:|",
        *[f"| {label[3:]} | {p50 * 1000:.0f} | {p50 / first:.2f}x | {n} |" for label, p50, n in rows],
    ])
    write_section("compose_latency_torch_team", body)


if __name__ == "__main__":
    main()
