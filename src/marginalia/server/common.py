"""What the routes share: the service and key dependencies, and answering a reading as JSON or as events."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sse_starlette import EventSourceResponse

from ..records import Answer, Done
from .auth import NOBODY, PRINCIPAL, ROUTE_SCOPES, Principal, RequestRate, Scope, caller
from .errors import Forbidden, TooLarge, describe, error_body, error_response
from .events import answer_dict, event_payload, margin_dict
from .schemas import SCANNED, lone_surrogate
from .service import Service
from .worker import ClientGone, Failed, Prepared, Reading

#: what a client sees when a client closed its request (nginx's convention; nobody reads it)
CLIENT_CLOSED = 499
#: the response header of a stream that names its reading (for POST /v1/readings/{id}/stop)
READING_HEADER = "Marginalia-Reading-Id"

#: the OpenAPI ``responses`` of a route that may answer with server-sent events (the schema is each event's)
STREAMED: dict[int | str, dict[str, Any]] = {
    200: {"description": "the answer, or with stream: true its events",
          "content": {"text/event-stream": {"schema": {
              "type": "object", "required": ["data"],
              "properties": {"event": {"type": "string"}, "data": {"type": "string", "description": "JSON"}}}}}},
}

_bearer = HTTPBearer(auto_error=False, description="a key (marginalia keys create, or serve --server-key)")


#: bodies above this many bytes are decoded and checked in a worker thread, not on the event loop
OFF_LOOP_BYTES = 256 * 1024
#: the most values (counted by the commas and colons outside strings) a large JSON body may hold: no request
#: needs nearly so many, and decoding millions holds the interpreter's lock, and with it the event loop, for
#: seconds, whichever thread decodes them
MAX_VALUES = 1_000_000
#: a JSON string, escapes included
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


class ParsedOffLoop(APIRoute):
    """A route whose large JSON body is decoded, and checked for lone surrogates (`schemas.lone_surrogate`),
    in a worker thread, so that a body of millions of values does not hold the event loop (and every other
    request, the health check included) while it is read."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parsed(request: Request) -> Response:
            if "json" in request.headers.get("content-type", "") and request.method in ("POST", "PUT", "PATCH"):
                body = await request.body()
                if len(body) > OFF_LOOP_BYTES:
                    data, where = await run_in_threadpool(_decode, body)
                    if where is not None:
                        raise RequestValidationError([{
                            "type": "value_error", "loc": ("body",),
                            "msg": f"not valid Unicode ({where}): it holds a lone surrogate, a \\ud800 to \\udfff "
                                   "escape without its pair; send UTF-8 text"}])
                    request._json = data  # what Starlette's Request.json() returns from now on
                    SCANNED.set(True)
            return await handler(request)

        return parsed


def _decode(body: bytes) -> tuple[Any, str | None]:
    """A JSON body, and where it holds a lone surrogate (None: nowhere).

    Raises:
        TooLarge: the body holds more than `MAX_VALUES` values (counted before it is decoded).
        RequestValidationError: not JSON (as FastAPI says it).
    """
    values = _values(body)
    if values > MAX_VALUES:
        raise TooLarge(f"the request body holds about {values:,} JSON values, more than the {MAX_VALUES:,} this "
                       "server decodes; no request needs so many: send only the fields the API documents")
    try:
        data = json.loads(body)
    except ValueError as exc:
        pos = getattr(exc, "pos", 0)
        why = getattr(exc, "msg", "unreadable")
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", pos), "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": why}}]) from None
    # in a UTF-8 body a lone surrogate comes as a \ud800-\udfff escape, or as the bytes UTF-8 would give one
    # (which json.loads lets through): without either, the walk over every value is spared
    if json.detect_encoding(body) == "utf-8" and not any(mark in body for mark in (b"\\ud", b"\\uD", b"\xed")):
        return data, None
    return data, lone_surrogate(data)


def _values(body: bytes) -> int:
    """How many values a JSON body holds, about: its commas and colons outside strings, or its strings where
    they are more. Each count is a pass in C; the strings are cut out (to tell a long text full of commas from
    a body of many values) only when the plain count passes `MAX_VALUES` and the strings are few."""
    rough = body.count(b",") + body.count(b":")
    if rough <= MAX_VALUES:
        return rough
    strings = (body.count(b'"') - body.count(b'\\"')) // 2
    if strings > MAX_VALUES:
        return strings
    bare = _STRING.sub(b"", body)
    return bare.count(b",") + bare.count(b":")


def get_service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


def route_scope(request: Request) -> Scope:
    """The scope `ROUTE_SCOPES` gives the route a request matched (admin for a route it does not list)."""
    route = request.scope.get("route")
    path = getattr(route, "path", None)
    return ROUTE_SCOPES.get((request.method if request.method != "HEAD" else "GET", str(path)), Scope.ADMIN)


async def require_key(request: Request,
                      credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Principal:
    """The caller, checked against the scope of the route it asks for (`ROUTE_SCOPES`), every route's first
    dependency; also counted against its key's bound on requests.

    Raises:
        Unauthorized: no key, or not a key of this server's.
        NotFound: the collection the path names is missing or out of the caller's reach (the same reply).
        Forbidden: the caller may see what the route names but not do this to it.
        RateExceeded: the caller's key sent as many requests as it may this minute.
    """
    scope = route_scope(request)
    if scope is Scope.PUBLIC:
        return NOBODY
    service = get_service(request)
    settings = service.settings
    who = request.scope.get("state", {}).get(PRINCIPAL) or caller(  # the gate's, else asked here
        settings, request.headers, request.client.host if request.client else None)
    if who.bounded:
        rate: RequestRate = request.app.state.rate
        rate.check(who.owner or who.actor)
    if scope is Scope.ADMIN and not who.grants.admin:
        raise Forbidden("only an admin key may do this; ask an admin (marginalia keys create NAME --admin)")
    if scope in (Scope.READ, Scope.WRITE):
        await run_in_threadpool(service.check_collection, request.path_params["name"], who, scope is Scope.WRITE)
    return who


#: what a route takes to know its caller (the dependency runs once per request, whoever asks for it)
Caller = Annotated[Principal, Depends(require_key)]


def start_reading(service: Service, prepared: Prepared, who: Principal) -> Reading:
    """A reading for ``who``: only it may stop it, and a key's readings at once are bounded.

    Raises:
        TooManyReadings: the key has as many readings waiting or running as it may.
        Busy: the model's queue is full.
    """
    limit = service.settings.key_readings if who.bounded else None
    return Reading(service.worker, prepared, owner=who.owner, limit=limit)


def sse(kind: str, data: Any) -> dict[str, str]:
    return {"event": kind, "data": json.dumps(data, ensure_ascii=False)}


async def answer(reading: Reading, request: Request, stream: bool,
                 on_answer: Callable[[Answer], None] | None = None,
                 done: Callable[[], None] | None = None,
                 render: Callable[[Answer], dict[str, Any]] = answer_dict) -> Response:
    """Answer a reading: one JSON object, or server-sent events (one per step) when ``stream``.

    Errors before the first event keep their HTTP status (the stream waits for that event before it
    starts); a later one becomes an ``error`` event with the margins judged so far, and ends the stream.
    A stream names its reading in the `READING_HEADER` header, so that its client can stop it and still
    get the answer.
    ``on_answer`` sees the answer; ``done`` runs when the reading is over, either way; ``render`` makes
    the JSON reply of an answer.
    """
    handed_over = False  # to the event stream, which then calls done itself
    try:
        first = await reading.next(request.is_disconnected)
        if not stream:
            return await _whole(reading, request, first, on_answer, render)
        if isinstance(first, Failed):
            return error_response(first.error)
        handed_over = True
        return EventSourceResponse(_events(reading, first, on_answer, done), headers={READING_HEADER: reading.id})
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED)
    finally:
        if not handed_over and done is not None:
            done()


async def _whole(reading: Reading, request: Request, item: Any, on_answer: Callable[[Answer], None] | None,
                 render: Callable[[Answer], dict[str, Any]]) -> Response:
    result: Answer | None = None
    while item is not None:
        if isinstance(item, Failed):
            return error_response(item.error, margins=[margin_dict(m) for m in reading.margins])
        if isinstance(item, Done):
            result = item.answer
        item = await reading.next(request.is_disconnected)
    if result is None:  # pragma: no cover - every reading ends in Done or an error
        raise RuntimeError("the reading ended without an answer")
    if on_answer is not None:
        on_answer(result)
    return JSONResponse(render(result))


async def _events(reading: Reading, item: Any, on_answer: Callable[[Answer], None] | None,
                  done: Callable[[], None] | None) -> AsyncIterator[dict[str, str]]:
    try:
        while item is not None:
            if isinstance(item, Failed):
                _, code, message = describe(item.error)
                yield sse("error", error_body(code, message, margins=[margin_dict(m) for m in reading.margins]))
                return
            if isinstance(item, Done) and on_answer is not None:
                on_answer(item.answer)
            yield sse(item.kind, event_payload(item))
            item = await reading.next()
    finally:  # the client left, or the stream ended: either way this reading is over
        if not reading.finished:
            reading.cancel()
        if done is not None:
            done()
