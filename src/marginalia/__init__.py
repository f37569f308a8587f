"""marginalia: answer questions over long documents, and measure how each way of reading works.

Importing the package is cheap (no torch); backends load when a model is asked for.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "load_generator": ("marginalia.models", "load_generator"),
    "make_pattern": ("marginalia.patterns", "make_pattern"),
    "read_document": ("marginalia.ingest.text", "read_document"),
    "segment_text": ("marginalia.ingest.segment", "segment_text"),
    "load_embedder": ("marginalia.index.embedders", "load_embedder"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'marginalia' has no attribute {name!r}")


__all__ = ["__version__", *_LAZY]
