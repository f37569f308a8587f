"""The client's prompt, as token ids: ``prefix + memory + context``, in a model's own chat template.

The completion client builds every prompt with it, and the tuning data is labelled with it (the larger
model gets the same prompt, in its own template), so what a tuned client learns from is exactly what it
sees when it completes.

- the **prefix** is the chat template's system turn and the start of the user turn, with the instruction;
- the **memory** block is the notes (when there are any) and the end of the user turn, through the start
  of the assistant's turn;
- the **context** is the text typed so far, which the model continues in the assistant's turn; a text too
  long for the window loses its start in steps of a quarter of the room left.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..errors import ContextOverflow
from ..models.base import Generator
from ..prompts import render
from .events import MemoryItem

_TRAILING = " \t"


def strip_trailing(text: str) -> str:
    """The text a prompt holds: without trailing spaces and tabs (a lone space is a token a model rarely
    saw before a word; the model writes the space itself, and the suggestion drops it)."""
    return text.rstrip(_TRAILING)


class ClientPrompt:
    """Builds the client's prompt for one model.

    Args:
        generator: the model whose tokenizer, chat template and window the prompt is for.
        suggestion_tokens: room kept after the prompt for the continuation.
        window: the most tokens a prompt and its continuation take (default: the model's window).
    """

    def __init__(self, generator: Generator, suggestion_tokens: int = 15, window: int | None = None) -> None:
        self.generator = generator
        self.suggestion_tokens = suggestion_tokens
        self.window = generator.context_window if window is None else window
        # a tokenizer that learns words as it goes (the fake) is not thread-safe
        self.lock = threading.Lock()
        frame = generator.chat_frame(render("compose_system").strip())
        tok = generator.tokenizer
        self.prefix = tuple(tok.encode(frame.head, allow_special=True) + tok.encode(render("compose_instruction")))
        self.tail = tuple(tok.encode(frame.tail, allow_special=True))

    def encode(self, text: str) -> list[int]:
        """The context tokens of ``text`` (see `strip_trailing`)."""
        with self.lock:
            return self.generator.tokenizer.encode(strip_trailing(text))

    def memory_ids(self, items: Sequence[MemoryItem]) -> tuple[int, ...]:
        """The memory block: the notes (none: nothing), then the end of the user turn."""
        if not items:
            return self.tail
        notes = "\n".join(f"- {' '.join(item.text.split())}" for item in items)
        with self.lock:
            return tuple(self.generator.tokenizer.encode(render("compose_memory", notes=notes))) + self.tail

    def context(self, ids: Sequence[int], memory_ids: Sequence[int]) -> Sequence[int]:
        """The context tokens that fit beside the prefix, the memory and a continuation. A longer text loses
        its start in steps of a quarter of the room, so the cut moves rarely and a cache stays reusable.

        Raises:
            ContextOverflow: the instruction and the memory alone leave no room.
        """
        room = self.window - len(self.prefix) - len(memory_ids) - self.suggestion_tokens - 4
        if room <= 0:
            raise ContextOverflow(len(self.prefix) + len(memory_ids) + self.suggestion_tokens, self.window,
                                  "the instruction and the memory")
        if len(ids) <= room:
            return ids
        step = max(room // 4, 1)
        cut = -(-(len(ids) - room) // step) * step
        return ids[cut:]

    def ids(self, context_ids: Sequence[int], memory: Sequence[MemoryItem] = (),
            memory_ids: Sequence[int] | None = None) -> list[int]:
        """The whole prompt for a context and a memory (``memory_ids``: its block, when already built)."""
        block = self.memory_ids(memory) if memory_ids is None else memory_ids
        return [*self.prefix, *block, *self.context(context_ids, block)]

    def for_text(self, text: str, memory: Sequence[MemoryItem] = ()) -> list[int]:
        """The whole prompt for a text and a memory."""
        return self.ids(self.encode(text), memory)
