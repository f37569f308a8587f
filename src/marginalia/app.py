"""The use-cases, written once: load a model, ask a text, a file or a collection, index paths, generate
questions, compose. The CLI, the benchmark runner and the HTTP service only translate to and from these functions.

Every way of reading takes its options record (`WimOptions`, `LcOptions`, `RagOptions`, and
`CollectionOptions` for what a collection contributes); long work reports progress through callbacks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import BackendError, NotFound, UserError
from .models.base import Generator
from .openmp import late_notice
from .options import (
    NO_REPEAT_NGRAM,
    ChunkingOptions,
    CollectionOptions,
    ComposeOptions,
    LcOptions,
    PatternOptions,
    RagOptions,
    TuneDataOptions,
    TuneOptions,
    WimOptions,
)
from .records import Chunk, Document, Section

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .compose import Composer
    from .compose.events import Listener
    from .compose.tuning import DataReport, TuneReport
    from .index.embedders import Embedder
    from .index.policy import Piece, Retrieval
    from .index.question_bank import BankReport
    from .index.schema import AddResult, DocumentInfo
    from .index.store import Collection
    from .ingest.loaders import LoadReport, Note, Skipped
    from .models.snapshots import SnapshotStore
    from .patterns import Pattern, Run
    from .patterns.collection import CollectionReader
    from .patterns.wim import WimReader

#: ``(done, total)`` of a long step
Progress = Callable[[int, int], None]
#: the embedder a new collection, or rag without one given, uses
DEFAULT_EMBEDDER = "minilm"


# -- models ----------------------------------------------------------------------------------------------


def load_model(spec: str = "smollm2", *, home: str | Path | None = None, device: str = "auto",
               backend: str = "auto", api_key: str | None = None,
               log: Callable[[str], None] | None = None) -> Generator:
    """Load the generator a spec names (see `marginalia.models.registry.known_specs`).

    Raises:
        UserError: an unknown or malformed spec (with a "did you mean"), a missing local file.
        MissingDependency: the backend's extra is not installed (the message has the pip command).
    """
    from .models import load_generator

    return load_generator(spec, home=home, device=device, log=log, backend=backend, api_key=api_key)


def load_embedder(spec: str = DEFAULT_EMBEDDER) -> Embedder:
    """Load an embedder: ``minilm`` (embedded), ``hashing`` or ``st:<local folder>``."""
    from .index.embedders import load_embedder as load

    return load(spec)


def demo() -> tuple[str, list[dict[str, Any]]]:
    """The bundled sample report (markdown) and its questions (``question``, ``answer``, ``position``)."""
    base = resources.files("marginalia").joinpath("data", "demo")
    text = base.joinpath("harbour_report.md").read_text("utf-8")
    questions = json.loads(base.joinpath("harbour_report.questions.json").read_text("utf-8"))
    return text, questions


# -- asking ----------------------------------------------------------------------------------------------


def pattern(options: PatternOptions | None, generator: Generator, embedder: Embedder | None = None) -> Pattern:
    """The pattern an options record describes (WiM with its defaults when None)."""
    from .patterns import make_pattern

    return make_pattern(options if options is not None else WimOptions(), generator, embedder=embedder)


def document_cache(home: str | Path | None = None, max_bytes: int | None = None) -> SnapshotStore:
    """The store of full WiM readings under the home directory, bounded to ``max_bytes`` (least recently
    used dropped first)."""
    from .models.snapshots import DEFAULT_MAX_BYTES, SnapshotStore

    return SnapshotStore.at_home(home, max_bytes or DEFAULT_MAX_BYTES)


def reader(text: str, options: WimOptions | None = None, *, generator: Generator, source: str = "text",
           cache: SnapshotStore | None = None) -> WimReader:
    """A document read once with WiM and asked many questions (``reader.ask(question)`` gives a `Run`).

    With ``cache``, a full reading is stored there and a later reader of the same document and model
    starts from it.
    """
    from .patterns.wim import WiM

    return WiM(generator, options or WimOptions()).reader(text, source, store=cache)


def ask_text(text: str, question: str, options: PatternOptions | None = None, *, generator: Generator,
             source: str = "text", embedder: Embedder | None = None, cache: SnapshotStore | None = None) -> Run:
    """Start reading ``text`` for ``question``; iterate the returned `Run` for events, `Run.stop()` to stop.

    With ``cache`` (WiM only), the reading is taken from a stored one when there is one, and stored once
    the whole document is read, so a later question prefills no document token.

    Raises:
        UserError: an empty question or text, options the model cannot serve (e.g. WiM without a KV cache).
        ContextOverflow: lc (or wim) and the text do not fit the model's window.
    """
    wim = options if options is not None else WimOptions()
    if cache is not None and isinstance(wim, WimOptions):
        return reader(text, wim, generator=generator, source=source, cache=cache).ask(question)
    return pattern(options, generator, embedder).run(text, question, source=source)


def read_file(path: str | Path) -> Document:
    """Load a document (pdf, markdown, text, html), or standard input for ``-``."""
    from .ingest.loaders import read_document

    return read_document(path)


def ask_file(path: str | Path, question: str, options: PatternOptions | None = None, *, generator: Generator,
             embedder: Embedder | None = None, cache: SnapshotStore | None = None) -> Run:
    """Load the document at ``path`` (``-``: standard input), then `ask_text` it."""
    from .patterns.base import check_question

    check_question(question)  # before reading a large file
    doc = read_file(path)
    return ask_text(doc.text, question, options, generator=generator, source=doc.source, embedder=embedder,
                    cache=cache)


def open_collection(name: str, *, home: str | Path | None = None) -> Collection:
    """An existing collection (a `UserError` naming the known ones when there is none by that name)."""
    from .index.store import Collection

    return Collection.open(name, home=home)


def collection_reader(collection: Collection | str, options: PatternOptions | None = None,
                      reading: CollectionOptions | None = None, *, generator: Generator,
                      home: str | Path | None = None) -> CollectionReader:
    """A reader that answers from a collection: the retrieval policy gathers references, a pattern reads them.

    ``rag`` answers from the retrieved chunks (its ``top_k`` hits), ``lc`` and ``wim`` read the retrieved
    sections (or what ``reading.scope`` says). For lc and rag, the references are cut to what fits the
    window beside the prompt and the answer.
    """
    from dataclasses import replace

    from .index.policy import RetrievalPolicy, piece_header, retrieve
    from .patterns import make_pattern
    from .patterns.collection import CollectionReader
    from .patterns.long_context import LongContext

    options = options if options is not None else WimOptions()
    reading = reading if reading is not None else CollectionOptions()
    store = open_collection(collection, home=home) if isinstance(collection, str) else collection
    policy = RetrievalPolicy(
        certain=reading.certain, uncertain=reading.uncertain,
        k=options.top_k if isinstance(options, RagOptions) else reading.hits,
        scope=reading.scope_for(options.pattern), max_context_tokens=reading.max_context_tokens,
        mode=reading.search, use_questions=reading.use_questions,
    )
    count = generator.tokenizer.count

    def header(piece: Piece) -> int:  # each piece is read under a line naming it
        return count(piece_header(piece))

    if options.pattern == "wim":
        inner = make_pattern(options, generator)

        def gather(question: str) -> Retrieval:
            return retrieve(store, question, policy, count, header)
    else:  # one prompt: the references must fit the window beside the prompt and the answer
        intro = "passages_intro" if options.pattern == "rag" else "document_intro"
        lc = LongContext(generator, LcOptions(max_new_tokens=options.max_new_tokens), intro=intro)
        inner = lc

        def gather(question: str) -> Retrieval:
            room = generator.context_window - lc.prompt_overhead(question)
            budget = min(policy.max_context_tokens or room, room)
            return retrieve(store, question, replace(policy, max_context_tokens=budget), count, header)

    return CollectionReader(inner, gather, name=options.pattern)


def ask_collection(collection: Collection | str, question: str, options: PatternOptions | None = None,
                   reading: CollectionOptions | None = None, *, generator: Generator,
                   home: str | Path | None = None) -> Run:
    """Start answering ``question`` from a collection (see `collection_reader`)."""
    from .patterns.base import check_question

    check_question(question)
    store = open_collection(collection, home=home) if isinstance(collection, str) else collection
    reader = collection_reader(store, options, reading, generator=generator)
    return reader.ask(question, source=store.name)


# -- indexing --------------------------------------------------------------------------------------------


def chunk_document(doc: Document, count_tokens: Callable[[str], int],
                   chunking: ChunkingOptions | None = None) -> tuple[list[Section], list[Chunk]]:
    """A document's section tree and its section-bounded chunks (sizes counted by ``count_tokens``)."""
    from .ingest.chunking import chunk_sections
    from .ingest.sections import parse_sections

    chunking = chunking or ChunkingOptions()
    sections = parse_sections(doc)
    chunks = chunk_sections(doc, sections, count_tokens, min_tokens=chunking.min_tokens,
                            max_tokens=chunking.max_tokens, overlap_tokens=chunking.overlap_tokens)
    return sections, chunks


@dataclass(frozen=True)
class Indexed:
    """One document's outcome in `index_paths`."""

    document: Document
    sections: tuple[Section, ...]
    result: AddResult


@dataclass
class IndexReport:
    """What `index_paths` did: per document, what could not be read, and notes from the loaders."""

    collection: str
    indexed: list[Indexed] = field(default_factory=list)
    skipped: tuple[Skipped, ...] = ()
    notes: tuple[Note, ...] = ()

    def counts(self) -> dict[str, int]:
        """How many documents ended in each status (added, replaced, unchanged, duplicate, skipped)."""
        out: dict[str, int] = {}
        for item in self.indexed:
            out[item.result.status] = out.get(item.result.status, 0) + 1
        if self.skipped:
            out["skipped"] = len(self.skipped)
        return out


def check_paths(paths: Sequence[str | Path]) -> None:
    """Refuse a path that does not exist (before anything slow is loaded)."""
    if not paths:
        raise UserError("give at least one file or folder to index")
    for given in paths:
        if not Path(given).expanduser().exists():
            raise UserError(f"no file or folder at {given}")


def index_paths(
    paths: Sequence[str | Path],
    collection: str | Collection,
    *,
    count_tokens: Callable[[str], int],
    home: str | Path | None = None,
    embedder: str | Embedder = DEFAULT_EMBEDDER,
    chunking: ChunkingOptions | None = None,
    recursive: bool = True,
    source: str | None = None,
    on_file: Callable[[int, int, str], None] | None = None,
    on_document: Callable[[Document, int], Progress | None] | None = None,
    on_indexed: Callable[[Indexed], None] | None = None,
) -> IndexReport:
    """Load files and folders, cut each document into sections and chunks, add them to a collection.

    The collection is created when missing (with ``embedder``; an existing one keeps its own). Re-indexing
    unchanged files does nothing; a changed file replaces its old version; each document is committed as
    it is added, so an interrupted run keeps what was indexed before it.

    Args:
        paths: files and folders (folders are walked; into subfolders when ``recursive``).
        collection: the collection's name, or an open collection (used as it is, with its embedder).
        count_tokens: the model tokenizer's count, for chunk sizes.
        home: marginalia's home directory.
        embedder: a spec or an embedder, for a new collection.
        chunking: chunk sizes.
        source: the name to index the one file in ``paths`` under, instead of its path (an uploaded file's
            own name, not its saved copy's); that file then raises when it cannot be read, where files
            given by path are skipped with the reason.
        on_file: ``(done, total, path)`` as files are loaded.
        on_document: called with each document and its chunk count before it is added; may return a
            ``(done, total)`` callback for the chunks embedded.
        on_indexed: called with each document's outcome.

    Raises:
        UserError: a path that does not exist, a bad collection name, bad chunk sizes, a ``source`` given
            with other than one file.
        IngestError: with ``source``, the file cannot be read (the message names ``source``, not the path).
    """
    from .index.store import Collection, collections_dir
    from .ingest.loaders import load_paths

    check_paths(paths)
    chunking = chunking or ChunkingOptions()
    if isinstance(collection, str):
        loaded_embedder = None
        if not (collections_dir(home) / collection).exists():
            loaded_embedder = load_embedder(embedder) if isinstance(embedder, str) else embedder
        store = Collection.open(collection, home=home, create=True, embedder=loaded_embedder)
    else:
        store = collection
    if source is None:
        loaded = load_paths(paths, recursive=recursive, progress=on_file)
    else:
        loaded = _load_as(paths, source, on_file)
    report = IndexReport(store.name, skipped=loaded.skipped, notes=loaded.notes)
    for doc in loaded.documents:
        sections, chunks = chunk_document(doc, count_tokens, chunking)
        progress = on_document(doc, len(chunks)) if on_document else None
        result = store.add_document(doc, sections, chunks, progress=progress)
        item = Indexed(doc, tuple(sections), result)
        report.indexed.append(item)
        if on_indexed:
            on_indexed(item)
    if any(i.result.status in ("added", "replaced") for i in report.indexed):
        store.optimize()  # fold the new rows into the BM25 (and vector) indices
    return report


def _load_as(paths: Sequence[str | Path], source: str, on_file: Callable[[int, int, str], None] | None) -> LoadReport:
    """The one file in ``paths``, loaded as the document ``source``."""
    from .ingest.loaders import LoadReport, Note, load_document

    if len(paths) != 1 or not Path(paths[0]).expanduser().is_file():
        raise UserError(f"a source name ({source!r}) names one document: give exactly one file with it, "
                        f"not {', '.join(str(p) for p in paths)}")
    notes: list[str] = []
    doc = load_document(paths[0], notes, source=source)
    if on_file:
        on_file(1, 1, source)
    return LoadReport((doc,), notes=tuple(Note(source, note) for note in notes))


# -- the question bank -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DocumentQuestions:
    """The question pairs written for one document, and how many of them were new to the collection."""

    source: str
    report: BankReport
    new: int


def generate_questions(
    collection: Collection | str,
    generator: Generator,
    *,
    home: str | Path | None = None,
    density: str = "sparse",
    long_answers: bool = False,
    retries: int = 2,
    documents: Sequence[str] | None = None,
    on_document: Callable[[str], Progress | None] | None = None,
    on_written: Callable[[DocumentQuestions], None] | None = None,
) -> list[DocumentQuestions]:
    """Write question-answer pairs for a collection's documents and store them in its question bank.

    Args:
        collection: the collection or its name.
        generator: the model that writes the pairs.
        density: ``sparse`` (about one pair per paragraph of each top-level section) or ``dense`` (one per
            chunk, as indexed).
        long_answers: also ask for a one-to-two-sentence answer.
        retries: tries after a malformed reply.
        documents: only these documents (paths or ids).
        on_document: called with each document's source; may return a ``(done, total)`` request callback.
        on_written: called with each document's outcome, once stored.

    Raises:
        UserError: an unknown document, or an empty collection.
    """
    from .index.question_bank import BankReport, QuestionWriter

    store = open_collection(collection, home=home) if isinstance(collection, str) else collection
    infos = store.documents()
    if documents:
        wanted = set(documents)
        infos = [d for d in infos if d.source in wanted or d.doc_id in wanted]
        missing = wanted - {d.source for d in infos} - {d.doc_id for d in infos}
        if missing:
            name = sorted(missing)[0]
            raise NotFound(f"collection {store.name!r} has no document {name!r}", "document", name)
    if not infos:
        raise UserError(f"collection {store.name!r} holds no documents; index some first")
    writer = QuestionWriter(generator, retries=retries, long_answers=long_answers)
    out = []
    for info in infos:
        doc = store.document(info.doc_id)
        progress = on_document(info.source) if on_document else None
        report = writer.write(doc, store.sections(info.doc_id), store.chunks(info.doc_id), density=density,
                              progress=progress, report=BankReport())
        written = DocumentQuestions(info.source, report, store.add_questions(report.pairs))
        out.append(written)
        if on_written:
            on_written(written)
    return out


# -- composing -------------------------------------------------------------------------------------------


def compose(collection: Collection | str, options: ComposeOptions | None = None, *, generator: Generator,
            standby: Generator | None = None, memory_generator: Generator | None = None,
            loader: Callable[[str], Generator] | None = None, home: str | Path | None = None,
            exclude: Sequence[str] = (), listeners: Sequence[Listener] = ()) -> Composer:
    """Suggestions for a text being written, from ``generator``, with a memory drawn from a collection.

    Call ``composer.edit(text)`` as the text changes and ``composer.suggest(text)`` (or ``stream``) for a
    suggestion; new memory is asked for, written and prepared in the background. Close it when done.

    Args:
        collection: the collection (or its name) memory is retrieved from.
        options: thresholds, memory and suggestion options.
        generator: the client model (one that keeps a KV cache).
        standby: a second load of the client model for preparing new memory beside the completions; made
            with ``loader`` when the client's forks share one cache (llama.cpp), else a fork.
        memory_generator: the model that writes memory; by default ``options.memory_model`` (else the
            client's spec) loaded with ``loader``.
        loader: loads a model spec (default: `load_model` under ``home``).
        exclude: the document being written, by path, source or id: never retrieved.
        listeners: called with every event (from background threads too).

    Raises:
        UserError: an empty collection, one that holds only the document being written, a client model
            without a KV cache, a model that cannot be loaded (the message names which).
        BackendError: a model failed while loading.
    """
    from .compose import MEMORY_MODES, CompletionClient, Composer, forks_share_cache
    from .models.base import CachingGenerator, GenerationParams

    options = options if options is not None else ComposeOptions()
    store = open_collection(collection, home=home) if isinstance(collection, str) else collection
    excluded = compose_sources(store, exclude)
    if not isinstance(generator, CachingGenerator):
        raise UserError(f"composition needs a client model whose KV cache it can reuse between keystrokes; "
                        f"{generator.name} does not offer one")
    guard = options.no_repeat_ngram
    if guard is None:  # the default: guard where the model can mask tokens, as a server cannot
        guard = NO_REPEAT_NGRAM if generator.supports_copy else 0
    generator.check_decoding(GenerationParams(no_repeat_ngram=guard))  # before loading more
    load = loader or (lambda spec: load_model(spec, home=home))
    if standby is None and forks_share_cache(generator):
        standby = _load_role(load, generator.name, "a second copy of the client model")
    if memory_generator is None:
        memory_generator = _load_role(load, options.memory_model or generator.name, "the memory model")
    if memory_generator is generator or memory_generator is standby:
        raise UserError("the memory model writes beside the client: give it a model object of its own")
    client = CompletionClient(generator, standby=standby, suggestion_tokens=options.suggestion_tokens,
                              no_repeat_ngram=guard)
    memory = MEMORY_MODES[options.memory_mode](
        store, memory_generator, hits=options.hits, search=options.search, min_similarity=options.min_similarity,
        exclude={*excluded, *exclude}, item_tokens=options.item_tokens)
    composer = Composer(client, memory, threshold=options.threshold, memory_size=options.memory_size,
                        memory_timeout=options.memory_timeout, debounce=options.debounce, listeners=listeners,
                        give_way=options.give_way)
    notice = late_notice()
    if notice is not None:  # said once per composer, as a failing memory model is
        log.warning(notice)
        composer.notices.append(notice)
    return composer


def compose_sources(store: Collection, exclude: Sequence[str] = ()) -> set[str]:
    """Check that a collection has documents to draw memory from besides the one being written; return the
    ids of those that ``exclude`` names (by path, source or id).

    Raises:
        UserError: the collection holds no documents, or only the one being written.
    """
    documents = store.documents()
    if not documents:
        raise UserError(f"collection {store.name!r} holds no documents; index some into it first")
    excluded = {d.doc_id for d in documents if _names(d, exclude)}
    if len(excluded) == len(documents):
        raise UserError(f"collection {store.name!r} holds only the document being written; index other "
                        "documents into it to draw memory from")
    return excluded


# -- tuning the composition client ---------------------------------------------------------------------


def tuning_data(paths: Sequence[str | Path], out: str | Path, options: TuneDataOptions | None = None,
                compose: ComposeOptions | None = None, *, label_model: Generator,
                collection: Collection | str | None = None, memory_generator: Generator | None = None,
                home: str | Path | None = None, limit: int | None = None,
                progress: Progress | None = None) -> DataReport:
    """Make tuning data for the composition client from the texts at ``paths`` (resumable: examples already
    in ``out`` are kept and skipped).

    Each text is cut into prefixes; the memory for a prefix is retrieved from ``collection`` and written by
    the memory model as the composer would (the text's own document never among its sources), and the label
    is ``label_model``'s continuation of the client's prompt.

    Args:
        paths: files and folders of texts to cut.
        out: the JSONL file of examples.
        options: where texts are cut, and the labels' length.
        compose: the memory settings (mode, hits, search, similarity, item tokens).
        label_model: the larger model that writes the labels.
        collection: where memory is retrieved from (None: examples without memory).
        memory_generator: the model that writes memory (default: ``label_model``).
        limit: at most this many examples in ``out``.
        progress: ``(done, total)`` over the cuts.

    Raises:
        UserError: a missing path, no readable text, an empty collection, a file of other settings.
    """
    from .compose import MEMORY_MODES
    from .compose.tuning import make_examples
    from .ingest.loaders import load_paths

    check_paths(paths)
    compose = compose or ComposeOptions()
    loaded = load_paths(paths)
    if not loaded.documents:
        why = "; ".join(f"{s.path}: {s.reason}" for s in loaded.skipped[:3])
        raise UserError("no readable text among the paths given" + (f" ({why})" if why else ""))
    memory = None
    if collection is not None:
        store = open_collection(collection, home=home) if isinstance(collection, str) else collection
        if not store.documents():
            raise UserError(f"collection {store.name!r} holds no documents; index the texts memory is drawn "
                            "from into it first")
        memory = MEMORY_MODES[compose.memory_mode](
            store, memory_generator or label_model, hits=compose.hits, search=compose.search,
            min_similarity=compose.min_similarity, item_tokens=compose.item_tokens)
    return make_examples(loaded.documents, label_model, out, options, memory=memory, limit=limit,
                         progress=progress)


def tune_client(data: str | Path, out: str | Path | None = None, options: TuneOptions | None = None, *,
                generator: Generator, home: str | Path | None = None,
                on_step: Callable[[int, int, float], None] | None = None,
                log: Callable[[str], None] | None = None) -> TuneReport:
    """Tune the composition client ``generator`` with LoRA on the examples in ``data``; the tuned model
    loads by the report's ``spec`` (``hf:<out>/model``).

    Args:
        data: the JSONL file `tuning_data` wrote.
        out: the folder to write (default: ``<home>/tuned/<data's name>``).
        options: LoRA settings, steps, batch, held-out share.
        generator: the client, in process on transformers.

    Raises:
        UserError: no tuning data there, a client not on transformers, no usable examples.
        MissingDependency: peft (``pip install 'marginalia[tune]'``) or torch is missing.
    """
    from .compose.tuning import read_examples, tune

    examples = read_examples(data)
    if not examples:
        raise UserError(f"{data} holds no tuning examples; make them with 'marginalia tune data'")
    return tune(examples, generator, tuned_folder(data, out, home), options, data_path=data, on_step=on_step,
                log=log)


def tuned_folder(data: str | Path, out: str | Path | None = None, home: str | Path | None = None) -> Path:
    """The folder `tune_client` writes: ``out``, or ``<home>/tuned/<data's name>``."""
    from .home import resolve_home

    return Path(out).expanduser() if out is not None else resolve_home(home) / "tuned" / Path(data).stem


def _names(document: DocumentInfo, given: Sequence[str]) -> bool:
    """Whether one of ``given`` (a path, source or document id) names this document."""
    for name in given:
        if name in (document.doc_id, document.source):
            return True
        try:
            if Path(name).expanduser().resolve() == Path(document.source).expanduser().resolve():
                return True
        except (OSError, ValueError):
            continue
    return False


def _load_role(load: Callable[[str], Generator], spec: str, role: str) -> Generator:
    """Load a model for a role, saying which role a failure is about."""
    try:
        return load(spec)
    except UserError as exc:
        raise UserError(f"{role} ({spec}) could not be loaded: {exc}") from exc
    except BackendError as exc:
        raise BackendError(f"{role} ({spec}) could not be loaded: {exc}") from exc
