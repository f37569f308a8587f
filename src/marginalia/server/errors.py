"""Errors as HTTP answers: one JSON shape, ``{"error": {"code", "message"}}``, with the status each error means.

marginalia's own errors keep their classes (`NotFound` is 404, `UserError` 400, ...); the server adds the
few that only HTTP has (a full queue, an unsupported upload). A failure nobody expected is a 500 whose
message names no file, line or traceback: those go to the server's log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..app import pattern_specs, public_spec
from ..errors import (
    BackendError,
    CollectionBusy,
    ContextOverflow,
    DocumentTooLarge,
    EmptyDocument,
    IngestError,
    MarginaliaError,
    MissingDependency,
    NotFound,
    UserError,
)

log = logging.getLogger("marginalia.server")
#: the most characters of an error message sent to a client
MAX_MESSAGE = 1000
#: the most problems a validation error lists; the rest are counted (a body may hold millions)
MAX_PROBLEMS = 20
#: the error type of a body part that names more than `MAX_PROBLEMS` unknown fields (``names``: the first)
UNKNOWN_FIELDS = "unknown_fields"


class Busy(MarginaliaError):
    """Too many requests wait for the model already; try again after ``retry_after`` seconds."""

    def __init__(self, retry_after: int, waiting: int) -> None:
        self.retry_after = retry_after
        super().__init__(f"the model is busy and {waiting} requests are waiting for it; "
                         f"try again in about {retry_after} s")


class Overloaded(MarginaliaError):
    """The server holds as much of requests as it takes at once; try again after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class UnsupportedType(UserError):
    """An upload whose content is not a kind of document marginalia reads."""


class Unauthorized(UserError):
    """A request without the server's key."""


class Forbidden(UserError):
    """A request this caller's key may not make, on something it may see (a reader's upload, a writer's
    new collection); what it may not see is answered as not found instead."""


class Conflict(UserError):
    """What a request would create exists already."""


class TooLarge(UserError):
    """A request body over the server's limit."""


class HostNotAllowed(UserError):
    """A request addressed to a host name this server does not answer to (its ``Host`` header)."""


class OriginNotAllowed(UserError):
    """A state-changing request a browser sent from a web page of another origin."""


#: the HTTP status and error code of each error class (the first match in this order wins)
STATUSES: tuple[tuple[type[BaseException], int, str], ...] = (
    (Busy, 429, "busy"),
    (Overloaded, 503, "overloaded"),
    (Unauthorized, 401, "unauthorized"),
    (Forbidden, 403, "forbidden"),
    (HostNotAllowed, 421, "host_not_allowed"),
    (OriginNotAllowed, 403, "origin_not_allowed"),
    (NotFound, 404, "not_found"),
    (UnsupportedType, 415, "unsupported_type"),
    (Conflict, 409, "conflict"),
    (CollectionBusy, 409, "collection_busy"),
    (TooLarge, 413, "too_large"),
    (ContextOverflow, 400, "context_overflow"),
    (MissingDependency, 501, "missing_dependency"),
    (EmptyDocument, 422, "empty_document"),
    (DocumentTooLarge, 422, "document_too_large"),  # over one of the server's document limits
    (IngestError, 422, "unreadable_document"),  # the upload's own name is the only path it names
    (UserError, 400, "bad_request"),
    (BackendError, 502, "backend_error"),
)

#: codes for the statuses Starlette raises itself (unknown route, wrong method, body over the limit)
HTTP_CODES = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 408: "timeout", 413: "too_large",
              429: "busy", 503: "overloaded"}


def describe(exc: BaseException) -> tuple[int, str, str]:
    """The status, code and message of an error (a message safe to show to a client: no URL's credentials or
    query, and at most `MAX_MESSAGE` characters, however long a value it quotes)."""
    for cls, status, code in STATUSES:
        if isinstance(exc, cls):
            return status, code, public_message(str(exc) + advice(exc))
    return 500, "internal_error", "the server failed on this request; its log has the details"


def public_message(message: str) -> str:
    """``message`` as a client may see it: model URLs without credentials or query (`app.public_spec`), cut
    to `MAX_MESSAGE` characters (a value a client sent may be megabytes long, and it is quoted)."""
    if len(message) > MAX_MESSAGE:
        message = f"{message[:MAX_MESSAGE]}... (cut: {len(message):,} characters)"
    return public_spec(message)


def advice(exc: BaseException) -> str:
    """What to do about an error, in the API's terms (appended to the message)."""
    if isinstance(exc, ContextOverflow):
        return ('; read it with {"reading": {"pattern": "rag"}} (only the most relevant chunks), send a shorter '
                "document, or serve a model with a longer window")
    return ""


def error_body(code: str, message: str, **more: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **more}}


def error_response(exc: BaseException, **more: Any) -> JSONResponse:
    status, code, message = describe(exc)
    if status == 500:
        log.error("unexpected error", exc_info=exc)
    headers = {}
    if isinstance(exc, Busy | Overloaded):
        headers["Retry-After"] = str(exc.retry_after)
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    extra: dict[str, Any] = dict(more)
    if isinstance(exc, ContextOverflow):
        extra.update(needed_tokens=exc.needed, window_tokens=exc.window)
    return JSONResponse(error_body(code, message, **extra), status_code=status, headers=headers)


def field_name(loc: tuple[Any, ...] | list[Any]) -> str:
    """A validation error's location as a dotted field name: without FastAPI's leading ``body``, nor the
    pattern name pydantic adds after ``reading`` (the tag of the union it chose: ``default`` for a reading that
    names none)."""
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    tags = reading_tags()
    return ".".join(p for i, p in enumerate(parts) if not (i and parts[i - 1] == "reading" and p in tags))


def reading_tags() -> set[str]:
    """The tags of the reading union (`schemas.Reading`) pydantic puts in an error's location: the registered
    patterns, and ``default`` for a reading that names none."""
    return {*(spec.name for spec in pattern_specs()), "default"}


def shorten(name: str, most: int = 100) -> str:
    """A field name a client chose, cut to ``most`` characters (a JSON key may be megabytes long)."""
    return name if len(name) <= most else f"{name[:most]}... ({len(name):,} characters)"


def json_kind(value: Any) -> str:
    """What a decoded JSON value is, in words (never the value itself, which may be megabytes)."""
    if value is None:
        return "null"
    if isinstance(value, bool | float):  # a float for an integer field: 512.0 says what is wrong
        return json.dumps(value)
    kinds = {str: "a string", int: "a number", list: "an array", dict: "an object"}
    return next((kind for cls, kind in kinds.items() if isinstance(value, cls)), type(value).__name__)


def validation_response(errors: Sequence[Any]) -> JSONResponse:
    """422, naming each bad field and what is wrong with it: the first `MAX_PROBLEMS` of them, and how many
    more there are."""
    fields: list[dict[str, str]] = []
    total = sum(e.get("ctx", {}).get("count", 1) if e.get("type") == UNKNOWN_FIELDS else 1 for e in errors)
    for err in errors[:MAX_PROBLEMS]:
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        loc = tuple(err.get("loc", ()))
        name = field_name(loc)
        if err.get("type") == UNKNOWN_FIELDS:  # many unknown fields in one error: a problem each
            names = err.get("ctx", {}).get("names", [])
            fields.extend({"field": shorten(field_name((*loc, n))), "message": "no such field"} for n in names)
            continue
        if err.get("type") == "extra_forbidden":
            message = "no such field"
        elif str(err.get("type")).endswith("_type") and "input" in err:  # strict: "512" is not a number
            message += f", not {json_kind(err['input'])}"
        elif err.get("type") == "json_invalid":
            why = err.get("ctx", {}).get("error", "unreadable")
            name, message = "body", f"not valid JSON ({why}, at character {name})"
        fields.append({"field": shorten(name), "message": message})
    fields = fields[:MAX_PROBLEMS]
    text = "; ".join(f"{f['field']}: {f['message']}" for f in fields)
    more: dict[str, Any] = {}
    if total > len(fields):
        more["more_problems"] = total - len(fields)
        text += f"; and {total - len(fields):,} more problems"
    return JSONResponse(error_body("validation_error", text or "invalid request", fields=fields, **more),
                        status_code=422)


class BodyTooLarge(StarletteHTTPException):
    """Raised while a body is read past the limit (an HTTP exception, so FastAPI's body parsing passes it on)."""

    def __init__(self) -> None:
        super().__init__(status_code=413)


class BodyLimit:
    """Refuse request bodies over ``max_body`` bytes with a JSON 413: at once when Content-Length says so,
    else as soon as that many bytes have been read (Starlette's own limiter answers in plain text); and a
    Content-Length that is not a number with a JSON 400."""

    def __init__(self, app: ASGIApp, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            # only ASCII digits: str.isdigit() also takes '²', which int() refuses
            if not (declared.isascii() and declared.isdigit()):
                await JSONResponse(error_body("bad_request", f"the Content-Length header {declared!r} is not a "
                                              "number of bytes; send the body's length, or no header"),
                                   status_code=400)(scope, receive, send)
                return
            if int(declared) > self.max_body:
                await self.too_large()(scope, receive, send)
                return
        read = 0

        async def limited() -> Message:
            nonlocal read
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > self.max_body:
                    raise BodyTooLarge()
            return message

        await self.app(scope, limited, send)

    def too_large(self) -> JSONResponse:
        return JSONResponse(error_body("too_large", too_large_message(self.max_body)), status_code=413)


def too_large_message(max_body: int) -> str:
    return f"the request body is larger than this server accepts ({max_body} bytes)"


def install(app: FastAPI, max_body: int) -> None:
    """Answer every error in the one JSON shape, and refuse bodies over ``max_body`` bytes."""

    async def on_marginalia(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        invalid = exc if isinstance(exc, RequestValidationError | ValidationError) else None
        return validation_response(invalid.errors() if invalid is not None else [])

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        status = exc.status_code if isinstance(exc, StarletteHTTPException) else 500
        message = str(getattr(exc, "detail", "")) or "HTTP error"
        if status == 413:
            message = too_large_message(max_body)
        return JSONResponse(error_body(HTTP_CODES.get(status, "http_error"), message), status_code=status,
                            headers=getattr(exc, "headers", None))

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    app.add_exception_handler(MarginaliaError, on_marginalia)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(ValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
    app.add_middleware(BodyLimit, max_body=max_body)
