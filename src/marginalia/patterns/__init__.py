"""Ways of reading: long context (lc), retrieval (rag), Writing in the Margins (wim), and routing (auto: rag,
then wim where rag's answer does not stand)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import UserError
from ..models.base import Generator
from ..options import (
    JUDGE_MODES,
    PATTERN_OPTIONS,
    PATTERNS,
    AutoOptions,
    LcOptions,
    PatternOptions,
    RagOptions,
    RunSettings,
    WimOptions,
    pattern_options,
)
from .base import Pattern, Run

if TYPE_CHECKING:
    from ..index.embedders import Embedder


def make_pattern(options: PatternOptions | str, generator: Generator, *, embedder: Embedder | None = None,
                 **values: Any) -> Pattern:
    """Build the pattern an options record describes (or a pattern by name, from its option values).

    Args:
        options: a `WimOptions`, `LcOptions`, `RagOptions` or `AutoOptions`, or the pattern's name.
        generator: the model.
        embedder: rag's embedder, already loaded (default: load the one its options name).
        values: option values laid over the record (with a name: the record's fields, and the
            pattern's own keyword arguments such as lc's ``intro``).

    Raises:
        UserError: an unknown pattern, an unknown option, or a bad value (the message names it).
    """
    if isinstance(options, str):
        fields = PATTERN_OPTIONS[options].model_fields if options in PATTERN_OPTIONS else {}
        options = pattern_options(options, **{k: v for k, v in values.items() if k in fields})
        values = {k: v for k, v in values.items() if k not in fields}  # the constructor's own (lc's intro)
    if isinstance(options, AutoOptions):  # before its bases, RagOptions and WimOptions
        from .auto import Auto

        return Auto(generator, options, embedder=embedder, **values)
    if isinstance(options, WimOptions):
        from .wim import WiM

        return WiM(generator, options, **values)
    if isinstance(options, LcOptions):
        from .long_context import LongContext

        return LongContext(generator, options, **values)
    if isinstance(options, RagOptions):
        from .rag import RAG

        return RAG(generator, options, embedder=embedder, **values)
    raise UserError(f"no pattern reads with {type(options).__name__}; "
                    "give WimOptions, LcOptions, RagOptions or AutoOptions")


__all__ = ["JUDGE_MODES", "PATTERNS", "Pattern", "Run", "RunSettings", "make_pattern"]
