"""WiM on one >= 6k-token document through four backends.

(a) transformers in-process, (b) llama.cpp in-process, (c) llama-cpp-python's
OpenAI-compatible server, whose single slot keeps the last prompt's KV cache, and
(d) the same server with that reuse disabled (the context is reset before every
request). For (c), a second question on the same document follows, to show what the
server's cache saves across questions. Reported: wall time, prompt tokens evaluated (in-process: our counters;
server: its own per-request "prompt eval ... / N tokens" log lines), tokens generated
and decode speed. Goals: (c) evaluates <= 1.1 x the document's tokens; (b) decodes
>= 4 x faster than (a).

    python benchmarks/backends.py [--segment-tokens 512 1024] [--skip-d]
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import command_line, git_commit, machine, write_section  # noqa: E402

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def served(reuse: bool, doc: str, question: str, segment_tokens: int,
           follow_up: str | None = None) -> dict[str, Any]:
    import httpx

    from marginalia.models import load_generator
    from marginalia.models.loaders import embedded_gguf

    port = free_port()
    log = Path(tempfile.mkstemp(prefix="server-", suffix=".log")[1])
    args = ["--model", str(embedded_gguf()), "--model_alias", "smollm2", "--host", "127.0.0.1",
            "--port", str(port), "--n_ctx", "8192", "--verbose", "true"]
    if reuse:
        command = [sys.executable, "-m", "llama_cpp.server", *args]
    else:
        launcher = log.with_suffix(".py")
        launcher.write_text(NO_REUSE_LAUNCHER)
        command = [sys.executable, str(launcher), *args]
    with log.open("w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
    try:
        for _ in range(300):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        start = log.stat().st_size
        gen = load_generator(f"openai:http://127.0.0.1:{port}/v1#smollm2;prompt=text;window=8192;x-repeat_penalty=1")
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segment-tokens", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--skip-d", action="store_true", help="skip the slow no-reuse server run")
    ap.add_argument("--runs", default="abcd", help="which of (a)-(d) to run, e.g. 'c' (the section is only "
                    "written when all four ran)")
    args = ap.parse_args()

    from marginalia.cli import demo_files
    from marginalia.models import load_generator

    doc, items = demo_files()
    question = items[0]["question"]
    n_doc = load_generator("smollm2", backend="llamacpp").tokenizer.count(doc)
    seg = args.segment_tokens[0]
    rows: dict[str, dict[str, Any]] = {}
    runs = [("(a) transformers, in-process", lambda: in_process("transformers", doc, question, seg)),
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
    lines = ["| backend | wall (s) | prompt tokens evaluated | / document | generated | decode tok/s | correct | answer |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for label, r in rows.items():
        lines.append(f"| {label} | {r['wall']:.1f} | {r['evaluated']} | {r['evaluated'] / n_doc:.2f} | "
                     f"{r['generated']} | {r['decode_tps']:.1f} | {gold in r['answer'].lower()} | "
                     f"{r['answer']} |")
    a, b = rows["(a) transformers, in-process"], rows["(b) llama.cpp, in-process"]
    speedup = b["decode_tps"] / a["decode_tps"]
    checks = [f"- (b) decodes {speedup:.1f}x faster than (a) (goal >= 4x: {'PASS' if speedup >= 4 else 'FAIL'})."]
    for label, r in rows.items():
        if label.startswith("(c)"):
            ratio = r["evaluated"] / n_doc
            checks.append(f"- {label}: evaluated {ratio:.2f}x the document's {n_doc} tokens "
                          f"(goal <= 1.1: {'PASS' if ratio <= 1.1 else 'FAIL'}); {r['requests']} requests "
                          f"sent {r['sent']} prompt tokens in all. A second question on the same document "
                          f"then evaluated {r['follow_up_evaluated']} prompt tokens "
                          f"({r['follow_up_evaluated'] / n_doc:.2f}x): this server keeps only its last "
                          "prompt's cache, so each new question reads the document once more; a server with a "
                          "block prefix cache (vLLM, SGLang) could keep it, since WiM's document prefix does not "
                          "depend on the question.")
    body = "\n".join([
        "## WiM through four backends (`benchmarks/backends.py`)",
        "",
        f"Command: `{command_line()}` · commit {git_commit()} · model SmolLM2-135M-Instruct "
        f"(Q4_1 GGUF; transformers de-quantizes it to fp32) · machine: {machine()}",
        "",
        f"Document: the bundled demo report ({n_doc} tokens); question: \"{question}\"; WiM, "
        f"grounded judge, segments of <= {seg} tokens unless said. Server prompt counts come from "
        "the server's own log; in-process ones from our counters (instructions and margin "
        "prompts included). (d) resets the server's context before every request.",
        "",
        *lines,
        "",
        *checks,
    ])
    write_section("backends", body)
    print(body)


if __name__ == "__main__":
    main()
