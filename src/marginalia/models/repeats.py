"""A loop guard for greedy decoding: no run of n tokens written twice in one generation.

Small models decoded greedily fall into loops: a sentence, once written, is the likeliest thing to write
again. `NoRepeat` keeps the tokens a generation has written and names those that, written next, would
close a run of ``n`` tokens it has already written (n-gram blocking); the decoder masks them, so the model
takes its next likeliest token instead. Only the generated tokens count: a phrase of the prompt may be
written again once (a name the writer used), but not twice.
"""

from __future__ import annotations

from collections.abc import Sequence


def repeating(tokens: Sequence[int], n: int) -> set[int]:
    """The tokens that, appended to ``tokens``, would end a run of ``n`` tokens already in ``tokens``."""
    if n <= 0 or len(tokens) < n:
        return set()
    head = tuple(tokens[len(tokens) - n + 1:]) if n > 1 else ()
    return {tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tuple(tokens[i:i + n - 1]) == head}


class NoRepeat:
    """What one generation has written, and which next tokens would repeat one of its runs of ``n``."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"a repeated run is at least 1 token long, not {n}")
        self.n = n
        self.written: list[int] = []

    def banned(self) -> list[int]:
        """The tokens that may not come next (sorted)."""
        return sorted(repeating(self.written, self.n))

    def feed(self, token: int) -> None:
        """``token`` was written."""
        self.written.append(token)
