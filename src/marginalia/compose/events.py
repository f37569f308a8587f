"""The records composition assistance passes around: memory items, memory requests, and its events.

Every event carries a ``kind`` for JSON consumers, like the reading events in `marginalia.records`.
Events are reported from the thread that caused them (the caller's, the memory worker's or the client's
background preparation), so a listener must be quick and thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

MemoryKind = Literal["takeaway", "margin"]


@dataclass(frozen=True)
class MemoryItem:
    """One thing the memory holds: a short text and where in the collection it comes from.

    ``start``/``end`` are character offsets into the source document's text. A ``margin`` item is
    extractive: its text is exactly ``document.text[start:end]``. A ``takeaway`` is written by the memory
    model from the chunk that ``start``/``end`` span.
    """

    text: str
    source: str
    doc_id: str
    section_path: tuple[str, ...]
    start: int
    end: int
    kind: MemoryKind
    score: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        """What makes two items the same (a repeat refreshes the older one instead of adding a copy)."""
        return (self.doc_id, " ".join(self.text.lower().split()))


@dataclass(frozen=True)
class MemoryRequest:
    """A request for new memory.

    ``query`` is only what the text gained since the last request that was sent (the incremental query);
    ``context`` is the whole text at the time, so the memory generator can keep the text being written
    out of what it retrieves.
    """

    id: int
    query: str
    context: str
    distance: int  # token edits between the text at the previous request and this one


@dataclass(frozen=True)
class MemoryRequested:
    """The text changed enough: a memory request was made. ``replaces`` names a pending request that this
    one took the place of (it was never sent); ``started`` says whether it went out at once."""

    request: MemoryRequest
    replaces: int | None
    started: bool
    kind: Literal["memory_requested"] = "memory_requested"


@dataclass(frozen=True)
class MemoryStarted:
    """A request was handed to the memory generator (at most one is in flight)."""

    request: MemoryRequest
    kind: Literal["memory_started"] = "memory_started"


@dataclass(frozen=True)
class MemoryUpdated:
    """A request's items entered the memory (oldest items dropped past the bound)."""

    request_id: int
    added: tuple[MemoryItem, ...]
    memory: tuple[MemoryItem, ...]
    version: int
    seconds: float
    kind: Literal["memory_updated"] = "memory_updated"


@dataclass(frozen=True)
class MemoryFailed:
    """A request failed or ran past its time; memory stays as it was. ``notice`` is a sentence for the
    writer, given once per run of failures (empty on the later ones)."""

    request_id: int
    message: str
    timed_out: bool
    notice: str
    kind: Literal["memory_failed"] = "memory_failed"


@dataclass(frozen=True)
class MemoryPrepared:
    """The client's second cache now holds the prompt with memory ``version`` and the text typed so far."""

    version: int
    prefilled_tokens: int
    seconds: float
    kind: Literal["memory_prepared"] = "memory_prepared"


@dataclass(frozen=True)
class MemorySwapped:
    """The prepared cache became the one completions run on (at the start of a completion)."""

    version: int
    kind: Literal["memory_swapped"] = "memory_swapped"


@dataclass(frozen=True)
class Suggested:
    """A completion ended: its text, and what it cost.

    ``prefilled_tokens`` counts the tokens evaluated before the first new one (the text typed since the
    last completion, nothing more when the cache could be reused; None when a model server did not say
    what it took from its prompt cache); ``cancelled`` means newer typing
    closed it, and ``text`` is then what had been written so far.
    """

    context_chars: int
    text: str
    prefilled_tokens: int | None
    generated_tokens: int
    first_token_seconds: float | None
    seconds: float
    memory_version: int
    cancelled: bool
    kind: Literal["suggested"] = "suggested"


ComposeEvent = (MemoryRequested | MemoryStarted | MemoryUpdated | MemoryFailed | MemoryPrepared | MemorySwapped
                | Suggested)
Listener = Callable[[ComposeEvent], None]


def compose_event_to_dict(event: ComposeEvent) -> dict[str, Any]:
    """A JSON-ready dict of an event."""
    return asdict(event)
