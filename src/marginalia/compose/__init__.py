"""Composition assistance: a small local model suggests the next words as the writer types, using a memory
of key points that a larger model writes, in the background, from documents retrieved from a collection.

- `AugmentationCoordinator` decides when the text has changed enough (token edit distance) to ask for
  new memory, and keeps the memory (a bounded FIFO);
- `TakeawayMemory` and `MarginMemory` retrieve from a collection and compress what they find;
- `CompletionClient` completes the text on a cached prompt (instruction + memory + text), preparing new
  memory on a second cache in the background;
- `Composer` ties them together; `marginalia.app.compose` builds one from a collection and options.
"""

from __future__ import annotations

from .client import Completion, CompletionClient, forks_share_cache
from .composer import Composer
from .coordinator import AugmentationCoordinator, token_distance
from .events import (
    ComposeEvent,
    MemoryFailed,
    MemoryItem,
    MemoryPrepared,
    MemoryRequest,
    MemoryRequested,
    MemoryStarted,
    MemorySwapped,
    MemoryUpdated,
    Suggested,
    compose_event_to_dict,
)
from .memory import MEMORY_MODES, MarginMemory, MemoryGenerator, TakeawayMemory

__all__ = [
    "MEMORY_MODES", "AugmentationCoordinator", "ComposeEvent", "Completion", "CompletionClient", "Composer",
    "MarginMemory", "MemoryFailed", "MemoryGenerator", "MemoryItem", "MemoryPrepared", "MemoryRequest",
    "MemoryRequested", "MemoryStarted", "MemorySwapped", "MemoryUpdated", "Suggested", "TakeawayMemory",
    "compose_event_to_dict", "forks_share_cache", "token_distance",
]
