"""How many usable QA pairs a model writes for the question bank (dense: one request per chunk).

Indexes the first three second-level sections of the bundled demo report as a collection of their own
(a temporary home), asks for one pair per chunk (`marginalia.generate_questions`, dense), and counts
the pairs kept (valid JSON, a question, an answer the text holds) and why others were dropped. Models: the embedded SmolLM2, and the stronger evaluation model when its GGUF is present
(`../shared/tools/eval-model` assembles it).

    python lab/question_bank.py [--model SPEC ...]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _lab_common import EVAL_GGUF, command_line, finish, git_commit


def first_sections(markdown: str, count: int) -> str:
    """The document's title line and its first ``count`` second-level sections (with their subsections)."""
    lines = markdown.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith("## ")]
    end = starts[count] if len(starts) > count else len(lines)
    title = [line for line in lines[: starts[0]] if line.startswith("# ")] if starts else []
    return "".join(title + ["\n"] + lines[starts[0]:end] if starts else lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", default=None, help="model specs (default: smollm2 and the eval model)")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave lab/findings alone")
    args = ap.parse_args()
    specs = args.model or ["smollm2"] + ([f"gguf:{EVAL_GGUF}"] if EVAL_GGUF.is_file() else [])

    from marginalia import demo, generate_questions, index_paths, load_model

    text, _ = demo()
    rows, examples = [], []
    with tempfile.TemporaryDirectory(prefix="question-bank-") as tmp:
        part = Path(tmp) / "harbour_report.md"
        part.write_text(first_sections(text, 3), "utf-8")
        for i, spec in enumerate(specs):
            gen = load_model(spec)
            home, chunks = Path(tmp) / f"home{i}", []
            index_paths([part], "demo", count_tokens=gen.tokenizer.count, home=home, embedder="hashing",
                        on_document=lambda _doc, count, chunks=chunks: chunks.append(count))
            t0 = time.perf_counter()
            (written,) = generate_questions("demo", gen, home=home, density="dense")
            seconds = time.perf_counter() - t0
            report = written.report
            skipped = ", ".join(f"{n} {why}" for why, n in sorted(report.skipped.items())) or "none"
            name = "SmolLM2-135M" if spec == "smollm2" else Path(spec.split(":", 1)[1]).stem
            rows.append(f"| {name} | {sum(chunks)} | {len(report.pairs)} | {report.requests} | {report.retries} | "
                        f"{skipped} | {seconds:.0f} |")
            examples += [f"- {name}: \"{p.question}\" → \"{p.answer}\"" for p in report.pairs[:3]]
            print(rows[-1], flush=True)
    body = "\n".join([
        "## Question bank: usable pairs per model (`lab/question_bank.py`)",
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
    finish("question_bank", body, write=not args.no_write)


if __name__ == "__main__":
    main()
