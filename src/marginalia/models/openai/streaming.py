"""Reading an OpenAI-compatible server's event stream: text deltas cut at the stop strings, the server's own
counts noted as they come, and a stream that breaks off or is malformed reported as such."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from ...errors import BackendError, MissingDependency
from ..base import StopScanner
from .replies import Chunk, MalformedReply, Timings, UsageReport, parse
from .requests import HTTP_INSTALL

try:
    import httpx
    import httpx_sse
except ImportError as exc:  # pragma: no cover - the tests run with the http extra
    raise MissingDependency("the OpenAI-compatible HTTP backend (httpx, httpx-sse, tenacity)",
                            HTTP_INSTALL) from exc


class _StreamFault(Exception):
    """A broken SSE stream: args are (what happened, detail); `read_stream` reports it."""


@dataclass
class Received:
    """What a stream said besides its text, noted as it is read."""

    usage: UsageReport | None = None
    timings: Timings | None = None
    first: float | None = None  # `time.perf_counter` at the first text delta


def read_stream(response: httpx.Response, scanner: StopScanner, *, chat: bool, base_url: str,
                received: Received) -> Iterator[str]:
    """The text deltas of ``response``'s event stream, cut by ``scanner``; its counts go into ``received``.

    Raises:
        BackendError: the server reported a failure, or its stream broke off or was malformed.
    """
    text = ""
    try:
        complete = False
        for chunk in _chunks(response):
            if chunk is None:  # [DONE]
                if not complete:
                    raise _StreamFault("cut off", "it said [DONE] before any finish_reason, as "
                                       "llama-cpp-python's server does when another request "
                                       "interrupts this one (start it with --interrupt_requests "
                                       "false, as `marginalia serve-model` does)")
                break
            failure = chunk.error_text()
            if failure is not None:
                raise BackendError(f"the model server at {base_url} failed after "
                                   f"{len(text)} characters: {failure}")
            received.usage = chunk.usage or received.usage
            received.timings = chunk.timings or received.timings
            piece = chunk.piece(chat)
            if piece:
                text += piece
                delta = scanner.feed(text)
                if delta:
                    received.first = received.first or time.perf_counter()
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
        raise BackendError(f"the model server's stream was {fault.args[0]} after {len(text)} "
                           f"characters: {fault.args[1]}; is the server at {base_url} "
                           "still running and serving this API?") from fault.__cause__


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
