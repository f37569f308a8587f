"""Questions of four kinds about one document, written by a model in small requests, with exact evidence.

A document's requests are planned before the first is sent, so a run can say what it will do and resume
inside a document: each request has a key that stays the same from one run to the next.

- ``single``: one request per chunk: a name or number in one of its sentences is the answer (both chosen by
  rule, so they are exact), and the model writes the question that sentence answers with it; where its question
  names the answer, the chunk's next fact is tried (up to `FACT_TRIES`).
- ``unanswerable``: a question on a chunk's subject that the document never answers (a word of it occurs
  nowhere in the document); it has no evidence and no answer.
- ``join``: two single facts from different sections made one question; both evidence spans kept.
- ``document``: a list, a count or the most frequent thing, over sentences from the whole document (the
  single facts' evidence); the sentences it uses are its evidence.

Every evidence span slices the document's text exactly: a single fact's is the sentence its answer was taken
from, and the other kinds keep the spans of the facts they are built on. A question too near one made before
is dropped too.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, ValidationError

from ..app import GenerationParams, Generator, Message, WrittenQuestion, section_at
from ..errors import MissingDependency
from ..prompts import render
from ..records import Chunk, Document, Section

KINDS = ("single", "join", "document", "unanswerable")
#: what a ``document`` question asks for, by its key's suffix
FORMS = {"list": "is answered with a list of things the document names",
         "count": "is answered with a number: how many times or things the document counts",
         "most": "asks which thing the document names most often"}
#: the reply budget of each field, in tokens
FIELD_TOKENS = {"question": 32, "answer": 24, "sentences": 12}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
#: a name: capitalised words in a row ("Orla Maye", "Kettleby Harbour Trust")
_NAME = re.compile(r"\b[A-Z][a-z'\u2019-]+(?:\s+(?:of\s+)?[A-Z][a-z'\u2019-]+)*")
#: a number, with its currency sign ("37", "1938", "\u00a34,200", "12.5")
_NUMBER = re.compile(r"[\u00a3$\u20ac]?\d+(?:[,.]\d+)*")
#: "<restated question> is <answer>"
_RESTATED = re.compile(r"(.+?)\s+(?:is|was|are|were)\s+(.+)", re.DOTALL)
#: the facts of a chunk a single-fact request tries in turn, while the model's question gives its answer away
FACT_TRIES = 3
#: token-set similarity (0-100) from which two questions count as one
NEAR_DUPLICATE = 90
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_HEADING_ONLY = re.compile(r"\s*#{1,6}[ \t][^\n]*\s*")
#: words too common to show that a question asks about something the document lacks
_COMMON = frozenset(
    "what which who whom whose when where why how does did do is are was were will would could should the "
    "this that these those there their they them with from about into over under after before many much "
    "most have has had been being year years first last next other than then also text document name named "
    "called type kind sort part main mentioned described given sentence article passage".split())


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

    question: WrittenQuestion
    answer: str = ""
    sentences: list[int] = []


def units_of(chunks: Sequence[Chunk]) -> list[Chunk]:
    """The chunks worth a question: those with text beyond a heading."""
    return [c for c in chunks if c.text.strip() and not _HEADING_ONLY.fullmatch(c.text)]


def plan(units: Sequence[Chunk]) -> list[Planned]:
    """The requests for a document's units, in the order they are sent: the single facts first (the other
    kinds but unanswerable build on them), then unanswerable, join and document questions."""
    n = len(units)
    out = [Planned(f"single:{i}", "single", (i,)) for i in range(n)]
    out += [Planned(f"unanswerable:{i}", "unanswerable", (i,)) for i in _spread(n, max(1, n // 6) if n else 0)]
    # "different sections" at the shallowest depth where the units' sections differ (a document under one title
    # has its parts one level down)
    depth = next((d for d in range(1, 7) if len({u.section_path[:d] for u in units}) > 1), 1)
    top = [u.section_path[:depth] for u in units]
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
        raise MissingDependency("rapidfuzz (to drop near-duplicate questions)",
                                "pip install 'marginalia[bench]'") from exc
    return fuzz.token_set_ratio(a, b, processor=utils.default_process) >= NEAR_DUPLICATE


class PairWriter:
    """Writes one planned request's pairs with ``generator`` (greedy; a malformed reply is asked again with
    another seed, ``retries`` times).

    Args:
        generator: any Generator.
        retries: further tries after a malformed reply.
    """

    def __init__(self, generator: Generator, retries: int = 2) -> None:
        self.generator = generator
        self.retries = retries

    def write(self, request: Planned, doc: Document, sections: Sequence[Section], units: Sequence[Chunk],
              singles: dict[int, Made]) -> Outcome:
        """The pairs of ``request``; ``singles`` are the document's single facts by unit, made so far
        (joins and document questions are built from them)."""
        out = Outcome()
        if request.kind == "single":
            unit = units[request.units[0]]
            candidates = pick_facts(doc.text, unit.start, unit.end, limit=FACT_TRIES)
            if not candidates:
                out.dropped["no name or number to ask about"] += 1
            tried = Outcome()
            for sentence, answer in candidates:  # the next fact where a question gives its answer away
                told = " ".join(doc.text[slice(*sentence)].split())
                reply = self._ask(tried, "qa_single", ("question",), sentence=told, answer=doc.text[slice(*answer)])
                if reply is not None:
                    self._single(tried, reply, doc, sections, sentence, answer)
                if tried.pairs:
                    break
            out.calls += tried.calls
            out.pairs += tried.pairs
            if not tried.pairs:
                out.dropped.update(tried.dropped)
        elif request.kind == "unanswerable":
            unit = units[request.units[0]]
            reply = self._ask(out, "qa_unanswerable", ("question",), text=unit.text.strip())
            if reply is not None:
                self._unanswerable(out, reply, doc, unit)
        elif request.kind == "join":
            facts = [singles.get(i) for i in request.units]
            if None in facts:
                out.dropped["a fact it joins was not made"] += 1
                return out
            first, second = (f for f in facts if f is not None)
            reply = self._ask(out, "qa_join", ("question", "answer"), first=_said(doc, first),
                              second=_said(doc, second))
            if reply is not None:
                if not reply.answer:
                    out.dropped["no answer"] += 1
                else:
                    out.pairs.append(Made("join", reply.question, reply.answer, first.spans + second.spans,
                                          first.section_path))
        elif request.kind == "document":
            drawn = [singles[i] for i in request.units if i in singles]
            if len(drawn) < 2:
                out.dropped["fewer than two drawn to draw on"] += 1
                return out
            drawn = drawn[:self._room(drawn, doc)]
            numbered = "\n".join(f"{k}. {_said(doc, f)}" for k, f in enumerate(drawn, 1))
            form = request.key.split(":", 1)[1]
            reply = self._ask(out, "qa_document", ("question", "answer", "sentences"), sentences=numbered,
                              form=FORMS[form])
            if reply is not None:
                used = sorted({n for n in reply.sentences if 1 <= n <= len(drawn)})
                if not reply.answer:
                    out.dropped["no answer"] += 1
                elif len(used) < 2:
                    out.dropped["fewer than two sentences named"] += 1
                else:
                    spans = tuple(span for n in used for span in drawn[n - 1].spans)
                    out.pairs.append(Made("document", reply.question, reply.answer, spans))
        else:  # pragma: no cover - plan() makes only the kinds above
            raise ValueError(f"unknown kind {request.kind!r}")
        return out

    def _room(self, facts: Sequence[Made], doc: Document) -> int:
        """How many facts fit the window beside the prompt and the reply."""
        budget = self.generator.context_window - sum(FIELD_TOKENS.values()) - 200
        used = 0
        for k, fact in enumerate(facts):
            used += self.generator.tokenizer.count(_said(doc, fact)) + 3
            if used > budget:
                return k
        return len(facts)

    def _single(self, out: Outcome, reply: _Reply, doc: Document, sections: Sequence[Section],
                sentence: tuple[int, int], answer: tuple[int, int]) -> None:
        said = doc.text[slice(*answer)]
        if said.lower() in reply.question.lower():
            out.dropped["the question gives its answer away"] += 1
            return
        section = section_at(sections, sentence[0])
        out.pairs.append(Made("single", reply.question, said, (sentence,), section.path if section else ()))

    def _unanswerable(self, out: Outcome, reply: _Reply, doc: Document, unit: Chunk) -> None:
        known = {w.lower() for w in _WORD.findall(doc.text)}
        novel = [w for w in _WORD.findall(reply.question)
                 if len(w) > 3 and w.lower() not in known and w.lower() not in _COMMON]
        if not novel:
            out.dropped["the document may answer it"] += 1
            return
        out.pairs.append(Made("unanswerable", reply.question, "", (), unit.section_path))

    def _messages(self, template: str, values: dict[str, str]) -> list[Message]:
        return [{"role": "system", "content": render("qa_kinds_system").strip()},
                {"role": "user", "content": render(template, **values).strip()}]

    def _ask(self, out: Outcome, template: str, fields: Sequence[str], **values: str) -> _Reply | None:
        """The model's reply to one request, field by field; None (counted) when every try was malformed.

        The reply is written for the model up to each field's label ("Question:", "Answer:") and each value ends
        at its line's end, so even a small model answers in the shape asked and never runs on.
        """
        gen = self.generator
        prompt = gen.encode_chat(self._messages(template, values))
        for attempt in range(self.retries + 1):
            reply, got = "", {}
            for name in fields:
                reply += ("\n" if reply else "") + f"{name.capitalize()}:"
                ids = prompt + gen.tokenizer.encode(reply)
                budget = FIELD_TOKENS[name]
                gen.check_fits(len(ids) + budget, what="the question-writing prompt")
                out.calls += 1
                params = GenerationParams(max_new_tokens=budget, temperature=0.0 if attempt == 0 else 0.7,
                                          seed=attempt, stop=("\n",))
                value = "".join(gen.stream_prompt(ids, params))
                got[name] = value.strip()
                reply += value
            if "answer" in got:
                got["answer"] = short_answer(got["answer"], got["question"])
            if "sentences" in got:
                got["sentences"] = [int(n) for n in re.findall(r"\d+", got["sentences"])]  # type: ignore[assignment]
            try:
                return _Reply.model_validate(got)
            except ValidationError:
                continue
        out.dropped["malformed reply"] += 1
        return None


def sentences(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Sentence spans (absolute offsets, no surrounding spaces) in ``text[start:end]``."""
    spans, at = [], start
    for match in [*_SENTENCE_END.finditer(text, start, end), None]:
        stop = match.start() if match is not None else end
        piece = text[at:stop]
        if piece.strip() and not _HEADING_ONLY.fullmatch(piece):
            lead = len(piece) - len(piece.lstrip())
            spans.append((at + lead, at + len(piece.rstrip())))
        if match is not None:
            at = match.end()
    return spans


def pick_facts(text: str, start: int, end: int, limit: int = 3) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Up to ``limit`` sentences of ``text[start:end]``, each with a fact in it to ask about, best first: a name of
    two or more words, then a number, then a name of one word not opening its sentence; a fact the whole text
    names more than twice (its subject, which questions name too) comes after the others. One fact per sentence
    and per wording; every span slices ``text`` exactly."""
    found: list[tuple[int, int, tuple[int, int], tuple[int, int]]] = []
    for s, e in sentences(text, start, end):
        for match in _NAME.finditer(text, s, e):
            a, b = _name_span(text, match, s)
            words = text[a:b].split()
            if len(words) >= 2:
                found.append((0, s, (s, e), (a, b)))
            elif words and a > s:
                found.append((2, s, (s, e), (a, b)))
        for match in _NUMBER.finditer(text, s, e):
            found.append((1, s, (s, e), match.span()))
    counts: dict[str, int] = {}

    def repeated(span: tuple[int, int]) -> bool:
        said = text[slice(*span)]
        if said not in counts:
            counts[said] = text.count(said)
        return counts[said] > 2

    ordered = sorted(found, key=lambda f: (repeated(f[3]), f[0], f[1], f[3][0]))
    out: list[tuple[tuple[int, int], tuple[int, int]]] = []
    for _, _, sentence, answer in ordered:
        if all(sentence != o[0] and text[slice(*answer)] != text[slice(*o[1])] for o in out):
            out.append((sentence, answer))
        if len(out) == limit:
            break
    return out


def _name_span(text: str, match: re.Match[str], sentence_start: int) -> tuple[int, int]:
    """A name's span without a possessive ending, and without the word that opens its sentence where the text
    also writes that word in lower case ("Although Rifenburg ..." names Rifenburg)."""
    a, b = match.span()
    if text.endswith(("'s", "\u2019s"), a, b):
        b -= 2
    if a == sentence_start:
        first = text[a:b].split()[0]
        if re.search(rf"\b{re.escape(first.lower())}\b", text):
            rest = text[a + len(first):b]
            a = b - len(rest.lstrip())
    return a, b


def short_answer(answer: str, question: str) -> str:
    """The answer without a restatement of the question before it ("The dredger hired was the Orla Maye." ->
    "the Orla Maye"), and without its closing stop."""
    answer = answer.strip()
    match = _RESTATED.match(answer)
    if match is not None:
        said = {w.lower() for w in _WORD.findall(match.group(1))}
        asked = {w.lower() for w in _WORD.findall(question)}
        if said and len(said & asked) / len(said) >= 0.6:
            answer = match.group(2)
    return answer.rstrip(" .;")


def _said(doc: Document, fact: Made) -> str:
    """A fact as the model sees it: its evidence, whitespace folded."""
    return " ".join(" ".join(doc.text[s:e].split()) for s, e in fact.spans)
