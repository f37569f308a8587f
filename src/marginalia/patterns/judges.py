"""Deciding whether a margin is relevant: three modes.

- ``separate``: a second, stateless request asks the model whether the note answers
  the question; it never touches the context's KV cache.
- ``fused``: the margin itself must start with YES or NO; a NO margin is cut after
  its first word, so irrelevant segments cost one or two decoded tokens.
- ``grounded``: no extra request; a margin is kept only if one sentence of the text
  read so far holds the words it adds beyond the question and also shares a word
  with the question. Small models write confident margins about facts they have not
  read, or pair the question's words with a name from elsewhere; this catches both.
  (The text read so far, not only the margin's own segment: the model attends to
  the whole cache and often quotes a fact one segment late.)
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from ..errors import UserError
from ..models.base import GenerationParams, Generator, close_stream
from ..options import JUDGE_MODES
from ..prompts import render
from ..records import Segment

_WORD = re.compile(r"\w+", re.UNICODE)
_NONE = re.compile(r"^\W*(none|no|nothing|n/a)\b\W*$", re.IGNORECASE)
STOPWORDS = frozenset(
    """a an the and or but if of to in on at by for with from as is are was were be been being
    it its this that these those there here what which who whom whose when where why how do does
    did has have had not no yes none can could would should will shall may might must than then
    so such into about over under after before during between out up down off again very just
    also only i you he she we they me him her us them my your his our their text question answer
    sentence sentences above below document note""".split()
)


_SENTENCE = re.compile(r"[^.!?\n]+(?:[.!?]+[\"'\u2019\u201d)\]]*|\n|$)")


@dataclass(frozen=True)
class Verdict:
    relevant: bool
    text: str
    score: float | None = None
    reason: str = ""
    evidence: tuple[int, int] | None = None  # char span of the supporting sentence


@dataclass(frozen=True)
class Evidence:
    start: int
    end: int
    support: float        # rarity-weighted share of the margin's new words found
    on_topic: bool        # the sentence shares a content word with the question


def stem(word: str) -> str:
    """A light suffix stripper, so 'leaves'/'leave' or 'named'/'name' match."""
    if word.isdigit() or len(word) <= 3:
        return word
    for suffix in ("ing", "es", "ed", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


def content_words(text: str) -> list[str]:
    """Lower-cased, stemmed words of ``text`` that are not stopwords."""
    return [stem(w) for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


def is_empty_margin(text: str) -> bool:
    return not text.strip() or bool(_NONE.match(text.strip()))


def find_evidence(question: str, margin: str, text: str) -> Evidence | None:
    """The sentence of ``text`` that best supports ``margin``'s words beyond the question.

    Support weighs each word by 1 / (the number of sentences of ``text`` that hold
    it): a name or number that occurs once counts far more than a common word the
    model added. Ties go to the latest sentence. Returns None when
    the margin adds no word of its own or none of them occurs in ``text``.
    """
    asked = set(content_words(question))
    new = set(content_words(margin)) - asked
    if not new:
        return None
    sentences = [(m.start() + len(m.group()) - len(m.group().lstrip()), m.end(),
                  set(content_words(m.group())))
                 for m in _SENTENCE.finditer(text) if m.group().strip()]
    df = {w: sum(w in words for _, _, words in sentences) for w in new}
    # a word the text never uses weighs like a unique one: it counts fully against
    weight = {w: 1.0 / max(df[w], 1) for w in new}
    total = sum(weight.values())
    best: Evidence | None = None
    for start, end, words in sentences:
        hits = new & words
        if not hits:
            continue
        ev = Evidence(start, end, sum(weight[w] for w in hits) / total,
                      bool(asked & words) or not asked)
        if best is None or (ev.on_topic, ev.support) >= (best.on_topic, best.support):
            best = ev
    return best


class MarginJudge(ABC):
    """Reads a margin's stream and judges it."""

    mode: ClassVar[str]
    #: the document's intro, which says what to write after each part (said once, not
    #: per margin: each margin prompt is then only the question, a third fewer tokens)
    intro_template: ClassVar[str] = "wim_intro"
    margin_template: ClassVar[str] = "margin"

    def read(self, stream: Iterator[str]) -> str:
        """Consume the margin stream (stopped early once `finished`) and return its text."""
        text = ""
        try:
            for delta in stream:
                text += delta
                if self.finished(text):
                    break
        finally:
            close_stream(stream)  # rolls the backend's cache back at once
        return text.strip()

    def finished(self, text: str) -> bool:
        """Whether a margin written so far needs no more tokens to be judged."""
        return False

    @abstractmethod
    def judge(self, question: str, margin: str, segment: Segment, read: str) -> Verdict:
        """Decide whether ``margin`` (written after ``segment``) is relevant.

        ``read`` is the context read so far (it ends with ``segment``'s text).
        """

    @staticmethod
    def locate(question: str, margin: str, read: str) -> tuple[int, int] | None:
        """Where ``read`` states what the margin says, for citing it (None: not found)."""
        ev = find_evidence(question, margin, read)
        return (ev.start, ev.end) if ev and ev.on_topic and ev.support >= 0.5 else None


class GroundedJudge(MarginJudge):
    """Keep a margin whose new words are found in its own segment (see module doc)."""

    mode = "grounded"

    def __init__(self, threshold: float = 0.5) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise UserError(f"the grounding threshold must be between 0 and 1, got {threshold}")
        self.threshold = threshold

    def judge(self, question: str, margin: str, segment: Segment, read: str) -> Verdict:
        if is_empty_margin(margin):
            return Verdict(False, margin, 0.0, "the margin says nothing was found")
        asked = set(content_words(question))
        if asked and not asked.intersection(content_words(margin)):
            return Verdict(False, margin, 0.0, "the margin shares no word with the question")
        if not set(content_words(margin)) - asked:
            return Verdict(False, margin, 0.0, "the margin adds nothing to the question")
        ev = find_evidence(question, margin, read)
        if ev is None:
            return Verdict(False, margin, 0.0, "none of the words it adds is in the text read")
        if not ev.on_topic:
            return Verdict(False, margin, 0.0,
                           "what it adds is in the text, but not beside the question's words")
        if ev.support < self.threshold:
            return Verdict(False, margin, ev.support,
                           f"only {ev.support:.0%} of its new words are in one sentence read")
        # numbers are where small models invent most: each one must be in the sentence
        sentence = set(content_words(read[ev.start:ev.end]))
        invented = [w for w in set(content_words(margin)) - asked if w.isdigit() and w not in sentence]
        if invented:
            return Verdict(False, margin, ev.support,
                           f"its number {invented[0]} is not in the sentence it draws on")
        return Verdict(True, margin, ev.support,
                       f"{ev.support:.0%} of its new words are in one sentence read",
                       (ev.start, ev.end))


class FusedJudge(MarginJudge):
    """The margin's first token is the verdict, chosen between YES and NO only.

    The first token is constrained to the two words (small models ignore a format
    they are merely asked for); a NO ends the margin after that one token.
    """

    mode = "fused"
    intro_template = "wim_intro_fused"
    margin_template = "margin_fused"
    choices = ("YES", "NO")

    def finished(self, text: str) -> bool:
        return text.strip().lower().startswith("no")  # a NO costs one token: stop there

    def judge(self, question: str, margin: str, segment: Segment, read: str) -> Verdict:
        m = re.match(r"\W*(yes|no)\b[\s:,.!-]*", margin, re.IGNORECASE)
        if not m:
            return Verdict(False, margin, None, "the margin did not start with YES")
        rest = margin[m.end():].strip()
        if m.group(1).lower() == "no":
            return Verdict(False, rest, 0.0, "the model said NO")
        return Verdict(not is_empty_margin(rest), rest, 1.0, "the model said YES",
                       self.locate(question, rest, read))


class SeparateJudge(MarginJudge):
    """A stateless classification request per margin (never touches the context cache)."""

    mode = "separate"

    def __init__(self, generator: Generator) -> None:
        self.generator = generator
        self.params = GenerationParams(max_new_tokens=3)

    def judge(self, question: str, margin: str, segment: Segment, read: str) -> Verdict:
        if is_empty_margin(margin):
            return Verdict(False, margin, 0.0, "the margin says nothing was found")
        reply = self.generator.generate(
            [
                {"role": "system", "content": render("system").strip()},
                {"role": "user", "content": render("classify", question=question, margin=margin)},
            ],
            self.params,
        )
        word = (_WORD.findall(reply.lower()) or [""])[0]
        relevant = word == "yes"
        return Verdict(relevant, margin, 1.0 if relevant else 0.0, f"the model said {reply.strip()!r}",
                       self.locate(question, margin, read) if relevant else None)


def make_judge(mode: str, generator: Generator, threshold: float = 0.5) -> MarginJudge:
    if mode == "grounded":
        return GroundedJudge(threshold)
    if mode == "fused":
        if not generator.supports_first_choices:  # else the verdict would be left to the prompt
            raise UserError(f"the fused judge needs the margin's first token restricted to "
                            f"{' or '.join(FusedJudge.choices)}, and {generator.name} cannot do that; "
                            "use the grounded or separate judge, or a backend that can (an in-process "
                            "model, or an openai: server in mode=completions)")
        return FusedJudge()
    if mode == "separate":
        return SeparateJudge(generator)
    raise UserError(f"unknown classification mode {mode!r}; choose one of {', '.join(JUDGE_MODES)}")
