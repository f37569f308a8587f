"""How many usable QA pairs a model writes for the question bank (dense: one request per chunk).

Reads the first three second-level sections of the bundled demo report, asks for one pair per chunk,
and counts the pairs kept (valid JSON, a question, an answer the text holds) and why others were
dropped. Models: the embedded SmolLM2, and the stronger evaluation model when its GGUF is present
(`../shared/tools/eval-model` assembles it).

    python benchmarks/question_bank.py [--model SPEC ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import command_line, git_commit, write_section  # noqa: E402

EVAL_GGUF = Path.home() / ".cache" / "marginalia-eval" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", default=None, help="model specs (default: smollm2 and the eval model)")
    args = ap.parse_args()
    specs = args.model or ["smollm2"] + ([f"gguf:{EVAL_GGUF}"] if EVAL_GGUF.is_file() else [])

    from marginalia.index.question_bank import QuestionWriter
    from marginalia.ingest.chunking import chunk_sections
    from marginalia.ingest.loaders import load_document
    from marginalia.ingest.sections import parse_sections
    from marginalia.models import load_generator

    demo = Path(__file__).resolve().parent.parent / "src" / "marginalia" / "data" / "demo" / "harbour_report.md"
    doc = load_document(demo)
    sections = parse_sections(doc)
    chosen_sections = [s for s in sections if s.level == 2][:3]
    rows, examples = [], []
    for spec in specs:
        gen = load_generator(spec)
        chunks = [c for c in chunk_sections(doc, sections, gen.tokenizer.count)
                  if any(s.start <= c.start < s.end for s in chosen_sections)]
        t0 = time.perf_counter()
        report = QuestionWriter(gen).write(doc, sections, chunks, density="dense")
        seconds = time.perf_counter() - t0
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(report.skipped.items())) or "none"
        name = "SmolLM2-135M" if spec == "smollm2" else Path(spec.split(":", 1)[1]).stem
        rows.append(f"| {name} | {len(chunks)} | {len(report.pairs)} | {report.requests} | {report.retries} | "
                    f"{skipped} | {seconds:.0f} |")
        examples += [f"- {name}: \"{p.question}\" → \"{p.answer}\"" for p in report.pairs[:3]]
        print(rows[-1], flush=True)
    body = "\n".join([
        "## Question bank: usable pairs per model (`benchmarks/question_bank.py`)",
        "",
        f"Command: `{command_line()}` · commit {git_commit()} · dense density (one request per chunk) over the "
        "first three second-level sections of the demo report; greedy first try, up to 2 retries at temperature "
        "0.7 after a malformed reply.",
        "",
        "| model | chunks | pairs kept | requests | retries | dropped | seconds |",
        "|---|---:|---:|---:|---:|---|---:|",
        *rows,
        "",
        "First pairs kept:",
        "",
        *examples,
    ])
    write_section("question_bank", body)
    print(body)


if __name__ == "__main__":
    main()
