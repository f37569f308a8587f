"""Ways of reading: long context (lc), retrieval (rag), Writing in the Margins (wim), and routing (auto: rag,
then wim where rag's answer does not stand); and the registry that knows them by name (`PatternSpec`,
`register`), through which a pattern from another package joins them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..models.base import Generator
from ..options import JUDGE_MODES, PatternOptions, RunSettings
from .base import Pattern, Run
from .registry import PatternSpec, register, specs

if TYPE_CHECKING:
    from ..index.embedders import Embedder


def make_pattern(options: PatternOptions | str, generator: Generator, *, embedder: Embedder | None = None,
                 **values: Any) -> Pattern:
    """Build the pattern an options record describes (or a pattern by name, from its option values).

    Args:
        options: a pattern's options record (`WimOptions`, `LcOptions`, `RagOptions`, `AutoOptions`, or a
            registered pattern's own), or the pattern's name.
        generator: the model.
        embedder: the embedder of a pattern that retrieves (rag, auto), already loaded (default: load the one
            its options name).
        values: option values laid over the record (with a name: the record's fields, and the
            pattern's own keyword arguments such as lc's ``intro``).

    Raises:
        UserError: an unknown pattern, an unknown option, or a bad value (the message names it).
    """
    from . import registry

    if isinstance(options, str):
        fields = registry.get(options).options.model_fields
        options = registry.pattern_options(options, **{k: v for k, v in values.items() if k in fields})
        values = {k: v for k, v in values.items() if k not in fields}  # the constructor's own (lc's intro)
    return registry.build(options, generator, embedder=embedder, **values)


def __getattr__(name: str) -> Any:
    """The built-in patterns' options records, from their modules (``from marginalia.patterns import
    WimOptions``)."""
    modules = {"AutoOptions": "auto", "WimOptions": "wim", "LcOptions": "long_context", "RagOptions": "rag"}
    if name in modules:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{modules[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["JUDGE_MODES", "Pattern", "PatternSpec", "Run", "RunSettings", "make_pattern", "register", "specs"]
