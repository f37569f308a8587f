"""Tuning data for the composition client: prefixes of real texts, the memory the composer would hold for
each, and the larger model's continuation as the label, one JSON line per example.

Each text is cut at word ends into a prefix (the text typed so far) and what follows it. The memory for a
prefix is what the memory generator returns for a first request on it (the composer's first request holds
the whole text), with the text's own document excluded. The label is the larger model's greedy
continuation of the client's prompt, built by `ClientPrompt` in the larger model's own template, so the
client is tuned on exactly the prompt it completes. The true continuation is kept beside it for comparison.

The file is appended to one fsynced line per example; running again skips the examples already there, so
a crash loses nothing written.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ...errors import UserError
from ...files import append_line, atomic_write_lines
from ...models.base import GenerationParams, Generator, close_stream
from ...options import TuneDataOptions
from ...records import Document
from ..events import MemoryItem, MemoryRequest
from ..memory import MemoryGenerator, items_from_records
from ..prompt import ClientPrompt

#: the version of the examples' JSON lines
SCHEMA = 1
_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class TuningExample:
    """One example: a prefix of a text, the memory for it, and the larger model's continuation (the label)."""

    id: str  # the document's content id and the prefix's length: the same cut of the same text, the same id
    source: str
    doc_id: str
    offset: int  # the prefix is the document's text[:offset]
    context: str
    memory: tuple[MemoryItem, ...]
    label: str
    reference: str  # the text's own next words
    label_model: str
    label_tokens: int
    seconds: float = 0.0  # memory and label, together
    label_guard: int = 0  # the label model's loop guard (`TuneDataOptions.label_guard`; 0: plain greedy)
    schema: int = field(default=SCHEMA)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuningExample:
        """An example from its JSON line.

        Raises:
            UserError: another schema version, or a line that is not an example.
        """
        if data.get("schema") != SCHEMA:
            raise UserError(f"a tuning example of schema {data.get('schema')!r}; this marginalia reads schema "
                            f"{SCHEMA}: make the data again")
        try:
            # the client is never shown a takeaway that says its passage holds nothing, so it is not tuned
            # with one either (examples made before memory dropped them may hold some)
            return cls(**{**data, "memory": items_from_records(data["memory"])})
        except (KeyError, TypeError) as exc:
            raise UserError(f"not a tuning example: {exc}") from exc


@dataclass(frozen=True)
class Cut:
    """A prefix of a text (``text[:offset]``) and the words that follow it."""

    offset: int
    context: str
    reference: str


def cut_text(text: str, cuts: int, min_words: int, max_words: int, reference_words: int) -> list[Cut]:
    """Up to ``cuts`` cuts of ``text``, each at a word's end, spread evenly over the whole text: each after at
    least ``min_words`` words and followed by at least ``reference_words``, never inside a heading line (a
    writer's next words there are the heading's, not the text's).

    A cut's context is the text before it, at most its last ``max_words`` words (from a word's start); when
    that leaves out the text's title (its first line, when a heading), the title comes first. That is what
    a writer deep in a long text has in view, at a length the larger model labels cheaply; cuts from all
    over the text make examples of every part of it, not only of its opening.
    """
    words = list(_WORD.finditer(text))
    ends = []
    for i, m in enumerate(words):
        n = i + 1
        if n < min_words or len(words) - n < reference_words:
            continue
        line_start = text.rfind("\n", 0, m.start()) + 1
        if text[line_start:m.start()].lstrip().startswith("#") or m.group().startswith("#"):
            continue
        ends.append(i)
    if not ends:
        return []
    if cuts >= len(ends):
        picks = ends
    else:
        step = (len(ends) - 1) / max(cuts - 1, 1)
        picks = sorted({ends[round(k * step)] for k in range(cuts)})
    first_line = text.split("\n", 1)[0]
    title = first_line.strip() if first_line.lstrip().startswith("#") else ""
    out = []
    for i in picks:
        offset = words[i].end()
        start = words[i + 1 - max_words].start() if i + 1 > max_words else 0
        if title and 0 < start < len(first_line):  # the window would open inside the title: take it whole
            start = 0
        context = text[start:offset]
        if title and start:
            context = f"{title}\n\n{context}"
        last = words[min(i + reference_words, len(words) - 1)]
        out.append(Cut(offset, context, text[offset:last.end()]))
    return out


def label_continuation(generator: Generator, prompt: ClientPrompt, context: str, memory: Sequence[MemoryItem],
                       tokens: int, guard: int = 0) -> str:
    """The larger model's greedy continuation of the client's prompt for ``context`` and ``memory``: at most
    ``tokens`` tokens, ended after a line break (kept: the client learns where a suggestion ends); ``guard``:
    no run of that many tokens written twice (numbers apart, `marginalia.models.repeats`)."""
    ids = prompt.for_text(context, memory)
    stream = generator.stream_prompt(ids, GenerationParams(max_new_tokens=tokens, no_repeat_ngram=guard))
    text = ""
    try:
        for delta in stream:
            text += delta
            if "\n" in text:
                return text[: text.index("\n") + 1]
    finally:
        close_stream(stream)
    return text


def read_examples(path: str | Path) -> list[TuningExample]:
    """The examples in a JSONL file (a last line cut short by a crash is left out).

    Raises:
        UserError: no such file, or a line that is not an example.
    """
    return _read(Path(path).expanduser())[0]


def _read(path: Path) -> tuple[list[TuningExample], bool]:
    """(examples, whether the last line was torn)."""
    try:
        lines = path.read_text("utf-8").splitlines(keepends=True)
    except FileNotFoundError:
        raise UserError(f"no tuning data at {path}; make it with 'marginalia tune data'") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read tuning data {path}: {exc}") from exc
    out, torn = [], False
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines) and not line.endswith("\n"):
                torn = True  # the write a crash interrupted
                break
            raise UserError(f"{path}, line {n} is not JSON; it is not tuning data") from None
        if not isinstance(data, dict):
            raise UserError(f"{path}, line {n} is not a tuning example")
        out.append(TuningExample.from_dict(data))
    return out, torn


def _open_output(out: Path, label_model: str, label_tokens: int, label_guard: int,
                 advice: str) -> list[TuningExample]:
    """The examples already in the output file ``out`` (a torn last line is cut off; a missing file's folder
    is made).

    Raises:
        UserError: ``out`` holds examples of another label model, label length or label guard.
    """
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        return []
    existing, torn = _read(out)
    if torn:
        atomic_write_lines(out, [e.to_dict() for e in existing])
    for example in existing[:1]:
        if (example.label_model, example.label_tokens, example.label_guard) != (label_model, label_tokens,
                                                                                label_guard):
            guard = f", no run of {example.label_guard} tokens twice" if example.label_guard else ", plain greedy"
            raise UserError(f"{out} holds examples labelled by {example.label_model} with at most "
                            f"{example.label_tokens} tokens{guard}; {advice}")
    return existing


@dataclass(frozen=True)
class DataReport:
    """What `make_examples` did."""

    path: Path
    written: int  # examples made by this run
    kept: int  # examples already in the file (a resumed run)
    documents: int  # texts with at least one cut
    too_short: tuple[str, ...]  # sources with no cut (shorter than min_words + reference_words)
    empty_labels: int  # examples (of this run) whose label is blank
    seconds: float


def make_examples(documents: Iterable[Document], label_model: Generator, path: str | Path,
                  options: TuneDataOptions | None = None, *, memory: MemoryGenerator | None = None,
                  limit: int | None = None,
                  progress: Callable[[int, int], None] | None = None) -> DataReport:
    """Make tuning examples from ``documents`` and append them to the JSONL file ``path``; examples already
    there are skipped, so an interrupted run goes on where it stopped.

    Args:
        documents: the texts to cut (markdown, as loaded).
        label_model: the larger model that writes the labels.
        path: the JSONL file (created with its folder when missing).
        options: where texts are cut and how long labels are.
        memory: the memory generator (its collection, model and settings); each document is excluded from
            its own memory. None: examples without memory.
        limit: at most this many examples in the file.
        progress: ``(done, total)`` over the cuts.

    Raises:
        UserError: no documents, none long enough to cut, a file made with another label model, label length
            or guard, or a guard the label model cannot enforce (a server).
    """
    options = options or TuneDataOptions()
    t0 = time.perf_counter()
    docs = list(documents)
    if not docs:
        raise UserError("no texts to make tuning examples from; give files or folders of documents")
    out = Path(path).expanduser()
    label_model.check_decoding(GenerationParams(no_repeat_ngram=options.label_guard))  # a server refuses it
    existing = _open_output(out, label_model.name, options.label_tokens, options.label_guard,
                            "give another file, or the same label model, --label-tokens and --label-guard to add "
                            "to it")
    done_ids = {e.id for e in existing}
    planned = [(doc, cut_text(doc.text, options.cuts, options.min_words, options.max_words,
                              options.reference_words)) for doc in docs]
    too_short = tuple(doc.source for doc, cuts in planned if not cuts)
    total = sum(len(cuts) for _, cuts in planned)
    if total == 0:
        raise UserError(f"no text is long enough to cut: each needs at least {options.min_words} words plus "
                        f"{options.reference_words} after the cut; give longer texts or lower --min-words")
    prompt = ClientPrompt(label_model, options.label_tokens)
    written = empty = seen = 0
    room = None if limit is None else max(limit - len(existing), 0)
    texts = [(doc, memory.excluding([doc.doc_id, doc.source]) if memory is not None else None, cuts)
             for doc, cuts in planned]
    # the texts in turn, a cut of each: a limit (or a run stopped early) leaves every text its share
    turns = [(doc, fetch, cuts[k]) for k in range(max(len(cuts) for _, cuts in planned))
             for doc, fetch, cuts in texts if k < len(cuts)]
    with out.open("a", encoding="utf-8") as f:
        for doc, fetch, cut in turns:
            seen += 1
            key = f"{doc.doc_id[:16]}:{cut.offset}"
            if key in done_ids or (room is not None and written >= room):
                if progress:
                    progress(seen, total)
                continue
            t1 = time.perf_counter()
            items = tuple(fetch(MemoryRequest(seen, cut.context, cut.context, 0))) if fetch else ()
            text = label_continuation(label_model, prompt, cut.context, items, options.label_tokens,
                                      options.label_guard)
            example = TuningExample(key, doc.source, doc.doc_id, cut.offset, cut.context, items, text,
                                    cut.reference, label_model.name, options.label_tokens,
                                    round(time.perf_counter() - t1, 3), options.label_guard)
            append_line(f, example.to_dict())
            done_ids.add(key)
            written += 1
            empty += not text.strip()
            if progress:
                progress(seen, total)
    return DataReport(out, written, len(existing), sum(1 for _, c in planned if c), too_short, empty,
                      round(time.perf_counter() - t0, 2))


def relabel_examples(source: str | Path, label_model: Generator, path: str | Path, label_tokens: int, *,
                     label_guard: int = 0, limit: int | None = None,
                     progress: Callable[[int, int], None] | None = None) -> DataReport:
    """Label the examples of ``source`` again, with ``label_model``, at most ``label_tokens`` tokens and the
    loop guard ``label_guard`` (see `label_continuation`), into the JSONL file ``path``: the same prefixes and
    memory (nothing is retrieved or compressed again), a new label each. Resumable like `make_examples`:
    examples already in ``path`` are skipped, and ``path`` can then be extended with `make_examples` (same
    label model, label length and guard).

    Raises:
        UserError: ``source`` is missing or not tuning data, ``path`` is ``source``, ``path`` holds examples
            of another label model, length or guard, or the label model cannot enforce the guard (a server).
    """
    t0 = time.perf_counter()
    src, out = Path(source).expanduser(), Path(path).expanduser()
    if out.exists() and out.resolve() == src.resolve():
        raise UserError(f"{out} is the file to relabel; give another output file")
    examples = read_examples(src)
    label_model.check_decoding(GenerationParams(no_repeat_ngram=label_guard))  # a server refuses it
    existing = _open_output(out, label_model.name, label_tokens, label_guard, "give another file")
    done_ids = {e.id for e in existing}
    prompt = ClientPrompt(label_model, label_tokens)
    room = None if limit is None else max(limit - len(existing), 0)
    written = empty = 0
    with out.open("a", encoding="utf-8") as f:
        for seen, example in enumerate(examples, 1):
            if example.id not in done_ids and (room is None or written < room):
                t1 = time.perf_counter()
                text = label_continuation(label_model, prompt, example.context, example.memory, label_tokens,
                                          label_guard)
                new = replace(example, label=text, label_model=label_model.name, label_tokens=label_tokens,
                              seconds=round(time.perf_counter() - t1, 3), label_guard=label_guard)
                append_line(f, new.to_dict())
                done_ids.add(example.id)
                written += 1
                empty += not text.strip()
            if progress:
                progress(seen, len(examples))
    return DataReport(out, written, len(existing), len({e.source for e in examples}), (), empty,
                      round(time.perf_counter() - t0, 2))
