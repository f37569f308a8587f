"""The service's state and its adapter over `marginalia.app`: the model, the embedders, collections, the
model's worker, indexing jobs, chat and compose sessions, and how a request's target becomes a reading.

Everything a request sets (its options, its temperature) lands on objects built for that request. The
model is shared and used by one reading at a time, or, served by an engine that batches requests, by as
many side by side as it allows, each on a view of its own (see `worker`); the embedders and the model's
tokenizer are shared by those readings and the one indexing job that may run beside them (see `jobs`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from .. import app
from ..app import Generator
from ..errors import NotFound, UserError
from ..home import resolve_home
from ..options import ChunkingOptions, PatternOptions
from ..records import Document, Section
from .audit import Audit
from .compose import ComposeSession, ComposeSessions, ModelPool
from .errors import Conflict, Forbidden
from .eval_jobs import Answered, EvalJobBoard
from .jobs import STAGING, JobBoard, check_upload, display_name, index_upload
from .qa_jobs import QaJobBoard, worker_gate
from .schemas import ComposeSessionRequest, Target
from .sessions import SessionStore
from .settings import Settings
from .worker import ModelWorker, Prepared

if TYPE_CHECKING:
    from ..app import Collection, DocumentInfo, Embedder, Run
    from .auth import Principal

#: embedders a client may name for a new collection (a folder path would let it load files of the server's)
CLIENT_EMBEDDERS = ("minilm", "hashing")
#: the source name of a pasted text in references
PASTED = "text"


class Service:
    """What one server process holds. Blocking methods are called from threads, never the event loop.

    ``loader`` loads the models compose sessions borrow, by spec (default: `app.load_model` with the
    server's settings).
    """

    def __init__(self, settings: Settings, generator: Generator | None = None,
                 embedder: Embedder | None = None, loader: Callable[[str], Generator] | None = None) -> None:
        self.settings = settings
        self._generator = generator
        self._model_lock = threading.Lock()
        self._sized = False  # whether the worker runs as many readings at once as the model allows
        self._embedders: dict[str, Embedder] = {embedder.name: embedder} if embedder is not None else {}
        self._embedder_lock = threading.Lock()
        #: full WiM readings of documents, so a follow-up question costs only its margins (None: not kept)
        self.readings = app.document_cache(settings.home) if settings.cache_readings else None
        self.worker = ModelWorker(settings.queue_size)
        self.jobs = JobBoard(settings.max_jobs, resolve_home(settings.home) / STAGING, settings.upload_queue,
                             settings.upload_queue_bytes, workers=settings.index_workers)
        self.qa_jobs = QaJobBoard(settings.max_jobs)
        self.eval_jobs = EvalJobBoard(settings.max_jobs)
        self._pairs_lock = threading.Lock()  # one review rewrites a collection's QA file at a time
        self.sessions = SessionStore(settings.session_ttl, settings.max_sessions, max_bytes=settings.session_bytes)
        self.compose = ComposeSessions(settings.session_ttl, settings.max_compose_sessions,
                                       ModelPool(loader or self._load))
        self.audit = Audit(settings.home, questions=settings.audit_questions)

    # -- what is loaded once ------------------------------------------------------------------------------

    @property
    def generator(self) -> Generator:
        """The model, loaded on first use unless one was given; the worker then runs as many readings at
        once as it allows (`Generator.parallel_readings`)."""
        with self._model_lock:
            if self._generator is None:
                s = self.settings
                self._generator = app.load_model(s.model, home=s.home, device=s.device, backend=s.backend,
                                                 api_key=s.model_api_key)
            if not self._sized:
                self.worker.allow(self._generator.parallel_readings)
                self._sized = True
            return self._generator

    def reading_model(self) -> Generator:
        """The model for one reading, in the model's thread: the shared one where readings run one at a time,
        else a view of its own (`Generator.fork_reading`), whose stats count this reading's requests only."""
        model = self.generator
        return model.fork_reading() if self.worker.parallel > 1 else model

    def _load(self, spec: str) -> Generator:
        s = self.settings
        return app.load_model(spec, home=s.home, device=s.device, backend=s.backend, api_key=s.model_api_key)

    @property
    def model_name(self) -> str | None:
        return app.public_spec(self._generator.name) if self._generator is not None else None

    def embedder(self, spec: str | None = None) -> Embedder:
        """An embedder by spec (default: the server's), loaded once."""
        spec = spec or self.settings.embedder
        with self._embedder_lock:
            if spec not in self._embedders:
                self._embedders[spec] = app.load_embedder(spec)
            return self._embedders[spec]

    def shutdown(self) -> None:
        self.worker.shutdown()
        self.jobs.shutdown()
        self.qa_jobs.shutdown()
        self.eval_jobs.shutdown()
        self.compose.close()

    # -- question generation ---------------------------------------------------------------------------------

    def generate_pairs(self, collection: str, documents: list[str] | None, retries: int) -> dict[str, Any]:
        """Start a job that writes QA pairs about a collection's documents (`bench.own.generate_collection_pairs`)
        into its QA file; returns the job.

        Raises:
            NotFound: no such collection.
        """
        from ..bench.own import collection_pairs_path, generate_collection_pairs

        self.open_collection(collection)  # NotFound now, not in the job
        target = collection_pairs_path(collection, self.settings.home)

        def work(on_event: Callable[..., None]) -> dict[str, Any]:
            summary = generate_collection_pairs(collection, self.generator, target, home=self.settings.home,
                                                documents=documents, retries=retries, on_event=on_event,
                                                gate=worker_gate(self.worker))
            return {"new_pairs": summary.new_pairs, "kinds": dict(summary.kinds), "documents": summary.documents,
                    "skipped_documents": summary.skipped_documents, "requests": summary.requests,
                    "resumed_requests": summary.resumed_requests, "dropped_pairs": summary.skipped_pairs}

        return self.qa_jobs.submit(collection, documents, work)

    # -- reviewing pairs and running readings on them ---------------------------------------------------------

    def _generating(self, collection: str) -> str | None:
        """The id of a question job that may still write into the collection's QA file, if any."""
        return next((j["id"] for j in self.qa_jobs.list() if j["collection"] == collection
                     and j["status"] in ("queued", "running")), None)

    def list_pairs(self, collection: str, who: Principal | None = None) -> dict[str, Any]:
        """A collection's QA pairs (`bench.own.collection_pairs_path`) with their counts by status, and the
        question job writing more, if one is."""
        from ..bench.own import STATUSES, collection_pairs_path, read_pairs

        self.check_collection(collection, who)
        pairs = read_pairs(collection_pairs_path(collection, self.settings.home))
        return {"collection": collection, "pairs": pairs,
                "counts": {s: sum(1 for p in pairs if p["status"] == s) for s in STATUSES},
                "generating": self._generating(collection)}

    def review_pair(self, collection: str, pair_id: str, status: str, question: str | None = None,
                    answer: str | None = None, who: Principal | None = None) -> dict[str, Any]:
        """Set a pair's status, with an edited question or answer (`bench.own.decide_pair`).

        Raises:
            NotFound: no such collection or pair.
            Conflict: a question job is writing into the collection's QA file (its appends and this rewrite
                would race).
        """
        from ..bench.own import collection_pairs_path, decide_pair

        self.check_collection(collection, who, write=True)
        with self._pairs_lock:
            job = self._generating(collection)
            if job is not None:
                raise Conflict(f"question job {job} is writing pairs into collection {collection!r}; review them "
                               f"when it has finished (GET /v1/qa-jobs/{job})")
            pair = decide_pair(collection_pairs_path(collection, self.settings.home), pair_id, status, question,
                               answer)
        self.audit.record(_actor(who), "review_pair", collection=collection, pair=pair_id, status=status)
        return pair

    def evaluate(self, collection: str, patterns: list[str], who: Principal | None = None) -> dict[str, Any]:
        """Start a job that answers the collection's accepted pairs with each of ``patterns`` (`eval_jobs`);
        returns the job.

        Raises:
            NotFound: no such collection.
            UserError: an unknown pattern, or no accepted pair to answer.
        """
        from ..bench.own import collection_pairs_path, read_pairs

        self.check_collection(collection, who, write=True)
        chosen = list(dict.fromkeys(patterns))
        for name in chosen:
            app.pattern_spec(name)  # a UserError naming the known ones
        pairs = [p for p in read_pairs(collection_pairs_path(collection, self.settings.home))
                 if p["status"] == "accepted"]
        if not pairs:
            raise UserError(f"collection {collection!r} has no accepted QA pairs to answer; generate some (POST "
                            f"/v1/collections/{collection}/qa-jobs) and accept them (PATCH "
                            f"/v1/collections/{collection}/qa-pairs/ID)")
        gate = worker_gate(self.worker)
        store: list[Collection] = []  # opened with its embedder in the job, once

        def answer(pattern: str, question: str) -> Answered:
            if not store:
                store.append(self.open_collection(collection, search=True))
            options = app.pattern_options(pattern)

            def call() -> Answered:
                model = self.reading_model()
                began = time.perf_counter()
                got = app.ask_collection(store[0], question, options, generator=model,
                                         home=self.settings.home).answer()
                return Answered(got.text, time.perf_counter() - began, got.route.taken if got.route else None)

            result: Answered = gate(call)
            return result

        job = self.eval_jobs.submit(collection, chosen, pairs, answer)
        self.audit.record(_actor(who), "evaluate", collection=collection, patterns=chosen, pairs=len(pairs),
                          job=job["id"])
        return job

    # -- collections ----------------------------------------------------------------------------------------

    def open_collection(self, name: str, *, search: bool = False, who: Principal | None = None,
                        write: bool = False) -> Collection:
        """An existing collection; with ``search``, holding its embedder (loaded once per process).

        ``who``: the caller, who must be allowed to read it (to ``write`` it too); None: no caller (the
        server itself).

        Raises:
            NotFound: there is no collection by that name, or the caller may not read it (the same reply:
                the caller learns nothing of a collection out of its reach).
            Forbidden: the caller may read it but not write it, and ``write``.
        """
        self.check_collection(name, who, write)
        store = app.open_collection(name, home=self.settings.home)
        if not search:
            return store
        return app.open_collection(name, home=self.settings.home, embedder=self.embedder(store.embedder_name))

    def check_collection(self, name: str, who: Principal | None, write: bool = False) -> None:
        """Raise what `open_collection` raises for a collection missing or out of ``who``'s reach."""
        if (who is not None and not who.can_read(name)) or not app.collection_exists(name, home=self.settings.home):
            known = ", ".join(c["name"] for c in self.collections(who)) or "none"
            raise NotFound(f"no collection named {name!r} (existing: {known}); create it with POST /v1/collections",
                           "collection", name)
        if write and who is not None and not who.can_write(name):
            raise Forbidden(f"this key may read collection {name!r} but not change it; ask an admin for a key "
                            f"with --write {name}")

    def collections(self, who: Principal | None = None) -> list[dict[str, Any]]:
        """The collections ``who`` may read (None: all)."""
        return [{"name": c.name, "embedder": c.embedder, "dim": c.dim, "created_at": c.created_at,
                 "documents": c.n_documents, "chunks": c.n_chunks, "questions": c.n_questions,
                 "schema_version": c.schema_version} for c in app.list_collections(self.settings.home)
                if who is None or who.can_read(c.name)]

    def create_collection(self, name: str, embedder: str | None, who: Principal | None = None) -> dict[str, Any]:
        """Create an empty collection.

        Raises:
            UserError: a bad name, an embedder clients may not choose, or a collection of that name exists.
        """
        if embedder is not None and embedder not in (*CLIENT_EMBEDDERS, self.settings.embedder):
            raise UserError(f"unknown embedder {embedder!r}; choose {', '.join(CLIENT_EMBEDDERS)}")
        if app.collection_exists(name, home=self.settings.home):
            raise Conflict(f"a collection named {name!r} exists already")
        store = app.create_collection(name, home=self.settings.home, embedder=self.embedder(embedder))
        self.audit.record(_actor(who), "create_collection", collection=store.name)
        return self.describe_collection(store.name, tree=False)

    def describe_collection(self, name: str, tree: bool = True, who: Principal | None = None) -> dict[str, Any]:
        """A collection's settings and documents, each with its section tree."""
        store = self.open_collection(name, who=who)
        docs = store.documents()
        return {"name": store.name, "embedder": store.embedder_name, "created_at": store.meta.get("created_at"),
                "documents": [self._document_dict(store, d, tree) for d in docs],
                "chunks": sum(d.n_chunks for d in docs), "questions": sum(d.n_questions for d in docs)}

    @staticmethod
    def _document_dict(store: Collection, info: DocumentInfo, tree: bool) -> dict[str, Any]:
        data: dict[str, Any] = {"id": info.doc_id, "source": info.source, "title": info.title,
                                "format": info.format, "chunks": info.n_chunks, "questions": info.n_questions,
                                "indexed_at": info.indexed_at}
        if tree:
            doc = store.document(info.doc_id) if info.format == "pdf" else None  # pages need the text
            data["sections"] = section_tree(store.sections(info.doc_id), doc)
        return data

    def delete_collection(self, name: str, who: Principal | None = None) -> None:
        self.open_collection(name, who=who)  # NotFound, in the API's words
        if who is not None and not who.grants.admin:
            raise Forbidden("only an admin key may delete a collection; delete its documents one by one, or ask "
                            "an admin")
        app.delete_collection(name, home=self.settings.home)
        self.audit.record(_actor(who), "delete_collection", collection=name)

    def find_document(self, store: Collection, name: str) -> DocumentInfo:
        """A document of a collection by its source or id.

        Raises:
            NotFound: the collection holds no such document.
        """
        for info in store.documents():
            if name in (info.doc_id, info.source):
                return info
        raise NotFound(f"collection {store.name!r} has no document {name!r}; see GET /v1/collections/{store.name}",
                       "document", name)

    def show_document(self, collection: str, name: str, who: Principal | None = None) -> dict[str, Any]:
        """A document of a collection with its text (references' character spans index it), the offset
        where each page begins, and its section tree."""
        store = self.open_collection(collection, who=who)
        info = self.find_document(store, name)
        doc = store.document(info.doc_id)
        data = self._document_dict(store, info, tree=False)
        data.update(text=doc.text, page_starts=list(doc.page_starts),
                    sections=section_tree(store.sections(info.doc_id), doc))
        return data

    def delete_document(self, collection: str, name: str, who: Principal | None = None) -> dict[str, Any]:
        store = self.open_collection(collection, who=who, write=True)
        info = self.find_document(store, name)
        store.delete_document(info.doc_id)
        self.audit.record(_actor(who), "delete_document", collection=collection, document=info.source,
                          doc_id=info.doc_id)
        return {"deleted": info.doc_id, "source": info.source, "collection": collection}

    # -- uploads ------------------------------------------------------------------------------------------

    def upload(self, collection: str, filename: str | None, data: bytes,
               chunking: ChunkingOptions, who: Principal | None = None) -> dict[str, Any]:
        """Check an upload and queue it for indexing; returns the job.

        Raises:
            NotFound: no such collection.
            UnsupportedType: the content is not a document marginalia reads.
        """
        self.open_collection(collection, who=who, write=True)
        name = display_name(filename)
        suffix = check_upload(name, data)
        count = self.generator.tokenizer.count

        def store() -> Collection:
            return self.open_collection(collection, search=True)

        job = self.jobs.submit(collection, name, data, suffix,
                               partial(index_upload, store=store, count_tokens=count, chunking=chunking,
                                       ingest=self.settings.ingest))
        self.audit.record(_actor(who), "upload", collection=collection, document=name, bytes=len(data),
                          job=job["id"])
        return job

    def job(self, job_id: str, who: Principal | None = None) -> dict[str, Any]:
        """An indexing job, as `JobBoard.get`; one of a collection ``who`` may not read is not found."""
        return self.jobs.get(job_id, None if who is None else who.can_read)

    def job_list(self, who: Principal | None = None) -> list[dict[str, Any]]:
        """The indexing jobs of the collections ``who`` may read, oldest first."""
        return [j for j in self.jobs.list() if who is None or who.can_read(j["collection"])]

    # -- composing ----------------------------------------------------------------------------------------

    def start_compose(self, body: ComposeSessionRequest, who: Principal | None = None) -> ComposeSession:
        """A compose session over a collection, on the server's models: the served model's spec completes,
        ``compose_memory_model`` (else the same spec) writes memory; each session has its own loads.

        Raises:
            NotFound: no such collection.
            UserError: it holds nothing to draw memory from, the request names another memory model, or a
                model cannot serve (the message names which).
            SessionsFull: every compose session is writing a suggestion (a `Busy`: HTTP 429).
        """
        s = self.settings
        memory_spec = s.compose_memory_model or s.model
        if body.options.memory_model not in (None, memory_spec):
            raise UserError(f"this server writes memory with {memory_spec}, loaded when it starts; leave "
                            "options.memory_model out (or give that spec)")
        store = self.open_collection(body.collection, search=True, who=who)
        app.compose_sources(store, body.exclude)  # an empty collection fails before a model loads
        return self.compose.start(store, body.options, body.exclude, s.model, memory_spec,
                                  None if who is None else who.owner)

    # -- reading ------------------------------------------------------------------------------------------

    def prepare(self, target: Target, question: str, temperature: float | None = None,
                who: Principal | None = None, route: str = "ask") -> Prepared:
        """Check what can be checked at once (the question, the collection, the document) and return what
        starts the reading in the model's thread, and what places its references in their sections.

        ``target`` is a pasted text, a document of a collection, or a collection; a reading that names no
        pattern takes the route by size (`app.default_options`), decided in the model's thread. ``who``
        must be allowed to read the collection; the question is written to the audit log (its text only
        where the server says so), as asked through ``route``.
        """
        app.check_question(question)
        if target.collection is not None:
            self.check_collection(target.collection, who)
        self.audit.asked(_actor(who), target.collection, question, route, target.document)
        options = target.options
        if target.collection is None:
            doc = app.text_document(target.text or "", PASTED)
            return self._read_document(doc, app.document_sections(doc), options, target.by_size, question,
                                       temperature)
        store = self.open_collection(target.collection, search=True, who=who)
        if target.document is not None:
            info = self.find_document(store, target.document)
            return self._read_document(store.document(info.doc_id), store.sections(info.doc_id), options,
                                       target.by_size, question, temperature)
        reading = target.collection_options

        def start() -> Run:
            model = self.reading_model()
            # no pattern and no option set: the collection's reading profile for the model, where it has one
            named = None if target.by_size and options == app.AutoOptions() else \
                self._chosen(options, target.by_size, None, model)
            return app.ask_collection(store, question, named, reading, generator=model, home=self.settings.home,
                                      temperature=temperature)

        return Prepared(start)

    def _read_document(self, doc: Document, sections: list[Section], options: PatternOptions, by_size: bool,
                       question: str, temperature: float | None) -> Prepared:
        """``by_size``: ``options`` are auto's, and the route by size chooses the pattern."""
        embedder = self.embedder() if not by_size and app.needs_embedder(options) else None

        def start() -> Run:
            model = self.reading_model()
            chosen = self._chosen(options, by_size, doc.text, model)
            # chosen by size: the embedder loads (once) only where the route takes retrieval
            loaded = self.embedder() if embedder is None and app.needs_embedder(chosen) else embedder
            return app.ask_text(doc.text, question, chosen, generator=model, source=doc.source,
                                embedder=loaded, cache=self.readings, temperature=temperature)

        return Prepared(start, partial(app.locate, doc=doc, sections=sections))

    @staticmethod
    def _chosen(options: PatternOptions, by_size: bool, text: str | None, model: Generator) -> PatternOptions:
        """The options a reading takes: ``options``, or with ``by_size`` the route by size with them (for a
        collection, ``text`` None)."""
        if by_size and isinstance(options, app.AutoOptions):
            return app.default_options(text, model, options)
        return options


def _actor(who: Principal | None) -> str:
    return "server" if who is None else who.actor


def section_tree(sections: list[Section], doc: Document | None = None) -> dict[str, Any]:
    """A document's sections as nested dicts from the root (title, level, span, page, children)."""
    nodes: dict[int, dict[str, Any]] = {
        s.index: {"title": s.title, "level": s.level, "path": list(s.path), "start": s.start, "end": s.end,
                  "page": doc.page_at(s.start) if doc is not None else None, "children": []}
        for s in sections}
    for s in sections:
        if s.parent is not None:
            nodes[s.parent]["children"].append(nodes[s.index])
    roots = [nodes[s.index] for s in sections if s.parent is None]
    return roots[0] if roots else {"title": "", "level": 0, "path": [], "start": 0, "end": 0, "page": None,
                                   "children": []}
