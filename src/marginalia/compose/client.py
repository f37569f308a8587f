"""The client: a small model that completes the writer's text as it is typed, from an instruction, the
memory and the text.

The prompt is one token sequence, ``prefix + memory + context``: the prefix (the chat template's system
turn and the instruction) never changes, the memory block changes when memory does, and the context is
the text typed so far, continued by the model in the assistant's turn.

- **Cache reuse.** The client keeps track of the tokens each of its caches holds. A keystroke rolls the
  cache back to the longest common prefix of what it holds and the new prompt, and prefills the rest:
  typing a word prefills that word's tokens, not the prompt.
- **Memory swap.** New memory changes every token after the prefix, so it is prepared on a second cache
  (the standby) by a background thread, which then catches up with the text typed meanwhile. The next
  completion after it is ready swaps the two caches; until then completions run on the old memory and
  never wait for the new one. The preparation yields to a completion in progress between slices of
  ``background_step`` tokens.
- **Cancellation.** A completion is a stream (`Completion`); ``cancel()`` (from any thread) ends it at
  the next token or prefill slice, and its cache is rolled back to the prompt, ready for the next.

The two caches must be truly separate. Forks of a llama.cpp model share one llama.cpp context (each
fork re-syncs it to its own tokens), so a standby made by forking would evict the active cache; the
client checks this when it makes its standby and asks for a separately loaded one instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from ..errors import ContextOverflow, UserError
from ..models.base import CachingGenerator, GenerationParams, Generator, Usage, close_stream
from ..models.ledger import common_prefix
from .events import ComposeEvent, MemoryItem, MemoryPrepared, MemorySwapped, Suggested
from .prompt import ClientPrompt, strip_trailing
from .threads import start_background

log = logging.getLogger(__name__)

#: tokens a completion prefills per step: a cancelled prefill stops within one
PREFILL_STEP = 64
#: tokens the background preparation prefills per step, giving way to a completion before each (a step as
#: long as a completion's: a finer one only adds calls)
BACKGROUND_STEP = PREFILL_STEP
#: seconds the background preparation waits for a completion to finish before it goes on anyway
YIELD_AT_MOST = 0.5
#: times the background preparation syncs again with text typed while it prefilled
CATCH_UP_ROUNDS = 4

__all__ = ["Completion", "CompletionClient", "common_prefix", "forks_share_cache", "strip_trailing"]


def _without_blank(raw: str, blank: str) -> str | None:
    """A suggestion without the blank the writer typed and the prompt left out (None: too early to say)."""
    if not blank:
        return raw
    if len(raw) < len(blank) and blank.startswith(raw):
        return None
    return raw[len(blank):] if raw.startswith(blank) else raw


def forks_share_cache(generator: CachingGenerator) -> bool:
    """Whether forks of ``generator`` share one physical cache (llama.cpp: one context), so that using
    one evicts another's tokens. Probed with two forks and three one-token prefills."""
    tok = generator.tokenizer
    ids = tok.encode("one two")
    x, y = ids[:1], ids[-1:]
    if not x or not y or x == y:
        return False
    a, b = generator.fork(keep_cache=False), generator.fork(keep_cache=False)
    a.usage, b.usage = Usage(), Usage()
    try:
        a.prefill(x)
        b.prefill(y)
        before = a.usage.prefilled_tokens
        a.prefill(x)
        return a.usage.prefilled_tokens - before > len(x)
    finally:
        a.reset()
        b.reset()


class _Cache:
    """A generator and the token ids its cache holds (only the client touches it, so its record is exact)."""

    def __init__(self, generator: CachingGenerator) -> None:
        self.gen = generator
        self.ids: list[int] = []

    def sync(self, target: Sequence[int], step: int, stop: Callable[[], bool] | None = None,
             before_step: Callable[[], None] | None = None) -> tuple[int, bool]:
        """Make the cache hold ``target``: roll back to the longest common prefix, prefill the rest in
        steps. Returns (tokens prefilled, whether it got all the way); ``stop()`` ends it between steps."""
        common = common_prefix(self.ids, target)
        if common < len(self.ids):
            self.gen.rollback(common)
            del self.ids[common:]
        done = 0
        rest = list(target[common:])
        for at in range(0, len(rest), step):
            if before_step is not None:
                before_step()
            if stop is not None and stop():
                return done, False
            piece = rest[at:at + step]
            self.gen.prefill(piece)  # a failed prefill leaves both the cache and this record as they were
            self.ids.extend(piece)
            done += len(piece)
        return done, True


@dataclass(frozen=True)
class _Memory:
    """Memory as the prompt holds it: its version, its items and the tokens of its block (with the turn's
    end and the assistant's start)."""

    version: int
    items: tuple[MemoryItem, ...]
    ids: tuple[int, ...]


class Completion:
    """A suggestion being written. Iterate it for text deltas (in one thread); `cancel` from any thread
    ends it at the next token; `result` is the `Suggested` record once it has ended."""

    def __init__(self, client: CompletionClient, text: str, ids: Sequence[int] | None, max_new_tokens: int,
                 memory: Sequence[MemoryItem] | None = None) -> None:
        self._cancel = threading.Event()
        self.result: Suggested | None = None
        self.context = text
        self._it = client._run(self, text, ids, max_new_tokens, memory)

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return next(self._it)

    def cancel(self) -> None:
        """End the completion at its next token (safe from any thread)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def close(self) -> None:
        """End it now, from the thread that iterates it (rolls its cache back)."""
        close_stream(self._it)

    def text(self) -> str:
        """Run it to its end and return the whole suggestion."""
        try:
            for _ in self:
                pass
        finally:
            self.close()
        return self.result.text if self.result is not None else ""


class CompletionClient:
    """Completes text on a `CachingGenerator`, reusing its KV cache from keystroke to keystroke.

    Args:
        generator: the client model (a `CachingGenerator`).
        standby: a second generator of the same model for preparing new memory in the background; by
            default a fork of ``generator``, unless its forks share one cache (llama.cpp), which is refused:
            load the model a second time and pass it.
        suggestion_tokens: the most tokens a suggestion has.
        stop: strings that end a suggestion.
        on_event: called with `MemoryPrepared`, `MemorySwapped` and `Suggested` events.
        prefill_step: tokens a completion prefills per step (see the module doc).
        background_step: tokens the background preparation prefills per step.
        no_repeat_ngram: above 0, no run of this many tokens is written twice in one suggestion (a loop guard
            for greedy decoding, `marginalia.models.repeats`); 0 writes plain greedy suggestions.

    Raises:
        UserError: the generator keeps no KV cache, the standby is another model, or forks share a cache and
            no standby was given.
    """

    def __init__(self, generator: Generator, *, standby: Generator | None = None, suggestion_tokens: int = 15,
                 stop: Sequence[str] = ("\n",), on_event: Callable[[ComposeEvent], None] | None = None,
                 prefill_step: int = PREFILL_STEP, background_step: int = BACKGROUND_STEP,
                 no_repeat_ngram: int = 0) -> None:
        if not isinstance(generator, CachingGenerator):
            raise UserError(f"composition needs a client model whose KV cache it can reuse between keystrokes; "
                            f"{generator.name} does not offer one")
        if standby is None:
            if forks_share_cache(generator):
                raise UserError(f"forks of {generator.name} share one cache, so new memory cannot be prepared "
                                "beside the completions; load the model a second time and give it as the standby")
            standby = generator.fork(keep_cache=False)
        if not isinstance(standby, CachingGenerator):
            raise UserError(f"the standby model {standby.name} keeps no KV cache; give a second load of the "
                            "client model")
        probe = "Composing: a probe sentence, 42 words."
        if standby.tokenizer.encode(probe) != generator.tokenizer.encode(probe):
            raise UserError(f"the standby model {standby.name} tokenizes differently from {generator.name}; "
                            "give a second load of the same model")
        if standby.usage is generator.usage:
            standby.usage = Usage()  # the background's work is not the completions' cost
        self.generator = generator
        self.suggestion_tokens = suggestion_tokens
        self.stop = tuple(stop)
        self.on_event = on_event
        self.prefill_step = prefill_step
        self.background_step = background_step
        self.params = GenerationParams(max_new_tokens=suggestion_tokens, stop=self.stop,
                                       no_repeat_ngram=no_repeat_ngram)
        generator.check_decoding(self.params)  # refuses a guard the client model cannot enforce
        self.prompt = ClientPrompt(generator, suggestion_tokens)
        self._prefix = self.prompt.prefix
        self._fg = threading.Lock()  # one completion at a time, on the active cache
        self._fg_idle = threading.Event()
        self._fg_idle.set()
        self._state = threading.Condition()  # guards everything below
        self._active = _Cache(generator)
        self._standby = _Cache(standby)
        self._memory = _Memory(0, (), self.prompt.tail)
        self._target: _Memory | None = None  # the newest memory asked for
        self._ready: tuple[_Cache, _Memory] | None = None  # prepared, not yet swapped in
        self._preparing = False
        self._latest: tuple[int, ...] = ()  # the newest context tokens seen
        self._closed = False
        self._worker: threading.Thread | None = None

    # -- what it holds ---------------------------------------------------------------------------

    @property
    def memory(self) -> tuple[MemoryItem, ...]:
        """The memory completions run with now."""
        with self._state:
            return self._memory.items

    @property
    def memory_version(self) -> int:
        with self._state:
            return self._memory.version

    def encode(self, text: str) -> list[int]:
        """The context tokens of ``text`` (see `strip_trailing`)."""
        return self.prompt.encode(text)

    def prompt_ids(self, context_ids: Sequence[int], memory: tuple[MemoryItem, ...] | None = None) -> list[int]:
        """The whole prompt for a context, with the given memory (default: the memory in use)."""
        if memory is None:
            with self._state:
                memory_ids: Sequence[int] = self._memory.ids
            return self.prompt.ids(context_ids, memory_ids=memory_ids)
        return self.prompt.ids(context_ids, memory)

    def _context(self, ids: Sequence[int], memory: _Memory) -> Sequence[int]:
        return self.prompt.context(ids, memory.ids)

    # -- keystrokes --------------------------------------------------------------------------------

    def update(self, ids: Sequence[int]) -> None:
        """Tell the client the text as it is now (its context tokens), so memory being prepared catches up."""
        with self._state:
            self._latest = tuple(ids)

    def complete(self, text: str, ids: Sequence[int] | None = None, max_new_tokens: int | None = None,
                 memory: Sequence[MemoryItem] | None = None) -> Completion:
        """Start completing ``text`` (``ids``: its `encode`, when already known); iterate the result.

        ``memory`` completes with those items instead of the memory in use (to evaluate the client with a
        given memory: nothing is swapped in, and the next plain completion syncs back to its own memory).
        """
        return Completion(self, text, ids, max_new_tokens or self.suggestion_tokens, memory)

    def score(self, text: str, continuation: str, memory: Sequence[MemoryItem] | None = None) -> list[float]:
        """The log-probability of each token of ``continuation`` (in the client's tokens) right after
        ``text``, with the memory in use or the given ``memory``: what perplexity is computed from.

        Raises:
            BackendError: the client model cannot score tokens (see `CachingGenerator.score`).
            UserError: an empty continuation.
        """
        healed = text[len(strip_trailing(text)):]  # blanks the prompt leaves out belong to the continuation
        with self.prompt.lock:
            ids = self.generator.tokenizer.encode(healed + continuation)
        if not ids:
            raise UserError("nothing to score: the continuation is empty")
        with self._fg:
            with self._state:
                cache = self._active
                block = self._memory if memory is None else _Memory(0, tuple(memory), self.prompt.memory_ids(memory))
            target = [*self._prefix, *block.ids, *self._context(self.encode(text), block)]
            cache.sync(target, self.prefill_step)
            if len(target) + len(ids) > self.generator.context_window:
                raise ContextOverflow(len(target) + len(ids), self.generator.context_window,
                                      "the prompt plus the scored continuation")
            return cache.gen.score(ids)

    def _run(self, completion: Completion, text: str, ids: Sequence[int] | None,
             max_new_tokens: int, given: Sequence[MemoryItem] | None) -> Iterator[str]:
        t0 = time.perf_counter()
        ids = self.encode(text) if ids is None else list(ids)
        healed = text[len(strip_trailing(text)):]  # trailing blanks the prompt left out
        out, raw, first = "", "", None
        prefilled: int | None = 0
        generated = 0
        version = 0
        stopped = False
        with self._fg:
            self._fg_idle.clear()
            try:
                self.update(ids)
                if given is None:
                    self._swap_if_ready()
                with self._state:
                    cache, memory = self._active, self._memory
                if given is not None:
                    memory = _Memory(0, tuple(given), self.prompt.memory_ids(given))
                version = memory.version
                before = cache.gen.usage.snapshot()
                target = [*self._prefix, *memory.ids, *self._context(ids, memory)]
                _, whole = cache.sync(target, self.prefill_step, stop=lambda: completion.cancelled)
                if whole and not completion.cancelled:
                    stream = cache.gen.generate_from_cache(
                        [], replace(self.params, max_new_tokens=max_new_tokens))
                    try:
                        for delta in stream:
                            if first is None:
                                first = time.perf_counter() - t0
                            if completion.cancelled:
                                stopped = True
                                break
                            raw += delta
                            shown = _without_blank(raw, healed)
                            if shown is None:
                                continue  # it may yet turn out to be the blank the writer typed
                            delta_out, out = shown[len(out):], shown
                            if delta_out:
                                yield delta_out
                    finally:
                        close_stream(stream)  # rolls the cache back to the prompt
                used = cache.gen.usage.since(before)
                # unknown when a model server did not say what it took from its prompt cache
                prefilled = None if used.cache_unreported else used.prefilled_tokens
                generated = used.generated_tokens
            finally:
                self._fg_idle.set()
                completion.result = Suggested(
                    len(text), out, prefilled, generated, None if first is None else round(first, 4),
                    round(time.perf_counter() - t0, 4), version, stopped or completion.cancelled)
        self._emit(completion.result)

    def give_way(self) -> None:
        """Wait while a completion is being written (at most `YIELD_AT_MOST` seconds, so that background work
        still moves on while the writer types without a break): background work calls it between its steps."""
        self._fg_idle.wait(YIELD_AT_MOST)

    # -- memory ------------------------------------------------------------------------------------

    def set_memory(self, items: Sequence[MemoryItem], version: int) -> None:
        """Ask for completions with this memory: it is prepared in the background and swapped in by the
        first completion after it is ready (an older version is ignored)."""
        memory = _Memory(version, tuple(items), self.prompt.memory_ids(items))
        with self._state:
            if self._closed:
                return
            newest = max(self._memory.version, self._target.version if self._target else 0)
            if version <= newest:
                return
            self._target = memory
            if self._worker is None:
                self._worker = start_background(self._prepare_loop, "compose-prepare")
            self._state.notify_all()

    def preparing(self) -> bool:
        """Whether new memory is being prepared or waits to be swapped in."""
        with self._state:
            return self._preparing or self._ready is not None or (
                self._target is not None and self._target.version > self._memory.version)

    def ready(self) -> bool:
        """Whether new memory is prepared and waits for the next completion to swap it in."""
        with self._state:
            return self._ready is not None

    def _swap_if_ready(self) -> None:
        with self._state:
            if self._ready is None:
                return
            cache, memory = self._ready
            self._ready = None
            self._standby, self._active = self._active, cache
            self._memory = memory
        self._emit(MemorySwapped(memory.version))

    def _prepare_loop(self) -> None:
        while True:
            with self._state:
                while not self._closed and (self._target is None or self._target.version <= self._memory.version
                                            or (self._ready is not None
                                                and self._ready[1].version >= self._target.version)):
                    self._state.wait()
                target = self._target
                if self._closed or target is None:
                    return
                if self._ready is not None:  # prepared for older memory, never swapped in: redo it
                    cache, _ = self._ready
                    self._ready = None
                else:
                    cache = self._standby
                self._preparing = True
            try:
                self._prepare(cache, target)
            except Exception:  # a failed preparation leaves the memory in use as it is
                log.exception("preparing memory version %d failed", target.version)
                with self._state:
                    cache.ids = []
                    cache.gen.reset()
                    if self._target is target:
                        self._target = None
            finally:
                with self._state:
                    self._preparing = False
                    self._state.notify_all()  # `wait_prepared`

    def _prepare(self, cache: _Cache, target: _Memory) -> None:
        t0 = time.perf_counter()
        total = 0

        def superseded() -> bool:
            with self._state:
                return self._closed or self._target is not target

        for _ in range(CATCH_UP_ROUNDS):  # catch up with the text typed while preparing
            with self._state:
                latest = self._latest
            prompt = [*self._prefix, *target.ids, *self._context(latest, target)]
            done, whole = cache.sync(prompt, self.background_step, stop=superseded, before_step=self.give_way)
            total += done
            if not whole:
                return  # newer memory came: the loop starts over with it
            with self._state:
                if self._target is not target:
                    return
                if self._latest == latest or done == 0:
                    break
        with self._state:  # the completion that swaps it in prefills what is left
            if self._target is not target:
                return
            self._ready = (cache, target)
        self._emit(MemoryPrepared(target.version, total, round(time.perf_counter() - t0, 4)))

    def wait_prepared(self, timeout: float | None = None) -> bool:
        """Block until no memory is being prepared (for tests and benchmarks); False on timeout."""
        with self._state:
            return self._state.wait_for(self._nothing_to_prepare, timeout)

    def _nothing_to_prepare(self) -> bool:
        """No memory is being prepared or waits to be (called under ``_state``)."""
        return not self._preparing and (self._target is None or self._ready is not None
                                        or self._target.version <= self._memory.version)

    def _emit(self, event: ComposeEvent) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                log.exception("a compose event listener failed")

    def close(self) -> None:
        """Stop the background preparation."""
        with self._state:
            self._closed = True
            self._state.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        """After `close`: wait for the background preparation's thread to end; False on timeout."""
        with self._state:
            worker = self._worker
        if worker is not None:
            worker.join(timeout)
            return not worker.is_alive()
        return True
