"""Benchmark datasets read from local files in their official formats, each into a list of `Example`.

Nothing downloads: every loader takes a path (a ``.gz`` file is read transparently). Examples come back in
file order. A malformed file raises `DatasetFormatError` naming the file, the place (``line 12`` for JSONL,
``data[3].paragraphs[0].qas[5]`` or ``item 7`` for JSON) and the missing or wrong field.

Loaders register in `LOADERS` by dataset name; `register_loader` adds one (the reviewed ``own`` QA pairs
plug in there).
"""

from __future__ import annotations

import difflib
import gzip
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import UserError
from .items import Example, Passage

Loader = Callable[[Path], list[Example]]


class DatasetFormatError(UserError):
    """A dataset file is not in the format its loader reads; ``where`` is the place inside it."""

    def __init__(self, message: str, path: str | Path, where: str = "", field: str = "") -> None:
        self.path = str(path)
        self.where = where
        self.field = field
        super().__init__(message)


# What each file should be, for the messages (a missing file, a wrong format).
FORMATS = {
    "squad": "the SQuAD v1.1 JSON ({'data': [{'title', 'paragraphs': [{'context', 'qas': [...]}]}]})",
    "squad2": "the SQuAD v2.0 JSON ({'data': [{'title', 'paragraphs': [{'context', 'qas': [...]}]}]})",
    "hotpotqa": "the HotpotQA JSON (a list of {question, answer, supporting_facts, context=[[title, [sentences]]]})",
    "nq": "the NQ-open JSONL with gold passages (one {question, answers, ctxs=[{title, text, isgold}]} a line)",
    "multihop": "the MultiHop-RAG queries JSONL (one {query, question_type, answer, evidence_list} a line)",
    "babilong": "a BABILong JSON item ({context, query, target}) or a folder of them",
    "pool": "a JSONL of texts (one {text, title?, id?} a line)",
    "own": "a reviewed QA file from 'marginalia bench qa-generate' and 'marginalia bench qa-review'",
}


# -- reading files ---------------------------------------------------------------------------------------


def _check_file(path: str | Path, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_file():
        kind = "a folder, not a file" if p.is_dir() else "missing"
        raise UserError(f"the dataset file {p} is {kind}; it should be {what}. Check the path "
                        "(relative paths in a run config resolve against the config's folder)")
    return p


def _read_text(path: Path) -> str:
    """The whole file as text; gzip is recognised by its magic bytes, whatever the name."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise DatasetFormatError(f"{path} is a damaged gzip file ({exc}); download it again",
                                     path) from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DatasetFormatError(f"{path} is not UTF-8 text (byte {exc.start}); give the dataset file itself",
                                 path) from exc


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise DatasetFormatError(f"{path} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
                                 f"it should be {what}", path, where=f"line {exc.lineno}") from exc


def _read_records(path: Path, what: str) -> Iterator[tuple[str, Any]]:
    """(place, record) for each record of a JSONL file (blank lines skipped), or of a JSON list."""
    text = _read_text(path)
    if text.lstrip().startswith("["):
        # the upstream release of some JSONL datasets is one JSON list (MultiHop-RAG)
        records = _read_json(path, what)
        for i, record in enumerate(records):
            yield f"item {i}", record
        return
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetFormatError(f"{path}: line {n} is not JSON ({exc.msg}); each line of {what} holds one "
                                     "JSON object", path, where=f"line {n}") from exc
        yield f"line {n}", record


def _field(record: Any, key: str, path: Path, where: str, kind: type | tuple[type, ...], what: str) -> Any:
    """``record[key]``, checked to be of ``kind``; a clear error naming the place otherwise."""
    if not isinstance(record, dict):
        raise DatasetFormatError(f"{path}: {where} is a {type(record).__name__}, not an object; "
                                 f"the file should be {what}", path, where=where)
    if key not in record:
        raise DatasetFormatError(f"{path}: {where} has no {key!r} field; the file should be {what}",
                                 path, where=where, field=key)
    value = record[key]
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise DatasetFormatError(f"{path}: {where}: {key!r} is a {type(value).__name__}, not a {names}; "
                                 f"the file should be {what}", path, where=where, field=key)
    return value


def _unique(values: Iterator[str] | list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v.strip() for v in values if v.strip()))


# -- SQuAD -------------------------------------------------------------------------------------------------


def _load_squad(path: Path, dataset: str) -> list[Example]:
    what = FORMATS[dataset]
    root = _read_json(path, what)
    data = _field(root, "data", path, "the top level", list, what)
    out: list[Example] = []
    for a, article in enumerate(data):
        where_a = f"data[{a}]"
        title = str(_field(article, "title", path, where_a, str, what))
        for p, paragraph in enumerate(_field(article, "paragraphs", path, where_a, list, what)):
            where_p = f"{where_a}.paragraphs[{p}]"
            context = _field(paragraph, "context", path, where_p, str, what).strip()
            gold = Passage(text=context, title=title, gold=True)
            for q, qa in enumerate(_field(paragraph, "qas", path, where_p, list, what)):
                where_q = f"{where_p}.qas[{q}]"
                qid = _field(qa, "id", path, where_q, (str, int), what)
                question = _field(qa, "question", path, where_q, str, what)
                impossible = bool(qa.get("is_impossible", False))
                answers: tuple[str, ...] = ()
                if not impossible:
                    items = _field(qa, "answers", path, where_q, list, what)
                    for k, ans in enumerate(items):
                        _field(ans, "text", path, f"{where_q}.answers[{k}]", str, what)
                    answers = _unique([ans["text"] for ans in items])
                    if not answers:
                        raise DatasetFormatError(
                            f"{path}: {where_q} has no answer and is not marked is_impossible; "
                            f"the file should be {what}", path, where=where_q, field="answers")
                meta: dict[str, Any] = {"title": title, "article_index": a, "paragraph_index": p}
                if impossible:
                    meta["is_impossible"] = True
                    meta["plausible_answers"] = _unique(
                        [x.get("text", "") for x in qa.get("plausible_answers", []) if isinstance(x, dict)])
                out.append(Example(id=str(qid), dataset=dataset, question=question.strip(), answers=answers,
                                   passages=(gold,), meta=meta))
    return out


def load_squad(path: Path) -> list[Example]:
    """SQuAD v1.1: one example per question; the gold passage is its paragraph (titled by the article)."""
    return _load_squad(_check_file(path, FORMATS["squad"]), "squad")


def load_squad2(path: Path) -> list[Example]:
    """SQuAD v2.0: as v1.1; an ``is_impossible`` question has no answers (its paragraph stays the gold)."""
    return _load_squad(_check_file(path, FORMATS["squad2"]), "squad2")


def spread_order(examples: list[Example]) -> list[int]:
    """Indices of SQuAD examples in an order that spreads over articles and paragraphs.

    Within an article: the first question of each paragraph, then the second of each, and so on; the
    articles then take turns. A prefix of this order is the selection for a ``limit``.
    """
    articles: dict[int, dict[int, list[int]]] = {}
    for i, ex in enumerate(examples):
        a = int(ex.meta.get("article_index", 0))
        articles.setdefault(a, {}).setdefault(int(ex.meta.get("paragraph_index", 0)), []).append(i)
    per_article: list[list[int]] = []
    for paragraphs in articles.values():
        queues = list(paragraphs.values())
        order: list[int] = []
        for rank in range(max(len(q) for q in queues)):
            order.extend(q[rank] for q in queues if rank < len(q))
        per_article.append(order)
    out: list[int] = []
    for rank in range(max((len(o) for o in per_article), default=0)):
        out.extend(o[rank] for o in per_article if rank < len(o))
    return out


# -- HotpotQA --------------------------------------------------------------------------------------------


def load_hotpotqa(path: Path) -> list[Example]:
    """HotpotQA (distractor setting): the supporting-fact paragraphs are gold, the other paragraphs the
    example's own distractors, all in the file's order."""
    what = FORMATS["hotpotqa"]
    path = _check_file(path, what)
    root = _read_json(path, what)
    if not isinstance(root, list):
        raise DatasetFormatError(f"{path} holds a {type(root).__name__}, not a list; it should be {what}", path)
    out: list[Example] = []
    for i, record in enumerate(root):
        where = f"item {i}"
        question = _field(record, "question", path, where, str, what)
        answer = _field(record, "answer", path, where, str, what)
        facts = _field(record, "supporting_facts", path, where, list, what)
        context = _field(record, "context", path, where, list, what)
        gold_titles: set[str] = set()
        for k, fact in enumerate(facts):
            if not (isinstance(fact, list) and fact and isinstance(fact[0], str)):
                raise DatasetFormatError(f"{path}: {where}: supporting_facts[{k}] is not [title, sentence]; "
                                         f"the file should be {what}", path, where=where, field="supporting_facts")
            gold_titles.add(fact[0])
        passages = []
        for k, entry in enumerate(context):
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                    and isinstance(entry[1], list) and all(isinstance(s, str) for s in entry[1])):
                raise DatasetFormatError(f"{path}: {where}: context[{k}] is not [title, [sentences]]; "
                                         f"the file should be {what}", path, where=where, field="context")
            text = "".join(entry[1]).strip()  # sentences after the first carry their leading space
            passages.append(Passage(text=text, title=entry[0], gold=entry[0] in gold_titles))
        missing = gold_titles - {p.title for p in passages}
        if missing:
            raise DatasetFormatError(f"{path}: {where}: supporting fact title {sorted(missing)[0]!r} is not in "
                                     f"its context; the file should be {what}", path, where=where,
                                     field="supporting_facts")
        qid = record.get("_id", record.get("id", i))
        meta = {k: record[k] for k in ("type", "level") if k in record}
        meta["supporting_facts"] = [list(f[:2]) for f in facts]
        out.append(Example(id=str(qid), dataset="hotpotqa", question=question.strip(), answers=_unique([answer]),
                           passages=tuple(passages), meta=meta))
    return out


# -- NQ-open with gold passages ("lost in the middle") -------------------------------------------------------


def load_nq(path: Path) -> list[Example]:
    """NQ-open with gold passages: the ctx marked ``isgold`` is the gold passage, other ctxs the example's own
    distractors. Without any ``isgold`` mark, the record's ``nq_annotated_gold`` (title + long answer) is the
    gold; a record with neither is a format error."""
    what = FORMATS["nq"]
    path = _check_file(path, what)
    out: list[Example] = []
    for index, (where, record) in enumerate(_read_records(path, what)):
        question = _field(record, "question", path, where, str, what)
        answers = _field(record, "answers", path, where, list, what)
        ctxs = _field(record, "ctxs", path, where, list, what)
        passages = []
        for k, ctx in enumerate(ctxs):
            text = _field(ctx, "text", path, f"{where}: ctxs[{k}]", str, what)
            title = ctx.get("title") or ""
            passages.append(Passage(text=text.strip(), title=str(title), gold=bool(ctx.get("isgold", False))))
        if not any(p.gold for p in passages):
            annotated = record.get("nq_annotated_gold")
            if not isinstance(annotated, dict) or not isinstance(
                    annotated.get("chunked_long_answer") or annotated.get("long_answer"), str):
                raise DatasetFormatError(f"{path}: {where} has no ctx with \"isgold\": true and no "
                                         f"nq_annotated_gold; the file should be {what}", path, where=where,
                                         field="isgold")
            text = annotated.get("chunked_long_answer") or annotated["long_answer"]
            passages.insert(0, Passage(text=text.strip(), title=str(annotated.get("title", "")), gold=True))
        qid = record.get("id", index)
        out.append(Example(id=str(qid), dataset="nq", question=question.strip(),
                           answers=_unique([str(a) for a in answers]), passages=tuple(passages), meta={}))
    return out


# -- MultiHop-RAG -------------------------------------------------------------------------------------------

NULL_ANSWER = re.compile(r"^\s*insufficient information\.?\s*$", re.IGNORECASE)


def load_multihop(path: Path) -> list[Example]:
    """MultiHop-RAG queries: the evidence facts are the gold passages (titled by their article).

    A ``null_query`` (answer "Insufficient information.") has no evidence and becomes an unanswerable
    example: empty ``answers``, scored like SQuAD v2 (right only when the model abstains).
    """
    what = FORMATS["multihop"]
    path = _check_file(path, what)
    out: list[Example] = []
    for index, (where, record) in enumerate(_read_records(path, what)):
        query = _field(record, "query", path, where, str, what)
        answer = _field(record, "answer", path, where, str, what)
        evidence = _field(record, "evidence_list", path, where, list, what)
        qtype = record.get("question_type", "")
        passages = []
        for k, ev in enumerate(evidence):
            fact = _field(ev, "fact", path, f"{where}: evidence_list[{k}]", str, what)
            passages.append(Passage(text=fact.strip(), title=str(ev.get("title") or ""), gold=True))
        unanswerable = qtype == "null_query" or bool(NULL_ANSWER.match(answer))
        meta: dict[str, Any] = {"question_type": qtype,
                                "sources": [str(ev.get("source", "")) for ev in evidence]}
        if unanswerable:
            meta["original_answer"] = answer
        qid = record.get("id", index)
        out.append(Example(id=str(qid), dataset="multihop", question=query.strip(),
                           answers=() if unanswerable else _unique([answer]), passages=tuple(_dedupe(passages)),
                           meta=meta))
    return out


def _dedupe(passages: list[Passage]) -> list[Passage]:
    seen: set[str] = set()
    out = []
    for p in passages:
        if p.text not in seen:
            seen.add(p.text)
            out.append(p)
    return out


# -- BABILong -------------------------------------------------------------------------------------------------

_SIZE = re.compile(r"(\d+)\s*k", re.IGNORECASE)


def _size_key(path: Path) -> tuple[int, str]:
    m = _SIZE.search(path.stem)
    return (int(m.group(1)) if m else 1 << 30, path.name)


def load_babilong(path: Path) -> list[Example]:
    """BABILong: each item comes with its own context (``context``/``query``/``target``; the Hugging Face
    field names ``input``/``question`` work too). A file may hold one item or a list; a folder means every
    ``*.json`` in it, smallest size (from the name, e.g. ``babilong_8k.json``) first."""
    what = FORMATS["babilong"]
    p = Path(path).expanduser()
    if p.is_dir():
        files = sorted(p.glob("*.json"), key=_size_key)
        if not files:
            raise UserError(f"the folder {p} holds no *.json file; it should hold BABILong items ({what})")
    else:
        files = [_check_file(p, what)]
    out: list[Example] = []
    for file in files:
        root = _read_json(file, what)
        records = root if isinstance(root, list) else [root]
        for i, record in enumerate(records):
            where = f"item {i}" if isinstance(root, list) else "the top level"
            ckey = "input" if isinstance(record, dict) and "context" not in record and "input" in record \
                else "context"
            qkey = "question" if isinstance(record, dict) and "query" not in record and "question" in record \
                else "query"
            context = _field(record, ckey, file, where, str, what)
            query = _field(record, qkey, file, where, str, what)
            target = _field(record, "target", file, where, (str, list), what)
            answers = _unique([target] if isinstance(target, str) else [str(t) for t in target])
            qid = file.stem if len(records) == 1 else f"{file.stem}-{i}"
            m = _SIZE.search(file.stem)
            meta = {"file": file.name, "nominal_length": f"{m.group(1)}k" if m else None}
            out.append(Example(id=qid, dataset="babilong", question=query.strip(), answers=answers,
                               context=context, meta=meta))
    return out


# -- plain-text pools -------------------------------------------------------------------------------------------

_WIKITEXT = {" @-@ ": "-", " @,@ ": ",", " @.@ ": "."}


def load_pool(path: str | Path) -> list[Passage]:
    """A JSONL of texts (``text``, optional ``title``/``id``) as passages, in file order.

    Used as extra distractors and as needle-in-a-haystack filler. WikiText's `` @-@ `` style markers are
    undone; empty texts are skipped.
    """
    what = FORMATS["pool"]
    p = _check_file(path, what)
    out = []
    for where, record in _read_records(p, what):
        text = _field(record, "text", p, where, str, what)
        for marker, plain in _WIKITEXT.items():
            text = text.replace(marker, plain)
        text = text.strip()
        if text:
            out.append(Passage(text=text, title=str(record.get("title") or "")))
    if not out:
        raise DatasetFormatError(f"{p} holds no text; it should be {what}", p)
    return out


# -- the registry -------------------------------------------------------------------------------------------------

def load_own(path: Path) -> list[Example]:
    """The user's own documents: the accepted pairs of a reviewed QA file (see `bench.own`)."""
    from .own import load_own as load

    return load(path)


LOADERS: dict[str, Loader] = {
    "own": load_own,
    "squad": load_squad,
    "squad2": load_squad2,
    "hotpotqa": load_hotpotqa,
    "nq": load_nq,
    "multihop": load_multihop,
    "babilong": load_babilong,
}

#: How ``limit`` selects examples, by dataset (default: the first N in file order).
SELECTORS: dict[str, Callable[[list[Example]], list[int]]] = {"squad": spread_order, "squad2": spread_order}


def register_loader(name: str, loader: Loader, selector: Callable[[list[Example]], list[int]] | None = None) -> None:
    """Make ``name`` loadable by `load_examples` and buildable by `build_items` (e.g. the ``own`` QA pairs).

    Args:
        name: the dataset name used in task specs.
        loader: reads a path into examples (in file order).
        selector: optional order in which ``limit`` picks examples (default: file order).
    """
    LOADERS[name] = loader
    if selector is not None:
        SELECTORS[name] = selector


def _loader(dataset: str) -> Loader:
    if dataset not in LOADERS:
        known = sorted(LOADERS)
        close = difflib.get_close_matches(dataset, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
        raise UserError(f"unknown dataset {dataset!r}{hint}")
    return LOADERS[dataset]


def select(examples: list[Example], dataset: str, limit: int | None) -> list[Example]:
    """The examples a ``limit`` picks (all when None), returned in file order.

    SQuAD picks spread over articles and paragraphs (see `spread_order`), so ten questions are not ten
    about one paragraph; every other dataset takes the first ``limit``.
    """
    if limit is not None and limit <= 0:
        raise UserError(f"limit must be positive, not {limit}")
    if limit is None or limit >= len(examples):
        return list(examples)
    order = SELECTORS.get(dataset, lambda exs: list(range(len(exs))))(examples)
    return [examples[i] for i in sorted(order[:limit])]


def load_examples(dataset: str, path: str | Path, limit: int | None = None) -> list[Example]:
    """Read a dataset file into examples.

    Args:
        dataset: one of `LOADERS` (squad, squad2, hotpotqa, nq, multihop, babilong, or a registered one).
        path: the local file (``.gz`` is fine; a folder for babilong).
        limit: how many questions to keep (see `select`); None keeps all.

    Returns:
        The examples, in file order.

    Raises:
        UserError: unknown dataset or missing file; `DatasetFormatError` for a file in the wrong format.
    """
    return select(_loader(dataset)(Path(path)), dataset, limit)


__all__ = [
    "FORMATS",
    "LOADERS",
    "DatasetFormatError",
    "load_babilong",
    "load_examples",
    "load_hotpotqa",
    "load_multihop",
    "load_nq",
    "load_pool",
    "load_squad",
    "load_squad2",
    "register_loader",
    "select",
    "spread_order",
]
