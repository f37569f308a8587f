"""Split a context into segments of at most N model tokens, cut at natural boundaries.

The whole context is tokenized once; segments are slices of that token sequence,
and each segment's text is the character span between its cut points. So the
segments' texts concatenate to the context exactly and their token ids concatenate
to the context's tokenization exactly: nothing is dropped or read twice.

A cut goes at the strongest boundary in the second half of the window: a paragraph
break, then a line break, then a sentence end, then a space, then any token.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..errors import UserError
from ..models.base import Tokenizer
from ..records import Segment

PARAGRAPH, LINE, SENTENCE, WORD, TOKEN = 4, 3, 2, 1, 0
_SENTENCE_END = re.compile(r"[.!?\u3002\uff01\uff1f][\"'\u2019\u201d)\]]*$")


def boundary_strength(text: str, cut: int) -> int:
    """How natural a cut before character ``cut`` is (higher is better).

    The cut is judged by the whitespace run it touches, whichever side of the run it
    falls on: byte-level BPE tokenizers attach a space to the following word, so a
    token boundary sits before the space that ends a sentence, not after it.
    """
    if cut <= 0 or cut >= len(text):
        return PARAGRAPH
    a = cut
    while a > 0 and text[a - 1].isspace():
        a -= 1
    b = cut
    while b < len(text) and text[b].isspace():
        b += 1
    run = text[a:b]
    if not run:
        return TOKEN
    if re.search(r"\n[ \t]*\n", run):
        return PARAGRAPH
    if "\n" in run:
        return LINE
    if _SENTENCE_END.search(text[max(0, a - 4):a]):
        return SENTENCE
    return WORD


def segment_text(
    text: str, tokenizer: Tokenizer, max_tokens: int, min_fill: float = 0.5
) -> list[Segment]:
    """Cut ``text`` into segments of at most ``max_tokens`` tokens.

    Args:
        text: the context.
        tokenizer: the model's own tokenizer.
        max_tokens: the most tokens a segment may hold (> 0).
        min_fill: a segment is cut no earlier than this fraction of ``max_tokens``
            unless the text ends first, so boundaries never make segments tiny.

    Raises:
        UserError: ``max_tokens`` is not positive.
    """
    if max_tokens <= 0:
        raise UserError(f"segment size must be a positive number of tokens, got {max_tokens}")
    ids, offsets = tokenizer.encode_with_offsets(text)
    return segments_from_tokens(text, ids, offsets, max_tokens, min_fill)


def _cut_chars(text: str, offsets: Sequence[tuple[int, int]]) -> list[int | None]:
    """Character position of a cut before each token, or None where a cut is unsafe
    (tokens overlapping the same character, as byte-fallback pieces do)."""
    cuts: list[int | None] = [0]
    for i in range(1, len(offsets)):
        start, prev_end = offsets[i][0], offsets[i - 1][1]
        ok = start >= prev_end and start > offsets[i - 1][0]
        cuts.append(start if ok else None)
    return cuts


def segments_from_tokens(
    text: str,
    ids: Sequence[int],
    offsets: Sequence[tuple[int, int]],
    max_tokens: int,
    min_fill: float = 0.5,
) -> list[Segment]:
    """Segments from an existing tokenization (see `segment_text`)."""
    n = len(ids)
    if n == 0:
        return []
    cut_at = _cut_chars(text, offsets)
    # strength is computed lazily: only tokens inside some window's tail are asked
    strength: dict[int, int] = {}

    def score(i: int) -> int:
        c = cut_at[i]
        if c is None:
            return -1
        if i not in strength:
            strength[i] = boundary_strength(text, c)
        return strength[i]

    bounds = [0]
    start = 0
    while n - start > max_tokens:
        hi = start + max_tokens          # cut before token `hi` at the latest
        lo = start + max(1, int(max_tokens * min_fill))
        best, best_score = None, -1
        for i in range(hi, lo - 1, -1):  # latest strongest boundary wins
            s = score(i)
            if s > best_score:
                best, best_score = i, s
                if s == PARAGRAPH:
                    break
        if best is None or best_score < 0:
            # no clean cut in the tail (a long run of byte pieces): take the nearest
            # clean cut before it, or failing that the first one after it
            best = next((i for i in range(lo - 1, start, -1) if cut_at[i] is not None), None)
            if best is None:
                best = next((i for i in range(hi + 1, n) if cut_at[i] is not None), n)
            if best == n:
                break
        bounds.append(best)
        start = best
    bounds.append(n)

    segments = []
    char_bounds = [0] + [int(cut_at[b] or 0) for b in bounds[1:-1]] + [len(text)]
    for k in range(len(bounds) - 1):
        a, b = char_bounds[k], char_bounds[k + 1]
        segments.append(
            Segment(index=k, start=a, end=b, text=text[a:b], token_ids=tuple(ids[bounds[k]:bounds[k + 1]]))
        )
    return segments
