"""Composing: suggestions for a text being written, with a memory drawn from a collection; and tuning the
client that writes them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BackendError, UserError
from ..models.base import Generator
from ..openmp import late_notice
from ..options import NO_REPEAT_NGRAM, ComposeOptions, TuneDataOptions, TuneOptions
from .indexing import Progress, check_paths, open_collection
from .loading import load_model

if TYPE_CHECKING:
    from ..compose import Composer
    from ..compose.events import Listener
    from ..compose.tuning import DataReport, TuneReport
    from ..index.schema import DocumentInfo
    from ..index.store import Collection

log = logging.getLogger("marginalia.app")


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
    from ..compose import MEMORY_MODES, CompletionClient, Composer, forks_share_cache
    from ..models.base import CachingGenerator, GenerationParams

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
    from ..compose import MEMORY_MODES
    from ..compose.tuning import make_examples
    from ..ingest.loaders import load_paths

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


def check_tuning(data: str | Path) -> None:
    """Fail at once, before a model loads, where `tune_client` could not run: torch or peft missing, no
    readable tuning data at ``data``.

    Raises:
        MissingDependency: torch or peft (the message has the pip command).
        UserError: no tuning data there.
    """
    from ..compose.tuning import read_examples
    from ..compose.tuning.train import import_peft
    from ..models.hf.backend import import_torch

    import_torch()
    import_peft()
    read_examples(data)


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
    from ..compose.tuning import read_examples, tune

    examples = read_examples(data)
    if not examples:
        raise UserError(f"{data} holds no tuning examples; make them with 'marginalia tune data'")
    return tune(examples, generator, tuned_folder(data, out, home), options, data_path=data, on_step=on_step,
                log=log)


def tuned_folder(data: str | Path, out: str | Path | None = None, home: str | Path | None = None) -> Path:
    """The folder `tune_client` writes: ``out``, or ``<home>/tuned/<data's name>``."""
    from ..home import resolve_home

    return Path(out).expanduser() if out is not None else resolve_home(home) / "tuned" / Path(data).stem


def _names(document: DocumentInfo, given: Sequence[str]) -> bool:
    """Whether one of ``given`` (a path, source or document id) names this document: its id, its source, a
    path it may have been indexed under (`names_for`), or the file it was indexed from by an absolute path."""
    from ..ingest.loaders import names_for

    for name in given:
        if name == document.doc_id or document.source in names_for(name):
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
