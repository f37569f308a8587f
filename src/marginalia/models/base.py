"""The generator seam: streaming text generation, and the optional KV-cache capability.

A `Generator` turns a chat (a list of messages) or a raw prompt into a stream of text
deltas. A `CachingGenerator` also owns a KV cache that can be prefilled with tokens,
generated from without committing, rolled back exactly and forked. Writing in the
Margins needs the second. In-process backends implement it over their real cache;
an HTTP backend can implement it over a server's prefix cache by keeping the token
prefix locally and sending prefix + suffix with every request, so every request
extends the one before.
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypedDict

from ..errors import BackendError, ContextOverflow, UserError
from .copying import CopyState
from .ledger import PrefillLedger
from .repeats import NoRepeat


class Message(TypedDict):
    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True)
class GenerationParams:
    """How to decode. ``temperature == 0`` is greedy (the default: reproducible).

    ``stop`` strings end generation and are not part of the text.
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    #: When set, copy decoding (`marginalia.models.copying`): every piece of the generated text between
    #: joining marks occurs in this text, or begins one of ``copy_also`` (WiM's extractive margins). A
    #: backend that cannot enforce it refuses it (`Generator.supports_copy`).
    copy_from: str | None = None
    copy_also: tuple[str, ...] = ()
    #: When above 0, no run of this many tokens generated twice in one generation (`marginalia.models.repeats`:
    #: a loop guard for greedy decoding); the same contract.
    no_repeat_ngram: int = 0


@dataclass
class Usage:
    """Running token counters of a generator (prompt tokens actually evaluated).

    Over HTTP the prompt tokens evaluated and those taken from the server's cache are the server's own
    counts; a request whose reply gave neither is in ``cache_unreported`` and in neither count, so while
    ``cache_unreported`` is above 0 those two are unknown (not a lower bound to read as a total).
    """

    prefilled_tokens: int = 0
    generated_tokens: int = 0
    requests: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    #: HTTP backends: prompt tokens sent with requests, and those the server said it
    #: took from its prefix cache (cumulative; 0 for in-process backends).
    prompt_tokens_sent: int = 0
    prompt_tokens_cached: int = 0
    #: HTTP requests whose server said nothing of its prompt cache (neither cached nor
    #: evaluated prompt tokens): counted in neither, which are then unknown
    cache_unreported: int = 0
    #: where a pattern is told which of its context tokens the backend evaluated, and how often (attached
    #: for a run; not a counter: snapshots leave it out)
    ledger: PrefillLedger | None = field(default=None, repr=False, compare=False)

    @staticmethod
    def counters() -> tuple[str, ...]:
        return tuple(f.name for f in fields(Usage) if f.name != "ledger")

    def snapshot(self) -> Usage:
        return Usage(**{k: getattr(self, k) for k in self.counters()})

    def since(self, before: Usage) -> Usage:
        return Usage(**{k: getattr(self, k) - getattr(before, k) for k in self.counters()})

    def add(self, other: Usage) -> None:
        """Add another account's counts to this one (e.g. a fork that ran in a thread)."""
        for k in self.counters():
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def evaluated(self, sequence: Sequence[int], start: int, end: int) -> None:
        """Backends call this for every prompt piece they evaluate: positions ``[start, end)`` of ``sequence``."""
        if self.ledger is not None:
            self.ledger.record(sequence, start, end)


class Tokenizer(ABC):
    """The model's own tokenizer: text to ids with character offsets, and back."""

    @abstractmethod
    def encode_with_offsets(
        self, text: str, allow_special: bool = False
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of ``text`` and each token's character span.

        No BOS/EOS is added. Special-token strings inside ``text`` are parsed as
        special tokens only when ``allow_special`` is true (template pieces), never
        in user text, so a document cannot forge a turn boundary.
        """

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (special tokens kept, so decode(encode(t)) == t)."""

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        return self.encode_with_offsets(text, allow_special)[0]

    def count(self, text: str) -> int:
        return len(self.encode(text))


@dataclass(frozen=True)
class ChatFrame:
    """The chat template cut around the user message's content.

    ``head`` is everything up to the user content (system turn included); ``tail``
    is everything after it, through the assistant's generation prompt. A user turn
    with content C renders as ``head + C + tail``.
    """

    head: str
    tail: str


_SENTINEL = "\u2063MARGINALIA-CONTENT\u2063"


class Generator(ABC):
    """Text generation, streaming first: `generate` consumes `stream`."""

    #: The spec string this generator was loaded from (e.g. ``smollm2``).
    name: str = "generator"
    #: Maximum tokens (prompt + generation) the model can attend to.
    context_window: int = 2048
    #: How many requests may be in flight at once (forks included). In-process backends
    #: compute one at a time; a server may batch several (see `OpenAIGenerator`).
    concurrency: int = 1
    #: Whether requests go to a server whose prefix cache decides what a request costs (HTTP backends)
    remote: bool = False
    #: Whether requests in flight side by side find each other's prompts in the prefix cache: a cache shared
    #: by every request (vLLM's, SGLang's blocks). A server that keeps a prompt per slot (llama.cpp's
    #: llama-server) reuses it only in the slot that read it, so a reading's requests go one at a time there.
    shares_prefixes: bool = True
    #: Whether `GenerationParams.copy_from` and ``no_repeat_ngram`` are enforced (patterns that need them
    #: check this when they are made; a backend without it refuses such requests)
    supports_copy: bool = False
    #: Whether `CachingGenerator.choice_probabilities` reads the model's next-token probabilities
    supports_choice_probabilities: bool = False

    def __init__(self) -> None:
        self.usage = Usage()

    @property
    def parallel_readings(self) -> int:
        """How many readings may run side by side on this model, each on a `fork_reading` of its own: 1 (one
        at a time, on the generator itself) unless a backend says more (a server that batches requests)."""
        return 1

    def fork_reading(self) -> Generator:
        """A generator for one of `parallel_readings` readings side by side: the same model, with a usage
        account (and a cache) of its own, so that a reading's stats count its own requests only. One reading
        at a time (the base) reads on the generator itself."""
        return self

    @property
    @abstractmethod
    def tokenizer(self) -> Tokenizer:
        """The model's own tokenizer."""

    @abstractmethod
    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """Render messages with the model's own chat template."""

    @abstractmethod
    def stream_prompt(self, prompt_ids: Sequence[int], params: GenerationParams) -> Iterator[str]:
        """Stream the continuation of a raw token prompt (no cache kept between calls)."""

    def stream(
        self, prompt: str | Sequence[Message], params: GenerationParams | None = None
    ) -> Iterator[str]:
        """Stream text deltas for a chat (list of messages) or a raw prompt string."""
        params = params or GenerationParams()
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            ids = self.encode_chat(prompt)
        self.check_fits(len(ids) + params.max_new_tokens, what="the prompt plus the answer")
        self.check_decoding(params)
        return self.stream_prompt(ids, params)

    def generate(
        self, prompt: str | Sequence[Message], params: GenerationParams | None = None
    ) -> str:
        """The whole text of `stream`."""
        return "".join(self.stream(prompt, params))

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of a rendered chat.

        For the usual [system, user] shape the template pieces parse special tokens
        and the user content does not, so a document cannot forge a turn boundary.
        """
        roles = [m["role"] for m in messages]
        if roles == ["system", "user"]:
            frame = self.chat_frame(messages[0]["content"])
            return (
                self.tokenizer.encode(frame.head, allow_special=True)
                + self.tokenizer.encode(messages[1]["content"])
                + self.tokenizer.encode(frame.tail, allow_special=True)
            )
        return self.tokenizer.encode(self.render_chat(messages), allow_special=True)

    def chat_frame(self, system: str) -> ChatFrame:
        """Cut the chat template around a user turn that follows ``system``."""
        rendered = self.render_chat(
            [{"role": "system", "content": system}, {"role": "user", "content": _SENTINEL}]
        )
        if rendered.count(_SENTINEL) != 1:
            raise BackendError(
                f"the chat template of {self.name} does not place the user's text verbatim; "
                "use a model whose chat template keeps message content unchanged"
            )
        head, tail = rendered.split(_SENTINEL)
        return ChatFrame(head=head, tail=tail)

    def check_fits(self, needed: int, what: str = "the prompt") -> None:
        if needed > self.context_window:
            raise ContextOverflow(needed, self.context_window, what)

    def check_decoding(self, params: GenerationParams) -> None:
        """Refuse copy decoding or a loop guard this backend cannot enforce (never ignore it)."""
        if params.no_repeat_ngram < 0:
            raise UserError(f"no_repeat_ngram is a run length in tokens (0 for none), not {params.no_repeat_ngram}")
        if (params.copy_from is not None or params.no_repeat_ngram) and not self.supports_copy:
            raise UserError(f"{self.name} cannot restrict what it generates (to copies from a text, or to no "
                            "run of tokens twice); use an in-process model (gguf: or hf:)")

    def copy_state(self, params: GenerationParams) -> CopyState | None:
        """A fresh `CopyState` for one generation under ``params`` (None without copy decoding)."""
        if params.copy_from is None:
            return None
        return CopyState(params.copy_from, self.tokenizer.decode, also=params.copy_also)

    def repeat_guard(self, params: GenerationParams) -> NoRepeat | None:
        """A fresh `NoRepeat` for one generation under ``params`` (None without ``no_repeat_ngram``); it lets
        numbers repeat (this model's tokens of digits and blanks)."""
        if params.no_repeat_ngram <= 0:
            return None
        return NoRepeat(params.no_repeat_ngram, self.tokenizer.decode)


@dataclass(frozen=True)
class CacheSnapshot:
    """A copy of what a cache holds, which `CachingGenerator.restore` puts back without evaluating a token.

    ``state`` is the backend's own copy of its KV entries (None where the token ids are all there is: an
    HTTP backend's prefix, which the server caches); ``nbytes`` is its size in memory.
    """

    ids: tuple[int, ...]
    state: Any = None
    nbytes: int = 0


class CachingGenerator(Generator):
    """A generator that owns one KV cache of token ids.

    The cache only ever holds a prefix of one token sequence: `prefill` appends,
    `rollback` cuts back to a length, `generate_from_cache` extends it temporarily;
    `snapshot` copies what it holds and `restore` puts such a copy back.
    """

    @property
    @abstractmethod
    def length(self) -> int:
        """Number of tokens in the cache."""

    @abstractmethod
    def prefill(self, ids: Sequence[int]) -> None:
        """Append ``ids`` to the cache (chunked internally to bound memory)."""

    @abstractmethod
    def rollback(self, length: int) -> None:
        """Cut the cache back to its first ``length`` tokens, exactly.

        Raises:
            BackendError: ``length`` is negative or beyond the cache (`check_rollback`).
        """

    @abstractmethod
    def snapshot(self) -> CacheSnapshot:
        """A copy of the cache's contents (its ids and KV entries) for `restore`."""

    @abstractmethod
    def restore(self, snapshot: CacheSnapshot) -> None:
        """Make the cache hold what ``snapshot`` holds; no token is evaluated."""

    def cache_identity(self) -> str:
        """What decides the contents of this model's cache besides its tokens (for stored caches)."""
        return f"{type(self).__name__}:{self.name}"

    def drop(self, start: int, end: int) -> None:
        """Remove the cached tokens ``[start, end)``; the later ones move down to close the gap, as if the
        dropped ones had never been read (the default prefills the later ones again; backends that can
        shift cached positions override it).

        Raises:
            BackendError: the range is not within the cache.
        """
        self.check_drop(start, end)
        tail = list(self.cached_ids[end:])
        self.rollback(start)
        self.prefill(tail)

    def check_drop(self, start: int, end: int) -> None:
        if not 0 <= start <= end <= self.length:
            raise BackendError(f"cannot drop tokens {start} to {end}: the cache holds {self.length}")

    @property
    def cached_ids(self) -> tuple[int, ...]:
        """The token ids the cache holds, in order (backends that keep them at hand override this)."""
        return self.snapshot().ids

    def state_bytes(self, snapshot: CacheSnapshot) -> bytes:
        """A snapshot's backend state as bytes, to store on disk (empty where the ids are all there is)."""
        return b""

    def snapshot_from_bytes(self, ids: Sequence[int], data: bytes) -> CacheSnapshot:
        """The snapshot that `state_bytes` wrote ``data`` for.

        Raises:
            BackendError: ``data`` is not such a state for this model (a damaged or foreign file).
        """
        return CacheSnapshot(tuple(ids))

    def choice_probabilities(self, suffix_ids: Sequence[int], choices: Sequence[str]) -> dict[str, float]:
        """The model's probability that the token after the cache plus ``suffix_ids`` is each choice's first
        token, among the choices only (they sum to 1); the cache is left as it was.

        Raises:
            UserError: the backend gives no probabilities (`supports_choice_probabilities`), or a choice is empty.
        """
        if not self.supports_choice_probabilities:
            raise UserError(f"{self.name} does not give next-token probabilities; use an in-process model")
        firsts = []
        for choice in choices:
            ids = self.tokenizer.encode(choice)
            if not ids:
                raise UserError(f"the choice {choice!r} is empty; give a word")
            firsts.append(ids[0])
        start = self.length
        self.check_fits(start + len(suffix_ids) + 1, what="the cached prefix plus this question")
        try:
            self.prefill(suffix_ids)
            logits = self._next_logits(firsts)
        finally:
            self.rollback(start)
        top = max(logits)
        weights = [math.exp(v - top) for v in logits]
        total = sum(weights)
        return {c: w / total for c, w in zip(choices, weights, strict=True)}

    def _next_logits(self, token_ids: Sequence[int]) -> list[float]:
        """The logits of ``token_ids`` for the token after the cache (backends that give probabilities)."""
        raise UserError(f"{self.name} does not give next-token probabilities; use an in-process model")

    def score(self, ids: Sequence[int]) -> list[float]:
        """The log-probability (natural log) of each of ``ids`` in turn after the cache's tokens (each given
        the cache and the ids before it), as the model's unconstrained distribution has it; the cache is
        left as it was. Perplexity is ``exp(-mean)`` of these.

        Raises:
            BackendError: the backend cannot see its logits (the base), or the cache is empty (the first
                id needs something to follow).
        """
        raise BackendError(f"{self.name} cannot score tokens: its backend gives no access to its logits "
                           "(use an in-process model: smollm2, gguf:, hf:)")

    def check_score(self, ids: Sequence[int]) -> None:
        """Raise `BackendError` unless ``ids`` can be scored after the cache."""
        if ids and not self.length:
            raise BackendError("nothing to score after: the cache is empty; prefill a prompt first")
        self.check_fits(self.length + len(ids), what="the cache plus the scored tokens")

    #: how many branches `branches` decodes side by side (1: none; the backend has no batched branches)
    max_branches: int = 1

    def branches(self, ends: Sequence[int], suffix_ids: Sequence[int],
                 params: GenerationParams) -> list[tuple[str, int]]:
        """For each ``end`` (at most `max_branches` of them), the continuation of the cache's first ``end``
        tokens plus ``suffix_ids``, all decoded side by side in one batch per step; the cache is left as
        it was.

        Returns:
            ``(text, tokens generated)`` per end, in order.
        """
        raise BackendError(f"{self.name} does not decode branches side by side")

    def check_branches(self, ends: Sequence[int], suffix_ids: Sequence[int], params: GenerationParams) -> None:
        """Raise `BackendError` unless `branches` can decode these."""
        if len(ends) > self.max_branches:
            raise BackendError(f"{len(ends)} branches, but this context decodes at most {self.max_branches}")
        if not suffix_ids or max(ends) > self.length or min(ends) < 1:
            raise BackendError("each branch needs a non-empty suffix and an end within the cache")
        self.check_fits(max(ends) + len(suffix_ids) + params.max_new_tokens, what="a branch")
        self.check_decoding(params)
        if params.copy_from is not None or params.no_repeat_ngram:
            raise BackendError("branches are not copy-decoded nor guarded against repeats; write such texts one "
                               "after another")

    def _decode_branches(self, ends: Sequence[int], suffix: Sequence[int], params: GenerationParams,
                         decode: Callable[[list[tuple[int, int, int, bool]]], dict[int, Any]],
                         pick: Callable[[Any], int], per_batch: int) -> list[tuple[str, int]]:
        """The loop of `branches` that backends share: every branch's suffix after its end (``per_batch``
        tokens a call), then one token of every unfinished branch a step. ``decode`` takes
        ``(branch, position, token, wants logits)`` items, one batch, and returns each branch's logits;
        ``pick(logits)`` samples a token."""
        t0 = time.perf_counter()
        tokens: list[list[int]] = [[] for _ in ends]
        scanners = [StopScanner(params.stop) for _ in ends]
        items = [(j, end + i, token, i == len(suffix) - 1) for j, end in enumerate(ends)
                 for i, token in enumerate(suffix)]
        pending: dict[int, Any] = {}  # branch -> the logits its next token is sampled from
        for at in range(0, len(items), per_batch):
            pending.update(decode(items[at:at + per_batch]))
        self.usage.prefilled_tokens += len(items)
        self.usage.prefill_seconds += time.perf_counter() - t0
        held = list(self.cached_ids)
        for end in ends:
            self.usage.evaluated(held[:end] + list(suffix), end, end + len(suffix))
        t1 = time.perf_counter()
        active = list(range(len(ends))) if params.max_new_tokens > 0 else []
        while active:
            chosen: list[tuple[int, int, int, bool]] = []  # (branch, position, token, True) to decode next
            for j in active:
                token = pick(pending[j])
                if token in self.eos_ids:
                    continue
                tokens[j].append(token)
                self.usage.generated_tokens += 1
                scanner = scanners[j]
                scanner.feed(self.tokenizer.decode(tokens[j]))
                if scanner.stopped or len(tokens[j]) >= params.max_new_tokens:
                    continue
                chosen.append((j, ends[j] + len(suffix) + len(tokens[j]) - 1, token, True))
            active = [j for j, _, _, _ in chosen]
            if chosen:
                pending = decode(chosen)
        self.usage.decode_seconds += time.perf_counter() - t1
        self.usage.requests += len(ends)
        return [(scanner.visible, len(toks)) for scanner, toks in zip(scanners, tokens, strict=True)]

    def check_rollback(self, length: int) -> None:
        """Raise `BackendError` unless the cache can be cut back to ``length`` tokens."""
        if not 0 <= length <= self.length:
            raise BackendError(f"cannot roll back to {length} tokens: the cache holds {self.length}")

    #: token ids that end generation (end of turn / sequence)
    eos_ids: frozenset[int] = frozenset()

    def _sample_tokens(self, params: GenerationParams) -> Iterator[int]:
        """Sample token ids after the cache's last token, lazily.

        Yield each sampled token; only when the next one is asked for, append the
        token to the cache and compute the next logits. A consumer that stops
        (EOS, a stop string, the token budget) therefore never pays for an extra
        forward pass. In-process backends implement this; a backend that receives
        text rather than token ids (HTTP) overrides `_decode_from_cache` instead.
        """
        raise NotImplementedError(f"{type(self).__name__} implements neither _sample_tokens "
                                  "nor _decode_from_cache")

    def _decode_from_cache(self, params: GenerationParams, commit: bool = False) -> Iterator[str]:
        """Text deltas of `_sample_tokens`, ended by EOS, a stop string or the budget.

        With ``commit``, the last token of a budget-ended generation is fed into the
        cache too, so the cache holds everything generated.
        """
        tokens = self._sample_tokens(params)
        scanner = StopScanner(params.stop)
        out: list[int] = []
        t0 = time.perf_counter()
        try:
            if params.max_new_tokens > 0:
                for token in tokens:
                    if token in self.eos_ids:
                        break
                    out.append(token)
                    self.usage.generated_tokens += 1
                    delta = scanner.feed(self.tokenizer.decode(out))
                    if delta:
                        yield delta
                    if scanner.stopped:
                        break
                    if len(out) >= params.max_new_tokens:
                        if commit:
                            next(tokens, None)  # feeds the last token into the cache
                        break
            tail = scanner.flush()
            if tail:
                yield tail
        finally:
            close_stream(tokens)
            self.usage.decode_seconds += time.perf_counter() - t0
            self.usage.requests += 1

    @abstractmethod
    def fork(self, keep_cache: bool = True) -> CachingGenerator:
        """An independent generator sharing the weights, with a copy of the cache
        (or an empty cache when ``keep_cache`` is false)."""

    def reset(self) -> None:
        self.rollback(0)

    def generate_from_cache(
        self,
        suffix_ids: Sequence[int],
        params: GenerationParams | None = None,
        commit: bool = False,
    ) -> Iterator[str]:
        """Prefill ``suffix_ids`` on top of the cache and stream the continuation.

        Unless ``commit`` is true, the cache is rolled back to its length before the
        call when the stream ends, raises, or is closed early by the consumer.
        """
        params = params or GenerationParams()
        start = self.length
        self.check_fits(start + len(suffix_ids) + params.max_new_tokens,
                        what="the cached prefix plus this request")
        self.check_decoding(params)
        try:
            if suffix_ids:
                self.prefill(suffix_ids)
            yield from self._decode_from_cache(params, commit)
        finally:
            if not commit:
                self.rollback(start)

    def stream_prompt(self, prompt_ids: Sequence[int], params: GenerationParams) -> Iterator[str]:
        """Stateless generation on a fork, so the main cache is never touched."""
        worker = self.fork(keep_cache=False)
        yield from worker.generate_from_cache(prompt_ids, params, commit=False)


_steps = threading.local()

#: tokens a backend prefills per step while its thread yields (see `yielding_to`)
YIELD_STEP = 16


@contextmanager
def yielding_to(pause: Callable[[], None] | None) -> Iterator[None]:
    """Run the block with ``pause()`` called before every model step an in-process backend takes on this
    thread: one token decoded, or a prefill slice of `YIELD_STEP` tokens (the backend slices its prefills
    while a pause is set). Background work gives way to foreground work this way: composition's memory model
    waits in ``pause`` while a suggestion is being written. Slicing a prefill may change the last bits of the
    logits (a batch cut elsewhere rounds differently), so only background work should use it."""
    before = getattr(_steps, "pause", None)
    _steps.pause = pause
    try:
        yield
    finally:
        _steps.pause = before


def step_pause() -> Callable[[], None] | None:
    """The pause set on this thread by `yielding_to` (None: run straight through)."""
    return getattr(_steps, "pause", None)


def close_stream(stream: Iterator[object]) -> None:
    """End a stream early: a generator runs its cleanup (e.g. rolls a cache back); other
    iterators are left alone."""
    close = getattr(stream, "close", None)
    if close is not None:
        close()


class StopScanner:
    """Turns a stream of decoded text into deltas, holding back possible stop strings."""

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = [s for s in stop if s]
        self.text = ""
        self.emitted = 0
        self.stopped = False

    def feed(self, full_text: str) -> str:
        """Give the whole text decoded so far; return the new safe delta."""
        self.text = full_text
        end = len(full_text)
        for s in self.stop:
            i = full_text.find(s)
            if i != -1:
                end = min(end, i)
                self.stopped = True
        if not self.stopped:
            # hold back a tail that could be the start of a stop string
            for s in self.stop:
                for k in range(min(len(s) - 1, len(full_text)), 0, -1):
                    if full_text.endswith(s[:k]):
                        end = min(end, len(full_text) - k)
                        break
            # an incomplete UTF-8 sequence decodes to U+FFFD: wait for the rest
            while end > self.emitted and full_text[end - 1] == "\ufffd":
                end -= 1
        delta = full_text[self.emitted:end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return delta

    @property
    def visible(self) -> str:
        """The text before a stop string (all of it when none came)."""
        return self.text[:self.emitted] if self.stopped else self.text

    def flush(self) -> str:
        if self.stopped:
            return ""
        delta = self.text[self.emitted:]
        self.emitted = len(self.text)
        return delta


class Clock:
    """Monotonic seconds since creation."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.t0


__all__ = [
    "CacheSnapshot",
    "CachingGenerator",
    "ChatFrame",
    "Clock",
    "close_stream",
    "GenerationParams",
    "Generator",
    "Message",
    "StopScanner",
    "Tokenizer",
    "Usage",
]
