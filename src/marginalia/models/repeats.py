"""A loop guard for greedy decoding: no run of n tokens written twice in one generation.

Small models decoded greedily fall into loops: a sentence, once written, is the likeliest thing to write
again. `NoRepeat` keeps the tokens a generation has written and names those that, written next, would
close a run of ``n`` tokens it has already written (n-gram blocking); the decoder masks them, so the model
takes its next likeliest token instead. Only the generated tokens count: a phrase of the prompt may be
written again once (a name the writer used), but not twice.

A token that writes only digits and blanks is never banned: tokenizers that give each digit a token of its
own would otherwise forbid "from 2005 to 2006" or "1,000 and 2,000" (the run " ", "2", "0" closing twice),
while a loop of words is still stopped at its first word token.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

_DIGITS = re.compile(r"[\d\s]+")


def repeating(tokens: Sequence[int], n: int) -> set[int]:
    """The tokens that, appended to ``tokens``, would end a run of ``n`` tokens already in ``tokens``."""
    if n <= 0 or len(tokens) < n:
        return set()
    head = tuple(tokens[len(tokens) - n + 1:]) if n > 1 else ()
    return {tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tuple(tokens[i:i + n - 1]) == head}


def digits_or_blanks(text: str) -> bool:
    """Whether a token's text is only digits and blanks (never banned by the guard)."""
    return bool(_DIGITS.fullmatch(text))


class NoRepeat:
    """What one generation has written, and which next tokens would repeat one of its runs of ``n``.

    Args:
        n: the run length.
        decode: the model's token decoder; with it, tokens that write only digits and blanks are never
            banned (see the module doc).
    """

    def __init__(self, n: int, decode: Callable[[Sequence[int]], str] | None = None) -> None:
        if n < 1:
            raise ValueError(f"a repeated run is at least 1 token long, not {n}")
        self.n = n
        self.decode = decode
        self.written: list[int] = []

    def banned(self) -> list[int]:
        """The tokens that may not come next (sorted)."""
        tokens = repeating(self.written, self.n)
        if self.decode is not None:
            tokens = {t for t in tokens if not digits_or_blanks(self.decode([t]))}
        return sorted(tokens)

    def feed(self, token: int) -> None:
        """``token`` was written."""
        self.written.append(token)
