"""The use-cases, written once: load a model, ask a text, a file or a collection, manage and index collections,
generate questions, compose. The CLI, the benchmark runner and the HTTP service only translate to and from these
functions, and reach the layers below (index, ingest, patterns, models) through this package only.

Every way of reading takes its options record (`AutoOptions`, `WimOptions`, `LcOptions`, `RagOptions`, a
registered pattern's own, and `CollectionOptions` for what a collection contributes; none: the route by size,
`default_options`); long work reports progress through callbacks. The registry of ways of reading
(`pattern_specs`, `pattern_spec`, `needs_embedder`) is what the front ends derive their flags, bodies and
choices from.

The benchmark harness (`marginalia.bench`) reads with more of the layers below than the use-cases show, and gets
that here too: the generator's types, the reading patterns' classes, the question writer, the document loaders
and the cores a backend may use (those in `_LAZY`, loaded when first asked for).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..ingest.isolated import stop_conversions
from ..models.base import CachingGenerator, GenerationParams, Generator, Message, Tokenizer, close_stream
from ..models.openai.spec import public_spec
from ..models.registry import BACKENDS, DEVICES
from ..patterns.auto import AutoOptions
from ..patterns.long_context import LcOptions
from ..patterns.rag import RagOptions
from ..patterns.registry import PatternSpec
from ..patterns.wim import WimOptions
from .composing import check_tuning, compose, compose_sources, tune_client, tuned_folder, tuning_data
from .indexing import (
    DocumentQuestions,
    Indexed,
    IndexReport,
    Progress,
    check_paths,
    chunk_document,
    collection_exists,
    create_collection,
    delete_collection,
    export_questions,
    generate_questions,
    index_paths,
    list_collections,
    open_collection,
    section_outline,
    upload_suffix,
)
from .loading import (
    DEFAULT_EMBEDDER,
    demo,
    load_embedder,
    load_model,
    model_folder,
    model_server_command,
    model_specs,
)
from .reading import (
    DEFAULT_CACHE_BYTES,
    ask_collection,
    ask_file,
    ask_text,
    check_question,
    collection_reader,
    default_options,
    document_cache,
    document_sections,
    locate,
    needs_embedder,
    pattern,
    pattern_options,
    pattern_spec,
    pattern_specs,
    read_file,
    reader,
    text_document,
)

if TYPE_CHECKING:  # types the front ends name in annotations, and the names in _LAZY (``as``: re-exported)
    from ..index.embedders import CachedEmbedder as CachedEmbedder
    from ..index.embedders import Embedder as Embedder
    from ..index.embedders import minilm_dir as minilm_dir
    from ..index.question_bank import BankReport as BankReport
    from ..index.question_bank import QuestionWriter as QuestionWriter
    from ..index.question_bank import WrittenQuestion as WrittenQuestion
    from ..index.schema import CollectionInfo as CollectionInfo
    from ..index.schema import DocumentInfo as DocumentInfo
    from ..index.store import Collection as Collection
    from ..ingest.chunking import paragraph_spans as paragraph_spans
    from ..ingest.loaders import load_document as load_document
    from ..ingest.loaders import load_paths as load_paths
    from ..ingest.sections import section_at as section_at
    from ..models.llamacpp.backend import usable_cores as usable_cores
    from ..patterns import Run as Run
    from ..patterns.auto import answer_signals as answer_signals
    from ..patterns.base import Pattern as Pattern
    from ..patterns.long_context import LongContext as LongContext
    from ..patterns.wim import REPEAT_REASON as REPEAT_REASON
    from ..patterns.wim import SharedReading as SharedReading
    from ..patterns.wim import WiM as WiM

#: the benchmark harness's names from the layers below, by the module that holds each (imported when first asked
#: for: some of those modules load numpy)
_LAZY = {
    "CachedEmbedder": "index.embedders", "Embedder": "index.embedders", "minilm_dir": "index.embedders",
    "BankReport": "index.question_bank", "QuestionWriter": "index.question_bank",
    "WrittenQuestion": "index.question_bank", "paragraph_spans": "ingest.chunking",
    "load_document": "ingest.loaders", "load_paths": "ingest.loaders", "section_at": "ingest.sections",
    "usable_cores": "models.llamacpp.backend",
    "answer_signals": "patterns.auto", "Pattern": "patterns.base", "LongContext": "patterns.long_context",
    "REPEAT_REASON": "patterns.wim",
    "SharedReading": "patterns.wim", "WiM": "patterns.wim",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"marginalia.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    # loading
    "BACKENDS", "DEFAULT_EMBEDDER", "DEVICES", "CachingGenerator", "GenerationParams", "Generator", "Message",
    "Tokenizer", "close_stream",
    "demo", "load_embedder", "load_model", "model_folder", "model_server_command", "model_specs", "public_spec",
    # reading
    "DEFAULT_CACHE_BYTES", "ask_collection", "ask_file", "ask_text", "check_question", "collection_reader",
    "default_options", "document_cache", "document_sections", "locate", "pattern", "read_file", "reader",
    "text_document",
    # the ways of reading
    "AutoOptions", "LcOptions", "PatternSpec", "RagOptions", "WimOptions", "needs_embedder", "pattern_options",
    "pattern_spec", "pattern_specs",
    # indexing
    "DocumentQuestions", "IndexReport", "Indexed", "Progress", "check_paths", "chunk_document", "collection_exists",
    "create_collection", "delete_collection", "export_questions", "generate_questions", "index_paths",
    "list_collections", "open_collection", "section_outline", "stop_conversions", "upload_suffix",
    # composing
    "check_tuning", "compose", "compose_sources", "tune_client", "tuned_folder", "tuning_data",
    # for the benchmark harness (`_LAZY`)
    "REPEAT_REASON", "BankReport", "CachedEmbedder", "Embedder", "LongContext", "Pattern", "QuestionWriter",
    "SharedReading", "WiM", "WrittenQuestion", "answer_signals", "load_document", "load_paths", "minilm_dir",
    "paragraph_spans", "section_at", "usable_cores",
]
