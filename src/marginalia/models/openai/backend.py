"""An OpenAI-compatible HTTP backend whose "KV cache" is a local token prefix.

`OpenAIGenerator` keeps the cached token ids locally and sends prefix + suffix with
every request, so each Writing-in-the-Margins request extends the one before and
the server's prefix cache (llama.cpp server, vLLM, SGLang) does the reuse. Spec:
``openai:<base-url>#<model>[;mode=completions|chat][;tokenizer=<spec>][;window=<n>]``.
Its requests are sent by `requests` (retries are tenacity's), read by `streaming`
(httpx-sse) and booked by `usage`; `prefix_cache` pins a reading to a llama-server slot.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import BackendError, MissingDependency, UserError
from ..base import (
    CacheSnapshot,
    CachingGenerator,
    GenerationParams,
    Generator,
    Message,
    StopScanner,
    Tokenizer,
    Usage,
)
from .prefix_cache import Pin, ServerSlots
from .replies import ModelEntry
from .requests import BACKOFF, RenderChat, Sender, chat_messages, new_client, request_body
from .spec import OPENAI_SPEC_FORM as SPEC_FORM
from .spec import OPTIONS, check_server, public_spec
from .streaming import Received, read_stream
from .usage import book

if TYPE_CHECKING:
    import httpx

DEFAULT_WINDOW = 4096


def chatml(messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
    """The ChatML template, used when a bare `Tokenizer` comes without ``render_chat``."""
    out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class OpenAIGenerator(CachingGenerator):
    """A model behind an OpenAI-compatible server, with a client-side token prefix.

    ``prefill`` and ``rollback`` only edit the local list of ids; every generation is
    ONE streaming request whose prompt is the whole prefix plus the suffix. In
    ``completions`` mode the prompt is the token id list itself (``token_prompts``;
    llama.cpp server, vLLM and SGLang accept it), so the server sees exactly the ids
    prefilled here. In ``chat`` mode the ids are decoded and the chat frame is cut
    off again (a system and a user message, or one user message); the server renders
    its own template, so the prefix it sees is textually but not necessarily
    byte-for-byte (token-for-token) identical to the local one.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8080/v1``.
        model: the model id the server knows.
        tokenizer: the model's tokenizer, or a `Generator` to borrow it and its chat template from.
        render_chat: the chat template for a bare `Tokenizer` (default: ChatML).
        mode: ``completions`` (token prompts) or ``chat``.
        context_window: None asks ``GET /models`` once (4096 when it does not say).
        api_key: a bearer token; default ``$MARGINALIA_API_KEY``, else ``$OPENAI_API_KEY``.
        token_prompts: send token ids (True) or the detokenized text (False).
        extra_body: server-specific fields added to every request body (e.g.
            ``{"repeat_penalty": 1.0}``: llama-cpp-python's server otherwise penalises
            repeats by default, so temperature 0 would not be plain greedy decoding).
        connect_timeout: seconds to open a connection.
        read_timeout: seconds to wait for each piece of a reply.
        max_retries: retries on 429, 5xx and failed connections, before any reply.
        backoff: seconds to wait before each retry (a ``Retry-After`` header wins).
        sleep: the waiting function (tests replace it).
        client: an `httpx.Client` to use instead of a new one.
        name: the spec it was loaded from.
        concurrency: requests that patterns may keep in flight at once (default 1). WiM
            then sends a segment's margin request as soon as the previous one's prompt
            has been taken in (its first text has arrived), so margins decode side by side
            while the shared prefix is still read once. Worth it on servers that batch
            requests and keep a block prefix cache (vLLM, SGLang); keep 1 for a one-slot
            server such as llama-cpp-python's, which queues them anyway (or, started
            without ``--interrupt_requests false``, cuts the running stream off).
        shares_prefixes: whether requests side by side find each other's prompts in the server's prefix
            cache; None asks ``GET /models`` once, when it matters: llama.cpp's llama-server (``owned_by``
            "llamacpp") keeps a prompt per slot, so WiM sends a reading's requests one at a time there
            (``concurrency`` then serves readings side by side, each on a slot of its own).

    Where the server shares prefixes, ``concurrency`` is also how many readings a service runs side by side
    (`parallel_readings`), each on a `fork_reading` of its own.
    """

    remote = True

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Tokenizer | Generator,
        *,
        render_chat: RenderChat | None = None,
        mode: str = "completions",
        context_window: int | None = None,
        api_key: str | None = None,
        token_prompts: bool = True,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
        max_retries: int = 3,
        backoff: Sequence[float] = BACKOFF,
        sleep: Callable[[float], None] = time.sleep,
        client: httpx.Client | None = None,
        name: str | None = None,
        extra_body: dict[str, Any] | None = None,
        concurrency: int = 1,
        shares_prefixes: bool | None = None,
    ) -> None:
        super().__init__()
        if concurrency < 1:
            raise UserError(f"concurrency must be at least 1, got {concurrency}")
        self.concurrency = concurrency
        self._lock = threading.Lock()  # the usage account, shared with forks and their threads
        self.extra_body = dict(extra_body or {})
        check_server(base_url, mode)
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.mode = mode
        self.shown_url = public_spec(self.base_url)  # what messages and logs name: no credentials, no query
        self.name = public_spec(name or f"openai:{self.base_url}#{model}")
        self._tokenizer: Tokenizer
        self._render: RenderChat
        if isinstance(tokenizer, Generator):
            self._tokenizer, self._render = tokenizer.tokenizer, tokenizer.render_chat
        else:
            self._tokenizer, self._render = tokenizer, render_chat or chatml
        self._window = context_window
        self.token_prompts = token_prompts
        self.client = client or new_client(api_key, connect_timeout=connect_timeout, read_timeout=read_timeout,
                                           concurrency=concurrency)
        self._sender = Sender(self.client, self.base_url, model, read_timeout=read_timeout,
                              max_retries=max_retries, backoff=backoff, sleep=sleep)
        self._ids: list[int] = []
        #: what the server says of itself and of its slots (shared with every fork), and this generator's slot
        self._pin = Pin(ServerSlots(self.client, self.base_url, self.list_models, model,
                                    per_slot=None if shares_prefixes is None else not shares_prefixes))

    @property
    def sleep(self) -> Callable[[float], None]:
        """What the generator waits with before a retry (shared with its forks; tests replace it)."""
        return self._sender.sleep

    @sleep.setter
    def sleep(self, value: Callable[[float], None]) -> None:
        self._sender.sleep = value

    @property
    def read_timeout(self) -> float:
        """Seconds to wait for each piece of a reply."""
        return self._sender.read_timeout

    # -- Generator ---------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        return self._render(messages, add_generation_prompt)

    @property  # type: ignore[override]
    def context_window(self) -> int:
        """The server's window: given, else from ``GET /models`` (asked once), else 4096."""
        if self._window is None:
            self._window = window_of(self.list_models(strict=True), self.model) or DEFAULT_WINDOW
        return self._window

    @context_window.setter
    def context_window(self, value: int) -> None:
        self._window = value

    @property
    def shares_prefixes(self) -> bool:  # type: ignore[override]
        """Given, else from ``GET /models`` (asked once for this generator and its forks): False for llama.cpp's
        llama-server."""
        return not self._pin.slots.per_slot

    @property
    def parallel_readings(self) -> int:
        """``concurrency`` on a server whose prefix cache every request shares (vLLM, SGLang): it batches
        readings as it batches a reading's margins. 1 on llama.cpp's llama-server, where a reading's requests
        go one at a time to a slot that keeps its prompt."""
        return self.concurrency if self.shares_prefixes else 1

    def fork_reading(self) -> OpenAIGenerator:
        """An empty fork (``fork(keep_cache=False)``: a prefix, a last prompt and a slot of its own) whose
        usage account, and the lock over it, are its own too."""
        other = self.fork(keep_cache=False)
        other.usage = Usage()
        other._lock = threading.Lock()
        return other

    def stream_prompt(self, prompt_ids: Sequence[int], params: GenerationParams) -> Iterator[str]:
        """One stateless request with just ``prompt_ids``; the local prefix is untouched."""
        return self._generate(list(prompt_ids), params)

    def close(self) -> None:
        """Close the HTTP connections (shared with every fork)."""
        self.client.close()

    def list_models(self, strict: bool = False) -> list[ModelEntry]:
        """The entries of the server's ``GET /models`` ([] when it gives none).

        Raises:
            BackendError: only when ``strict``: the server cannot be reached, or its
                listing is malformed.
        """
        return self._sender.list_models(strict)

    # -- CachingGenerator --------------------------------------------------

    @property
    def length(self) -> int:
        return len(self._ids)

    def prefill(self, ids: Sequence[int]) -> None:
        """Append ``ids`` to the local prefix; nothing is sent until a generation."""
        self.check_fits(self.length + len(ids), what="the prefilled context")
        self._ids.extend(int(i) for i in ids)

    def rollback(self, length: int) -> None:
        self.check_rollback(length)
        del self._ids[length:]

    @property
    def cached_ids(self) -> tuple[int, ...]:
        return tuple(self._ids)

    def drop(self, start: int, end: int) -> None:
        """Remove ``[start, end)`` from the local prefix: the server evaluates the tail again on the next
        request, under new positions (its prefix cache serves only what comes before ``start``)."""
        self.check_drop(start, end)
        del self._ids[start:end]

    def snapshot(self) -> CacheSnapshot:
        """The prefix; the server caches it itself. On a llama-server slot that has just read it, the slot's
        state is also saved to a file on the server, for `restore` to put back."""
        self._pin.save(self._ids)
        return CacheSnapshot(tuple(self._ids))

    def restore(self, snapshot: CacheSnapshot) -> None:
        """Take the snapshot's prefix; on a llama-server slot whose file holds it, put it back into the slot, so
        that the next request finds it (a slot keeps only the last prompt's prefix)."""
        self._ids = list(snapshot.ids)
        self._pin.restore(snapshot.ids)

    def fork(self, keep_cache: bool = True) -> OpenAIGenerator:
        """A copy sharing the client, the tokenizer, the usage account and what the server said of itself. An
        empty one is a reading of its own: on a server with a prompt per slot, its requests go to a slot of
        their own (chosen at its first request)."""
        other = copy.copy(self)
        other._ids = list(self._ids) if keep_cache else []
        other._pin = copy.copy(self._pin) if keep_cache else self._pin.fresh()
        return other

    def _decode_from_cache(self, params: GenerationParams, commit: bool = False) -> Iterator[str]:
        if not self._ids:
            raise BackendError("nothing to generate from: the cache is empty and no prompt was given")
        out: list[str] = []
        try:
            for delta in self._generate(list(self._ids), params):
                out.append(delta)
                yield delta
        finally:  # the generated text joins the cache; the base rolls it back unless committed
            if out:
                self._ids.extend(self._tokenizer.encode("".join(out)))

    # -- the wire ----------------------------------------------------------

    def messages_of(self, ids: Sequence[int]) -> list[Message]:
        """The chat messages whose rendering is the decoded ``ids`` (chat mode).

        The frame of a [system, user] chat, else of a lone user turn, is cut off; a
        prompt in neither frame becomes one user message as it is.
        """
        return chat_messages(self._tokenizer.decode(ids), self.render_chat)

    def _generate(self, ids: list[int], params: GenerationParams) -> Iterator[str]:
        """Text deltas for the prompt ``ids``: one streaming request."""
        self.check_decoding(params)
        return self._stream(ids, params)

    def _stream(self, ids: list[int], params: GenerationParams) -> Iterator[str]:
        """One streaming request for ``ids``; yields text deltas and books the usage."""
        chat = self.mode == "chat"
        t0 = time.perf_counter()
        scanner = StopScanner(params.stop)
        self._pin.choose()
        prompt: dict[str, Any]
        if chat:
            prompt = {"messages": self.messages_of(ids)}
        else:
            prompt = {"prompt": ids if self.token_prompts else self._tokenizer.decode(ids)}
        response = self._sender.open("/chat/completions" if chat else "/completions",
                                     request_body(self.model, params, prompt, self._pin.slot, self.extra_body))
        received = Received()
        try:
            yield from read_stream(response, scanner, chat=chat, base_url=self.shown_url, received=received)
        finally:
            response.close()
            self._pin.sent = ids
            end = time.perf_counter()
            text = scanner.text[:scanner.emitted]
            book(self.usage, self._lock, ids, received.usage, received.timings,
                 self._tokenizer.count(text) if text else 0, t0, received.first, end)


def window_of(models: Sequence[ModelEntry], model: str) -> int | None:
    """The context window a ``/models`` listing gives for ``model`` (or its only entry)."""
    entry = next((m for m in models if m.id == model), models[0] if len(models) == 1 else None)
    if entry is None:
        return None
    return entry.window() or (entry.meta.window() if entry.meta else None)


def from_spec(arg: str, load: Callable[[str], Generator], **options: Any) -> OpenAIGenerator:
    """Build a generator from the part of the spec after ``openai:``.

    ``arg`` is ``<base-url>#<model>`` then optional ``;key=value`` options: ``mode``,
    ``prompt`` (``tokens``: send token ids, the default; ``text``: send the decoded text),
    ``x-<field>=<value>`` (a server-specific request field, e.g. ``x-repeat_penalty=1``),
    ``tokenizer`` (a model spec whose tokenizer and chat template to use; default:
    the model id itself, e.g. ``smollm2``), ``window``, ``timeout`` (seconds to wait for
    each piece of a reply, the first one included: a long prompt on a slow server takes
    a while) and ``concurrency`` (requests in flight at once; see `OpenAIGenerator`).
    ``load`` loads a spec.

    Raises:
        UserError: a malformed spec or an unknown option.
    """
    shown = public_spec(f"openai:{arg}")  # what errors quote: no credentials, no query string
    url, sep, rest = arg.partition("#")
    model, *pairs = rest.split(";")
    if not sep or not url or not model.strip():
        raise UserError(f"the spec {shown!r} needs a model id after '#': {SPEC_FORM}")
    opts: dict[str, str] = {}
    extra: dict[str, Any] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if eq and key.strip().startswith("x-") and len(key.strip()) > 2 and value.strip():
            try:  # numbers and true/false as JSON, anything else as a string
                extra[key.strip()[2:]] = json.loads(value.strip())
            except ValueError:
                extra[key.strip()[2:]] = value.strip()
            continue
        if not eq or key.strip() not in OPTIONS or not value.strip():
            raise UserError(f"bad option {pair!r} in {shown!r}; the form is {SPEC_FORM}")
        opts[key.strip()] = value.strip()
    if opts.get("prompt", "tokens") not in ("tokens", "text"):
        raise UserError(f"prompt={opts['prompt']} in {shown!r} must be 'tokens' or 'text' "
                        "(text for servers that take no token-id prompts, e.g. llama-cpp-python's)")
    if "prompt" in opts:
        options.setdefault("token_prompts", opts["prompt"] == "tokens")

    def positive(key: str, unit: str) -> int | None:
        text = opts.get(key)
        if text is not None and (not text.isdigit() or int(text) <= 0):
            raise UserError(f"{key}={text} in {shown!r} must be a positive number of {unit}")
        return int(text) if text is not None else None

    window = positive("window", "tokens")
    options.setdefault("concurrency", positive("concurrency", "requests") or 1)
    if "timeout" in opts:
        try:
            timeout = float(opts["timeout"])
        except ValueError:
            timeout = -1.0
        if not timeout > 0:
            raise UserError(f"timeout={opts['timeout']} in {shown!r} must be a positive number of seconds")
        options.setdefault("read_timeout", timeout)
    check_server(url.strip(), opts.get("mode", "completions"))  # before a slow tokenizer load
    spec = opts.get("tokenizer", model.strip())
    render: RenderChat | None = None
    try:
        if spec.startswith("hf:"):  # the tokenizer files only: a served model's weights can be huge
            borrowed: Tokenizer | Generator
            borrowed, render = hf_tokenizer(spec[3:])
        else:
            borrowed = load(spec)
    except UserError as exc:
        hint = "" if "tokenizer" in opts else f"; name a local model with the same tokenizer: {SPEC_FORM}"
        raise UserError(f"cannot load the tokenizer {spec!r} for {shown!r}: {exc}{hint}") from exc
    return OpenAIGenerator(
        url.strip(), model.strip(), borrowed, render_chat=render, mode=opts.get("mode", "completions"),
        context_window=window, name=f"openai:{arg}",
        extra_body=extra or None, **options,
    )


def hf_tokenizer(path: str) -> tuple[Tokenizer, RenderChat]:
    """The tokenizer and chat template of a local Hugging Face folder, without its weights.

    Raises:
        UserError: no such folder, or no tokenizer in it.
        MissingDependency: transformers is not installed.
    """
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise MissingDependency("Hugging Face tokenizers (transformers)", "pip install 'marginalia[hf]'") from exc
    from ..hf.backend import HFTokenizer

    folder = os.path.expanduser(path)
    if not os.path.isdir(folder):
        raise UserError(f"no tokenizer folder at {folder}; give a local Hugging Face model folder")
    try:
        tok = AutoTokenizer.from_pretrained(folder)
    except Exception as exc:  # transformers raises many kinds here
        raise UserError(f"could not load a tokenizer from {folder}: {exc}") from exc

    def render(messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        if not getattr(tok, "chat_template", None):
            raise BackendError(f"the tokenizer in {folder} has no chat template; use an instruct model's")
        plain = [{"role": m["role"], "content": m["content"]} for m in messages]
        return str(tok.apply_chat_template(plain, tokenize=False, add_generation_prompt=add_generation_prompt))

    return HFTokenizer(tok), render
