"""Bounds on what one client's connection may hold: how long its request headers and its body may take to
arrive, how many connections the server keeps open, and the uvicorn settings that carry them.

uvicorn bounds the size of request headers (h11's incomplete-event size) and the idle time between two
requests on a connection (keep-alive), but not the time a request's headers or body take: a connection
that sends half a request line, or declares more body than it sends, is held for as long as the client
likes. `BoundedH11` adds a deadline for the headers and a limit on open connections (uvicorn's own
``limit_concurrency`` answers in plain text and refuses the health check too); `ReadTimeouts`, a pure ASGI
middleware, bounds the time between two pieces of a body and the whole body's time. Each answers with the
service's JSON error shape and closes the connection.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_body

if TYPE_CHECKING:
    import uvicorn

    from .settings import Settings

#: what an answer that closes its connection says
CLOSE = {"Connection": "close"}
#: the route that answers even when the server keeps as many connections as it may
HEALTH = "/v1/health"
#: seconds a client refused for too many connections is told to wait
RETRY_AFTER = 5


class BodyTimeout(StarletteHTTPException):
    """Raised while a body is read, when its next piece is late (an HTTP exception, so that FastAPI's body
    parsing passes it on to the JSON error handler)."""

    def __init__(self, message: str) -> None:
        super().__init__(status_code=408, detail=message, headers=CLOSE)


class ReadTimeouts:
    """Refuse a request whose body stops arriving or trickles: 408 (JSON) and the connection closed when no
    piece of it comes for ``between`` seconds, the whole of it takes more than ``total``, or, once ``grace``
    seconds have passed since it began, it has averaged fewer than ``min_rate`` bytes a second (so that a
    byte every few seconds cannot hold a connection for the whole of ``total``).

    Only reading the body is timed: once its last piece has come, the app's later calls to ``receive``
    (waiting for the client to leave) pass through untouched.
    """

    def __init__(self, app: ASGIApp, between: float, total: float, min_rate: float = 0.0,
                 grace: float = 0.0) -> None:
        self.app = app
        self.between = between
        self.total = total
        self.min_rate = min_rate
        self.grace = grace

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        began = loop.time()
        deadline = began + self.total
        complete = False
        started = False
        received = 0

        def rate_deadline() -> float:
            """When the body's average rate falls below ``min_rate`` if nothing more comes."""
            if self.min_rate <= 0:
                return math.inf
            return began + max(self.grace, received / self.min_rate)

        async def timed() -> Message:
            nonlocal complete, received
            if complete:
                return await receive()
            now = loop.time()
            left = deadline - now
            if left <= 0:
                raise BodyTimeout(self.too_slow("total"))
            if rate_deadline() <= now:
                raise BodyTimeout(self.too_slow("rate"))
            wait = min(self.between, left, rate_deadline() - now)
            try:
                message = await asyncio.wait_for(receive(), wait)
            except TimeoutError:
                why = "between" if wait >= self.between else "total" if wait >= left else "rate"
                raise BodyTimeout(self.too_slow(why)) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, timed, watched)
        except BodyTimeout as exc:  # raised where no error handler answers it
            if started:
                raise
            await _answer(send, exc.status_code, "timeout", exc.detail)

    def too_slow(self, why: str) -> str:
        if why == "total":
            return (f"the request body took more than {self.total:g} s to arrive (the server's "
                    "--body-total-timeout); send it faster, or a smaller one")
        if why == "rate":
            return (f"the request body arrived at fewer than {self.min_rate:g} bytes a second after its first "
                    f"{self.grace:g} s (the server's --min-body-rate and --body-rate-grace); send it faster")
        return (f"the request body stopped arriving: nothing of it came for {self.between:g} s (the server's "
                "--body-timeout); send the whole body, as long as its Content-Length says")


async def _answer(send: Send, status: int, code: str, message: str, **headers: str) -> None:
    """A JSON error that closes the connection, sent with ASGI's ``send``."""
    body = json.dumps(error_body(code, message)).encode()
    fields = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
              (b"connection", b"close"), *((k.lower().encode(), v.encode()) for k, v in headers.items())]
    await send({"type": "http.response.start", "status": status, "headers": fields})
    await send({"type": "http.response.body", "body": body})


def refusing(app: ASGIApp, max_connections: int) -> ASGIApp:
    """``app`` for a connection past the limit: 503 (JSON) to every request but the health check, which is
    answered as ever; either way the connection then closes."""

    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] != HEALTH:
            await _answer(send, 503, "busy", f"this server has {max_connections} connections open, as many as it "
                          f"keeps (its --max-connections); try again in a few seconds", **{
                              "Retry-After": str(RETRY_AFTER)})
            return

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await app(scope, receive, closing)

    return refuse


def bounded_protocol(header_timeout: float, max_connections: int) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a deadline for request headers and a limit on open connections.

    A connection has ``header_timeout`` seconds from when it opens, or from the end of its last response,
    until its next request's headers are complete; past it, it is closed (with a 408 when part of a request
    came). A connection opened while ``max_connections`` are open gets `refusing`'s answers.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from .net import send_json_400

    class BoundedH11(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        send_400_response = send_json_400  # a request h11 cannot parse gets the JSON error shape
        _awaited: Any = None  # the request cycle that was current when the headers began to be awaited

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                self.app = refusing(self.app, max_connections)
            self._await_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_header_timer()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self._header_timer is not None and self.cycle is not self._awaited:  # a request began
                self._stop_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # may start the next request, if the client sent it already
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._await_headers()

        def _await_headers(self) -> None:
            self._stop_header_timer()
            self._awaited = self.cycle
            self._header_timer = self.loop.call_later(header_timeout, self._headers_late)

        def _stop_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.transport.get_protocol() is not self:  # closed, or upgraded
                return
            partial, _ = self.conn.trailing_data
            if partial:  # part of a request came: say why it is refused (none came: an idle connection)
                body = json.dumps(error_body("timeout", f"the request's headers did not arrive within "
                                             f"{header_timeout:g} s (the server's --header-timeout)")).encode()
                self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                                     b"connection: close\r\ncontent-length: " + str(len(body)).encode()
                                     + b"\r\n\r\n" + body)
            self.transport.close()

    return BoundedH11


def install(app: Any, settings: Settings) -> None:
    """Bound the time a request body may take, and its rate (`ReadTimeouts`)."""
    app.add_middleware(ReadTimeouts, between=settings.body_timeout, total=settings.body_total_timeout,
                       min_rate=settings.min_body_rate, grace=settings.body_rate_grace)


def server_config(app: Any, settings: Settings, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` with the bounds of ``settings`` (headers, connections, keep-alive,
    shutdown); ``options`` are uvicorn's others (host, port, log level)."""
    import uvicorn

    return uvicorn.Config(
        app, http=bounded_protocol(settings.header_timeout, settings.max_connections),
        h11_max_incomplete_event_size=settings.max_header_bytes, timeout_keep_alive=settings.keep_alive,
        timeout_graceful_shutdown=settings.shutdown_timeout, **options)
