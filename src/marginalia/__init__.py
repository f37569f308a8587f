"""marginalia: answer questions over long documents, and measure how each way of reading works.

The front door is a handful of use-cases and the options records they take::

    from marginalia import WimOptions, ask_file, load_model

    run = ask_file("report.md", "Who signed the lease?", WimOptions(segment_tokens=512),
                   generator=load_model("smollm2"))
    for event in run:          # Started, SegmentRead, MarginWritten, MarginJudged, AnswerDelta..., Done
        ...
    answer = run.answer()

Use-cases: `load_model`, `load_embedder`, `read_file`, `ask_text`, `ask_file` (with no options: auto, RAG
then WiM where RAG's answer does not stand, for a collection or a long document; WiM for a short one, as
`default_options` says), `reader` (a document read once with WiM, asked many questions), `document_cache`,
`ask_collection`, `collection_reader`, `index_paths`, `generate_questions`, `compose` (a composer for writing
with suggestions), `tuning_data` and `tune_client` (instruction tuning of the composer's client), `demo`.
Options: `AutoOptions`, `WimOptions`, `LcOptions`, `RagOptions`, `RunSettings` (what one run may change),
`CollectionOptions`, `ChunkingOptions`, `IngestOptions` (the bounds on converting a document), `ComposeOptions`,
`TuneDataOptions`, `TuneOptions` (the patterns' own records live in their modules: `marginalia.patterns.wim`
and its siblings).
Lower layers: `make_pattern`, `segment_text`; a new way of reading registers a `PatternSpec` (docs/patterns.md).

Importing the package is cheap (no torch); backends load when a model is asked for. It sets how the OpenMP
runtime waits (`marginalia.openmp`) unless the environment already says.
"""

from __future__ import annotations

from typing import Any

from . import openmp  # noqa: F401  (sets how OpenMP waits, before any backend loads)

__version__ = "0.1.0"

_APP = ("load_model", "load_embedder", "read_file", "ask_text", "ask_file", "default_options", "reader",
        "document_cache", "ask_collection", "collection_reader", "index_paths", "generate_questions", "compose",
        "tuning_data", "tune_client", "demo")
_PATTERN_OPTIONS = {"AutoOptions": "auto", "WimOptions": "wim", "LcOptions": "long_context", "RagOptions": "rag"}
_OPTIONS = (*_PATTERN_OPTIONS, "RunSettings", "CollectionOptions", "ChunkingOptions", "IngestOptions",
            "ComposeOptions", "TuneDataOptions", "TuneOptions")
_LAZY = {
    **{name: ("marginalia.app", name) for name in _APP},
    **{name: ("marginalia.options", name) for name in _OPTIONS if name not in _PATTERN_OPTIONS},
    **{name: (f"marginalia.patterns.{module}", name) for name, module in _PATTERN_OPTIONS.items()},
    "make_pattern": ("marginalia.patterns", "make_pattern"),
    "segment_text": ("marginalia.ingest.segment", "segment_text"),
    # earlier names, kept working
    "load_generator": ("marginalia.models", "load_generator"),
    "read_document": ("marginalia.ingest.loaders", "read_document"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'marginalia' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = ["__version__", *_APP, *_OPTIONS, "make_pattern", "segment_text"]
