"""Copy decoding: a generated text whose every piece occurs in a given source text.

The text is cut into pieces at joining marks (commas, full stops, semicolons, colons, line ends); each piece,
case and spacing aside, must occur in the source as whole words (or be one of a few fixed words, such as
NONE). A decoder keeps a `CopyState` per generation and, at each step, lets through only the candidate
tokens that keep every piece a copy (`CopyState.mask`): the piece being written must begin at a word of the
source, a finished one must also end at a word's end (so "m, h, s" is not a copy of "mango, honey, salt"),
no piece may be written twice (a list names each thing once: "silver, silver, silver" is refused), and the
generation may end only where its last piece is finished. Copying is checked on text, not on token
ids, so a word the source spells with a space before it may be copied without one, and a piece may run
across the source's own line breaks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

import numpy as np

#: marks that end a copied piece: what follows may be copied from anywhere in the source
JOINERS = re.compile(r"[,.;:\n]")
#: how many of the likeliest tokens a step considers, more each time none of them keeps the copy
CANDIDATES = (64, 1024, 16384)


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


class CopyState:
    """What one generation has written so far, and which next tokens keep it a copy of ``source`` with no
    piece twice."""

    def __init__(self, source: str, decode: Callable[[Sequence[int]], str], also: Iterable[str] = ()) -> None:
        self.source = _norm(source)
        self.also = tuple(_norm(word) for word in also)
        self.decode = decode
        self.piece = ""  # the text since the last joining mark
        self.written: set[str] = set()  # the finished pieces, normalised

    def _fits(self, piece: str, finished: bool) -> bool:
        """Whether ``piece`` is (``finished``) or begins (not yet) a copy of whole words of the source; a
        space after its last word finishes that word (else "m" followed by spaces would stay open)."""
        finished = finished or piece[-1:].isspace()
        piece = _norm(piece)
        if not piece:
            return True
        if any(word == piece or not finished and word.startswith(piece) for word in self.also):
            return True
        source, at = self.source, self.source.find(piece)
        while at >= 0:
            end = at + len(piece)
            if (at == 0 or not _is_word(source[at - 1]) or not _is_word(piece[0])) and (
                    not finished or end == len(source) or not _is_word(source[end]) or not _is_word(piece[-1])):
                return True
            at = source.find(piece, at + 1)
        return False

    def _new(self, pieces: list[str]) -> bool:
        """Whether none of ``pieces`` (finished ones) repeats another or one written before."""
        keys = [_norm(p) for p in pieces]
        keys = [k for k in keys if k]
        return len(set(keys)) == len(keys) and not self.written.intersection(keys)

    def allowed(self, token: int) -> bool:
        """Whether writing ``token`` next keeps every piece a copy, and new (a token that writes nothing, a
        control token, does not). A token that starts a piece with a whole word already written as a piece
        is refused at once, so the model turns to another word rather than to a longer piece."""
        text = self.decode([token])
        if not text:
            return False
        *done, last = JOINERS.split(self.piece + text)
        if not (all(self._fits(p, True) for p in done) and self._fits(last, False) and self._new(done)):
            return False
        starts = bool(done) or not self.piece.strip()  # this token begins the piece being written
        return not (starts and _norm(last) in self.written)

    @property
    def finished(self) -> bool:
        """Whether the text may end here (its last piece a whole copy, not written before)."""
        return self._fits(self.piece, True) and self._new([self.piece])

    def feed(self, token: int) -> None:
        """``token`` was written."""
        *done, self.piece = JOINERS.split(self.piece + self.decode([token]))
        self.written.update(k for k in map(_norm, done) if k)

    def mask(self, logits: np.ndarray, ends: Iterable[int]) -> np.ndarray:
        """Indices of the tokens that may come next: the end-of-generation tokens ``ends``, and those
        `allowed` among the likeliest (the first of the `CANDIDATES` counts that holds any: a model that
        wants a word the source lacks is led to the likeliest one it holds, not stopped)."""
        ends = {t for t in ends if 0 <= t < len(logits)}
        keep: set[int] = set()
        seen = 0
        for n in CANDIDATES:
            n = min(n, len(logits))
            top = np.argpartition(-logits, n - 1)[:n]  # the n likeliest, in no order
            top = top[np.argsort(-logits[top], kind="stable")][seen:]
            keep = {int(t) for t in top if int(t) not in ends and self.allowed(int(t))}
            seen = n
            if keep or n == len(logits):
                break
        if keep and not self.finished:
            ends = set()  # the piece being written is not a whole copy yet
        return np.asarray(sorted(keep | ends), dtype=np.int64)
