"""Section-bounded chunks: a section's paragraphs packed up to a token budget, never across a section boundary."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import UserError
from ..records import Chunk, Document, Section
from .sections import closes_fence, fence_opening

CountTokens = Callable[[str], int]

# a sentence ends at . ! ? (or their CJK forms), maybe followed by closing quotes or brackets, then whitespace
_SENTENCE_END = re.compile(r"[.!?\u2026\u3002\uff01\uff1f][\"'\u2019\u201d)\]]*\s+")
_SPACE_RUN = re.compile(r"\s+")
_LINE_END = re.compile(r"\n+")


@dataclass(frozen=True)
class _Piece:
    """A span of the text that is never cut further unless it alone is too long; ``n`` is its token count."""

    start: int
    end: int
    n: int
    exact: bool = False  # n is the count of exactly this span (not a sum of its parts)


def paragraph_spans(text: str, start: int, end: int) -> list[tuple[int, int, bool]]:
    """Split ``text[start:end]`` into paragraphs that tile it: (start, end, is_code_or_table).

    Paragraphs are separated by blank lines; a fenced code block is a paragraph of its own
    (as in CommonMark, it needs no blank line around it) even with blank lines inside. Each
    paragraph keeps the blank lines that follow it, and the first one starts at ``start``,
    so the spans are consecutive and cover the range exactly.
    """
    starts: list[tuple[int, bool]] = []
    fence: str | None = None
    in_paragraph = False
    pos = start
    while pos < end:
        nl = text.find("\n", pos, end)
        line_end = end if nl < 0 else nl + 1
        line = text[pos:line_end]
        if fence is not None:
            if closes_fence(line, fence):
                fence = None
                in_paragraph = False  # what follows a code block is a new paragraph, blank line or not
        elif not line.strip():
            in_paragraph = False
        else:
            opening = fence_opening(line)
            if not in_paragraph or opening:  # a code block starts its own paragraph, even without a blank line
                starts.append((pos, bool(opening) or line.lstrip().startswith("|")))
                in_paragraph = True
            if opening:
                fence = opening
        pos = line_end
    if not starts:
        return []
    bounds = [start] + [s for s, _ in starts[1:]] + [end]
    return [(bounds[i], bounds[i + 1], starts[i][1]) for i in range(len(starts))]


def _cuts(text: str, start: int, end: int, pattern: re.Pattern[str]) -> list[int]:
    """Positions inside (start, end) just after each match of ``pattern`` (a cut keeps whitespace on the left)."""
    return [m.end() for m in pattern.finditer(text, start, end) if start < m.end() < end]


def _split(text: str, start: int, end: int, budget: int, count: CountTokens, code: bool) -> list[_Piece]:
    """Cut an over-long paragraph into pieces of at most ``budget`` tokens each (counted once each).

    Prose is cut at sentence ends, then at line ends, then at whitespace; code and tables at line
    ends first. A single word longer than the budget stays whole.
    """
    patterns = [_LINE_END, _SPACE_RUN] if code else [_SENTENCE_END, _LINE_END, _SPACE_RUN]

    def split(a: int, b: int, level: int) -> list[_Piece]:
        while level < len(patterns):
            cuts = _cuts(text, a, b, patterns[level])
            if cuts:
                break
            level += 1
        else:
            return [_Piece(a, b, count(text[a:b]), exact=True)]
        bounds = [a, *cuts, b]
        out: list[_Piece] = []
        run: list[_Piece] = []
        total = 0
        def close() -> None:
            out.append(run[0] if len(run) == 1 else _Piece(run[0].start, run[-1].end, total))
            run.clear()

        for s, e in zip(bounds, bounds[1:], strict=False):
            n = count(text[s:e])
            if n > budget:  # this sentence (line, ...) alone is too long: cut it more finely
                if run:
                    close()
                    total = 0
                out.extend(split(s, e, level + 1))
                continue
            if run and total + n > budget:
                close()
                total = 0
            run.append(_Piece(s, e, n, exact=True))
            total += n
        if run:
            close()
        return out

    return split(start, end, 0)


def _pack(pieces: list[_Piece], budget: int, min_tokens: int) -> list[list[_Piece]]:
    """Greedy packing up to ``budget``; then a small group merges into a neighbour (or takes from the previous)."""
    groups: list[list[_Piece]] = []
    total = 0
    for piece in pieces:
        if groups and total + piece.n <= budget:
            groups[-1].append(piece)
            total += piece.n
        else:
            groups.append([piece])
            total = piece.n

    def size(group: list[_Piece]) -> int:
        return sum(p.n for p in group)

    i = 0
    while i < len(groups):
        n = size(groups[i])
        if n >= min_tokens or len(groups) == 1:
            i += 1
            continue
        options = []
        if i > 0 and size(groups[i - 1]) + n <= budget:
            options.append((size(groups[i - 1]) + n, i - 1))
        if i + 1 < len(groups) and size(groups[i + 1]) + n <= budget:
            options.append((size(groups[i + 1]) + n, i + 1))
        if options:
            _, j = min(options)
            first, second = min(i, j), max(i, j)
            groups[first] = groups[first] + groups[second]
            del groups[second]
            i = first
            continue
        # no merge fits: move whole pieces from the previous group while both stay big enough
        if i > 0:
            previous = groups[i - 1]
            while (n < min_tokens and len(previous) > 1 and size(previous) - previous[-1].n >= min_tokens
                   and n + previous[-1].n <= budget):
                moved = previous.pop()
                groups[i].insert(0, moved)
                n += moved.n
        i += 1
    return groups


def _breakable(text: str) -> bool:
    return _SPACE_RUN.search(text.strip()) is not None


def _section_spans(
    text: str, start: int, end: int, count: CountTokens, min_tokens: int, budget: int,
) -> list[tuple[int, int, int]]:
    """(start, end, tokens) of a body's chunks without overlap: consecutive, covering [start, end)."""
    pieces: list[_Piece] = []
    for a, b, code in paragraph_spans(text, start, end):
        n = count(text[a:b])
        pieces.extend([_Piece(a, b, n, exact=True)] if n <= budget else _split(text, a, b, budget, count, code))
    queue = _pack(pieces, budget, min_tokens)
    spans: list[tuple[int, int, int]] = []
    # the packing summed per-piece counts; a tokenizer may count the joined text a little differently,
    # so each chunk is counted whole (its n_tokens needs that anyway) and re-cut in the rare case it is over
    while queue:
        group = queue.pop(0)
        a, b = group[0].start, group[-1].end
        n = group[0].n if len(group) == 1 and group[0].exact else count(text[a:b])
        if n <= budget or (len(group) == 1 and not _breakable(text[a:b])):
            spans.append((a, b, n))
        elif len(group) > 1:
            queue[:0] = [group[:-1], group[-1:]]
        else:
            finer = _split(text, a, b, max(1, budget - (n - budget)), count, code=False)
            if len(finer) > 1:
                queue[:0] = [[p] for p in finer]
            else:  # it cannot be cut finer: keep it whole
                spans.append((a, b, n))
    return spans


def _overlap_start(
    text: str, floor: int, start: int, end: int, budget: int, max_tokens: int, count: CountTokens,
) -> tuple[int, int] | None:
    """Where a chunk [start, end) begins with its overlap, and its token count then, or None for no overlap.

    The new start is the earliest word start in [floor, start) whose tail up to ``start`` fits
    ``budget`` tokens while the whole chunk stays within ``max_tokens``.
    """
    window = max(floor, start - 16 * budget - 64)  # no tokenizer spends more than ~16 characters a token
    candidates = [p for p in range(window, start) if (p == floor or text[p - 1].isspace()) and not text[p].isspace()]
    while candidates and budget > 0:
        lo, hi = 0, len(candidates)  # binary search: the tail shrinks (so does its count) as p moves right
        while lo < hi:
            mid = (lo + hi) // 2
            if count(text[candidates[mid]:start]) <= budget:
                hi = mid
            else:
                lo = mid + 1
        if lo == len(candidates):
            return None
        n = count(text[candidates[lo]:end])
        if n <= max_tokens:
            return candidates[lo], n
        budget -= n - max_tokens
    return None


def chunk_sections(
    doc: Document,
    sections: Sequence[Section],
    count_tokens: CountTokens,
    min_tokens: int = 130,
    max_tokens: int = 260,
    overlap_tokens: int = 0,
) -> list[Chunk]:
    """Cut each section's own text into chunks of whole paragraphs, never across a section boundary.

    Paragraphs (blank-line separated; a fenced code block or a table is one) are packed greedily
    while the chunk stays within ``max_tokens``; a chunk under ``min_tokens`` is merged into a
    neighbour when the result fits (else it takes paragraphs from the previous chunk while both
    stay at or above ``min_tokens``). A paragraph over ``max_tokens`` is cut at sentence ends, then
    at whitespace, so no chunk exceeds ``max_tokens`` unless a single word does. Without overlap a
    section's chunks tile its body exactly (the blank lines after a paragraph belong to its chunk).
    With ``overlap_tokens``, each chunk after a section's first starts up to that many tokens
    earlier, at a word start inside the same section; ``max_tokens`` bounds the whole chunk,
    overlap included. Every chunk's ``text`` is ``doc.text[start:end]``.

    Each paragraph and each chunk is counted once (plus a few counts per overlap), so a model
    tokenizer's count is cheap enough here.

    Args:
        doc: the document the sections belong to.
        sections: from :func:`~marginalia.ingest.sections.parse_sections`.
        count_tokens: the number of model tokens in a text (any callable).
        min_tokens: chunks smaller than this are merged when they can be.
        max_tokens: no chunk is longer (except a single unbreakable word).
        overlap_tokens: tokens of the preceding text repeated at the start of each later chunk.

    Returns:
        The chunks, in document order, indexed from 0.

    Raises:
        UserError: the thresholds are inconsistent.
    """
    if max_tokens < 1 or min_tokens < 0 or min_tokens > max_tokens:
        raise UserError(f"chunk sizes must satisfy 0 <= min_tokens <= max_tokens and max_tokens >= 1; "
                        f"got min_tokens={min_tokens}, max_tokens={max_tokens}")
    if not 0 <= overlap_tokens < max_tokens:
        raise UserError(f"overlap_tokens must be at least 0 and less than max_tokens ({max_tokens}); "
                        f"got {overlap_tokens}")
    text = doc.text
    budget = max_tokens - overlap_tokens
    chunks: list[Chunk] = []
    for section in sections:
        if not text[section.body_start:section.body_end].strip():
            continue
        spans = _section_spans(text, section.body_start, section.body_end, count_tokens, min(min_tokens, budget),
                               budget)
        for k, (a, b, n) in enumerate(spans):
            if overlap_tokens and k > 0:
                moved = _overlap_start(text, section.body_start, a, b, min(overlap_tokens, max_tokens - n),
                                       max_tokens, count_tokens)
                if moved is not None:
                    a, n = moved
            chunks.append(Chunk(
                doc_id=doc.doc_id, section_index=section.index, index=len(chunks), start=a, end=b,
                text=text[a:b], section_path=section.path, n_tokens=n, page=doc.page_at(a),
            ))
    return chunks
