"""The question bank: QA pairs a language model writes about each part of a document.

Two densities:

- ``sparse``: one request per top-level section (long sections in windows), asking for about one
  pair per paragraph;
- ``dense``: one request per chunk, asking for one pair (so at most one per chunk).

A model's output is untrusted: it is parsed as JSON and validated; a pair must be a question with
an answer the text supports (its words occur in the section), and it is placed on the sentence
that holds the answer so it can be cited. Malformed output is retried with another seed, then
skipped and counted — a run never stops on it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, field_validator

from ..errors import UserError
from ..ingest.chunking import paragraph_spans
from ..ingest.sections import section_at
from ..models.base import GenerationParams, Generator, Message
from ..prompts import render
from ..records import Chunk, Document, Section
from .schema import QuestionEntry

DENSITIES = ("sparse", "dense")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n\s*\n")


@dataclass
class BankReport:
    """What a generation run produced, and what it had to skip."""

    pairs: list[QuestionEntry] = field(default_factory=list)
    requests: int = 0
    retries: int = 0
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> count

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())


def _a_question(value: str) -> str:
    if len(value) < 8 or not value.endswith("?"):
        raise ValueError("not a question")
    return value


#: a question a model wrote: at least 8 characters, ending in "?" (what both question writers accept)
WrittenQuestion = Annotated[str, AfterValidator(_a_question)]


class _Pair(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    question: WrittenQuestion
    answer: str
    long_answer: str = ""

    @field_validator("answer")
    @classmethod
    def _has_answer(cls, value: str) -> str:
        if not value:
            raise ValueError("empty answer")
        return value


def parse_pairs(reply: str) -> list[dict[str, Any]]:
    """The JSON object or list of objects in a model's reply (code fences and prose around it allowed).

    Raises:
        ValueError: no JSON value found, or it is not an object or a list of objects.
    """
    decoder = json.JSONDecoder()
    loose: list[dict[str, Any]] = []
    at = 0
    for match in re.finditer(r"[\[{]", reply):
        if match.start() < at:
            continue
        try:
            value, end = decoder.raw_decode(reply, match.start())
        except json.JSONDecodeError:
            continue
        items = value if isinstance(value, list) else [value]
        if isinstance(value, list) and items and all(isinstance(item, dict) for item in items):
            return items
        if isinstance(value, dict):  # a list cut short still yields its complete objects
            loose.append(value)
            at = end
    if loose:
        return loose
    raise ValueError("no JSON object in the reply")


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _sentences(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Sentence spans (absolute offsets) in ``text[start:end]``."""
    spans: list[tuple[int, int]] = []
    at = start
    for match in _SENTENCE_END.finditer(text, start, end):
        if text[at:match.start()].strip():
            spans.append((at, match.start()))
        at = match.end()
    if text[at:end].strip():
        spans.append((at, end))
    return spans


def locate(text: str, start: int, end: int, question: str, answer: str) -> tuple[int, int] | None:
    """The sentence in ``text[start:end]`` that supports ``answer``, or None when the text does not.

    The answer must be grounded: most of its words occur in one sentence (ties broken by the
    question's words), so invented answers are refused.
    """
    answer_words = set(_words(answer))
    if not answer_words:
        return None
    question_words = set(_words(question))
    best: tuple[float, float, tuple[int, int]] | None = None
    for span in _sentences(text, start, end):
        words = set(_words(text[span[0]:span[1]]))
        covered = len(answer_words & words) / len(answer_words)
        context = len(question_words & words)
        if best is None or (covered, context) > best[:2]:
            best = (covered, context, span)
    if best is None or best[0] < 0.75:
        return None
    s, e = best[2]
    while s < e and text[s].isspace():
        s += 1
    return s, e


@dataclass(frozen=True)
class _Unit:
    start: int
    end: int
    want: int


def _top_sections(sections: Sequence[Section]) -> list[Section]:
    """The top-level sections (and the root's own text when it has any)."""
    if not sections:
        return []
    root = sections[0]
    tops = [sections[i] for i in root.children]
    if not tops:
        return [root]
    out = [root] if root.body_end > root.body_start else []
    return out + tops


def _window_unit(doc: Document, window: Sequence[Chunk], max_per_request: int) -> _Unit:
    """A run of chunks as one request, asking for about one pair per paragraph."""
    start, end = window[0].start, window[-1].end
    return _Unit(start, end, min(max_per_request, max(1, len(paragraph_spans(doc.text, start, end)))))


def plan_units(
    doc: Document,
    sections: Sequence[Section],
    chunks: Sequence[Chunk],
    density: str,
    count_tokens: Callable[[str], int],
    window_tokens: int = 1200,
    max_per_request: int = 6,
) -> list[_Unit]:
    """What to ask about: spans of the document, each with how many pairs to ask for."""
    if density == "dense":
        return [_Unit(c.start, c.end, 1) for c in chunks if c.text.strip()]
    if density != "sparse":
        raise UserError(f"unknown question density {density!r}; choose one of {', '.join(DENSITIES)}")
    units: list[_Unit] = []
    for top in _top_sections(sections):
        inside = [c for c in chunks if top.start <= c.start and c.end <= top.end]
        window: list[Chunk] = []
        size = 0
        for chunk in inside:
            n = chunk.n_tokens or count_tokens(chunk.text)
            if window and size + n > window_tokens:
                units.append(_window_unit(doc, window, max_per_request))
                window, size = [], 0
            window.append(chunk)
            size += n
        if window:
            units.append(_window_unit(doc, window, max_per_request))
    return units


class QuestionWriter:
    """Writes QA pairs about a document with a generator.

    Args:
        generator: any Generator (greedy on the first try; retries sample with another seed).
        retries: further tries after a malformed reply.
        long_answers: also ask for a longer answer (a sentence or two).
        max_new_tokens: the reply budget per pair.
    """

    def __init__(self, generator: Generator, retries: int = 2, long_answers: bool = False,
                 max_new_tokens: int = 80) -> None:
        if retries < 0:
            raise UserError(f"retries must be 0 or more, got {retries}")
        self.generator = generator
        self.retries = retries
        self.long_answers = long_answers
        self.max_new_tokens = max_new_tokens

    def _messages(self, text: str, want: int) -> list[Message]:
        shape = '{"question": "...", "answer": "..."' + (', "long_answer": "..."' if self.long_answers else "") + "}"
        return [
            {"role": "system", "content": render("qa_system").strip()},
            {"role": "user", "content": render(
                "qa_pairs", text=text.strip(), count=str(want), shape=shape,
                plural="question" if want == 1 else f"{want} questions",
                long=" " + render("qa_long").strip() if self.long_answers else "",
            ).strip()},
        ]

    def _fit(self, text: str, want: int) -> str:
        """Cut ``text`` so the request fits the window (the model sees the start of the unit)."""
        budget = self.generator.context_window - self.max_new_tokens * want - 160
        ids = self.generator.tokenizer.encode(text)
        if len(ids) <= budget:
            return text
        return self.generator.tokenizer.decode(ids[:max(budget, 64)])

    def write(
        self,
        doc: Document,
        sections: Sequence[Section],
        chunks: Sequence[Chunk],
        density: str = "sparse",
        progress: Callable[[int, int], None] | None = None,
        report: BankReport | None = None,
    ) -> BankReport:
        """Generate the pairs for one document; malformed or unsupported pairs are skipped and counted."""
        report = report or BankReport()
        units = plan_units(doc, sections, chunks, density, self.generator.tokenizer.count)
        seen = {p.question.lower() for p in report.pairs}

        def ask(unit: _Unit) -> tuple[list[QuestionEntry], BankReport]:
            tally = BankReport()
            return list(self._ask(doc, sections, unit, tally)), tally

        # units are independent: a server that takes several requests at once gets them
        # side by side; results are taken in order, so the bank is the same either way
        limit = self.generator.concurrency
        pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="questions") if limit > 1 else None
        try:
            results = pool.map(ask, units) if pool is not None else map(ask, units)
            for done, (pairs, tally) in enumerate(results, 1):
                report.requests += tally.requests
                report.retries += tally.retries
                report.skipped.update(tally.skipped)
                for pair in pairs:
                    if pair.question.lower() not in seen:
                        seen.add(pair.question.lower())
                        report.pairs.append(pair)
                if progress is not None:
                    progress(done, len(units))
        finally:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        return report

    def _ask(self, doc: Document, sections: Sequence[Section], unit: _Unit,
             report: BankReport) -> Iterable[QuestionEntry]:
        text = self._fit(doc.text[unit.start:unit.end], unit.want)
        gen = self.generator
        # The reply is started for the model, so even a small one answers in the asked shape.
        opening = '[{"question": "' if unit.want > 1 else '{"question": "'
        closing = "]" if unit.want > 1 else "}"
        prompt = gen.encode_chat(self._messages(text, unit.want)) + gen.tokenizer.encode(opening)
        budget = min(self.max_new_tokens * unit.want, gen.context_window // 2)
        gen.check_fits(len(prompt) + budget, what="the question-writing prompt")
        for attempt in range(self.retries + 1):
            report.requests += 1
            if attempt:
                report.retries += 1
            params = GenerationParams(max_new_tokens=budget, temperature=0.0 if attempt == 0 else 0.7,
                                      seed=attempt, stop=(closing,))
            reply = opening + "".join(gen.stream_prompt(prompt, params)) + closing
            try:
                raw = parse_pairs(reply)
            except ValueError:
                continue
            pairs: list[QuestionEntry] = []
            for item in raw[: unit.want]:
                try:
                    valid = _Pair.model_validate(item)
                except ValidationError:
                    report.skipped["invalid pair"] += 1
                    continue
                span = locate(doc.text, unit.start, unit.start + len(text), valid.question, valid.answer)
                if span is None:
                    report.skipped["answer not in the text"] += 1
                    continue
                section = section_at(sections, span[0])
                pairs.append(QuestionEntry(
                    question=valid.question, answer=valid.answer, long_answer=valid.long_answer,
                    doc_id=doc.doc_id, source=doc.source,
                    section_path=section.path if section else (), start=span[0], end=span[1],
                    page=doc.page_at(span[0]), section_index=section.index if section else None,
                ))
            return pairs
        report.skipped["malformed reply"] += 1
        return []


def to_chat_jsonl(pairs: Iterable[QuestionEntry], system: str | None = None, long: bool = False) -> Iterable[str]:
    """Lines of chat-format fine-tuning JSONL (``{"messages": [...]}``), one per pair."""
    system = system if system is not None else render("system").strip()
    for pair in pairs:
        answer = pair.long_answer if long and pair.long_answer else pair.answer
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": pair.question},
            {"role": "assistant", "content": answer},
        ]
        yield json.dumps({"messages": messages}, ensure_ascii=False)
