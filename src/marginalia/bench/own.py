"""Benchmarks on the user's own documents: generate QA pairs, have a person review them, use the accepted ones.

The pairs live in one JSONL file, a line per pair, with a ``status`` of ``pending``, ``accepted`` or
``rejected`` and a ``kind`` (`qa_writer.KINDS`). Generating appends each pair as it is made and lists the
requests done in a file beside it, so a rerun resumes inside a document; reviewing rewrites the file
atomically after every decision, so quitting or a crash loses nothing.
The ``own`` dataset reads the accepted pairs back as examples: the paragraph holding the evidence is the
gold passage and the documents' other paragraphs are the distractors, so the position and size sweeps
run on the user's own text.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from ..app import Generator
from ..errors import UserError
from ..files import append_lines, atomic_write_lines, mend_tail
from ..records import Chunk, Document, Section
from .items import Example, Passage
from .qa_writer import Made, Outcome

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
    skipped_documents: int = 0  # every request of theirs done before
    new_pairs: int = 0
    requests: int = 0  # requests sent this run (retries included)
    resumed_requests: int = 0  # planned requests done by an earlier run
    skipped_pairs: int = 0  # dropped: malformed, evidence not found, near duplicates
    unreadable: tuple[str, ...] = ()
    kinds: Counter[str] = field(default_factory=Counter)  # new pairs by kind


@dataclass(frozen=True)
class DocumentStarted:
    """A document's requests are planned: ``planned`` counts them by kind; ``done`` were done before."""

    source: str
    doc_id: str
    sections: int
    planned: dict[str, int]
    done: int

    @property
    def total(self) -> int:
        return sum(self.planned.values())


@dataclass(frozen=True)
class RequestDone:
    """One request is done: ``done`` of ``total`` of its document's, with the pairs it added and dropped."""

    source: str
    key: str
    kind: str
    done: int
    total: int
    new_pairs: int
    dropped: dict[str, int]


@dataclass(frozen=True)
class PairWritten:
    """A pair is in the QA file (``pair`` is its line)."""

    pair: dict[str, Any]


QaEvent = DocumentStarted | RequestDone | PairWritten
#: runs one request of the model (the server sends it through the model's worker); the default calls it
Gate = Callable[[Callable[[], Outcome]], Outcome]


def requests_path(out_path: str | Path) -> Path:
    """The file beside a QA file that lists the requests done, so a rerun skips them (even those that made
    no pair)."""
    return Path(out_path).with_suffix(".requests.jsonl")


def collection_pairs_path(collection: str, home: str | Path | None = None) -> Path:
    """Where a collection's generated pairs are kept (the CLI's ``--collection`` and the HTTP jobs share it)."""
    from ..home import resolve_home

    return resolve_home(home) / "qa" / f"{collection}.jsonl"


Source = tuple[Document, Sequence[Section], Sequence[Chunk]]


def generate_pairs(
    paths: Sequence[str | Path],
    generator: Generator,
    out_path: str | Path,
    retries: int = 2,
    on_event: Callable[[QaEvent], None] | None = None,
    gate: Gate | None = None,
) -> GenerateSummary:
    """Write QA pairs of four kinds (`qa_writer.KINDS`) for every readable document under ``paths`` into
    ``out_path`` (status ``pending``), each appended as soon as it is made; a rerun skips the requests done.

    Raises:
        UserError: no readable document under ``paths``.
    """
    from ..app import chunk_document, load_paths

    report = load_paths(paths)
    unreadable = tuple(f"{s.path}: {s.reason}" for s in report.skipped)
    if not report.documents:
        raise UserError("no readable documents under " + ", ".join(map(str, paths))
                        + (f" ({unreadable[0]})" if unreadable else ""))
    # pairs of one's own files name each by its path, so that `load_own` reads it again from there
    located = (replace(doc, source=_located(doc.source, paths)) for doc in report.documents)
    sources = ((doc, *chunk_document(doc, generator.tokenizer.count)) for doc in located)
    summary = _generate(sources, generator, out_path, retries, on_event, gate)  # type: ignore[arg-type]
    summary.unreadable = unreadable
    return summary


def _located(name: str, paths: Sequence[str | Path]) -> str:
    """The absolute path of the file `load_paths` named ``name`` (a file given: its file name; a file in a
    folder given: its path from the folder's name down), found among the ``paths`` given."""
    for given in map(Path, paths):
        if given.is_file() and given.name == name:
            return str(given.absolute())
        candidate = given.absolute().parent / name
        if given.is_dir() and candidate.is_file():
            return str(candidate)
    return name


def generate_collection_pairs(
    collection: str,
    generator: Generator,
    out_path: str | Path | None = None,
    *,
    home: str | Path | None = None,
    documents: Sequence[str] | None = None,
    retries: int = 2,
    on_event: Callable[[QaEvent], None] | None = None,
    gate: Gate | None = None,
) -> GenerateSummary:
    """`generate_pairs` over the stored text of a collection's documents (``documents``: only these, by
    source or id), into ``out_path`` (default: `collection_pairs_path`).

    Raises:
        NotFound: no such collection, or no such document in it.
        UserError: the collection holds no documents.
    """
    from ..app import open_collection
    from ..errors import NotFound

    store = open_collection(collection, home=home)
    infos = store.documents()
    if documents:
        wanted = set(documents)
        infos = [d for d in infos if d.source in wanted or d.doc_id in wanted]
        missing = sorted(wanted - {d.source for d in infos} - {d.doc_id for d in infos})
        if missing:
            raise NotFound(f"collection {collection!r} has no document {missing[0]!r}", "document", missing[0])
    if not infos:
        raise UserError(f"collection {collection!r} holds no documents; index some first")
    sources = ((store.document(i.doc_id), store.sections(i.doc_id), store.chunks(i.doc_id)) for i in infos)
    return _generate(sources, generator, out_path or collection_pairs_path(collection, home), retries, on_event,
                     gate)


def _generate(sources: Iterable[Source], generator: Generator, out_path: str | Path, retries: int,
              on_event: Callable[[QaEvent], None] | None, gate: Gate | None) -> GenerateSummary:
    from .qa_writer import PairWriter, plan, similar, units_of

    out = Path(out_path)
    log = requests_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    mend_tail(out)  # a run killed mid-line
    mend_tail(log)
    existing = read_pairs(out)
    done_keys: dict[str, set[str]] = {}
    for record in _read_log(log) + existing:
        if record.get("request"):
            done_keys.setdefault(record["doc_id"], set()).add(record["request"])
    legacy = {p["doc_id"] for p in existing if "request" not in p}  # from a version that wrote whole documents
    seen_ids = {p["id"] for p in existing}
    emit = on_event or (lambda event: None)
    run = gate or (lambda call: call())
    writer = PairWriter(generator, retries=retries)
    summary = GenerateSummary()
    for doc, sections, chunks in sources:
        units = units_of(chunks)
        planned = plan(units)
        done = done_keys.get(doc.doc_id, set())
        todo = [p for p in planned if p.key not in done]
        if doc.doc_id in legacy or not todo:
            summary.skipped_documents += 1
            continue
        summary.documents += 1
        summary.resumed_requests += len(planned) - len(todo)
        mine = [p for p in existing if p["doc_id"] == doc.doc_id]
        questions = [p["question"] for p in mine]
        singles = {int(p["request"].split(":")[1]): _made(p) for p in mine
                   if p.get("kind") == "single" and str(p.get("request", "")).startswith("single:")}
        emit(DocumentStarted(doc.source, doc.doc_id, len(sections) - 1 if sections else 0,
                             dict(Counter(p.kind for p in planned)), len(planned) - len(todo)))
        for n, request in enumerate(todo, len(planned) - len(todo) + 1):
            outcome = run(partial(writer.write, request, doc, sections, units, singles))
            summary.requests += outcome.calls
            dropped = Counter(outcome.dropped)
            added = 0
            for made in outcome.pairs:
                pid = pair_id(doc.doc_id, made.question)
                if pid in seen_ids or any(similar(made.question, q) for q in questions):
                    dropped["near duplicate"] += 1
                    continue
                record = _record(made, pid, doc, request.key, generator.name)
                append_lines(out, [record])
                seen_ids.add(pid)
                questions.append(made.question)
                if made.kind == "single":
                    singles[request.units[0]] = made
                added += 1
                summary.kinds[made.kind] += 1
                emit(PairWritten(record))
            append_lines(log, [{"doc_id": doc.doc_id, "request": request.key, "pairs": added,
                                "dropped": dict(dropped)}])
            summary.new_pairs += added
            summary.skipped_pairs += sum(dropped.values())
            emit(RequestDone(doc.source, request.key, request.kind, n, len(planned), added, dict(dropped)))
    return summary


def _read_log(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    lines = []
    for line in path.read_text("utf-8").splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a damaged line: its request is asked again
    return lines


def _record(made: Made, pid: str, doc: Document, request: str, model: str) -> dict[str, Any]:
    """A pair's line in the QA file; ``start``/``end``/``evidence`` are its first span's (None, None and ""
    for an unanswerable question)."""
    spans = [{"doc_id": doc.doc_id, "source": doc.source, "start": s, "end": e, "text": doc.text[s:e]}
             for s, e in made.spans]
    first = spans[0] if spans else None
    return {
        "id": pid, "kind": made.kind, "question": made.question, "answer": made.answer, "status": "pending",
        "source": doc.source, "doc_id": doc.doc_id, "section_path": list(made.section_path),
        "start": first["start"] if first else None, "end": first["end"] if first else None,
        "evidence": first["text"] if first else "", "evidence_spans": spans, "request": request,
        "generated_by": model,
    }


def _made(record: dict[str, Any]) -> Made:
    spans = tuple((s["start"], s["end"]) for s in record.get("evidence_spans") or ())
    return Made(record.get("kind", "single"), record["question"], record["answer"], spans,
                tuple(record.get("section_path") or ()))


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


def decide_pair(path: str | Path, pid: str, status: str, question: str | None = None,
                answer: str | None = None) -> dict[str, Any]:
    """Set one pair's ``status`` (`STATUSES`), with an edited ``question`` or ``answer`` (the pair is then
    marked ``edited``), and rewrite the QA file atomically; returns the pair as stored.

    Raises:
        UserError: an unknown status, or an edit that leaves the question or the answer empty.
        NotFound: the file holds no pair with that id.
    """
    from ..errors import NotFound

    if status not in STATUSES:
        raise UserError(f"unknown status {status!r}; choose one of {', '.join(STATUSES)}")
    pairs = read_pairs(path)
    pair = next((p for p in pairs if p["id"] == pid), None)
    if pair is None:
        raise NotFound(f"no QA pair {pid!r} in {Path(path).name}; list the pairs to see their ids", "qa-pair", pid)
    for key, value in (("question", question), ("answer", answer)):
        if value is None:
            continue
        if not value.strip():
            raise UserError(f"an edited {key} cannot be empty; send the text, or leave {key!r} out to keep it")
        if value.strip() != pair[key]:
            pair[key] = value.strip()
            pair["edited"] = True
    pair["status"] = status
    write_pairs(path, pairs)
    return pair


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
        starts = [s["start"] for s in pair.get("evidence_spans") or ()] or (
            [pair["start"]] if pair["start"] is not None else [])
        golds = list(dict.fromkeys(next((p for p in paragraphs if p[0] <= at < p[1]), None) or
                                   (at, pair["end"]) for at in starts))  # an unanswerable pair has none
        title = " > ".join(pair.get("section_path") or [])
        passages = [Passage(doc.text[s:e].strip(), title=title, gold=True) for s, e in golds]
        passages += [Passage(doc.text[s:e].strip()) for s, e in paragraphs
                     if (s, e) not in golds and not _HEADING_ONLY.fullmatch(doc.text[s:e].strip())]
        answers = () if pair.get("kind") == "unanswerable" else (pair["answer"],)
        examples.append(Example(id=pair["id"], dataset="own", question=pair["question"], answers=answers,
                                passages=tuple(passages), meta={"source": source, "edited": bool(pair.get("edited")),
                                                                "kind": pair.get("kind", "single")}))
    return examples
