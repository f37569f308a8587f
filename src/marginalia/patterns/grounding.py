"""Whether a margin is supported by the text read: sentences, word units, evidence and topicality.

Sentences come from pysbd (rule-based: "3.5 metres", "Dr. Smith" and "U.S." do not end one; CJK full stops
do). Word units come from the ``regex`` module's Unicode classes: words in scripts that separate words by
spaces (lower-cased, lightly stemmed, stopwords dropped), and, in scripts that do not (Chinese, Japanese,
Thai, Lao, Khmer, Myanmar), overlapping pairs of grapheme clusters, so a phrase copied out of such text
shares units with it without a dictionary.

A reading judges a margin after every segment against all it has read. So that this costs the same at the end
of a long document as at its start, the sentences are found once as the text grows (`SentenceSplitter`: only
what a segment adds and the unfinished sentence before it are split), a run of text without a sentence end is
cut into pieces of at most `MAX_SENTENCE` characters, and each sentence's units go into an index, unit to
sentences (`SentenceIndex`), once; `Reading.of` reads any prefix of an indexed text through it.
"""

from __future__ import annotations

import bisect
import functools
import math
import threading
from collections.abc import Collection, Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import regex

from ..errors import MissingDependency

#: scripts written without spaces between words
_UNSPACED = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}\p{Tibetan}"
_SPACED_LETTER = rf"(?![{_UNSPACED}])\p{{L}}"
#: a run of unspaced script; or an abbreviation of single letters and dots ("m.o.", "U.S."), one unit, so its
#: letters match no lone letter elsewhere; or a word (letters, digits, marks; "3.5" and "1,200" stay one number)
#: with an English contraction's ending ("I'm", "don't", "we'll") read and dropped, so no "m" or "t" is left
_UNIT = regex.compile(
    rf"(?P<piece>[{_UNSPACED}\p{{M}}]+"
    rf"|{_SPACED_LETTER}(?:\.{_SPACED_LETTER})+(?![\p{{L}}\p{{N}}])"
    rf"|(?:(?![{_UNSPACED}])[\p{{L}}\p{{N}}\p{{M}}])+(?:[.,]\p{{N}}+)*)"
    r"(?:['’](?:s|m|t|d|ll|re|ve)(?![\p{L}\p{N}]))?"
)
_UNSPACED_RUN = regex.compile(rf"[{_UNSPACED}]")
_GRAPHEME = regex.compile(r"\X")
_WORD = regex.compile(r"[\p{L}\p{N}\p{M}]+")
_PARAGRAPH_BREAK = regex.compile(r"\n[^\S\n]*\n")
_NONE = regex.compile(r"^\W*(none|no|nothing|n/a)\b\W*$", regex.IGNORECASE)
STOPWORDS = frozenset(
    """a an the and or but if of to in on at by for with from as is are was were be been being
    it its this that these those there here what which who whom whose when where why how do does
    did has have had not no yes none can could would should will shall may might must than then
    so such into about over under after before during between out up down off again very just
    also only i you he she we they me him her us them my your his our their text question answer
    sentence sentences above below document note s according passage passages excerpt""".split()
)
PYSBD_INSTALL = "pip install pysbd"


def stem(word: str) -> str:
    """A light suffix stripper, so 'leaves'/'leave', 'named'/'name' or 'cities'/'city' match."""
    if not word.isalpha() or len(word) <= 3:
        return word
    if word.endswith(("ies", "ied")) and len(word) > 4:
        return word[:-3] + "y"
    for suffix in ("ing", "es", "ed", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


def units(text: str) -> list[str]:
    """The word units of ``text`` (see the module doc): what margins, sentences and questions are compared by."""
    out: list[str] = []
    for match in _UNIT.finditer(text.casefold()):
        piece = match.group("piece")
        if _UNSPACED_RUN.match(piece):
            graphemes = _GRAPHEME.findall(piece)
            out.extend(graphemes if len(graphemes) == 1 else
                       (a + b for a, b in zip(graphemes, graphemes[1:], strict=False)))
        elif piece not in STOPWORDS:
            out.append(stem(piece))
    return out


#: the former name, kept for callers that speak of words
content_words = units


_TOKEN = regex.compile(r"[\p{L}\p{N}][\p{L}\p{N}\p{M}'’.-]*")


def question_names(question: str) -> set[str]:
    """The units of the words a question capitalises after its first (its names: "Paul Baran", "Saxon Garden");
    none in a question written all in capitals or in a script without case."""
    return names(question, first=False)


def names(text: str, first: bool = True) -> set[str]:
    """The units of the words ``text`` capitalises (the first word too when ``first``: a sentence of a document
    often opens on its subject, "Shirley Temple Black was ..."); none in a text written all in capitals or in a
    script without case."""
    words = _TOKEN.findall(text)
    rest = words[1:]
    if len(rest) >= 3 and all(w[:1].isupper() or not w[:1].isalpha() for w in rest):  # a headline: no names
        return set()
    return {u for word in (words if first else rest) if word[:1].isupper() for u in units(word)}


#: where a question's clauses part: commas, semicolons, colons, brackets, dashes set apart by spaces
_CLAUSE_BREAK = regex.compile(r"[,;:()\[\]]|\s[-–—]\s")


def question_clauses(question: str, least: int = 3) -> list[tuple[str, list[str]]]:
    """The clauses of a question of two or more clauses that hold ``least`` units or more, each as its text and
    its units; none for a question of one clause. A long composite question ("Which company, praised by one
    paper for the glaze of its kilns, was fined by another for ...?") asks several things, each of which one
    sentence may answer while holding little of the whole question."""
    clauses = [(part.strip(" ?.!"), units(part)) for part in _CLAUSE_BREAK.split(question)]
    clauses = [(part, seq) for part, seq in clauses if len(set(seq)) >= least]
    return clauses if len(clauses) >= 2 else []


def unit_pairs(seq: Sequence[str]) -> set[tuple[str, str]]:
    """The pairs of units next to each other in ``seq`` (stopwords already gone): "Kansas Song" is a pair the
    question "... Lawrence, Kansas ... fight song ..." does not hold, though it holds both units."""
    return set(zip(seq, seq[1:], strict=False))


def new_pairs(question: str, margin: str) -> set[tuple[str, str]]:
    """The margin's `unit_pairs` that the question does not hold: what a margin made only of the question's
    words still says (an answer named with the question's words, or the question's words reordered)."""
    return unit_pairs(units(margin)) - unit_pairs(units(question))


def is_number(unit: str) -> bool:
    return unit[:1].isdigit()


def is_empty_margin(text: str) -> bool:
    return not text.strip() or bool(_NONE.match(text.strip()))


#: the longest a sentence may be, in characters: a run of text without a sentence boundary (a text without full
#: stops, a table flattened into one line) is cut into pieces at most this long, at a space where it has one, so
#: that splitting, indexing and comparing each piece costs the same however long the run
MAX_SENTENCE = 2000
_LAST_SPACE = regex.compile(r"\s", regex.REVERSE)
_NOT_SPACE = regex.compile(r"\S")

Span = tuple[int, int]


def cut_long(text: str, start: int, end: int, limit: int = MAX_SENTENCE) -> list[Span]:
    """The sentence ``text[start:end]`` (no space at either end) as pieces of at most ``limit`` characters, each
    ending at the last space that keeps it within the limit (or at the limit, in a run without a space), the
    spaces between pieces left out. Each cut depends only on the ``limit + 1`` characters from the piece's start,
    so a sentence still being read is cut where the whole one is."""
    pieces: list[Span] = []
    while end - start > limit:
        space = _LAST_SPACE.search(text, start + 1, start + limit + 1)
        if space is None:
            pieces.append((start, start + limit))
            start += limit
            continue
        cut = space.start()
        pieces.append((start, start + len(text[start:cut].rstrip())))
        found = _NOT_SPACE.search(text, cut, end)
        start = found.start() if found else end  # the sentence ends on a character that is not a space
    pieces.append((start, end))
    return pieces


class SentenceSplitter:
    """Sentence spans of a text that grows, found incrementally: WiM asks for ever longer prefixes of one document.

    pysbd splits at most ``2 * limit`` characters at a time, from the end of the last sentence known to be
    closed (followed by another): what a text adds is split once, with only its unfinished last sentence split
    again. Each sentence is cut to ``limit`` characters (`cut_long`). A sentence is remembered with the length
    of text that closed it, so a shorter prefix asked later (a second question reading from the start) takes
    the sentences closed within it and splits only its own end. A text that neither extends nor starts the one
    split so far starts it again.
    """

    def __init__(self, limit: int = MAX_SENTENCE) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._segmenter: Any = None
        self.reset()

    def reset(self) -> None:
        """Forget the text split so far (new lists: spans handed out stay as they were)."""
        self.text = ""
        self.closed: list[Span] = []
        self.closing: list[int] = []  # for each of `closed`, the length of text that closed it
        self._open: dict[int, tuple[int, list[Span]]] = {}  # for each length grown to: closed count, the rest

    def fits(self, text: str) -> bool:
        """Whether ``text`` extends the text split so far or is a prefix of it."""
        return text.startswith(self.text) or self.text.startswith(text)

    def _pysbd(self, text: str) -> list[str]:
        if self._segmenter is None:
            try:
                import pysbd
            except ImportError as exc:
                raise MissingDependency("sentence splitting for the grounded judge (pysbd)", PYSBD_INSTALL) from exc
            self._segmenter = pysbd.Segmenter(language="en", clean=False)
        # the processor's sentences, not `segment`'s: that one looks each sentence up again from the start of
        # the text, time that grows with the square of the text
        return list(self._segmenter.processor(text).process() or [])

    def _split(self, text: str, start: int, stop: int) -> list[Span]:
        """The sentences of ``text[start:stop]`` as spans of ``text``, surrounding space left out, cut to the limit."""
        piece = text[start:stop]
        spans: list[Span] = []
        at = 0
        for sentence in self._pysbd(piece):
            found = piece.find(sentence, at)
            if found < 0:  # pysbd returns the text's own pieces; should one differ, keep going from here
                continue
            at = found + len(sentence)
            stripped = sentence.strip()
            if stripped:
                first = start + found + len(sentence) - len(sentence.lstrip())
                spans += cut_long(text, first, first + len(stripped), self.limit)
        return spans

    def _run(self, text: str, start: int, end: int) -> tuple[list[Span], list[int], list[Span]]:
        """``text[start:end]`` split window by window: the sentences closed, the length that closed each, and
        the open rest (the last sentence)."""
        closed: list[Span] = []
        closing: list[int] = []
        while True:
            stop = min(end, start + 2 * self.limit)
            spans = self._split(text, start, stop)
            if stop == end:
                return closed + spans[:-1], closing + [end] * (len(spans) - 1), spans[-1:]
            done = spans[:-1] or spans[:1]  # a lone sentence, at most `limit` long: space fills the window after it
            closed += done
            closing += [stop] * len(done)
            start = done[-1][1] if done else stop

    def split(self, text: str) -> tuple[int, list[Span]]:
        """``text``'s sentences: how many of `closed` begin it, and its sentences after them."""
        with self._lock:
            if not self.fits(text):
                self.reset()
            if len(text) > len(self.text):
                start = self.closed[-1][1] if self.closed else 0
                closed, closing, rest = self._run(text, start, len(text))
                self.closed += closed
                self.closing += closing
                self.text = text
                self._open[len(text)] = (len(self.closed), rest)
            count = bisect.bisect_right(self.closing, len(text))
            known = self._open.get(len(text))
            if known is not None and known[0] == count:
                return count, list(known[1])
            start = self.closed[count - 1][1] if count else 0
            closed, _, rest = self._run(text, start, len(text))
            return count, closed + rest

    def spans(self, text: str) -> list[Span]:
        """``(start, end)`` of each sentence of ``text``, surrounding whitespace left out."""
        count, rest = self.split(text)
        return self.closed[:count] + rest


_SPLITTER = SentenceSplitter()


def sentence_spans(text: str) -> list[Span]:
    return _SPLITTER.spans(text)


_MARGIN_SPLITTER = SentenceSplitter()  # its own: a margin must not push the document out of `_SPLITTER`


def margin_sentences(margin: str) -> list[str]:
    """The sentences of a margin, its line breaks read as spaces (small models wrap lines mid-sentence)."""
    flat = " ".join(margin.split())
    return [flat[a:b] for a, b in _MARGIN_SPLITTER.spans(flat)]


@dataclass(frozen=True)
class Evidence:
    """The sentence of the text read that best supports a margin, and how well."""

    start: int
    end: int
    support: float    # rarity-weighted share of the margin's new units found in the sentence (1.0: copied)
    topic: float      # rarity-weighted share of the question's units (found in the text) near the sentence
    copied: bool = False  # the margin is a verbatim span of the text


@dataclass(frozen=True)
class _Closed:
    """What a `SentenceIndex` holds of its closed sentences, as lists that only grow (a reset makes new ones):
    a `Reading` takes the first ``count`` of each."""

    count: int
    spans: list[Span]
    seqs: list[list[str]]
    sets: list[set[str]]
    paragraphs: list[int]
    holding: dict[str, list[int]]  # unit -> the sentences holding it, in order


class SentenceIndex:
    """The sentences of a text that grows (`SentenceSplitter`), with their units, paragraphs and, for each unit,
    the sentences that hold it: each sentence indexed once, when it is closed. `Reading`s of any prefix of the
    text take what it holds; the last few are remembered by length."""

    #: readings remembered (each margin of a segment, each sentence of a margin, is judged on the same one)
    KEEP = 8

    def __init__(self, limit: int = MAX_SENTENCE) -> None:
        self._lock = threading.Lock()
        self.splitter = SentenceSplitter(limit)
        self._reset()

    def _reset(self) -> None:
        self.splitter.reset()
        self._seqs: list[list[str]] = []
        self._sets: list[set[str]] = []
        self._paragraphs: list[int] = []
        self._holding: dict[str, list[int]] = {}
        self._readings: dict[int, Reading] = {}

    @property
    def text(self) -> str:
        """The longest text indexed."""
        return self.splitter.text

    def fits(self, text: str) -> bool:
        return self.splitter.fits(text)

    def closed(self, text: str) -> tuple[_Closed, list[Span]]:
        """The closed sentences that begin ``text`` (the index grown to it first, or started again on it when it
        does not fit), and its sentences after them."""
        with self._lock:
            if not self.fits(text):
                self._reset()
            count, rest = self.splitter.split(text)
            spans, whole = self.splitter.closed, self.splitter.text
            for k in range(len(self._seqs), len(spans)):
                seq = units(whole[spans[k][0]:spans[k][1]])
                held = set(seq)
                self._seqs.append(seq)
                self._sets.append(held)
                self._paragraphs.append(_paragraph_after(whole, spans, k, self._paragraphs))
                for unit in held:
                    self._holding.setdefault(unit, []).append(k)
            return _Closed(count, spans, self._seqs, self._sets, self._paragraphs, self._holding), rest

    def reading(self, text: str) -> Reading:
        """The `Reading` of ``text``, made once for each of the last few lengths asked."""
        with self._lock:
            known = self._readings.get(len(text))
            if known is not None and known.text == text:
                return known
        reading = Reading(text, self)
        with self._lock:
            if self.fits(text):
                self._readings[len(text)] = reading
                for old in list(self._readings)[:-self.KEEP]:
                    del self._readings[old]
        return reading


def _paragraph_after(text: str, spans: Sequence[Span], k: int, numbers: Sequence[int]) -> int:
    """The paragraph number of sentence ``k``: that of the one before it, plus one across a blank line."""
    if not k:
        return 0
    return numbers[k - 1] + bool(_PARAGRAPH_BREAK.search(text, spans[k - 1][0], spans[k][0]))


#: how many texts `Reading.of` keeps indexed: a reading judges its margins against one text, a few are read in turn
KEEP_INDEXES = 4
_INDEXES: list[SentenceIndex] = []  # the most recently used first
_INDEXES_LOCK = threading.Lock()


class Reading:
    """The text read so far, split into sentences with their units, for judging margins against it.

    Made from scratch (``Reading(text)``), or through a `SentenceIndex` of a text it extends or begins
    (`Reading.of`), which splits and indexes each sentence once however many margins and questions are judged.
    """

    def __init__(self, text: str, index: SentenceIndex | None = None) -> None:
        closed, rest = (index or SentenceIndex()).closed(text)
        count = self._count = closed.count
        self.text = text
        self.spans = closed.spans[:count] + rest
        rest_seqs = [units(text[s:e]) for s, e in rest]
        self.seqs = closed.seqs[:count] + rest_seqs
        self.sets = closed.sets[:count] + [set(seq) for seq in rest_seqs]
        self._paragraphs = closed.paragraphs[:count]
        for k in range(count, len(self.spans)):
            self._paragraphs.append(_paragraph_after(text, self.spans, k, self._paragraphs))
        self._holding = closed.holding
        self._rest_holding: dict[str, list[int]] = {}
        for k in range(count, len(self.sets)):
            for unit in self.sets[k]:
                self._rest_holding.setdefault(unit, []).append(k)
        self._pairs: dict[int, set[tuple[str, str]]] = {}
        self._df: dict[str, int] = {}
        self._idf: dict[str, float] = {}

    @classmethod
    def of(cls, text: str) -> Reading:
        """The reading of ``text`` through the index of one of the last texts read (`KEEP_INDEXES`) that it
        extends or begins, grown to it (a new index when none fits)."""
        with _INDEXES_LOCK:
            index = next((i for i in _INDEXES if i.fits(text)), None)
            if index is None:
                index = SentenceIndex()
            else:
                _INDEXES.remove(index)
            _INDEXES.insert(0, index)
            del _INDEXES[KEEP_INDEXES:]
        return index.reading(text)

    def holding(self, unit: str) -> list[int]:
        """The sentences that hold ``unit``, in order."""
        closed = self._holding.get(unit, [])
        return closed[:bisect.bisect_left(closed, self._count)] + self._rest_holding.get(unit, [])

    def holding_any(self, wanted: Iterable[str]) -> list[int]:
        """The sentences that hold one or more of the units ``wanted``, in order."""
        return sorted({k for unit in wanted for k in self.holding(unit)})

    def df(self, unit: str) -> int:
        if unit not in self._df:
            closed = self._holding.get(unit)
            self._df[unit] = (bisect.bisect_left(closed, self._count) if closed else 0) + \
                len(self._rest_holding.get(unit, ()))
        return self._df[unit]

    def idf(self, unit: str) -> float:
        """Smoothed inverse sentence frequency: a unit in every sentence weighs least; one never read weighs
        like one read once (it counts fully against a margin that adds it)."""
        if unit not in self._idf:
            self._idf[unit] = math.log(1.0 + len(self.sets) / max(self.df(unit), 1))
        return self._idf[unit]

    def pairs(self, index: int) -> set[tuple[str, str]]:
        """The `unit_pairs` of sentence ``index``."""
        if index not in self._pairs:
            self._pairs[index] = unit_pairs(self.seqs[index])
        return self._pairs[index]

    def near(self, index: int) -> set[str]:
        """The units of sentence ``index`` and the one before it (which often names what "she" or "it" is), when
        no blank line parts them: across a paragraph break the sentence before may be another passage's."""
        if not index or self._paragraphs[index] != self._paragraphs[index - 1]:
            return self.sets[index]
        return self.sets[index] | self.sets[index - 1]

    def topic(self, question: Iterable[str], index: int, named: Collection[str] = (),
              ahead: Collection[str] = ()) -> float:
        """Share of the question's units that sentence ``index`` or the one before it (`near`) holds, each
        weighed by its rarity: a name counts more than a word in every sentence.

        Units the text never uses are left out (a question may paraphrase), except the question's names
        (``named``, see `question_names`) and the units of the document still to be read (``ahead``): such a
        unit, not read yet, counts fully against every sentence, as no sentence read can be about it ("What
        did Paul Baran develop?" before Baran is read: a sentence holding "developed" is not on the question;
        "What concept did philosophers use to study machines?" before "philosophers" or "machines" are read:
        a sentence on how geologists use and study rocks is not either).
        """
        return self.topic_of(self.question_weights(question, named, ahead), index)

    def question_weights(self, question: Iterable[str], named: Collection[str] = (),
                         ahead: Collection[str] = ()) -> tuple[set[str], float]:
        """The question's units that `topic` counts, and their total weight: worked out once for the many
        sentences `topic_of` weighs against one question."""
        asked = {q for q in question if self.df(q) or q in named or q in ahead}
        return asked, sum(self.idf(q) for q in asked)

    def topic_of(self, asked: tuple[set[str], float], index: int) -> float:
        """`topic` of sentence ``index``, for the question's units and weight (`question_weights`)."""
        before = self.sets[index - 1] if index and self._paragraphs[index] == self._paragraphs[index - 1] else ()
        return self._held(asked, self.sets[index], before)

    def _held(self, asked: tuple[set[str], float], held: Container[str], before: Container[str] = ()) -> float:
        """The share of the `asked` units' weight that ``held`` (or ``before``) holds."""
        counted, total = asked
        if not counted:
            return 0.0
        return sum(self.idf(q) for q in counted if q in held or q in before) / total

    def _share(self, question: Iterable[str], held: Collection[str], named: Collection[str],
               ahead: Collection[str]) -> float:
        """`topic`'s share of the question's units that ``held`` holds."""
        return self._held(self.question_weights(question, named, ahead), held)

    def paragraph(self, index: int) -> range:
        """The sentences of the paragraph that holds sentence ``index``."""
        numbers, number = self._paragraphs, self._paragraphs[index]  # numbers never fall
        return range(bisect.bisect_left(numbers, number), bisect.bisect_right(numbers, number))

    def _paragraphs_with(self, unit: str) -> int:
        return len({self._paragraphs[k] for k in self.holding(unit)})

    def linked_topic(self, said: Collection[str], index: int, question: Collection[str],
                     named: Collection[str] = (), ahead: Collection[str] = (),
                     link_sentences: int = 5) -> tuple[float, str | None]:
        """`topic` of sentence ``index`` joined to a sentence of another paragraph that holds question units
        the margin repeats and the name of the subject of sentence ``index``'s paragraph: two or more units
        its first sentence capitalises (a whole name, "Shirley Temple", not a first name alone), none the
        question's, each held by at most ``link_sentences`` sentences and by at most half the paragraphs.
        That topicality and the link's rarest unit (0.0 and None when no sentence links).

        A multi-hop margin states a fact of one passage about a subject the question names through
        another ("The woman who portrayed Corliss Archer in Kiss and Tell served as Chief of Protocol": the
        fact's passage is on Shirley Temple, and the one naming her as Corliss Archer shares her name with
        it). The fact's sentence alone holds little of the question; the pair holds it. A margin that repeats
        none of the question's units beyond its sentence gains nothing.
        """
        near = self.near(index)
        repeated = {u for u in said if u in question and self.df(u)} - near
        best, link = 0.0, ""
        if not repeated:
            return best, None
        for j, shared in self.linked(index, question, link_sentences):
            if self.sets[j] & repeated:
                share = self._share(question, near | (self.sets[j] & repeated), named, ahead)
                if share > best:
                    best, link = share, shared
        return best, link or None

    def linked(self, index: int, question: Collection[str], link_sentences: int = 5) -> list[tuple[int, str]]:
        """The sentences of other paragraphs that name the subject of sentence ``index``'s paragraph (see
        `linked_topic`), each with the rarest unit of the name it shares."""
        own = self.paragraph(index)
        subject = names(self.text[slice(*self.spans[own[0]])])  # what the paragraph's first sentence names
        paragraphs = self._paragraphs[-1] + 1
        links = {u for u in subject if u not in question and not is_number(u) and 0 < self.df(u) <= link_sentences
                 and 2 * self._paragraphs_with(u) <= paragraphs}  # not a heading that every passage opens with
        found = []
        for j in self.holding_any(links):
            shared = self.sets[j] & links
            if j not in own and len(shared) >= 2:  # a whole name, not a first name or an ordinal ("John", "Second")
                found.append((j, max(sorted(shared), key=self.idf)))
        return found

    def cover(self, said: Iterable[str], index: int, asked: Collection[str], named: Collection[str] = (),
              ahead: Collection[str] = ()) -> float:
        """Share of the units a margin says (``said``: the question's it repeats included) that the text read
        holds, each weighed by its rarity: the margin's own units in sentence ``index`` or the one before it
        (`near`), the question's anywhere (a margin may join the question's subject, read in one passage, to
        a fact read in another, as a multi-hop answer does). The question's units that the text never uses
        are left out as in `topic` (a paraphrase); a name the question gives, or a unit the document uses
        only further on, counts against: a margin that speaks of it says what was not read yet."""
        counted = {u for u in said if u not in asked or self.df(u) or u in named or u in ahead}
        total = sum(self.idf(u) for u in counted)
        if not total:
            return 1.0
        near = self.near(index)
        return sum(self.idf(u) for u in counted if u in near or (u in asked and self.df(u))) / total

    def sentence_at(self, position: int) -> int:
        """The sentence that holds ``position``, or the first after it (the last when none is)."""
        return min(bisect.bisect_right(self.spans, position, key=lambda span: span[1]), len(self.spans) - 1)

    def copies(self, margin: str) -> list[tuple[int, int]]:
        """Where ``margin`` occurs verbatim in the text (see `verbatim_spans`)."""
        return verbatim_spans(margin, self.text)



def verbatim_spans(phrase: str, text: str, limit: int = 64) -> list[tuple[int, int]]:
    """Where ``phrase`` occurs in ``text`` as whole words (case, spacing and punctuation between words aside),
    at most ``limit`` places."""
    words = _WORD.findall(phrase)
    if not words:
        return []
    pattern = r"(?<![\p{L}\p{N}])" + r"[\W_]+".join(regex.escape(w) for w in words) + r"(?![\p{L}\p{N}])"
    found = regex.finditer(pattern, text, regex.IGNORECASE | regex.V1)
    return [(m.start(), m.end()) for m, _ in zip(found, range(limit), strict=False)]


#: what separates a list's items: commas, semicolons, line breaks and bullets (a final "and" is dropped)
_ITEM_SPLIT = regex.compile(r"\s*(?:(?<!\d),|,(?!\d)|[;\n\u3001\uff0c]|^\s*[-*\u2022]|\s\d+[.)]\s)\s*",
                            regex.MULTILINE)
_LEADING = regex.compile(r"^(?:and|or|\d+[.)])\s+", regex.IGNORECASE)
#: a list item is a few words: longer pieces are clauses of a sentence, not items
LIST_ITEM_WORDS = 4
#: the fewest items that make a margin a list
LIST_MIN_ITEMS = 3


def list_items(margin: str) -> list[str]:
    """The items of a margin written as a list (``a, b and c``; one per line; bullets), each once, in order;
    [] when the margin is not such a list (fewer than `LIST_MIN_ITEMS` items, or an item of more than
    `LIST_ITEM_WORDS` words)."""
    pieces = []
    for piece in _ITEM_SPLIT.split(margin.strip().rstrip(".")):
        piece = _LEADING.sub("", piece.strip()).strip(" .:")
        if " and " in piece and len(piece.split()) > 1:  # "x and y" at the end of a list: two items
            pieces += [p.strip() for p in piece.split(" and ")]
        elif piece:
            pieces.append(piece)
    items = list(dict.fromkeys(p for p in pieces if _WORD.search(p)))
    if len(items) < LIST_MIN_ITEMS or any(len(_WORD.findall(item)) > LIST_ITEM_WORDS for item in items):
        return []
    return items


def items_found(items: list[str], text: str) -> list[str]:
    """The items that occur verbatim in ``text`` as whole words (case, spacing and punctuation aside)."""
    return [item for item in items if verbatim_spans(item, text, limit=1)]


@functools.lru_cache(maxsize=4)
def document_units(text: str) -> frozenset[str]:
    """The set of ``text``'s `units`, remembered for the last few texts (a reading judges many margins
    against one document)."""
    return frozenset(units(text))


def find_evidence(question: str, margin: str, text: str | Reading, min_support: float = 0.5,
                  ahead: Collection[str] = ()) -> Evidence | None:
    """The sentence of ``text`` that best supports ``margin``, or None when none does.

    A margin copied verbatim (a phrase, a sentence, a bare number) is supported fully where it occurs.
    Otherwise support weighs each of the margin's units beyond the question's by its rarity in the text
    (a unit never read weighs most, and counts against). Among the sentences with at least ``min_support``
    the most on-topic wins, then the best supported, then the latest; where none has that much, the best
    supported (an on-topic sentence that shares one word with the margin does not hide the one it was
    copied from). A margin made only of the question's units is supported by the sentences holding the pairs of
    units it puts side by side and the question does not (`new_pairs`). None when the margin adds nothing
    beyond the question (no unit, no pair) or none of what it adds was read. ``ahead``: the units of the whole
    document, for topicality (`Reading.topic`).
    """
    reading = text if isinstance(text, Reading) else Reading.of(text)
    if not reading.spans:
        return None
    question_units, margin_units = units(question), units(margin)
    asked = set(question_units)
    new = set(margin_units) - asked
    pairs = set() if new else unit_pairs(margin_units) - unit_pairs(question_units)  # `new_pairs`
    if not new and not pairs:
        return None
    named = question_names(question)
    counted = reading.question_weights(asked, named, ahead)  # once for every sentence `topic_of` weighs
    best: Evidence | None = None

    def rank(ev: Evidence) -> tuple[bool, float, float, int]:
        return ev.support >= min_support, ev.topic, ev.support, ev.start

    def consider(ev: Evidence) -> None:
        nonlocal best
        if best is None or rank(ev) >= rank(best):
            best = ev

    for start, end in reading.copies(margin):
        i = reading.sentence_at(start)
        j = reading.sentence_at(max(end - 1, start))
        consider(Evidence(reading.spans[i][0], reading.spans[j][1], 1.0, reading.topic_of(counted, j), True))
    if best is not None:
        return best
    if pairs:  # the margin's units are all the question's: what it adds is their order, pair by pair
        both = {i for a, b in pairs for i in set(reading.holding(a)).intersection(reading.holding(b))}
        for i in sorted(both):
            shared = pairs & reading.pairs(i)
            if shared:
                start, end = reading.spans[i]
                consider(Evidence(start, end, len(shared) / len(pairs), reading.topic_of(counted, i)))
        return best
    weight = {u: reading.idf(u) for u in new}
    total = sum(weight.values())
    for i in reading.holding_any(new):  # the sentences that hold none of it support nothing
        hits = new & reading.sets[i]
        start, end = reading.spans[i]
        consider(Evidence(start, end, sum(weight[u] for u in hits) / total, reading.topic_of(counted, i)))
    return best
