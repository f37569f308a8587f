"""llama.cpp with and without flash attention: prefill and decode speed on a long document, per model.

`llamacpp_settings.py` times the decode step alone, where flash attention is slower once the prefix is long.
Reading a long document is mostly prefill, though: a WiM or long-context answer at 8k tokens on two cores
spends most of its time there. This prefills the demo document (repeated up to ``--tokens``) in the backend's
batches of 512, then decodes ``--steps`` tokens, with flash attention off and on, in ABBA order in one process,
and checks that both pick the same greedy tokens.

    python lab/flash_attention.py [--models smollm2 gguf:FILE ...] [--tokens 6000] [--rounds 2]

Default models: the embedded SmolLM2 and, when it has been assembled, the eval model
(``../shared/tools/eval-model``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _lab_common import EVAL_GGUF, command_line, finish, git_commit, load_note, machine


def measure(path: str, ids: list[int], steps: int, flash: bool, threads: int) -> tuple[float, float, list[int]]:
    """(prefill tok/s, decode tok/s, the greedy tokens) of one fresh context."""
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(path, n_ctx=len(ids) + steps + 16, n_batch=512, n_threads=threads, flash_attn=flash,
                          verbose=False)
    try:
        t0 = time.perf_counter()
        llm.eval(ids)
        prefill = len(ids) / (time.perf_counter() - t0)
        out: list[int] = []
        t0 = time.perf_counter()
        for _ in range(steps):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),))
            token = int(np.argmax(logits))
            out.append(token)
            llm.eval([token])
        decode = steps / (time.perf_counter() - t0)
        return prefill, decode, out
    finally:
        llm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=None, help="GGUF specs (default: smollm2 and the eval model)")
    ap.add_argument("--tokens", type=int, default=6000, help="document tokens prefilled")
    ap.add_argument("--steps", type=int, default=32, help="tokens decoded after the prefill")
    ap.add_argument("--rounds", type=int, default=2, help="ABBA pairs per model")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave lab/findings alone")
    args = ap.parse_args()

    import llama_cpp

    from marginalia import demo as demo_files
    from marginalia.models import gguf_file

    specs = args.models or ["smollm2"] + ([f"gguf:{EVAL_GGUF}"] if EVAL_GGUF.is_file() else [])
    threads = os.cpu_count() or 1
    doc, _ = demo_files()
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    rows = []
    for spec in specs:
        path = gguf_file(spec)
        if path is None or not path.is_file():
            raise SystemExit(f"{spec}: not a GGUF model file here")
        vocab = llama_cpp.Llama(str(path), n_ctx=64, vocab_only=True, verbose=False)
        ids = vocab.tokenize(doc.encode("utf-8"), add_bos=False)
        ids = (ids * (args.tokens // len(ids) + 1))[: args.tokens]
        got: dict[bool, list[tuple[float, float, list[int]]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for flash in (False, True, True, False):
                got[flash].append(measure(str(path), ids, args.steps, flash, threads))
                print(f"{path.name}: flash attention {'on' if flash else 'off'}: prefill "
                      f"{got[flash][-1][0]:.0f} tok/s, decode {got[flash][-1][1]:.1f} tok/s", flush=True)
        med = {f: (statistics.median(r[0] for r in got[f]), statistics.median(r[1] for r in got[f])) for f in got}
        same = got[True][0][2] == got[False][0][2]
        agree = next((i for i, (a, b) in enumerate(zip(got[True][0][2], got[False][0][2], strict=True)) if a != b),
                     args.steps)
        rows.append((path.name, med, same, agree))
    load_after = os.getloadavg()
    lines = ["| model | prefill off (tok/s) | prefill on (tok/s) | ratio | decode off (tok/s) | decode on (tok/s) | "
             "ratio | same greedy tokens |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, med, same, agree in rows:
        (p0, d0), (p1, d1) = med[False], med[True]
        lines.append(f"| {name} | {p0:.0f} | {p1:.0f} | {p1 / p0:.2f}x | {d0:.1f} | {d1:.1f} | {d1 / d0:.2f}x | "
                     + ("all" if same else f"the first {agree} of {args.steps}") + " |")
    body = "\n".join([
        "## llama.cpp with and without flash attention (`lab/flash_attention.py`)",
        "",
        f"Command: `{command_line()}` · commit {git_commit()} · llama-cpp-python {llama_cpp.__version__} · "
        f"machine: {machine()} · {load_note(load_before[0], load_after[0])} · total "
        f"{(time.perf_counter() - t_start) / 60:.1f} min",
        "",
        f"The demo document repeated to {args.tokens} tokens, prefilled in batches of 512 into a fresh context, "
        f"then {args.steps} greedy tokens decoded one at a time; flash attention off and on in ABBA order, "
        f"{args.rounds} pair(s) of each per model, medians; 16-bit keys and values, {threads} threads.",
        "",
        *lines,
    ])
    finish("flash_attention", body, write=not args.no_write)


if __name__ == "__main__":
    main()
