"""The checks a request meets before a byte of its body is read: the server's key (`auth.authenticate`), the
body's declared length against the largest the server takes, an upload's room in the indexing queue, and the
bytes of bodies being received at once over all connections. Each is answered at once, in the one JSON error
shape, and a connection whose body was announced but not read is closed.

A body without a Content-Length (chunked) is counted as it arrives, and refused as soon as it would pass a
bound.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .auth import PRINCIPAL, caller
from .errors import Overloaded, TooLarge, Unauthorized, error_response, too_large_message
from .settings import MIB, Settings

#: the paths any caller may reach: the page, its files and the health check (which says more with the key)
OPEN = re.compile(r"/(?:static/.*|v1/health)?")
#: the route that takes uploads, whose room in the indexing queue is checked by the body's declared length
UPLOAD = re.compile(r"/v1/collections/[^/]+/documents/?")
#: seconds a client refused for too many bytes in flight is told to wait
RETRY_AFTER = 5


class InFlight:
    """The bytes of request bodies being received, over all connections (the event loop's alone: no lock)."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.held = 0

    def take(self, size: int) -> bool:
        """Hold ``size`` more bytes, unless that passes the bound."""
        if self.held + size > self.bound:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size


class Refused(StarletteHTTPException):
    """Raised while a body without a declared length is read, when it would pass a bound (an HTTP exception,
    so that FastAPI's body parsing passes it on to the JSON error handler)."""

    def __init__(self, error: Exception) -> None:
        response = error_response(error)
        super().__init__(status_code=response.status_code, detail=str(error),
                         headers={**dict(response.headers), "Connection": "close"})
        self.error = error


class Gate:
    """Refuse a request before its body is read: 401 without the key, 413 for a declared body over
    ``max_body``, 429 for an upload the indexing queue has no room for (``room``: the refusal for an upload
    of so many bytes, or None), and 503 when the bodies in flight would pass ``settings.body_bytes_in_flight``."""

    def __init__(self, app: ASGIApp, settings: Settings, max_body: int,
                 room: Callable[[int], Exception | None] | None = None) -> None:
        self.app = app
        self.settings = settings
        self.max_body = max_body
        self.room = room
        self.in_flight = InFlight(settings.body_bytes_in_flight)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        announced = (declared not in (None, "0")) or "chunked" in headers.get("transfer-encoding", "").lower()
        refusal = self.refusal(scope, headers, declared)
        if refusal is not None:
            await self.refuse(refusal, announced)(scope, receive, send)
            return
        if declared is not None and declared.isascii() and declared.isdigit():
            size = int(declared)
            if not self.in_flight.take(size):
                await self.refuse(self.overloaded(), announced)(scope, receive, send)
                return
            try:
                await self.app(scope, receive, send)
            finally:
                self.in_flight.give(size)
            return
        await self.counted(scope, receive, send)

    def refusal(self, scope: Scope, headers: Headers, declared: str | None) -> Exception | None:
        """Why a request is refused before its body is read, or None (a malformed Content-Length is left to
        `errors.BodyLimit`, which says so)."""
        if OPEN.fullmatch(scope["path"]) is None and scope["method"] != "OPTIONS":
            try:
                client = scope.get("client")
                scope.setdefault("state", {})[PRINCIPAL] = caller(self.settings, headers, client[0] if client else None)
            except Unauthorized as exc:
                return exc
        if declared is None or not (declared.isascii() and declared.isdigit()):
            return None
        size = int(declared)
        if size > self.max_body:
            return TooLarge(too_large_message(self.max_body))
        if self.room is not None and scope["method"] == "POST" and UPLOAD.fullmatch(scope["path"]):
            return self.room(size)
        return None

    async def counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass a request on whose body has no declared length, holding its bytes as they arrive."""
        held = 0

        async def counting() -> Message:
            nonlocal held
            message = await receive()
            size = len(message.get("body", b"")) if message["type"] == "http.request" else 0
            if size:
                if not self.in_flight.take(size):
                    raise Refused(self.overloaded())
                held += size
            return message

        try:
            await self.app(scope, counting, send)
        except Refused as exc:  # raised where no error handler answers it
            await self.refuse(exc.error, True)(scope, receive, send)
        finally:
            self.in_flight.give(held)

    def overloaded(self) -> Overloaded:
        return Overloaded(
            f"this server is receiving {self.in_flight.held / MIB:.1f} MiB of request bodies already, as much as "
            f"it takes at once (its --max-inflight-mb, {self.in_flight.bound / MIB:.0f} MiB); try again in a few "
            "seconds", RETRY_AFTER)

    @staticmethod
    def refuse(error: Exception, close: bool) -> ASGIApp:
        """The JSON error for ``error``; it closes the connection when a body was announced (and is not read)."""
        response = error_response(error)
        if close:
            response.headers["Connection"] = "close"
        return response
