"""An OpenAI-compatible HTTP backend whose "KV cache" is a local token prefix.

`OpenAIGenerator` keeps the cached token ids locally and sends prefix + suffix with
every request, so each Writing-in-the-Margins request extends the one before and
the server's prefix cache (llama.cpp server, vLLM, SGLang) does the reuse. Spec:
``openai:<base-url>#<model>[;mode=completions|chat][;tokenizer=<spec>][;window=<n>]``.
Retries are tenacity's, the event stream is read by httpx-sse, and every reply is
validated by the pydantic models of `openai_replies`.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from email.utils import parsedate_to_datetime
from typing import Any, NoReturn

from ..errors import BackendError, ContextOverflow, MarginaliaError, MissingDependency, UserError
from .base import (
    CacheSnapshot,
    CachingGenerator,
    GenerationParams,
    Generator,
    Message,
    StopScanner,
    Tokenizer,
    Usage,
)
from .llama_slots import ServerSlots
from .openai_replies import Chunk, ErrorBody, MalformedReply, ModelEntry, ModelList, Timings, UsageReport, parse
from .openai_spec import MODES, OPTIONS, public_spec
from .openai_spec import OPENAI_SPEC_FORM as SPEC_FORM

HTTP_INSTALL = "pip install 'marginalia[http]'"
try:
    import httpx
    import httpx_sse
    import tenacity
except ImportError as exc:  # pragma: no cover - the tests run with the http extra
    raise MissingDependency("the OpenAI-compatible HTTP backend (httpx, httpx-sse, tenacity)",
                            HTTP_INSTALL) from exc

DEFAULT_WINDOW = 4096
BACKOFF = (0.5, 1.0, 2.0)  # seconds before retry 1, 2, 3
MAX_RETRY_AFTER = 60.0  # a server asking to wait longer gets an error, not a hang
KEY_VARS = ("MARGINALIA_API_KEY", "OPENAI_API_KEY")
START_HINT = ("start one with e.g. `llama-server -m model.gguf --port 8080` "
              "(then use openai:http://127.0.0.1:8080/v1#<model>) or `vllm serve <model>`")
_SYS = "\u2063MARGINALIA-SYSTEM\u2063"
_USR = "\u2063MARGINALIA-USER\u2063"
_CONTEXT = re.compile(r"context|length|tokens", re.IGNORECASE)
_WINDOW_NUM = re.compile(r"(?:context length|context size|context window|n_ctx)\D{0,20}?(\d+)", re.IGNORECASE)
_NEEDED_NUM = re.compile(r"(?:requested|resulted in|request has|prompt has|you have)\D{0,20}?(\d+)", re.IGNORECASE)
_MODEL_MISSING = re.compile(r"model.{0,80}(not found|does not exist|unknown|not available|no such)|"
                            r"(unknown|invalid|no such) model", re.IGNORECASE | re.DOTALL)
#: failures to send a request or to receive its headers: nothing of a reply has arrived
_CONNECTION_FAILURES = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError,
                        httpx.ReadError, httpx.WriteError)

RenderChat = Callable[[Sequence[Message], bool], str]


class _StreamFault(Exception):
    """A broken SSE stream: args are (what happened, detail); `_stream` reports it."""


class _Retryable(Exception):
    """A failure before any reply arrived that another attempt may cure: a failed connection
    (``cause``) or a 429/5xx ``response``; ``wait`` is the server's Retry-After in seconds."""

    def __init__(self, cause: Exception | None = None, response: httpx.Response | None = None,
                 wait: float | None = None) -> None:
        super().__init__(cause or response)
        self.cause = cause
        self.response = response
        self.wait = wait


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
        self.read_timeout = read_timeout
        self.max_retries = max_retries
        self.backoff = tuple(backoff) or (0.0,)
        self.sleep = sleep
        key = api_key or next((os.environ[v] for v in KEY_VARS if os.environ.get(v)), None)
        # in flight at once: a reading's margins (plus a judge's request) in each of as many readings
        in_flight = concurrency * (concurrency + 1)
        self.client = client or httpx.Client(
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout),
            headers={"Authorization": f"Bearer {key}"} if key else {},
            limits=httpx.Limits(max_connections=max(100, in_flight), max_keepalive_connections=max(20, in_flight)),
        )
        self._ids: list[int] = []
        #: what the server says of itself and of its slots (shared with every fork)
        self._slots = ServerSlots(self.client, self.base_url, self.list_models, model,
                                  per_slot=None if shares_prefixes is None else not shares_prefixes)
        self._slot: int | None = None  # the llama-server slot this generator's requests go to (None: any)
        self._own_slot = False  # a fork for a reading of its own: pinned to a slot on a per-slot server
        self._sent: list[int] = []  # the prompt of the last request (what its slot holds, then what it generated)

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
        return not self._slots.per_slot

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
        if self._slot is not None and self._ids and self._sent[:len(self._ids)] == self._ids:
            self._slots.save(self._slot, self._ids)
        return CacheSnapshot(tuple(self._ids))

    def restore(self, snapshot: CacheSnapshot) -> None:
        """Take the snapshot's prefix; on a llama-server slot whose file holds it, put it back into the slot, so
        that the next request finds it (a slot keeps only the last prompt's prefix)."""
        self._ids = list(snapshot.ids)
        if self._slot is not None:
            self._slots.restore(self._slot, snapshot.ids)

    def fork(self, keep_cache: bool = True) -> OpenAIGenerator:
        """A copy sharing the client, the tokenizer, the usage account and what the server said of itself. An
        empty one is a reading of its own: on a server with a prompt per slot, its requests go to a slot of
        their own (chosen at its first request)."""
        other = copy.copy(self)
        other._ids = list(self._ids) if keep_cache else []
        if not keep_cache:
            other._slot, other._own_slot, other._sent = None, True, []
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

    def _body(self, ids: list[int], params: GenerationParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": params.max_new_tokens, "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if self.mode == "chat":
            body["messages"] = self.messages_of(ids)
        else:
            body["prompt"] = ids if self.token_prompts else self._tokenizer.decode(ids)
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        if self._slot is not None:
            body["id_slot"] = self._slot  # llama-server: the slot that holds this reading's prefix
        return {**body, **self.extra_body}

    def messages_of(self, ids: Sequence[int]) -> list[Message]:
        """The chat messages whose rendering is the decoded ``ids`` (chat mode).

        The frame of a [system, user] chat, else of a lone user turn, is cut off; a
        prompt in neither frame becomes one user message as it is.
        """
        text = self._tokenizer.decode(ids)
        both = self.render_chat([{"role": "system", "content": _SYS}, {"role": "user", "content": _USR}])
        before, _, rest = both.partition(_SYS)
        middle, _, tail = rest.partition(_USR)
        if _SYS in both and _USR in rest and text.startswith(before) and text.endswith(tail):
            cut = text.find(middle, len(before))
            if cut != -1 and cut + len(middle) <= len(text) - len(tail):
                return [{"role": "system", "content": text[len(before):cut]},
                        {"role": "user", "content": text[cut + len(middle):len(text) - len(tail)]}]
        head, _, tail = self.render_chat([{"role": "user", "content": _USR}]).partition(_USR)
        if text.startswith(head) and text.endswith(tail) and len(head) + len(tail) <= len(text):
            return [{"role": "user", "content": text[len(head):len(text) - len(tail)]}]
        return [{"role": "user", "content": text}]

    def _generate(self, ids: list[int], params: GenerationParams) -> Iterator[str]:
        """Text deltas for the prompt ``ids``: one streaming request."""
        self.check_decoding(params)
        return self._stream(ids, params)

    def _stream(self, ids: list[int], params: GenerationParams) -> Iterator[str]:
        """One streaming request for ``ids``; yields text deltas and books the usage."""
        chat = self.mode == "chat"
        t0 = time.perf_counter()
        first: float | None = None
        usage: UsageReport | None = None
        timings: Timings | None = None
        scanner = StopScanner(params.stop)
        if self._own_slot and self._slot is None and self._slots.per_slot:
            self._slot = self._slots.next_slot()
        response = self._open("/chat/completions" if chat else "/completions",
                              self._body(ids, params))
        received = ""
        try:
            complete = False
            for chunk in self._chunks(response):
                if chunk is None:  # [DONE]
                    if not complete:
                        raise _StreamFault("cut off", "it said [DONE] before any finish_reason, as "
                                           "llama-cpp-python's server does when another request "
                                           "interrupts this one (start it with --interrupt_requests "
                                           "false, as `marginalia serve-model` does)")
                    break
                failure = chunk.error_text()
                if failure is not None:
                    raise BackendError(f"the model server at {self.shown_url} failed after "
                                       f"{len(received)} characters: {failure}")
                usage = chunk.usage or usage
                timings = chunk.timings or timings
                piece = chunk.piece(chat)
                if piece:
                    received += piece
                    delta = scanner.feed(received)
                    if delta:
                        first = first or time.perf_counter()
                        yield delta
                complete = complete or chunk.finished()
                if scanner.stopped:  # the server ignored a stop string
                    complete = True
                    break
            if not complete:
                raise _StreamFault("cut off", "it ended with no [DONE] and no finish_reason")
            tail = scanner.flush()
            if tail:
                yield tail
        except _StreamFault as fault:
            raise BackendError(f"the model server's stream was {fault.args[0]} after {len(received)} "
                               f"characters: {fault.args[1]}; is the server at {self.shown_url} "
                               "still running and serving this API?") from fault.__cause__
        finally:
            response.close()
            self._sent = ids
            self._book(ids, usage, timings, scanner.text[:scanner.emitted], t0, first)

    @staticmethod
    def _chunks(response: httpx.Response) -> Iterator[Chunk | None]:
        """The chunks of the response's event stream, validated; None for ``[DONE]``."""
        try:
            for event in httpx_sse.EventSource(response).iter_sse():
                data = event.data.strip()
                if not data:
                    continue  # an event with no data (a keep-alive, a bare event name)
                if data == "[DONE]":
                    yield None
                    return
                try:
                    chunk = parse(Chunk, data, "a chunk")
                except MalformedReply as exc:
                    raise _StreamFault("malformed", exc.detail) from exc
                yield chunk
        except httpx_sse.SSEError as exc:  # not an event stream at all
            raise _StreamFault("malformed", str(exc)) from exc
        except httpx.HTTPError as exc:
            raise _StreamFault("cut off", f"{type(exc).__name__}: {exc}") from exc

    def _book(self, ids: list[int], usage: UsageReport | None, timings: Timings | None, text: str,
              t0: float, first: float | None) -> None:
        """Add one request to the usage account, with the server's own counts of its prompt cache.

        The prompt tokens the server evaluated are taken to be its last ones (a prefix cache serves a
        prefix); in chat mode the server's own tokens may differ from ours, so their positions are ours.
        A reply that says neither how many prompt tokens the server took from its cache nor how many it
        evaluated leaves both unknown: the request is counted in ``cache_unreported`` and in neither
        count (nor in the ledger), never as a prompt evaluated in full.
        """
        sent = len(ids)
        counts = server_counts(usage, timings, sent)
        end = time.perf_counter()
        generated = self._tokenizer.count(text) if text else 0
        with self._lock:
            u = self.usage
            u.requests += 1
            u.prompt_tokens_sent += sent
            if counts is None:
                u.cache_unreported += 1
            else:
                cached, evaluated = counts
                u.prompt_tokens_cached += cached
                u.prefilled_tokens += evaluated
                u.evaluated(ids, sent - min(evaluated, sent), sent)
            u.generated_tokens += generated
            u.prefill_seconds += (first or end) - t0
            u.decode_seconds += end - (first or end)

    def _open(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """POST ``body`` and return the streaming response once it says 200.

        Retries with tenacity on failed connections, 429 and 5xx, waiting as ``backoff``
        says or as the server's Retry-After asks; never once a response has begun to
        stream (that is the caller's to read).
        """
        url = self.base_url + path
        attempts = itertools.count(1)
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Retryable),
            stop=self._stop,
            wait=self._wait,
            sleep=lambda seconds: self.sleep(float(seconds)),
            retry_error_callback=self._give_up,
        )
        response: httpx.Response = retrying(lambda: self._send(url, body, next(attempts)))
        return response

    def _send(self, url: str, body: dict[str, Any], attempt: int) -> httpx.Response:
        """One attempt of `_open`."""
        try:
            response = self.client.send(self.client.build_request("POST", url, json=body), stream=True)
        except _CONNECTION_FAILURES as exc:
            raise _Retryable(cause=exc) from exc
        except httpx.TimeoutException as exc:
            raise BackendError(f"the model server at {self.shown_url} sent nothing for "
                               f"{self.read_timeout:g} s; give it more time with "
                               "';timeout=<seconds>' in the model spec, or a smaller prompt") from exc
        if response.status_code < 400:
            return response
        response.read()
        response.close()
        if response.status_code == 429 or response.status_code >= 500:
            raise _Retryable(response=response, wait=_retry_after(response))
        raise self._error(response, attempts=attempt)

    def _wait(self, state: tenacity.RetryCallState) -> float:
        """Seconds before the next attempt: the server's Retry-After, else the backoff schedule."""
        failure = _failure(state)
        if failure is not None and failure.wait is not None:
            return failure.wait
        return self.backoff[min(state.attempt_number - 1, len(self.backoff) - 1)]

    def _stop(self, state: tenacity.RetryCallState) -> bool:
        """No more attempts: the retries are spent, or the server asks to wait too long."""
        failure = _failure(state)
        too_long = failure is not None and failure.wait is not None and failure.wait > MAX_RETRY_AFTER
        return too_long or state.attempt_number > self.max_retries

    def _give_up(self, state: tenacity.RetryCallState) -> NoReturn:
        """Raise the error for the last failure once `_stop` says so."""
        failure = _failure(state)
        if failure is not None and failure.response is not None:
            raise self._error(failure.response, attempts=state.attempt_number)
        cause = failure.cause if failure is not None and failure.cause is not None else RuntimeError(failure)
        raise self._unreachable(cause) from cause

    def _error(self, response: httpx.Response, attempts: int) -> MarginaliaError:
        """The marginalia error for an HTTP error response."""
        status = response.status_code
        try:
            body = ErrorBody.model_validate_json(response.text)
        except ValueError:  # not JSON, or not an error body we know: its text is the message
            body = ErrorBody(error=response.text)
        message = body.text()[:500] or "(no message)"
        fields = body.fields()
        where = f"the model server at {self.shown_url}"
        if status in (401, 403):
            return UserError(f"{where} refused the request (HTTP {status}: {message}); set "
                             f"{KEY_VARS[0]} (or {KEY_VARS[1]}) to an API key it accepts")
        too_long = "exceed_context" in (fields.type or "")
        if status in (400, 413) and (too_long or _CONTEXT.search(message)):
            window = fields.n_ctx or _first_int(_WINDOW_NUM, message)
            needed = fields.n_prompt_tokens or _first_int(_NEEDED_NUM, message)
            if window and needed:
                return ContextOverflow(needed, window, what=f"the request to {self.model}")
            return BackendError(f"{where} says the prompt is too long: {message}; use a shorter "
                                "document, --pattern rag, or a smaller ;window= in the model spec")
        mentions_model = _MODEL_MISSING.search(message) or (len(self.model) > 2 and self.model in message)
        if status == 404 or (status < 500 and mentions_model):
            try:
                ids = [m.id for m in self.list_models()]
            except MarginaliaError:
                ids = []
            known = f"; it serves: {', '.join(ids)}" if ids else ""
            return UserError(f"{where} does not know the model {self.model!r} (HTTP {status}: {message})"
                             f"{known}; put one of its model ids after '#' in the spec")
        if status == 429:
            return BackendError(f"{where} is busy (HTTP 429: {message}) after {attempts} attempt(s); "
                                "try again later or send fewer requests at once")
        return BackendError(f"{where} answered HTTP {status} after {attempts} attempt(s): {message}")

    def list_models(self, strict: bool = False) -> list[ModelEntry]:
        """The entries of the server's ``GET /models`` ([] when it gives none).

        Raises:
            BackendError: only when ``strict``: the server cannot be reached, or its
                listing is malformed.
        """
        try:
            response = self.client.get(self.base_url + "/models")
        except httpx.TransportError as exc:
            if strict:
                raise self._unreachable(exc) from exc
            return []
        if response.status_code != 200:
            return []
        try:
            return parse(ModelList, response.content, f"the model list at {self.shown_url}/models").data
        except MalformedReply:
            if strict:
                raise
            return []

    def _unreachable(self, exc: Exception) -> BackendError:
        return BackendError(f"cannot reach the model server at {self.shown_url}: is it running? "
                            f"{START_HINT} ({type(exc).__name__}: {exc})")


def check_server(base_url: str, mode: str) -> None:
    """Reject a URL that is not http(s) or an unknown mode, with what to write instead."""
    if not re.match(r"https?://[^/]", base_url):
        raise UserError(f"the server URL {base_url!r} must start with http:// or https://")
    if mode not in MODES:
        raise UserError(f"unknown mode {mode!r} for {public_spec(base_url)}; choose one of {', '.join(MODES)}")


def server_counts(usage: UsageReport | None, timings: Timings | None, sent: int) -> tuple[int, int] | None:
    """``(cached, evaluated)``: the prompt tokens a server says it took from its prefix cache and those it
    evaluated, or None when its reply says neither.

    llama.cpp's server gives both in ``timings`` (``cache_n``, ``prompt_n``); vLLM (with
    ``--enable-prompt-tokens-details``), SGLang and OpenAI give ``usage.prompt_tokens_details.cached_tokens``
    beside ``usage.prompt_tokens``. Where a reply gives one of the two, the other is the rest of the prompt
    (its length as the server counts it, else ``sent``, the tokens sent). A bare ``usage.prompt_tokens``
    says how long the prompt was, not what the server computed of it: None.
    """
    cached = timings.cache_n if timings else None
    if cached is None and usage is not None and usage.prompt_tokens_details is not None:
        cached = usage.prompt_tokens_details.cached_tokens
    evaluated = timings.prompt_n if timings else None
    if cached is None and evaluated is None:
        return None
    whole = usage.prompt_tokens if usage is not None and usage.prompt_tokens is not None else None
    if evaluated is None:
        evaluated = (sent if whole is None else whole) - (cached or 0)
    if cached is None:
        cached = (sent if whole is None else whole) - evaluated
    return max(cached, 0), max(evaluated, 0)


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
    url, sep, rest = arg.partition("#")
    model, *pairs = rest.split(";")
    if not sep or not url or not model.strip():
        raise UserError(f"the spec 'openai:{arg}' needs a model id after '#': {SPEC_FORM}")
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
            raise UserError(f"bad option {pair!r} in 'openai:{arg}'; the form is {SPEC_FORM}")
        opts[key.strip()] = value.strip()
    if opts.get("prompt", "tokens") not in ("tokens", "text"):
        raise UserError(f"prompt={opts['prompt']} in 'openai:{arg}' must be 'tokens' or 'text' "
                        "(text for servers that take no token-id prompts, e.g. llama-cpp-python's)")
    if "prompt" in opts:
        options.setdefault("token_prompts", opts["prompt"] == "tokens")

    def positive(key: str, unit: str) -> int | None:
        text = opts.get(key)
        if text is not None and (not text.isdigit() or int(text) <= 0):
            raise UserError(f"{key}={text} in 'openai:{arg}' must be a positive number of {unit}")
        return int(text) if text is not None else None

    window = positive("window", "tokens")
    options.setdefault("concurrency", positive("concurrency", "requests") or 1)
    if "timeout" in opts:
        try:
            timeout = float(opts["timeout"])
        except ValueError:
            timeout = -1.0
        if not timeout > 0:
            raise UserError(f"timeout={opts['timeout']} in 'openai:{arg}' must be a positive number of seconds")
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
        raise UserError(f"cannot load the tokenizer {spec!r} for 'openai:{arg}': {exc}{hint}") from exc
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
    from .transformers_backend import HFTokenizer

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


def _first_int(pattern: re.Pattern[str], text: str) -> int | None:
    m = pattern.search(text)
    return int(m.group(1)) if m else None


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds the server's Retry-After header asks to wait (seconds or an HTTP date), if any."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
        return seconds if seconds >= 0 else 0.0  # nan too
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _failure(state: tenacity.RetryCallState) -> _Retryable | None:
    """The retryable failure of tenacity's last attempt, if that is how it ended."""
    failure = state.outcome.exception() if state.outcome is not None else None
    return failure if isinstance(failure, _Retryable) else None
