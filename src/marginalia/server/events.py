"""What the service sends for each reading event and answer: plain JSON-ready dicts.

Every step the Python API yields becomes one typed event (``started``, ``retrieved``, ``routed`` (pattern
auto: the reading it takes and why, before WiM reads or before retrieval's answer), ``segment_read``,
``segments_dropped`` (a long document: the oldest segments left the cache to make room),
``margin_written``, ``margin_judged``, ``reading_stopped`` (before the end: asked, or the answer was found),
``answer_delta``, ``done``: the whole answer, `Answer.to_dict`'s document as every answer is sent). References
are sent once, in ``done``;
``retrieved`` says only how many were gathered, and ``segment_read`` says where a segment lies, not its text
(in the text read: for a collection, the retrieved references joined under their headings).
"""

from __future__ import annotations

from typing import Any

from ..records import (
    Answer,
    AnswerDelta,
    Done,
    Event,
    Margin,
    MarginJudged,
    MarginWritten,
    ReadingStopped,
    Retrieved,
    Route,
    Routed,
    SegmentRead,
    SegmentsDropped,
    Started,
    to_json,
)

#: a reference's quoted text is cut to this many characters (a whole section can be a reference)
QUOTE_CHARS = 2000


def margin_dict(margin: Margin) -> dict[str, Any]:
    return to_json(margin)


def route_dict(route: Route | None) -> dict[str, Any] | None:
    """Pattern auto's route: the reading that answered (``rag`` or ``wim``), why, and the signals it read."""
    return None if route is None else to_json(route)


def answer_dict(answer: Answer) -> dict[str, Any]:
    """The whole answer (`Answer.to_dict`), each reference's quoted text cut to `QUOTE_CHARS` characters."""
    return answer.to_dict(quote_chars=QUOTE_CHARS)


def event_payload(event: Event) -> dict[str, Any]:
    """The data of one event (its kind travels as the SSE event name)."""
    if isinstance(event, Started):
        return {"pattern": event.pattern, "segments_total": event.segments_total,
                "context_tokens": event.context_tokens}
    if isinstance(event, Retrieved):
        return {"outcome": event.outcome, "best_similarity": event.best_similarity,
                "references": len(event.references), "elapsed": event.elapsed}
    if isinstance(event, Routed):
        return {**(route_dict(event.route) or {}), "elapsed": event.elapsed}
    if isinstance(event, SegmentRead):
        seg = event.segment
        return {"index": seg.index, "total": event.total, "start": seg.start, "end": seg.end,
                "tokens": seg.n_tokens, "elapsed": event.elapsed, "cached": event.cached}
    if isinstance(event, SegmentsDropped):
        return {"first": event.first, "last": event.last, "tokens": event.tokens,
                "cache_tokens": event.cache_tokens}
    if isinstance(event, ReadingStopped):
        return {"after": event.after, "reason": event.reason, "elapsed": event.elapsed}
    if isinstance(event, MarginWritten):
        return {"segment_index": event.segment_index, "text": event.text, "elapsed": event.elapsed}
    if isinstance(event, MarginJudged):
        return {"margin": margin_dict(event.margin), "elapsed": event.elapsed}
    if isinstance(event, AnswerDelta):
        return {"text": event.text}
    if isinstance(event, Done):
        return answer_dict(event.answer)
    raise TypeError(f"not a reading event: {event!r}")  # pragma: no cover - the Event union is closed
