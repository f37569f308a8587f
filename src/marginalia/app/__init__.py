"""The use-cases, written once: load a model, ask a text, a file or a collection, manage and index collections,
generate questions, compose. The CLI, the benchmark runner and the HTTP service only translate to and from these
functions, and reach the layers below (index, ingest, patterns, models) through this package only.

Every way of reading takes its options record (`AutoOptions`, `WimOptions`, `LcOptions`, `RagOptions`, a
registered pattern's own, and `CollectionOptions` for what a collection contributes; none: the route by size,
`default_options`); long work reports progress through callbacks. The registry of ways of reading
(`pattern_specs`, `pattern_spec`, `needs_embedder`) is what the front ends derive their flags, bodies and
choices from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..models.base import CachingGenerator, GenerationParams, Generator, close_stream
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

if TYPE_CHECKING:  # types the front ends name in annotations (``as``: re-exported)
    from ..index.embedders import Embedder as Embedder
    from ..index.schema import CollectionInfo as CollectionInfo
    from ..index.schema import DocumentInfo as DocumentInfo
    from ..index.store import Collection as Collection
    from ..patterns import Run as Run

__all__ = [
    # loading
    "BACKENDS", "DEFAULT_EMBEDDER", "DEVICES", "CachingGenerator", "GenerationParams", "Generator", "close_stream",
    "demo", "load_embedder", "load_model", "model_folder", "model_server_command", "model_specs",
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
    "list_collections", "open_collection", "section_outline", "upload_suffix",
    # composing
    "check_tuning", "compose", "compose_sources", "tune_client", "tuned_folder", "tuning_data",
]
