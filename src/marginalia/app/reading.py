"""Asking: a text, a file or a collection, with the pattern an options record describes; WiM from a
stored reading of the document when there is one. A reading that names no pattern takes the route by size
(`default_options`): auto for a collection or a long text, WiM for a short one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..models.base import Generator
from ..models.snapshots import DEFAULT_MAX_BYTES
from ..options import ROUTE_TOKENS, CollectionOptions, PatternOptions, RunSettings
from ..patterns import registry
from ..patterns.auto import AutoOptions
from ..patterns.wim import WimOptions
from ..records import Answer, Document, Section
from .indexing import open_collection

if TYPE_CHECKING:
    from ..index.embedders import Embedder
    from ..index.store import Collection
    from ..models.snapshots import SnapshotStore
    from ..patterns import Pattern, Run
    from ..patterns.wim import WimReader

#: the most disk the stored WiM readings take by default (`document_cache`)
DEFAULT_CACHE_BYTES = DEFAULT_MAX_BYTES


def check_question(question: str) -> None:
    """Refuse an empty question (a `UserError`), before anything slow is loaded."""
    from ..patterns.base import check_question as check

    check(question)


def pattern(options: PatternOptions | None, generator: Generator, embedder: Embedder | None = None) -> Pattern:
    """The pattern an options record describes (WiM with its defaults when None: a pattern is built before
    it is given what it reads, so the route by size, `default_options`, is not its to take)."""
    return registry.build(options if options is not None else WimOptions(), generator, embedder=embedder)


def default_options(text: str | None, generator: Generator, options: AutoOptions | None = None) -> PatternOptions:
    """The options of a reading that names no pattern, by the size of what it reads: ``options`` (auto's
    defaults when None) for a collection (``text`` None) or a text of more than `ROUTE_TOKENS` of
    ``generator``'s tokens; their WiM part for a shorter text, which WiM reads whole for a few margins."""
    options = options if options is not None else AutoOptions()
    if text is None or generator.tokenizer.count(text) > ROUTE_TOKENS:
        return options
    return options.wim_options()


def document_cache(home: str | Path | None = None, max_bytes: int | None = None) -> SnapshotStore:
    """The store of full WiM readings under the home directory, bounded to ``max_bytes`` (least recently
    used dropped first)."""
    from ..models.snapshots import SnapshotStore

    return SnapshotStore.at_home(home, max_bytes or DEFAULT_CACHE_BYTES)


def reader(text: str, options: WimOptions | None = None, *, generator: Generator, source: str = "text",
           cache: SnapshotStore | None = None) -> WimReader:
    """A document read once with WiM and asked many questions (``reader.ask(question)`` gives a `Run`).

    With ``cache``, a full reading is stored there and a later reader of the same document and model
    starts from it.
    """
    from ..patterns.wim import WiM

    return WiM(generator, options or WimOptions()).reader(text, source, store=cache)


def ask_text(text: str, question: str, options: PatternOptions | None = None, *, generator: Generator,
             source: str = "text", embedder: Embedder | None = None, cache: SnapshotStore | None = None,
             temperature: float | None = None) -> Run:
    """Start reading ``text`` for ``question``; iterate the returned `Run` for events, `Run.stop()` to stop.

    With no ``options``, the route by size (`default_options`): auto for a text of more than a few WiM
    segments, WiM for a shorter one. With ``cache`` (wim, and auto's WiM reading), the reading is taken from
    a stored one when there is one, and stored once the whole document is read, so a later question
    prefills no document token. ``temperature`` samples the answer (default: the pattern's, greedy).

    Raises:
        UserError: an empty question or text, options the model cannot serve (e.g. WiM without a KV cache).
        ContextOverflow: lc (or wim) and the text do not fit the model's window.
    """
    settings = RunSettings(temperature=temperature)
    if options is None:
        check_question(question)  # before counting a long text's tokens
        options = default_options(text, generator)
    return registry.read_text(options, generator, text, question, source=source, embedder=embedder, cache=cache,
                              settings=settings)


def read_file(path: str | Path) -> Document:
    """Load a document (pdf, markdown, text, html), or standard input for ``-``."""
    from ..ingest.loaders import read_document

    return read_document(path)


def ask_file(path: str | Path, question: str, options: PatternOptions | None = None, *, generator: Generator,
             embedder: Embedder | None = None, cache: SnapshotStore | None = None) -> Run:
    """Load the document at ``path`` (``-``: standard input), then `ask_text` it."""
    check_question(question)  # before reading a large file
    doc = read_file(path)
    return ask_text(doc.text, question, options, generator=generator, source=doc.source, embedder=embedder,
                    cache=cache)


def text_document(text: str, source: str = "text") -> Document:
    """A pasted text as a markdown document named ``source``."""
    from ..ingest.base import content_id

    return Document(source, text, content_id(text), format="markdown")


def document_sections(doc: Document) -> list[Section]:
    """A document's section tree, from its headings (the root first)."""
    from ..ingest.sections import parse_sections

    return parse_sections(doc)


def locate(answer: Answer, doc: Document, sections: Sequence[Section]) -> Answer:
    """The answer with each reference into ``doc`` given its section path and page, where it has none."""
    from dataclasses import replace

    from ..ingest.sections import section_at

    refs = []
    for ref in answer.references:
        if ref.source == doc.source and not ref.section_path:
            section = section_at(list(sections), ref.start)
            ref = replace(ref, section_path=section.path if section is not None else (),
                          page=ref.page if ref.page is not None else doc.page_at(ref.start))
        refs.append(ref)
    return replace(answer, references=tuple(refs))


def collection_reader(collection: Collection | str, options: PatternOptions | None = None,
                      reading: CollectionOptions | None = None, *, generator: Generator,
                      home: str | Path | None = None) -> Pattern:
    """A reader that answers from a collection (its ``ask(question, source, settings)`` starts a `Run`): the
    retrieval policy gathers references, a pattern reads them, as its registration says.

    ``rag`` answers from the retrieved chunks (its ``top_k`` hits), ``lc`` and ``wim`` read the retrieved
    sections (or what ``reading.scope`` says); ``auto`` (the default) answers as rag does, then reads as wim
    does where rag's answer does not stand. For lc and rag, the references are cut to what fits the window
    beside the prompt and the answer. With no ``options``, auto reads with the collection's reading profile for
    ``generator``'s model where it has one (`profiles.default_reading`; the route names it), else its defaults.
    """
    from .profiles import default_reading

    reading = reading if reading is not None else CollectionOptions()
    store = open_collection(collection, home=home) if isinstance(collection, str) else collection
    note = None
    if options is None:
        chosen = default_reading(store, generator.name)
        options, note = chosen.options, chosen.note
    reader: Pattern = registry.collection_reader(store, options, reading, generator, note=note)
    return reader


def ask_collection(collection: Collection | str, question: str, options: PatternOptions | None = None,
                   reading: CollectionOptions | None = None, *, generator: Generator,
                   home: str | Path | None = None, temperature: float | None = None) -> Run:
    """Start answering ``question`` from a collection (see `collection_reader`: auto, with the collection's
    reading profile where it has one, with no ``options``; ``temperature`` as in `ask_text`)."""
    check_question(question)
    store = open_collection(collection, home=home) if isinstance(collection, str) else collection
    reader: Any = collection_reader(store, options, reading, generator=generator)
    return reader.ask(question, source=store.name, settings=RunSettings(temperature=temperature))


def pattern_specs() -> list[registry.PatternSpec]:
    """Every way of reading the registry knows (`marginalia.patterns.registry`): the built-ins, then those
    registered from other packages. The front ends derive their flags, bodies and choices from these."""
    return registry.specs()


def pattern_spec(name: str) -> registry.PatternSpec:
    """The registered pattern called ``name`` (a `UserError` naming the known ones when there is none)."""
    return registry.get(name)


def pattern_options(name: str, **values: object) -> PatternOptions:
    """The options record of the pattern ``name`` from ``values`` (a `UserError` for a bad one)."""
    return registry.pattern_options(name, **values)


def needs_embedder(options: PatternOptions | str) -> bool:
    """Whether reading a text with this pattern (a record, or a name) needs an embedder: the one rule the
    CLI, the service and the benchmark runner load one by."""
    return registry.needs_embedder(options)
