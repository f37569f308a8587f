"""Ways of reading: long context (lc), retrieval (rag), Writing in the Margins (wim)."""

from __future__ import annotations

from typing import Any

from ..errors import UserError
from ..models.base import Generator
from .base import Pattern, Run
from .judges import JUDGE_MODES

PATTERNS = ("wim", "lc", "rag")


def make_pattern(name: str, generator: Generator, **options: Any) -> Pattern:
    """Build a pattern by name; options are the pattern class's keyword arguments."""
    if name == "wim":
        from .wim import WiM

        return WiM(generator, **options)
    if name == "lc":
        from .long_context import LongContext

        return LongContext(generator, **options)
    if name == "rag":
        from .rag import RAG

        return RAG(generator, **options)
    raise UserError(f"unknown pattern {name!r}; choose one of {', '.join(PATTERNS)}")


__all__ = ["JUDGE_MODES", "PATTERNS", "Pattern", "Run", "make_pattern"]
