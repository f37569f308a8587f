"""A ledger of the prompt tokens a backend evaluated, against one reference token sequence (a document's).

A pattern knows the sequence its context occupies in the cache (the instructions, then the document's
tokens) and which of its positions are context; the backend knows what it evaluated. Each time a backend
evaluates the tokens at positions ``[start, end)`` of a sequence, it tells the ledger attached to its
usage account (`Usage.ledger`), which counts the positions where that sequence still agrees with the
reference: the same token after the same tokens is the same cache entry, so a position counted twice was
computed twice. Over HTTP the evaluated positions are the prompt's last ``n``, ``n`` as the server reports.

An evaluation that leaves the reference part-way (a margin prompt after a segment, whose first token may by
chance equal the next segment's first one) counts only up to the last block boundary it covers (the end of
a segment): a prompt is not a re-read of the document because it begins like it.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int | None = None) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, at most ``limit`` (slices compared in C)."""
    hi = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    if list(a[:hi]) == list(b[:hi]):
        return hi
    lo = 0
    hi -= 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if list(a[:mid]) == list(b[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefillLedger:
    """How many times the backend evaluated each context token of ``reference``.

    Args:
        reference: the token sequence as the cache holds it (instructions, then the context).
        context: ``(start, end)`` position ranges of ``reference`` that are context (in order).
        blocks: positions where a block of the reference ends (segments' ends); an evaluation that leaves
            the reference counts only up to the last of these it reaches. Default: the context ranges' ends.
    """

    def __init__(self, reference: Sequence[int], context: Sequence[tuple[int, int]],
                 blocks: Sequence[int] | None = None) -> None:
        self.reference = list(reference)
        self.times = [0] * len(self.reference)
        self.is_context = [False] * len(self.reference)
        for start, end in context:
            for p in range(start, end):
                self.is_context[p] = True
        self.blocks = sorted(set(blocks if blocks is not None else [end for _, end in context]) | {0})
        self.gone_evaluated = 0  # counts of positions dropped from the reference (`shift`)
        self.gone_repeated = 0
        self._lock = threading.Lock()

    def record(self, sequence: Sequence[int], start: int, end: int) -> None:
        """The backend evaluated positions ``[start, end)`` of ``sequence`` (what its cache then held)."""
        if end <= start:
            return
        with self._lock:
            agree = common_prefix(sequence, self.reference, end)
            if agree < end:  # it left the reference: keep only whole blocks
                agree = self.blocks[bisect.bisect_right(self.blocks, agree) - 1]
            for p in range(start, agree):
                self.times[p] += 1

    def shift(self, start: int, end: int) -> None:
        """The cache dropped positions ``[start, end)`` and moved the later ones down: so does the reference."""
        with self._lock:
            for p in range(start, end):
                if self.is_context[p]:
                    self.gone_evaluated += self.times[p]
                    self.gone_repeated += max(self.times[p] - 1, 0)
            del self.reference[start:end], self.times[start:end], self.is_context[start:end]
            n = end - start
            self.blocks = sorted({b if b <= start else b - n for b in self.blocks if not start < b < end})

    @property
    def evaluated(self) -> int:
        """Context token evaluations, repeats included."""
        with self._lock:
            return self.gone_evaluated + sum(t for t, c in zip(self.times, self.is_context, strict=True) if c)

    @property
    def repeated(self) -> int:
        """Context token evaluations beyond each token's first: the tokens prefilled again."""
        with self._lock:
            return self.gone_repeated + sum(t - 1 for t, c in zip(self.times, self.is_context, strict=True)
                                            if c and t > 1)
