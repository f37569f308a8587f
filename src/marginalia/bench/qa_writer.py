"""Questions of four kinds about one document, written by a model in small requests, with exact evidence.

A document's requests are planned before the first is sent, so a run can say what it will do and resume
inside a document: each request has a key that stays the same from one run to the next.

- ``single``: one request per chunk, for one fact; its evidence is the sentence that holds the answer.
- ``unanswerable``: a question on a chunk's subject that the document never answers (a word of it occurs
  nowhere in the document); it has no evidence and no answer.
- ``join``: two single facts from different top-level sections made one question; both evidence spans kept.
- ``document``: a list, a count or the most frequent thing, over sentences from the whole document (the
  single facts' evidence); the sentences it uses are its evidence.

Every evidence span slices the document's text exactly: a quote the model gives is kept only where it is
found verbatim, and a pair whose evidence is not found is dropped, as is a question too near one made before.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from ..errors import MissingDependency
from ..index.question_bank import locate, parse_pairs
from ..ingest.sections import section_at
from ..models.base import GenerationParams, Generator, Message
from ..prompts import render
from ..records import Chunk, Document, Section

KINDS = ("single", "join", "document", "unanswerable")
#: what a ``document`` question asks for, by its key's suffix
FORMS = {"list": "is answered with a list of things the document names",
         "count": "is answered with a number: how many times or things the document counts",
         "most": "asks which thing the document names most often"}
#: token-set similarity (0-100) from which two questions count as one
NEAR_DUPLICATE = 90
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_HEADING_ONLY = re.compile(r"\s*#{1,6}[ \t][^\n]*\s*")
#: words too common to show that a question asks about something the document lacks
_COMMON = frozenset(
    "what which who whom whose when where why how does did do is are was were will would could should the "
    "this that these those there their they them with from about into over under after before many much "
    "most have has had been being year years first last next other than then also text document".split())


@dataclass(frozen=True)
class Planned:
    """One request: ``key`` is stable across runs (``kind:detail``); ``units`` index the document's chunks."""

    key: str
    kind: str
    units: tuple[int, ...] = ()


@dataclass(frozen=True)
class Made:
    """A pair a request made: ``spans`` are its evidence, character offsets into the document's text."""

    kind: str
    question: str
    answer: str
    spans: tuple[tuple[int, int], ...]
    section_path: tuple[str, ...] = ()


@dataclass
class Outcome:
    """What one request made, and why the rest of what the model wrote was dropped (reason -> count)."""

    pairs: list[Made] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    calls: int = 0


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    question: str
    answer: str = ""
    evidence: str = ""
    sentences: list[int] = []

    @field_validator("question")
    @classmethod
    def _is_question(cls, value: str) -> str:
        if len(value) < 8 or not value.endswith("?"):
            raise ValueError("not a question")
        return value


def units_of(chunks: Sequence[Chunk]) -> list[Chunk]:
    """The chunks worth a question: those with text beyond a heading."""
    return [c for c in chunks if c.text.strip() and not _HEADING_ONLY.fullmatch(c.text)]


def plan(units: Sequence[Chunk]) -> list[Planned]:
    """The requests for a document's units, in the order they are sent: the single facts first (the other
    kinds but unanswerable build on them), then unanswerable, join and document questions."""
    n = len(units)
    out = [Planned(f"single:{i}", "single", (i,)) for i in range(n)]
    out += [Planned(f"unanswerable:{i}", "unanswerable", (i,)) for i in _spread(n, max(1, n // 6) if n else 0)]
    top = [u.section_path[:1] for u in units]
    joins: list[Planned] = []
    for i in _spread(n, max(1, n // 4) if n >= 2 else 0):
        j = next((k % n for k in range(i + n // 2, i + n // 2 + n) if top[k % n] != top[i]), None)
        if j is not None:
            a, b = sorted((i, j))
            if all(p.units != (a, b) for p in joins):
                joins.append(Planned(f"join:{a}-{b}", "join", (a, b)))
    out += joins
    forms = list(FORMS) if n >= 3 else ["list"] if n == 2 else []
    out += [Planned(f"document:{form}", "document", tuple(range(n))) for form in forms]
    return out


def _spread(n: int, k: int) -> list[int]:
    """``k`` indices of ``range(n)`` spread evenly (no repeats)."""
    k = min(k, n)
    return sorted({i * n // k for i in range(k)}) if k else []


def similar(a: str, b: str) -> bool:
    """Whether two questions are near duplicates (the same words, give or take a few, in any order)."""
    try:
        from rapidfuzz import fuzz, utils
    except ImportError as exc:
        raise MissingDependency("rapidfuzz (to drop near-duplicate questions)", "pip install 'marginalia[bench]'") from exc
    return fuzz.token_set_ratio(a, b, processor=utils.default_process) >= NEAR_DUPLICATE


def exact_span(text: str, start: int, end: int, quote: str) -> tuple[int, int] | None:
    """Where ``quote`` occurs verbatim in ``text[start:end]`` (its surrounding spaces and quotes aside)."""
    quote = quote.strip().strip("\"'").strip()
    if len(quote) < 8:
        return None
    at = text.find(quote, start, end)
    return (at, at + len(quote)) if at != -1 else None


class PairWriter:
    """Writes one planned request's pairs with ``generator`` (greedy; a malformed reply is asked again with
    another seed, ``retries`` times).

    Args:
        generator: any Generator.
        retries: further tries after a malformed reply.
        max_new_tokens: the reply budget of one request.
    """

    def __init__(self, generator: Generator, retries: int = 2, max_new_tokens: int = 120) -> None:
        self.generator = generator
        self.retries = retries
        self.max_new_tokens = max_new_tokens

    def write(self, request: Planned, doc: Document, sections: Sequence[Section], units: Sequence[Chunk],
              singles: dict[int, Made]) -> Outcome:
        """The pairs of ``request``; ``singles`` are the document's single facts by unit, made so far
        (joins and document questions are built from them)."""
        out = Outcome()
        if request.kind == "single":
            unit = units[request.units[0]]
            reply = self._ask(out, "qa_single", text=unit.text.strip())
            if reply is not None:
                self._single(out, reply, doc, sections, unit)
        elif request.kind == "unanswerable":
            unit = units[request.units[0]]
            reply = self._ask(out, "qa_unanswerable", text=unit.text.strip())
            if reply is not None:
                self._unanswerable(out, reply, doc, unit)
        elif request.kind == "join":
            facts = [singles.get(i) for i in request.units]
            if None in facts:
                out.dropped["a fact it joins was not made"] += 1
                return out
            first, second = (f for f in facts if f is not None)
            reply = self._ask(out, "qa_join", first=_said(doc, first), second=_said(doc, second))
            if reply is not None:
                if not reply.answer:
                    out.dropped["no answer"] += 1
                else:
                    out.pairs.append(Made("join", reply.question, reply.answer, first.spans + second.spans,
                                          first.section_path))
        elif request.kind == "document":
            facts = [singles[i] for i in request.units if i in singles]
            if len(facts) < 2:
                out.dropped["fewer than two facts to draw on"] += 1
                return out
            facts = facts[:self._room(facts, doc)]
            numbered = "\n".join(f"{k}. {_said(doc, f)}" for k, f in enumerate(facts, 1))
            form = request.key.split(":", 1)[1]
            reply = self._ask(out, "qa_document", sentences=numbered, form=FORMS[form])
            if reply is not None:
                used = sorted({n for n in reply.sentences if 1 <= n <= len(facts)})
                if not reply.answer:
                    out.dropped["no answer"] += 1
                elif len(used) < 2:
                    out.dropped["fewer than two sentences named"] += 1
                else:
                    spans = tuple(span for n in used for span in facts[n - 1].spans)
                    out.pairs.append(Made("document", reply.question, reply.answer, spans))
        else:  # pragma: no cover - plan() makes only the kinds above
            raise ValueError(f"unknown kind {request.kind!r}")
        return out

    def _room(self, facts: Sequence[Made], doc: Document) -> int:
        """How many facts fit the window beside the prompt and the reply."""
        budget = self.generator.context_window - self.max_new_tokens - 200
        used = 0
        for k, fact in enumerate(facts):
            used += self.generator.tokenizer.count(_said(doc, fact)) + 3
            if used > budget:
                return k
        return len(facts)

    def _single(self, out: Outcome, reply: _Reply, doc: Document, sections: Sequence[Section], unit: Chunk) -> None:
        if not reply.answer:
            out.dropped["no answer"] += 1
            return
        span = exact_span(doc.text, unit.start, unit.end, reply.evidence)
        if span is not None and not _covers(doc.text[span[0]:span[1]], reply.answer):
            span = None
        if span is None:  # the quote is not in the text: the sentence that holds the answer, if one does
            span = locate(doc.text, unit.start, unit.end, reply.question, reply.answer)
        if span is None:
            out.dropped["evidence not found verbatim"] += 1
            return
        section = section_at(sections, span[0])
        out.pairs.append(Made("single", reply.question, reply.answer, (span,), section.path if section else ()))

    def _unanswerable(self, out: Outcome, reply: _Reply, doc: Document, unit: Chunk) -> None:
        known = {w.lower() for w in _WORD.findall(doc.text)}
        novel = [w for w in _WORD.findall(reply.question)
                 if len(w) > 3 and w.lower() not in known and w.lower() not in _COMMON]
        if not novel:
            out.dropped["the document may answer it"] += 1
            return
        out.pairs.append(Made("unanswerable", reply.question, "", (), unit.section_path))

    def _messages(self, template: str, values: dict[str, str]) -> list[Message]:
        return [{"role": "system", "content": render("qa_system").strip()},
                {"role": "user", "content": render(template, **values).strip()}]

    def _ask(self, out: Outcome, template: str, **values: str) -> _Reply | None:
        """The model's reply to one request, parsed; None (counted) when every try was malformed."""
        gen = self.generator
        opening = '{"question": "'  # started for the model, so even a small one answers in the shape asked
        prompt = gen.encode_chat(self._messages(template, values)) + gen.tokenizer.encode(opening)
        budget = min(self.max_new_tokens, gen.context_window // 2)
        gen.check_fits(len(prompt) + budget, what="the question-writing prompt")
        for attempt in range(self.retries + 1):
            out.calls += 1
            params = GenerationParams(max_new_tokens=budget, temperature=0.0 if attempt == 0 else 0.7,
                                      seed=attempt, stop=("}",))
            reply = opening + "".join(gen.stream_prompt(prompt, params)) + "}"
            try:
                items: list[dict[str, Any]] = parse_pairs(reply)
                return _Reply.model_validate(items[0])
            except (ValueError, ValidationError):
                continue
        out.dropped["malformed reply"] += 1
        return None


def _said(doc: Document, fact: Made) -> str:
    """A fact as the model sees it: its evidence, whitespace folded."""
    return " ".join(" ".join(doc.text[s:e].split()) for s, e in fact.spans)


def _covers(evidence: str, answer: str) -> bool:
    """Whether most of the answer's words are in the evidence."""
    words = {w.lower() for w in _WORD.findall(answer)}
    have = {w.lower() for w in _WORD.findall(evidence)}
    return bool(words) and len(words & have) / len(words) >= 0.75
