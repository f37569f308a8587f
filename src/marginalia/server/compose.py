"""Compose sessions: suggestions for a text being written, each session with a `Composer` of its own (its
own loads of the client and memory models, its own memory), bounded in number and expiring when idle.

Models are loaded once and lent out (`ModelPool`): a session borrows a client model, a second copy of it
where forks share one cache (llama.cpp), and a memory model. They come back when the session has ended
and its threads have stopped (a memory request in flight runs to its end first), so the next session
starts without loading anything.

A suggestion is written in a thread of its own (`Suggestion`), its pieces relayed to the request as they
come. A newer suggestion for the same session cancels it (the composer's edit does), and so does a
streaming client that leaves.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .. import app
from ..app import CachingGenerator, Generator
from ..compose import Composer, MemoryFailed, MemoryItem, MemoryUpdated, Suggested, forks_share_cache
from ..compose.events import ComposeEvent
from ..compose.threads import wait_limit
from ..errors import BackendError, MarginaliaError, MissingDependency, NotFound, UserError
from ..options import ComposeOptions
from .errors import Busy
from .sessions import BoundedStore
from .worker import Failed

if TYPE_CHECKING:
    from ..app import Collection

log = logging.getLogger("marginalia.server")

#: seconds an ended session's threads get beyond its memory timeout to stop before its models are dropped
#: instead of lent again
RETIRE_SLACK = 30.0

#: seconds a client is told to wait when every compose session is busy (a suggestion takes about that)
RETRY_AFTER = 2
#: a model spec and one loaded instance of it
Borrowed = tuple[str, Generator]


class SessionsFull(Busy):
    """Every compose session is writing a suggestion, and the store may hold no more."""

    def __init__(self, sessions: int) -> None:
        MarginaliaError.__init__(self, f"all {sessions} compose sessions are writing suggestions; try again in a "
                                       "few seconds (the server's --max-compose-sessions bounds them)")
        self.retry_after = RETRY_AFTER


class ModelPool:
    """Loaded models lent to one compose session at a time, by spec; loads another when none is free."""

    def __init__(self, load: Callable[[str], Generator]) -> None:
        self._load = load
        self._free: dict[str, list[Generator]] = {}
        self._shared: dict[str, bool] = {}
        self._lock = threading.Lock()

    def borrow(self, spec: str, role: str) -> Generator:
        """A model of ``spec`` nobody else uses (``role`` names it in a load error).

        Raises:
            UserError: the spec cannot be loaded (the message names the role).
            BackendError: the model failed while loading.
        """
        with self._lock:
            free = self._free.get(spec)
            if free:
                return free.pop()
        try:
            return self._load(spec)
        except MissingDependency:
            raise
        except UserError as exc:
            raise UserError(f"{role} ({spec}) could not be loaded: {exc}") from exc
        except BackendError as exc:
            raise BackendError(f"{role} ({spec}) could not be loaded: {exc}") from exc

    def forks_share_cache(self, spec: str, model: CachingGenerator) -> bool:
        """Whether forks of a model of ``spec`` share one cache (probed once per spec: it runs the model)."""
        with self._lock:
            known = self._shared.get(spec)
        if known is None:
            known = forks_share_cache(model)
            with self._lock:
                self._shared[spec] = known
        return known

    def give_back(self, models: Iterable[Borrowed]) -> None:
        """Models no one uses any more, their caches emptied, ready for the next session."""
        for spec, model in models:
            try:
                if isinstance(model, CachingGenerator):
                    model.reset()
            except Exception:  # a model that cannot even be reset is not lent again
                log.exception("a compose model could not be reset; it is dropped")
                continue
            with self._lock:
                self._free.setdefault(spec, []).append(model)

    def free(self) -> int:
        """Models loaded and waiting to be lent."""
        with self._lock:
            return sum(len(models) for models in self._free.values())


class MemoryWatch:
    """What a session's events say about its memory beyond the items: whether the memory model is failing,
    and why; and each run of failures' notice, to be given to the client once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.failing = False
        self.error: str | None = None
        self._notices: list[str] = []
        self._given = 0

    def __call__(self, event: ComposeEvent) -> None:
        with self._lock:
            if isinstance(event, MemoryFailed):
                self.failing, self.error = True, event.message
                if event.notice:
                    self._notices.append(event.notice)
            elif isinstance(event, MemoryUpdated):
                self.failing, self.error = False, None

    def state(self) -> tuple[bool, str | None, list[str]]:
        """(failing, error, the notices not given yet); the notices count as given."""
        with self._lock:
            new = self._notices[self._given:]
            self._given = len(self._notices)
            return self.failing, self.error, new


def memory_item_dict(item: MemoryItem) -> dict[str, Any]:
    """A memory item and its source: document, section path and character span (in the document's text)."""
    return {"text": item.text, "kind": item.kind, "document": item.source, "doc_id": item.doc_id,
            "section_path": list(item.section_path), "start": item.start, "end": item.end, "score": item.score}


class ComposeSession:
    """One text being written: its composer, the models it borrowed, and its memory's state.

    ``busy`` counts the requests using it (a busy session neither expires nor makes room); ``running`` the
    suggestions whose threads have not ended yet.
    """

    def __init__(self, collection: str, options: ComposeOptions, exclude: Sequence[str], models: dict[str, str],
                 composer: Composer, watch: MemoryWatch, borrowed: list[Borrowed], now: float,
                 owner: str | None = None) -> None:
        self.id = uuid.uuid4().hex
        self.owner = owner  # the caller that opened it (`auth.Principal.owner`); None: anyone
        self.collection = collection
        self.options = options
        self.exclude = tuple(exclude)
        self.models = models
        self.composer = composer
        self.watch = watch
        self.borrowed = borrowed
        self.created_at = self.last_used = now
        self.busy = 0
        self._running = 0
        self._closed = False
        self._cond = threading.Condition()

    def begin(self) -> None:
        """A suggestion starts.

        Raises:
            NotFound: the session has ended.
        """
        with self._cond:
            if self._closed:
                raise NotFound(f"compose session {self.id!r} has ended; start a new one with POST "
                               "/v1/compose/sessions", "compose session", self.id)
            self._running += 1

    def end(self) -> None:
        """A suggestion's thread is over."""
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    def close(self) -> None:
        """No new suggestions; the one in progress is cancelled, memory is no longer asked for."""
        with self._cond:
            self._closed = True
        self.composer.close()

    def join(self, timeout: float) -> bool:
        """After `close`: wait until no thread uses the session's models; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if not self._cond.wait_for(lambda: self._running == 0, timeout):
                return False
        return self.composer.join(max(0.0, deadline - time.monotonic()))

    def memory(self) -> dict[str, Any]:
        """The memory now: its items with their sources, its version and the version suggestions use, whether
        it is being refreshed, whether the memory model is failing, and the notices not given to the client
        yet (each is given once)."""
        composer = self.composer
        failing, error, notices = self.watch.state()
        client = composer.client
        # memory prepared and waiting for the next suggestion to take it in is not being refreshed any more
        refreshing = composer.coordinator.busy() or (client.preparing() and not client.ready())
        return {"version": composer.coordinator.version, "in_use": client.memory_version, "refreshing": refreshing,
                "failing": failing, "error": error, "notices": notices,
                "items": [memory_item_dict(item) for item in composer.memory]}

    def to_dict(self, ttl: float) -> dict[str, Any]:
        return {"id": self.id, "collection": self.collection, "options": self.options.model_dump(),
                "exclude": list(self.exclude), **self.models, "created_at": self.created_at,
                "expires_at": self.last_used + ttl, "memory": self.memory()}


class ComposeSessions(BoundedStore[ComposeSession]):
    """At most ``limit`` compose sessions (see `BoundedStore`); an ended session is closed and its models go
    back to ``pool`` once its threads have stopped."""

    def __init__(self, ttl: float, limit: int, pool: ModelPool, clock: Callable[[], float] = time.time) -> None:
        super().__init__(ttl, limit, "compose session", "POST /v1/compose/sessions", SessionsFull,
                         on_end=self._retire, clock=clock)
        self.pool = pool

    def start(self, store: Collection, options: ComposeOptions, exclude: Sequence[str], client_spec: str,
              memory_spec: str, owner: str | None = None) -> ComposeSession:
        """A new session over ``store``, on borrowed models (loaded when none is free), owned by ``owner``.

        Raises:
            SessionsFull: the store is full and every session is writing a suggestion (HTTP 429).
            UserError: a model that cannot serve (the message names which), an empty collection.
            BackendError: a model failed while loading.
        """
        self.check_room()  # before any model loads
        borrowed: list[Borrowed] = []

        def borrow(spec: str, role: str) -> Generator:
            model = self.pool.borrow(spec, role)
            borrowed.append((spec, model))
            return model

        watch = MemoryWatch()
        try:
            client = borrow(client_spec, "the client model")
            standby = None
            if isinstance(client, CachingGenerator) and self.pool.forks_share_cache(client_spec, client):
                standby = borrow(client_spec, "a second copy of the client model")
            memory = borrow(memory_spec, "the memory model")
            composer = app.compose(store, options, generator=client, standby=standby, memory_generator=memory,
                                   exclude=exclude, listeners=[watch])
        except BaseException:
            self.pool.give_back(borrowed)
            raise
        session = ComposeSession(store.name, options, exclude, {"model": client_spec, "memory_model": memory_spec},
                                 composer, watch, borrowed, self.clock(), owner)
        try:
            return self.add(session)
        except BaseException:
            self._retire([session])
            raise

    def close(self) -> None:
        """End every session (the server stops)."""
        for session in self.clear():
            session.close()

    def _retire(self, sessions: Iterable[ComposeSession]) -> None:
        """Close sessions now, and give their models back once their threads have stopped (in the
        background: a memory request in flight may take a while)."""
        for session in sessions:
            session.close()
            threading.Thread(target=self._give_back, args=(session,), name="compose-retire", daemon=True).start()

    def _give_back(self, session: ComposeSession) -> None:
        if session.join(wait_limit(session.options.memory_timeout + RETIRE_SLACK)):
            self.pool.give_back(session.borrowed)
        else:  # its models stay with the thread that still uses them, and go when it does
            log.warning("compose session %s did not stop in time; its models are not lent again", session.id)


# -- one suggestion --------------------------------------------------------------------------------------

_END = object()


class Suggestion:
    """A suggestion for a session's text, written in a thread of its own; `next` gives its pieces (text),
    then its `Suggested` record (or a `Failed`), then None.

    The composer waits its ``debounce`` first; newer text for the session, from another request, cancels it
    (its record then says ``cancelled``), and so does `cancel`.
    """

    def __init__(self, session: ComposeSession, text: str) -> None:
        self.session = session
        self.text = text
        self.finished = False
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._completion: Any = None
        session.begin()
        try:
            threading.Thread(target=self._work, name="compose-suggest", daemon=True).start()
        except BaseException:
            session.end()
            raise

    def _put(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone: nobody listens
            self._cancel.set()

    def _work(self) -> None:
        composer = self.session.composer
        try:
            if not composer.settle(self.text) or self._cancel.is_set():
                self._put(composer.cancelled(self.text))
                return
            completion = composer.stream(self.text)
            with self._lock:
                self._completion = completion
                if self._cancel.is_set():
                    completion.cancel()
            try:
                for piece in completion:
                    self._put(piece)
            finally:
                completion.close()
            self._put(completion.result or composer.cancelled(self.text))
        except Exception as exc:  # noqa: BLE001 - relayed to the request, which answers it
            self._put(Failed(exc))
        finally:
            self.session.end()
            self._put(_END)

    def cancel(self) -> None:
        """Stop writing (safe from any thread): the suggestion ends at its next token."""
        self._cancel.set()
        with self._lock:
            if self._completion is not None:
                self._completion.cancel()

    async def next(self) -> str | Suggested | Failed | None:
        """The next piece of text, the record at the end, a `Failed`, or None once it is over."""
        try:
            item = await self._queue.get()
        except asyncio.CancelledError:  # the request's task was cancelled (the client left, the server stops)
            self.cancel()
            raise
        if item is _END:
            self.finished = True
            return None
        return item  # type: ignore[no-any-return]


def suggestion_dict(result: Suggested, session: ComposeSession) -> dict[str, Any]:
    """A suggestion's reply: its text, what it cost, and the session's memory now."""
    return {"suggestion": result.text, "cancelled": result.cancelled, "context_chars": result.context_chars,
            "prefilled_tokens": result.prefilled_tokens, "generated_tokens": result.generated_tokens,
            "first_token_seconds": result.first_token_seconds, "seconds": result.seconds,
            "memory_version": result.memory_version, "memory": session.memory()}
