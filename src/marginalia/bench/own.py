"""Benchmarks on the user's own documents: generate QA pairs, have a person review them, use the accepted ones.

The pairs live in one JSONL file, a line per pair, with a ``status`` of ``pending``, ``accepted`` or
``rejected``. Generating appends (documents already in the file are skipped, so a rerun resumes);
reviewing rewrites the file atomically after every decision, so quitting or a crash loses nothing.
The ``own`` dataset reads the accepted pairs back as examples: the paragraph holding the evidence is the
gold passage and the documents' other paragraphs are the distractors, so the position and size sweeps
run on the user's own text.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ..app import Generator
from ..errors import UserError
from ..files import append_lines, atomic_write_lines
from .items import Example, Passage

STATUSES = ("pending", "accepted", "rejected")
_HEADING_ONLY = re.compile(r"#{1,6}[ \t][^\n]*")  # a heading alone is no distractor


def pair_id(doc_id: str, question: str) -> str:
    return hashlib.sha256(f"{doc_id}\x00{question.strip().lower()}".encode()).hexdigest()[:12]


def read_pairs(path: str | Path) -> list[dict[str, Any]]:
    """The pairs in a QA file (a missing file has none); a damaged line is an error naming it."""
    p = Path(path)
    if not p.exists():
        return []
    pairs = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{p} line {n} is not JSON ({exc.msg}); fix or remove that line") from exc
            for key in ("id", "question", "answer", "status", "source", "doc_id", "start", "end"):
                if key not in record:
                    raise UserError(f"{p} line {n} has no {key!r}; is this a file from 'marginalia bench qa-generate'?")
            pairs.append(record)
    return pairs


def write_pairs(path: str | Path, pairs: Iterable[dict[str, Any]]) -> None:
    """Replace the QA file atomically."""
    atomic_write_lines(path, pairs)


@dataclass
class GenerateSummary:
    documents: int = 0
    skipped_documents: int = 0  # already in the file
    new_pairs: int = 0
    requests: int = 0
    skipped_pairs: int = 0
    unreadable: tuple[str, ...] = ()


def generate_pairs(
    paths: Sequence[str | Path],
    generator: Generator,
    out_path: str | Path,
    density: str = "sparse",
    long_answers: bool = False,
    retries: int = 2,
    progress: Callable[[str, int, int], None] | None = None,
) -> GenerateSummary:
    """Write QA pairs for every readable document under ``paths`` into ``out_path`` (status ``pending``).

    Each document's pairs are appended as soon as they are written, so an interrupted run resumes
    with the next document.
    """
    from ..app import BankReport, QuestionWriter, chunk_document, load_paths

    existing = read_pairs(out_path)
    done_docs = {p["doc_id"] for p in existing}
    seen = {p["id"] for p in existing}
    report = load_paths(paths)
    summary = GenerateSummary(unreadable=tuple(f"{s.path}: {s.reason}" for s in report.skipped))
    if not report.documents:
        raise UserError("no readable documents under " + ", ".join(map(str, paths))
                        + (f" ({summary.unreadable[0]})" if summary.unreadable else ""))
    writer = QuestionWriter(generator, retries=retries, long_answers=long_answers)
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    for doc in report.documents:
        if doc.doc_id in done_docs:
            summary.skipped_documents += 1
            continue
        sections, chunks = chunk_document(doc, generator.tokenizer.count)
        step: Callable[[int, int], None] | None = None
        if progress is not None:
            def step(done: int, total: int, source: str = doc.source) -> None:
                progress(source, done, total)
        bank = writer.write(doc, sections, chunks, density=density, report=BankReport(), progress=step)
        summary.documents += 1
        summary.requests += bank.requests
        summary.skipped_pairs += bank.skipped_total
        lines = []
        for entry in bank.pairs:
            pid = pair_id(doc.doc_id, entry.question)
            if pid in seen:
                continue
            seen.add(pid)
            lines.append({
                "id": pid, "question": entry.question, "answer": entry.answer, "long_answer": entry.long_answer,
                "status": "pending", "source": doc.source, "doc_id": doc.doc_id,
                "section_path": list(entry.section_path), "start": entry.start, "end": entry.end,
                "evidence": doc.text[entry.start:entry.end], "generated_by": generator.name,
            })
        append_lines(out_path, lines)
        summary.new_pairs += len(lines)
    return summary


HELP = "[a]ccept  [e]dit  [r]eject  [s]kip  [b]ack  [q]uit"


def review(path: str | Path, inp: TextIO, out: TextIO, show_all: bool = False) -> dict[str, int]:
    """A terminal review loop over the pending pairs (or all, with ``show_all``); returns counts by status.

    Every decision is saved at once. Editing asks for a new question and answer (an empty line keeps the
    old one); an edited pair is accepted.
    """
    if not Path(path).is_file():
        raise UserError(f"no QA file at {path}; make one with 'marginalia bench qa-generate DOCS -o {path}'")
    pairs = read_pairs(path)
    if not pairs:
        raise UserError(f"{path} holds no QA pairs; make some with 'marginalia bench qa-generate'")
    todo = [i for i, p in enumerate(pairs) if show_all or p["status"] == "pending"]
    if not todo:
        out.write(f"nothing to review: all {len(pairs)} pairs are decided (use --all to go over them again)\n")
    at = 0

    def ask(prompt: str) -> str | None:
        out.write(prompt)
        out.flush()
        line = inp.readline()
        return None if line == "" else line.rstrip("\n")

    while 0 <= at < len(todo):
        pair = pairs[todo[at]]
        out.write(f"\n[{at + 1}/{len(todo)}] {pair['source']} > {' > '.join(pair.get('section_path') or [])}"
                  f"  ({pair['status']})\n")
        out.write(f"  evidence: {pair.get('evidence', '')}\n")
        out.write(f"  Q: {pair['question']}\n  A: {pair['answer']}\n")
        choice = ask(f"{HELP} > ")
        if choice is None or choice.strip().lower() in ("q", "quit"):
            break
        key = choice.strip().lower()[:1]
        if key == "a":
            pair["status"] = "accepted"
        elif key == "r":
            pair["status"] = "rejected"
        elif key == "e":
            question = ask("  new question (empty: keep): ")
            answer = ask("  new answer (empty: keep): ")
            if question is None or answer is None:
                break
            if question.strip():
                pair["question"] = question.strip()
            if answer.strip():
                pair["answer"] = answer.strip()
            pair["status"] = "accepted"
            pair["edited"] = True
        elif key == "s":
            at += 1
            continue
        elif key == "b":
            at = max(0, at - 1)
            continue
        else:
            out.write(f"  unknown choice {choice!r}; {HELP}\n")
            continue
        write_pairs(path, pairs)
        at += 1
    counts = {s: sum(1 for p in pairs if p["status"] == s) for s in STATUSES}
    out.write(f"\n{counts['accepted']} accepted, {counts['rejected']} rejected, {counts['pending']} pending "
              f"— saved in {path}\n")
    return counts


def load_own(path: Path) -> list[Example]:
    """The accepted pairs of a reviewed QA file as examples (documents are re-read from their sources).

    The gold passage is the paragraph that holds the evidence; the other paragraphs of the same
    documents are the example's distractors. A pair whose document changed since generation is an error
    that names it (its offsets would point at other text).
    """
    from ..app import load_document, paragraph_spans

    pairs = [p for p in read_pairs(path) if p["status"] == "accepted"]
    if not pairs and not Path(path).exists():
        raise UserError(f"no QA file at {path}; make one with 'marginalia bench qa-generate' and review it")
    if not pairs:
        raise UserError(f"{path} has no accepted pairs yet; review them with 'marginalia bench qa-review {path}'")
    docs: dict[str, Any] = {}
    examples = []
    for pair in pairs:
        source = pair["source"]
        if source not in docs:
            doc = load_document(source)
            if doc.doc_id != pair["doc_id"]:
                raise UserError(f"{source} changed since its QA pairs were generated; generate and review "
                                "them again (the stored offsets no longer match)")
            docs[source] = doc
        doc = docs[source]
        paragraphs = [(s, e) for s, e, _ in paragraph_spans(doc.text, 0, len(doc.text))]
        gold = next((s for s in paragraphs if s[0] <= pair["start"] < s[1]), (pair["start"], pair["end"]))
        passages = [Passage(doc.text[gold[0]:gold[1]].strip(), title=" > ".join(pair.get("section_path") or []),
                            gold=True)]
        passages += [Passage(doc.text[s:e].strip()) for s, e in paragraphs
                     if (s, e) != gold and not _HEADING_ONLY.fullmatch(doc.text[s:e].strip())]
        examples.append(Example(id=pair["id"], dataset="own", question=pair["question"], answers=(pair["answer"],),
                                passages=tuple(passages), meta={"source": source, "edited": bool(pair.get("edited"))}))
    return examples
