"""WiM on one >= 6k-token document through four backends.

(a) transformers in-process, (b) llama.cpp in-process, (c) llama-cpp-python's
OpenAI-compatible server, whose single slot keeps the last prompt's KV cache, and
(d) the same server with that reuse disabled (the context is reset before every
request). For (c), a second question on the same document follows, to show what the
server's cache saves across questions. Reported: wall time, prompt tokens evaluated (in-process: our counters;
server: its own per-request "prompt eval ... / N tokens" log lines), tokens generated
and decode speed. Goals: (c) evaluates <= 1.1 x the document's tokens; (b) decodes
>= 4 x faster than (a).

(a) and (b) run in interleaved rounds (medians reported), and a second table times the
decode step alone (one-token forward passes) after prefixes of several lengths, since
attention over a long cache is what separates the two backends' speeds.

Stores benchmarks/measurements/backends.json (see benchmarks/report.py).

    python benchmarks/backends.py [--segment-tokens 512 1024] [--rounds 3] [--skip-d] [--no-write]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import BENCHMARKS, Benchmark, free_port, measurement, show, wait_up
from _markdown import Record, made_by, num, ratio, table

NO_REUSE_LAUNCHER = """
import runpy, sys
import llama_cpp

_generate = llama_cpp.Llama.generate

def generate(self, tokens, *args, **kwargs):
    self.reset()  # forget the previous prompt: every request is evaluated in full
    yield from _generate(self, tokens, *args, **kwargs)

llama_cpp.Llama.generate = generate
sys.argv = ["llama_cpp.server", *sys.argv[1:]]
runpy.run_module("llama_cpp.server", run_name="__main__")
"""
PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
DECODE = re.compile(r"\s eval time =\s*([\d.]+) ms /\s*(\d+) runs")


def run_wim(gen: Any, doc: str, question: str, segment_tokens: int) -> tuple[Any, float]:
    from marginalia.patterns import make_pattern

    t0 = time.perf_counter()
    answer = make_pattern("wim", gen, segment_tokens=segment_tokens).answer(doc, question)
    return answer, time.perf_counter() - t0


def in_process(backend: str, doc: str, question: str, segment_tokens: int) -> dict[str, Any]:
    from marginalia.models import load_generator

    gen = load_generator("smollm2", backend=backend)
    before = gen.usage.snapshot()
    answer, wall = run_wim(gen, doc, question, segment_tokens)
    used = gen.usage.since(before)
    return {"wall": wall, "evaluated": used.prefilled_tokens, "generated": used.generated_tokens,
            "decode_tps": used.generated_tokens / used.decode_seconds, "answer": answer.text}


def decode_by_context(backends: list[str], doc: str, contexts: list[int],
                      steps: int = 32, rounds: int = 3) -> dict[str, dict[int, float]]:
    """Tokens/s of the decode step alone (single-token forward passes through each
    backend's own `prefill`) after a prefix of each length; median of interleaved rounds."""
    import statistics

    from marginalia.models import load_generator

    gens = {b: load_generator("smollm2", backend=b) for b in backends}
    ids = gens[backends[0]].tokenizer.encode(doc)
    need = max(contexts) + steps
    if len(ids) < need:
        raise SystemExit(f"the document has {len(ids)} tokens; the decode table needs {need}")
    for gen in gens.values():
        gen.prefill(ids[:max(contexts)])
    rates: dict[str, dict[int, list[float]]] = {b: {c: [] for c in contexts} for b in backends}
    for c in sorted(contexts, reverse=True):  # one prefill: each prefix is a rollback away
        for _ in range(rounds):
            for b, gen in gens.items():
                gen.rollback(c)
                t0 = time.perf_counter()
                for t in ids[c:c + steps]:
                    gen.prefill([t])
                rates[b][c].append(steps / (time.perf_counter() - t0))
                gen.rollback(c)
    return {b: {c: statistics.median(v) for c, v in by.items()} for b, by in rates.items()}


def served(reuse: bool, doc: str, question: str, segment_tokens: int,
           follow_up: str | None = None) -> dict[str, Any]:

    from marginalia.cli import serve_command
    from marginalia.models import load_generator

    port = free_port()
    log = Path(tempfile.mkstemp(prefix="server-", suffix=".log")[1])
    # `marginalia serve-model`'s command (its settings match the in-process backend's), verbose
    # so that the server logs what it evaluates
    command, spec = serve_command(argparse.Namespace(model="smollm2", host="127.0.0.1", port=port,
                                                     n_ctx=8192, verbose=True))
    if not reuse:
        launcher = log.with_suffix(".py")
        launcher.write_text(NO_REUSE_LAUNCHER)
        command = [sys.executable, str(launcher), *command[3:]]  # past "python -m llama_cpp.server"
    with log.open("w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_up(f"http://127.0.0.1:{port}/v1/models", 300, proc, log)
        start = log.stat().st_size
        gen = load_generator(spec)
        answer, wall = run_wim(gen, doc, question, segment_tokens)
        with log.open() as f:
            f.seek(start)
            text = f.read()
        follow_up_evaluated = None
        if follow_up:  # a second question on the same document, same server
            second = log.stat().st_size
            run_wim(gen, doc, follow_up, segment_tokens)
            with log.open() as f:
                f.seek(second)
                follow_up_evaluated = sum(int(n) for _, n in PROMPT_EVAL.findall(f.read()))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    evaluated = sum(int(n) for _, n in PROMPT_EVAL.findall(text))
    decode = DECODE.findall(text)
    ms, runs = sum(float(m) for m, _ in decode), sum(int(r) for _, r in decode)
    return {"wall": wall, "evaluated": evaluated, "generated": answer.stats.generated_margin_tokens
            + answer.stats.generated_answer_tokens, "decode_tps": runs / (ms / 1000) if ms else 0.0,
            "sent": answer.stats.prompt_tokens_sent, "requests": len(PROMPT_EVAL.findall(text)),
            "answer": answer.text, "follow_up_evaluated": follow_up_evaluated}


def interleaved(doc: str, question: str, seg: int, rounds: int) -> dict[str, dict[str, Any]]:
    """(a) and (b) alternately, `rounds` times each; medians, with every round kept."""
    import statistics

    labels = {"transformers": "(a) transformers, in-process", "llamacpp": "(b) llama.cpp, in-process"}
    done: dict[str, list[dict[str, Any]]] = {b: [] for b in labels}
    for i in range(rounds):
        for backend, label in labels.items():
            print(f"running {label}, round {i + 1}/{rounds} ...", file=sys.stderr, flush=True)
            r = in_process(backend, doc, question, seg)
            print(label, {k: v for k, v in r.items() if k != "answer"}, flush=True)
            done[backend].append(r)
    out = {}
    for backend, label in labels.items():
        rs = done[backend]
        out[label] = {**rs[0], "wall": statistics.median(r["wall"] for r in rs),
                      "decode_tps": statistics.median(r["decode_tps"] for r in rs),
                      "rounds": [r["decode_tps"] for r in rs]}
    ratios = [b["decode_tps"] / a["decode_tps"] for a, b in zip(done["transformers"], done["llamacpp"],
                                                              strict=True)]
    out[labels["llamacpp"]]["round_ratios"] = ratios
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segment-tokens", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of (a) and (b)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[64, 512, 1500, 3000, 4500, 6400],
                    help="prefix lengths for the decode-step table")
    ap.add_argument("--skip-d", action="store_true", help="skip the slow no-reuse server run")
    ap.add_argument("--runs", default="abcd", help="which of (a)-(d) to run, e.g. 'c' (the measurement is only "
                    "stored when (a) and (b) ran)")
    ap.add_argument("--no-write", action="store_true", help="print the section, store nothing")
    args = ap.parse_args()

    from marginalia.app import demo as demo_files
    from marginalia.models import load_generator

    doc, items = demo_files()
    question = items[0]["question"]
    n_doc = load_generator("smollm2", backend="llamacpp").tokenizer.count(doc)
    seg = args.segment_tokens[0]
    rows: dict[str, dict[str, Any]] = {}
    runs: list[tuple[str, Any]] = []
    if "a" in args.runs and "b" in args.runs:
        rows.update(interleaved(doc, question, seg, args.rounds))
    else:
        runs += [("(a) transformers, in-process", lambda: in_process("transformers", doc, question, seg)),
                 ("(b) llama.cpp, in-process", lambda: in_process("llamacpp", doc, question, seg))]
    for s in args.segment_tokens:
        runs.append((f"(c) llama.cpp server, prefix reuse, segments {s}",
                     lambda s=s: served(True, doc, question, s, follow_up=items[1]["question"])))
    if not args.skip_d:
        runs.append((f"(d) llama.cpp server, no reuse, segments {seg}",
                     lambda: served(False, doc, question, seg)))
    runs = [(label, fn) for label, fn in runs if label[1] in args.runs]
    for label, fn in runs:
        print(f"running {label} ...", file=sys.stderr, flush=True)
        rows[label] = fn()
        print(label, {k: v for k, v in rows[label].items() if k != "answer"}, flush=True)

    if not {"(a) transformers, in-process", "(b) llama.cpp, in-process"} <= set(rows):
        return
    gold = items[0]["answer"].lower()
    print("timing the decode step by prefix length ...", file=sys.stderr, flush=True)
    by_ctx = decode_by_context(["transformers", "llamacpp"], doc, args.contexts)
    numbers = {
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF; transformers de-quantizes it to fp32, llama.cpp reads its Q8_0 "
                 "copy made by `models.llamacpp.gguf_copy`)",
        "document_tokens": n_doc, "question": question, "segment_tokens": seg,
        "rows": [{"label": label, **r, "correct": gold in r["answer"].lower()} for label, r in rows.items()],
        "decode_step": [{"prefix": c, "transformers": by_ctx["transformers"][c], "llamacpp": by_ctx["llamacpp"][c]}
                        for c in args.contexts],
    }
    show(measurement("backends", numbers), write=not args.no_write)


def summary(m: Record) -> list[list[str]]:
    n = m["numbers"]
    rows = {r["label"]: r for r in n["rows"]}
    a, b = rows.get("(a) transformers, in-process"), rows.get("(b) llama.cpp, in-process")
    reuse = [r for label, r in rows.items() if label.startswith("(c)")]
    fresh = [r for label, r in rows.items() if label.startswith("(d)")]
    out = []
    if a and b:
        out.append(["Decoding: llama.cpp vs transformers, in process",
                    f"{ratio(b['decode_tps'], a['decode_tps'])} the tokens per second", made_by(m)])
    if reuse:
        doc = n["document_tokens"]
        out.append(["WiM over an OpenAI-compatible server: prompt tokens evaluated",
                    f"{ratio(reuse[0]['evaluated'], doc)} the document with prefix reuse"
                    + (f", {ratio(fresh[0]['evaluated'], doc)} without" if fresh else ""), made_by(m)])
    return out


def section(m: Record) -> list[str]:
    n = m["numbers"]
    doc = n["document_tokens"]
    rows = [[r["label"], num(r["wall"]), num(r["evaluated"], 0), ratio(r["evaluated"], doc), num(r["generated"], 0),
             num(r["decode_tps"]), "yes" if r["correct"] else "no"] for r in n["rows"]]
    lines = [f"WiM (segments of {n['segment_tokens']} tokens unless said) over the demo report ({num(doc, 0)} tokens); "
             f"{n['model']}. The server is `marginalia serve-model` (llama-cpp-python), its counts from its log; (d) "
             "resets its context before every request.",
             "", *table(["backend", "wall (s)", "prompt tokens evaluated", "/ document", "generated", "decode tok/s",
                         "answer holds the gold"], rows, "lrrrrrl"), ""]
    by = {r["label"]: r for r in n["rows"]}
    b = by.get("(b) llama.cpp, in-process")
    if b and b.get("round_ratios"):
        lines.append(f"- (b) decodes {ratio(b['decode_tps'], by['(a) transformers, in-process']['decode_tps'])} as "
                     f"fast as (a): medians of {len(b['round_ratios'])} interleaved rounds (per round "
                     f"{min(b['round_ratios']):.2f}-{max(b['round_ratios']):.2f}).")
    again = [f"{ratio(r['follow_up_evaluated'], doc)} ({r['label'].rsplit(', ', 1)[-1]})" for r in n["rows"]
             if r.get("follow_up_evaluated") is not None]
    if again:
        lines.append("- (c): a second question on the same document evaluated " + ", ".join(again) + " the document "
                     "again: this server keeps only its last prompt's cache, while WiM's document prefix does not "
                     "depend on the question (a block prefix cache, as vLLM's or SGLang's, keeps it).")
    if n.get("decode_step"):
        steps = n["decode_step"]
        lines.append(f"- The decode step alone, (b) against (a): {ratio(steps[0]['llamacpp'], steps[0]['transformers'])} "
                     f"after {num(steps[0]['prefix'], 0)} tokens, {ratio(steps[-1]['llamacpp'], steps[-1]['transformers'])} "
                     f"after {num(steps[-1]['prefix'], 0)}: attention over a long cache narrows the gap.")
    return lines


BENCHMARKS["backends"] = Benchmark("WiM through four backends", section, summary)


if __name__ == "__main__":
    main()
