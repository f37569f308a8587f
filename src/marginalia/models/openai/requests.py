"""The requests of the OpenAI-compatible backend: their bodies, and sending them with retries.

A request is retried (tenacity) on a failed connection, 429 and 5xx, before any reply has arrived; an error
reply becomes the marginalia error that says what to do about it (an API key, a shorter prompt, a model id
the server knows).
"""

from __future__ import annotations

import itertools
import os
import re
import time
from collections.abc import Callable, Sequence
from email.utils import parsedate_to_datetime
from typing import Any, NoReturn

from ...errors import BackendError, ContextOverflow, MarginaliaError, MissingDependency, UserError
from ..base import GenerationParams, Message
from .replies import ErrorBody, MalformedReply, ModelEntry, ModelList, parse
from .spec import public_spec

HTTP_INSTALL = "pip install 'marginalia[http]'"
try:
    import httpx
    import tenacity
except ImportError as exc:  # pragma: no cover - the tests run with the http extra
    raise MissingDependency("the OpenAI-compatible HTTP backend (httpx, httpx-sse, tenacity)",
                            HTTP_INSTALL) from exc

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


class _Retryable(Exception):
    """A failure before any reply arrived that another attempt may cure: a failed connection
    (``cause``) or a 429/5xx ``response``; ``wait`` is the server's Retry-After in seconds."""

    def __init__(self, cause: Exception | None = None, response: httpx.Response | None = None,
                 wait: float | None = None) -> None:
        super().__init__(cause or response)
        self.cause = cause
        self.response = response
        self.wait = wait


def new_client(api_key: str | None, *, connect_timeout: float, read_timeout: float,
               concurrency: int) -> httpx.Client:
    """An HTTP client for one server, with ``api_key`` as its bearer token (default ``$MARGINALIA_API_KEY``,
    else ``$OPENAI_API_KEY``) and connections for the requests of ``concurrency`` readings at once."""
    key = api_key or next((os.environ[v] for v in KEY_VARS if os.environ.get(v)), None)
    # in flight at once: a reading's margins (plus a judge's request) in each of as many readings
    in_flight = concurrency * (concurrency + 1)
    return httpx.Client(
        timeout=httpx.Timeout(read_timeout, connect=connect_timeout),
        headers={"Authorization": f"Bearer {key}"} if key else {},
        limits=httpx.Limits(max_connections=max(100, in_flight), max_keepalive_connections=max(20, in_flight)),
    )


def request_body(model: str, params: GenerationParams, prompt: dict[str, Any], slot: int | None,
                 extra: dict[str, Any]) -> dict[str, Any]:
    """A streaming request's body: ``prompt`` (``{"prompt": ...}`` or ``{"messages": ...}``) under ``params``,
    pinned to a llama-server ``slot`` (None: any), with the server-specific ``extra`` fields last."""
    body: dict[str, Any] = {
        "model": model, "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": params.max_new_tokens, "temperature": params.temperature,
        "top_p": params.top_p, **prompt,
    }
    if params.stop:
        body["stop"] = list(params.stop)
    if params.seed is not None:
        body["seed"] = params.seed
    if slot is not None:
        body["id_slot"] = slot  # llama-server: the slot that holds this reading's prefix
    return {**body, **extra}


def chat_messages(text: str, render_chat: RenderChat) -> list[Message]:
    """The chat messages whose rendering by ``render_chat`` is ``text``.

    The frame of a [system, user] chat, else of a lone user turn, is cut off; a
    prompt in neither frame becomes one user message as it is.
    """
    both = render_chat([{"role": "system", "content": _SYS}, {"role": "user", "content": _USR}], True)
    before, _, rest = both.partition(_SYS)
    middle, _, tail = rest.partition(_USR)
    if _SYS in both and _USR in rest and text.startswith(before) and text.endswith(tail):
        cut = text.find(middle, len(before))
        if cut != -1 and cut + len(middle) <= len(text) - len(tail):
            return [{"role": "system", "content": text[len(before):cut]},
                    {"role": "user", "content": text[cut + len(middle):len(text) - len(tail)]}]
    head, _, tail = render_chat([{"role": "user", "content": _USR}], True).partition(_USR)
    if text.startswith(head) and text.endswith(tail) and len(head) + len(tail) <= len(text):
        return [{"role": "user", "content": text[len(head):len(text) - len(tail)]}]
    return [{"role": "user", "content": text}]


class Sender:
    """Sends a generator's requests to one server, and says what went wrong in marginalia's words.

    Args:
        client: the HTTP client (shared with the generator's forks).
        base_url: the API root, e.g. ``http://127.0.0.1:8080/v1``.
        model: the model id the server knows.
        read_timeout: seconds the client waits for each piece of a reply (for the error that says so).
        max_retries: retries on 429, 5xx and failed connections, before any reply.
        backoff: seconds to wait before each retry (a ``Retry-After`` header wins).
        sleep: the waiting function.
    """

    def __init__(self, client: httpx.Client, base_url: str, model: str, *, read_timeout: float,
                 max_retries: int, backoff: Sequence[float], sleep: Callable[[float], None]) -> None:
        self.client = client
        self.base_url = base_url
        self.shown_url = public_spec(base_url)  # what messages name: no credentials, no query
        self.model = model
        self.read_timeout = read_timeout
        self.max_retries = max_retries
        self.backoff = tuple(backoff) or (0.0,)
        self.sleep = sleep

    def open(self, path: str, body: dict[str, Any]) -> httpx.Response:
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
        """One attempt of `open`."""
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
        raise self.error(response, attempts=attempt)

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
            raise self.error(failure.response, attempts=state.attempt_number)
        cause = failure.cause if failure is not None and failure.cause is not None else RuntimeError(failure)
        raise self.unreachable(cause) from cause

    def error(self, response: httpx.Response, attempts: int) -> MarginaliaError:
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
                raise self.unreachable(exc) from exc
            return []
        if response.status_code != 200:
            return []
        try:
            return parse(ModelList, response.content, f"the model list at {self.shown_url}/models").data
        except MalformedReply:
            if strict:
                raise
            return []

    def unreachable(self, exc: Exception) -> BackendError:
        return BackendError(f"cannot reach the model server at {self.shown_url}: is it running? "
                            f"{START_HINT} ({type(exc).__name__}: {exc})")


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
