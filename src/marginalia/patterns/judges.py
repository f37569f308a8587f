"""Deciding whether a margin is relevant: two modes.

- ``separate``: a second, stateless request asks the model whether the note answers
  the question; it never touches the context's KV cache (the WiM paper's method).
- ``grounded``: no extra request; a margin is kept only if the text read so far
  supports it (it is a verbatim span of the text, or one sentence holds the words it
  adds beyond the question, numbers included; for a margin made only of the question's
  words, the pairs of them it puts side by side) and that sentence, with the one before
  it, holds the question's rarer words (`grounding.Reading.topic`; a name the question gives,
  or a word the document uses further on, that was not read yet counts against; a multi-hop
  margin may take the question's words it repeats from another passage that names the subject
  of the fact's passage, `grounding.Reading.linked_topic`; for a question of several clauses, half
  of one clause's rarer words will do, `grounding.question_clauses`), and the
  margin does not speak of what the text has not come to yet (`grounding.Reading.cover`: "The
  University of Chicago is a public university" drawn on a sentence about public universities
  in Michigan, before Chicago is read). Small models write confident margins about facts they
  have not read, or copy a sentence that merely shares a common word with the question; this
  catches both, while a bare correct answer copied from the text ("1997") is kept. (The text
  read so far, not only the margin's own segment: the model attends to the whole cache and
  often quotes a fact one segment late.)
"""

from __future__ import annotations

import functools
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar

from ..errors import UserError
from ..models.base import GenerationParams, Generator, close_stream
from ..options import JUDGE_MODES, TOPIC_THRESHOLD
from ..prompts import render
from ..records import Segment
from .grounding import (
    Evidence,
    Reading,
    content_words,
    document_units,
    find_evidence,
    is_empty_margin,
    is_number,
    items_found,
    list_items,
    margin_sentences,
    new_pairs,
    question_clauses,
    question_names,
    units,
)

__all__ = ["Evidence", "GroundedJudge", "MarginJudge", "SeparateJudge", "Verdict", "content_words", "find_evidence",
           "is_empty_margin", "make_judge"]

_WORD = re.compile(r"\w+", re.UNICODE)
#: a word the text holds in at most this many sentences is rare: a margin may not bring one in from elsewhere
RARE_SENTENCES = 2
#: a unit in at most this many sentences may link two passages (`grounding.Reading.linked_topic`)
LINK_SENTENCES = 5
#: the least share of one clause's units (by rarity) that a sentence must hold, for a question of several clauses
#: (`grounding.question_clauses`), when it holds too little of the whole question
CLAUSE_SHARE = 0.5
#: the least share of a margin's units (by rarity, the question's it repeats included) that the text read holds
#: (`grounding.Reading.cover`), unless the margin was copied
COVER = 0.7
#: the least share of a list margin's items (`grounding.list_items`) found verbatim in the part just read
LIST_SHARE = 0.75


@dataclass(frozen=True)
class Verdict:
    relevant: bool
    text: str
    score: float | None = None
    reason: str = ""
    evidence: tuple[int, int] | None = None  # char span of the supporting sentence


class MarginJudge(ABC):
    """Reads a margin's stream and judges it."""

    mode: ClassVar[str]

    @staticmethod
    def read(stream: Iterator[str]) -> str:
        """Consume the margin stream and return its text."""
        try:
            text = "".join(stream)
        finally:
            close_stream(stream)  # rolls the backend's cache back at once
        return text.strip()

    @abstractmethod
    def judge(self, question: str, margin: str, segment: Segment, read: str,
              document: str | None = None) -> Verdict:
        """Decide whether ``margin`` (written after ``segment``) is relevant.

        ``read`` is the context read so far (it ends with ``segment``'s text); ``document`` the whole
        context, read or not (None: only ``read`` is known), for the words still to come.
        """

    @staticmethod
    def locate(question: str, margin: str, read: str) -> tuple[int, int] | None:
        """Where ``read`` states what the margin says, for citing it (None: not found)."""
        ev = find_evidence(question, margin, read)
        return (ev.start, ev.end) if ev and ev.topic > 0 and ev.support >= 0.5 else None


class GroundedJudge(MarginJudge):
    """Keep a margin the text read supports, beside the question's words (see module doc).

    Args:
        threshold: the least support (share of the margin's new words, by rarity, in one sentence).
        topic_threshold: the least topicality of that sentence (share of the question's words, by rarity).
        link_sentences: a unit in at most this many sentences may link a multi-hop margin's passage to the
            question's (`grounding.Reading.linked_topic`; 0: no links).
        clause_share: the least share of one clause's units for a question of several clauses (None: the
            whole question only).
    """

    mode = "grounded"

    def __init__(self, threshold: float = 0.5, topic_threshold: float = TOPIC_THRESHOLD, *,
                 link_sentences: int = LINK_SENTENCES, clause_share: float | None = CLAUSE_SHARE) -> None:
        for name, value in (("grounding", threshold), ("topicality", topic_threshold)):
            if not 0.0 <= value <= 1.0:
                raise UserError(f"the {name} threshold must be between 0 and 1, got {value}")
        self.threshold = threshold
        self.topic_threshold = topic_threshold
        self.cover_threshold = COVER
        self.link_sentences = link_sentences
        self.clause_share = clause_share

    def ground(self, question: str, margin: str, read: str, segment: Segment | None = None,
               document: str | None = None) -> tuple[Verdict, Evidence | None]:
        """The grounding verdict, and the evidence it rests on (None when the text does not support the margin:
        nothing of it was read, too little in one sentence, or a number of its own).

        A margin of several sentences that is not kept whole is judged sentence by sentence, and kept as the
        sentences that pass on their own: small models open a copied sentence with one of their own ("The
        answer is: 1. The harbour master ... logged exactly 4438131 crates ..."), which alone would sink it.
        """
        make_reading = functools.cache(lambda: Reading.of(read))  # only when needed; grown from the last one
        ahead = document_units(document) if document else frozenset()
        verdict, ev = self._ground(question, margin, read, segment, make_reading, ahead)
        if verdict.relevant or is_empty_margin(margin) or list_items(margin):
            return verdict, ev
        sentences = margin_sentences(margin)
        if len(sentences) < 2:
            return verdict, ev
        passed = [(v, e) for v, e in (self._ground(question, s, read, segment, make_reading, ahead)
                                        for s in sentences)
                  if v.relevant]
        if not passed:
            return verdict, ev
        best, best_ev = max(passed, key=lambda p: p[0].score or 0.0)
        kept = " ".join(v.text for v, _ in passed)
        return Verdict(True, kept, best.score, f"{best.reason}; {len(passed)} of its {len(sentences)} sentences "
                       f"kept (whole: {verdict.reason})", best.evidence), best_ev

    def _ground(self, question: str, margin: str, read: str, segment: Segment | None,
                make_reading: Callable[[], Reading], ahead: frozenset[str]) -> tuple[Verdict, Evidence | None]:
        """`ground` for the margin as a whole (``make_reading``: ``read`` as a `Reading`, made once; ``ahead``:
        the whole document's units).

        A margin written as a list of short items (words, names, figures: a partial aggregate, such as the
        words frequent in the part just read) is judged as a list: kept when at least `LIST_SHARE` of its
        items occur verbatim in ``segment`` (the part just read), cited as that part. The question's words
        are not asked of it: a list's items rarely repeat them.
        """
        if is_empty_margin(margin):
            return Verdict(False, margin, 0.0, "the margin says nothing was found"), None
        asked, said = set(units(question)), set(units(margin))
        if not said - asked and not new_pairs(question, margin):
            return Verdict(False, margin, 0.0, "the margin adds nothing to the question"), None
        items = list_items(margin) if segment is not None else []
        if items and segment is not None:
            part = read[segment.start:segment.end]
            share = len(items_found(items, part)) / len(items)
            listed = f"a list of {len(items)} items, {share:.0%} of them in the part just read"
            if share >= LIST_SHARE:
                whole = Evidence(segment.start, segment.end, share, 1.0, copied=share == 1.0)
                return Verdict(True, margin, share, listed, (segment.start, segment.end)), whole
            return Verdict(False, margin, share, listed), None
        reading = make_reading()
        ev = find_evidence(question, margin, reading, self.threshold, ahead)
        if ev is None:
            return Verdict(False, margin, 0.0, "none of the words it adds is in the text read"), None
        if ev.support < self.threshold:
            return Verdict(False, margin, ev.support,
                           f"only {ev.support:.0%} of its new words are in one sentence read"), None
        i = reading.sentence_at(ev.start)
        if not ev.copied:  # numbers are where small models invent most: each one must be in the sentence
            sentence = set(units(read[ev.start:ev.end]))
            new = said - asked
            invented = sorted(u for u in new if is_number(u) and u not in sentence)
            if invented:
                return Verdict(False, margin, ev.support,
                               f"its number {invented[0]} is not in the sentence it draws on"), None
            # and a rare word read elsewhere, not near that sentence, pairs the fact with another one
            near = reading.near(i)
            foreign = sorted(u for u in new - near if 0 < reading.df(u) <= RARE_SENTENCES)
            if foreign:
                return Verdict(False, margin, ev.support,
                               f"its {foreign[0]!r} comes from another part of the text"), None
        how = "copied from the text" if ev.copied else f"{ev.support:.0%} of its new words in one sentence"
        named = question_names(question)
        topic, beside = ev.topic, f"beside {ev.topic:.0%} of the question's words"
        if topic < self.topic_threshold and not ev.copied:  # a multi-hop margin: the passage it links to
            linked, link = reading.linked_topic(said, i, asked, named, ahead, self.link_sentences)
            if linked >= self.topic_threshold:
                topic, beside = linked, f"beside {linked:.0%} of the question's words with the passage on " \
                    f"{link!r} it links to"
        if topic < self.topic_threshold and not ev.copied and self.clause_share is not None:
            for clause, seq in question_clauses(question):  # one clause of a composite question
                share = reading.topic(seq, i, named, ahead)
                scaled = share * self.topic_threshold / self.clause_share  # on the topicality's scale
                if share >= self.clause_share and scaled > topic:
                    topic = scaled
                    beside = f"beside {share:.0%} of the words of the question's clause {clause!r}"
        if topic < self.topic_threshold:
            return Verdict(False, margin, ev.support * ev.topic,
                           f"{how}, but the sentence holds only {ev.topic:.0%} of the question's words"), ev
        if not ev.copied:  # and it may not speak of the question's subject before the text does
            cover = reading.cover(said, i, asked, named, ahead)
            if cover < self.cover_threshold:  # name a unit that counted against it, if one did
                unread = sorted(u for u in said & asked if not reading.df(u) and (u in named or u in ahead))
                why = f"it speaks of {unread[0]!r}, which the text has not come to yet" if unread else \
                    f"the text read holds only {cover:.0%} of what it says"
                return Verdict(False, margin, ev.support * cover, f"{how}, but {why}"), None
        return Verdict(True, margin, ev.support * topic, f"{how}, {beside}", (ev.start, ev.end)), ev

    def judge(self, question: str, margin: str, segment: Segment, read: str,
              document: str | None = None) -> Verdict:
        return self.ground(question, margin, read, segment, document)[0]


class SeparateJudge(MarginJudge):
    """A stateless classification request per margin (never touches the context cache)."""

    mode = "separate"

    def __init__(self, generator: Generator) -> None:
        self.generator = generator
        self.params = GenerationParams(max_new_tokens=3)

    def judge(self, question: str, margin: str, segment: Segment, read: str,
              document: str | None = None) -> Verdict:
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


def make_judge(mode: str, generator: Generator, threshold: float = 0.5,
               topic_threshold: float = TOPIC_THRESHOLD) -> MarginJudge:
    """The margin judge of ``mode``; ``threshold`` and ``topic_threshold`` are the grounded judge's."""
    if mode == "grounded":
        return GroundedJudge(threshold, topic_threshold)
    if mode == "separate":
        return SeparateJudge(generator)
    raise UserError(f"unknown classification mode {mode!r}; choose one of {', '.join(JUDGE_MODES)}")
