"""llama.cpp's decode step under the settings that could make it faster, by prefix length.

The in-process llama.cpp backend's decode speed falls with the length of the cache (see
`backends.py`'s step table), and the backends goal asks it to decode 4x faster than
transformers over a WiM run whose margins are written after 0.5k to 6.5k tokens. This
times one-token forward passes (`Llama.eval`) after prefixes of the demo document under
each setting, and also a bare `llama_decode` call without llama-cpp-python's wrapper, to
show how much of a step is ours to win back.

    python lab/llamacpp_settings.py [--contexts 512 3000 6400] [--rounds 3]

Settings: the backend's default (16-bit keys and values, no flash attention, all cores);
8-bit keys; flash attention with 16-bit and with 8-bit keys and values (llama.cpp stores
8-bit values only with flash attention); 32-bit keys and values; one thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

from _lab_common import command_line, finish, git_commit, machine

STEPS = 32


def settings(threads: int) -> dict[str, dict[str, Any]]:
    import llama_cpp

    f16, q8, f32 = llama_cpp.GGML_TYPE_F16, llama_cpp.GGML_TYPE_Q8_0, llama_cpp.GGML_TYPE_F32
    found = {
        "default: f16 keys and values": {"type_k": f16},
        "q8_0 keys": {"type_k": q8},
        "flash attention, f16": {"type_k": f16, "flash_attn": True},
        "flash attention, q8_0 keys and values": {"type_k": q8, "type_v": q8, "flash_attn": True},
        "f32 keys and values": {"type_k": f32, "type_v": f32},
        "bare llama_decode (default settings)": {"type_k": f16, "bare": True},
    }
    if threads > 1:
        found["one thread"] = {"type_k": f16, "n_threads": 1}
    return found


def bare_stepper(llm: Any) -> Any:
    """One-token `llama_decode` calls on a batch allocated once, logits read in place."""
    import llama_cpp

    batch = llama_cpp.llama_batch_init(1, 0, 1)
    ctx = llm._ctx.ctx

    def step(pos: int, token: int) -> None:
        batch.n_tokens = 1
        batch.token[0], batch.pos[0], batch.n_seq_id[0] = token, pos, 1
        batch.seq_id[0][0], batch.logits[0] = 0, 1
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        llama_cpp.llama_get_logits_ith(ctx, -1)

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 3000, 6400],
                    help="prefix lengths (tokens of the demo document)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per prefix (median reported)")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave lab/findings alone")
    args = ap.parse_args()

    import llama_cpp

    from marginalia import demo as demo_files
    from marginalia.models import gguf_file

    threads = os.cpu_count() or 1
    doc, _ = demo_files()
    path = str(gguf_file("smollm2"))
    variants = settings(threads)
    llms: dict[str, Any] = {}
    for name, opts in variants.items():
        opts = dict(opts)
        bare = opts.pop("bare", False)
        opts.setdefault("n_threads", threads)
        llms[name] = (llama_cpp.Llama(path, n_ctx=8192, n_batch=512, verbose=False, **opts), bare)
    first = next(iter(llms.values()))[0]
    ids = first.tokenize(doc.encode("utf-8"), add_bos=False)
    if len(ids) < max(args.contexts) + STEPS:
        raise SystemExit(f"the demo document has {len(ids)} tokens; the longest prefix needs "
                         f"{max(args.contexts) + STEPS}")
    steppers = {name: bare_stepper(llm) if bare else None for name, (llm, bare) in llms.items()}
    for llm, _ in llms.values():
        llm.eval(ids[:max(args.contexts)])
    mem_rm = llama_cpp.llama_memory_seq_rm
    rates: dict[str, dict[int, list[float]]] = {n: {c: [] for c in args.contexts} for n in llms}
    for c in sorted(args.contexts, reverse=True):  # one prefill: each prefix is a rollback away
        for _ in range(args.rounds):
            for name, (llm, _) in llms.items():
                llm.n_tokens = c  # roll back to the prefix (llama_decode alone needs the cells dropped)
                mem_rm(llama_cpp.llama_get_memory(llm._ctx.ctx), -1, c, -1)
                step = steppers[name]
                t0 = time.perf_counter()
                for i, t in enumerate(ids[c:c + STEPS]):
                    if step is None:
                        llm.eval([t])
                    else:
                        step(c + i, t)
                rates[name][c].append(STEPS / (time.perf_counter() - t0))
            print(f"prefix {c}: round done", file=sys.stderr, flush=True)
    med = {n: {c: statistics.median(v) for c, v in by.items()} for n, by in rates.items()}
    base = med[next(iter(med))]
    head = "| setting | " + " | ".join(f"tok/s after {c}" for c in args.contexts) + " |"
    lines = [head, "|---|" + "---:|" * len(args.contexts)]
    for name, by in med.items():
        cells = [f"{by[c]:.1f}" + ("" if by is base else f" ({by[c] / base[c]:.2f}x)") for c in args.contexts]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    body = "\n".join([
        "## llama.cpp's decode step under other settings (`lab/llamacpp_settings.py`)",
        "",
        f"Command: `{command_line()}` · commit {git_commit()} · llama-cpp-python {llama_cpp.__version__} "
        f"· model SmolLM2-135M-Instruct (Q4_1 GGUF) · machine: {machine()}",
        "",
        f"{STEPS} one-token forward passes after a prefix of the demo document, every setting in one "
        f"process, interleaved; medians of {args.rounds} rounds; in brackets, the ratio to the default.",
        "",
        *lines,
    ])
    finish("llamacpp_settings", body, write=not args.no_write)


if __name__ == "__main__":
    main()
