"""The embedded SmolLM2 on llama.cpp: its weights as shipped (Q4_1) against the Q8_0 copy `smollm2` reads.

Times prefill of the demo document's first tokens and one-token decoding after a prefix, both files in one
process, interleaved, and says how often their greedy continuations agree (the copy rounds every weight once
more, so near-ties can flip; `marginalia.models.gguf_copy`).

    python benchmarks/smollm2_q8.py [--prefill 512 4096] [--rounds 3] [--cuts 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import command_line, git_commit, load_note, machine, write_section  # noqa: E402

STEPS = 32  # decoded tokens per timing, and per greedy continuation compared
DECODE_AFTER = 512  # the prefix decoding is timed after


def greedy(llm: Any, prefix: list[int], steps: int) -> list[int]:
    llm.reset()
    llm.eval(prefix)
    out: list[int] = []
    for _ in range(steps):
        token = int(llm.sample(top_k=1))
        out.append(token)
        llm.eval([token])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefill", type=int, nargs="+", default=[512, 4096],
                    help="prefill lengths (tokens of the demo document)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median reported)")
    ap.add_argument("--cuts", type=int, default=8, help="places in the document to compare greedy continuations")
    args = ap.parse_args()

    import llama_cpp

    from marginalia.app import demo as demo_files
    from marginalia.models.gguf_copy import q8_copy
    from marginalia.models.llamacpp_backend import DEFAULT_KEY_CACHE, KEY_CACHE_TYPES, usable_cores
    from marginalia.models.loaders import embedded_gguf

    before = os.getloadavg()[0]
    started = time.perf_counter()
    shipped = embedded_gguf()
    copy = q8_copy(shipped, lambda line: print(line, file=sys.stderr))
    if copy == shipped:
        raise SystemExit("the Q8_0 copy could not be made (see above)")
    threads = usable_cores()
    files = {"as shipped (Q4_1)": shipped, "Q8_0 copy (what `smollm2` reads)": copy}
    llms = {name: llama_cpp.Llama(str(path), n_ctx=8192, n_batch=512, n_threads=threads, n_threads_batch=threads,
                                  type_k=KEY_CACHE_TYPES[DEFAULT_KEY_CACHE], verbose=False)
            for name, path in files.items()}
    doc, _ = demo_files()
    ids = next(iter(llms.values())).tokenize(doc.encode("utf-8"), add_bos=False)
    longest = max(*args.prefill, DECODE_AFTER + STEPS)
    if len(ids) < longest:
        raise SystemExit(f"the demo document has {len(ids)} tokens; --prefill asks for {longest}")

    prefill: dict[str, dict[int, list[float]]] = {n: {p: [] for p in args.prefill} for n in llms}
    decode: dict[str, list[float]] = {n: [] for n in llms}
    for r in range(args.rounds):
        for name, llm in llms.items():
            for p in args.prefill:
                llm.reset()
                t0 = time.perf_counter()
                llm.eval(ids[:p])
                prefill[name][p].append(p / (time.perf_counter() - t0))
            llm.reset()
            llm.eval(ids[:DECODE_AFTER])
            t0 = time.perf_counter()
            for t in ids[DECODE_AFTER:DECODE_AFTER + STEPS]:
                llm.eval([t])
            decode[name].append(1000 * (time.perf_counter() - t0) / STEPS)
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)

    usable = len(ids) - STEPS
    cuts = [int(usable * (k + 1) / (args.cuts + 1)) for k in range(args.cuts)]
    first_same = whole_same = agreed = 0
    a, b = llms.values()
    for cut in cuts:
        x, y = greedy(a, ids[:cut], STEPS), greedy(b, ids[:cut], STEPS)
        first_same += x[0] == y[0]
        whole_same += x == y
        agreed += next((i for i, (u, v) in enumerate(zip(x, y, strict=True)) if u != v), STEPS)
    after = os.getloadavg()[0]

    med_pre = {n: {p: statistics.median(v) for p, v in by.items()} for n, by in prefill.items()}
    med_dec = {n: statistics.median(v) for n, v in decode.items()}
    base = next(iter(llms))
    head = "| weights | " + " | ".join(f"prefill {p} tokens (tok/s)" for p in args.prefill) + \
        f" | decode after {DECODE_AFTER} (ms/token) |"
    rows = [head, "|---|" + "---:|" * (len(args.prefill) + 1)]
    for name in llms:
        cells = [f"{med_pre[name][p]:.0f}" + ("" if name == base else f" ({med_pre[name][p] / med_pre[base][p]:.2f}x)")
                 for p in args.prefill]
        cells.append(f"{med_dec[name]:.1f}" + ("" if name == base else f" ({med_dec[name] / med_dec[base]:.2f}x)"))
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    body = "\n".join([
        "## SmolLM2's weights on llama.cpp: as shipped, and the Q8_0 copy (`benchmarks/smollm2_q8.py`)",
        "",
        f"Command: `{command_line()}` · commit {git_commit()} · llama-cpp-python {llama_cpp.__version__} · "
        f"{threads} threads · machine: {machine()} · {load_note(before, after)} · "
        f"{(time.perf_counter() - started) / 60:.1f} min",
        "",
        f"Both files in one process, interleaved; medians of {args.rounds} rounds; in brackets, the ratio to the "
        f"file as shipped (above 1 is faster for prefill, below 1 for decoding). Prefill reads the demo document's "
        f"first tokens in one call; decoding is {STEPS} one-token passes after its first {DECODE_AFTER}.",
        "",
        *rows,
        "",
        f"- Greedy continuations ({STEPS} tokens) after {len(cuts)} places in the demo document: the first token "
        f"the same at {first_same} of {len(cuts)}, all {STEPS} the same at {whole_same}; on average the first "
        f"{agreed / len(cuts):.1f} tokens agree.",
    ])
    write_section("smollm2_q8", body)
    print(body)


if __name__ == "__main__":
    main()
