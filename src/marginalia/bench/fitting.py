"""Fitting text to a token budget, shared by the task builders: the target window, a token cache,
cutting a text at a sentence end, labels for ids and per-example random generators."""

from __future__ import annotations

import bisect
import random
import re
from collections.abc import Sequence

from ..app import Tokenizer

TOLERANCE = 0.02  # a context holds between (1 - TOLERANCE) * target and target tokens
_SENTENCE_END = re.compile(r"[.!?][\"')\]\u201d\u2019]*(?=\s)")


def window(target: int) -> tuple[int, int]:
    """(high, low): the most and fewest tokens a context built for ``target`` may hold (at least 16 apart,
    so that very short targets stay reachable by cutting at words)."""
    return target, max(0, min(int(target * (1 - TOLERANCE)), target - 16))

class TokenCache:
    """Token counts and offsets of texts under one tokenizer; each distinct text is encoded once."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._counts: dict[str, int] = {}
        self._offsets: dict[str, list[tuple[int, int]]] = {}
        #: tokens a passage boundary adds beyond the separator's own count (learned from measured contexts)
        self.boundary_extra = 0.0
        self._learned = 0

    def learn_boundary(self, extra: float) -> None:
        """Fold one measured context's per-boundary miss into `boundary_extra` (a running mean)."""
        self._learned = min(self._learned + 1, 20)
        self.boundary_extra += (extra - self.boundary_extra) / self._learned

    def count(self, text: str) -> int:
        n = self._counts.get(text)
        if n is None:
            n = self._counts[text] = len(self.offsets(text)) if text in self._offsets \
                else len(self.tokenizer.encode(text))
        return n

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """Character spans of the tokens of ``text`` (cached)."""
        spans = self._offsets.get(text)
        if spans is None:
            spans = self._offsets[text] = self.measure(text)
            self._counts[text] = len(spans)
        return spans

    def measure(self, text: str) -> list[tuple[int, int]]:
        """Character spans of the tokens of ``text``, not cached (a final context is measured once)."""
        return list(self.tokenizer.encode_with_offsets(text)[1])


def cut_text(text: str, spans: Sequence[tuple[int, int]], keep: int, slack: int) -> tuple[str, int]:
    """The start of ``text`` that holds at most ``keep`` of its tokens, and how many it holds.

    It ends at a sentence end when that loses at most ``slack`` tokens, else at a word boundary (a single
    word longer than ``keep`` tokens is cut at a token boundary).
    """
    if keep >= len(spans):
        return text, len(spans)
    if keep <= 0:
        return "", 0
    ends = [e for _, e in spans]
    limit = spans[keep - 1][1]
    best = None
    for m in _SENTENCE_END.finditer(text, 0, limit + 1):
        if m.end() <= limit:
            best = m.end()
    if best is not None and keep - bisect.bisect_right(ends, best) <= slack:
        cut = best
    else:
        cut = limit
        if cut < len(text) and not text[cut].isspace():
            space = max(text.rfind(" ", 0, cut), text.rfind("\n", 0, cut))
            if space > 0:
                cut = space
    piece = text[:cut].rstrip()
    return piece, bisect.bisect_right(ends, len(piece))

def label(value: float) -> str:
    """A depth or fraction as a percentage for ids: 0.5 -> ``50``, 1/3 -> ``33.3``."""
    return f"{round(value * 100, 1):g}"

def example_rng(seed: int, example_id: str, salt: str = "") -> random.Random:
    """A random generator determined by the seed and the example (string seeds hash stably)."""
    return random.Random(f"{seed}/{example_id}/{salt}")
