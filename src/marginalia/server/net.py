"""The server's transport: its listening socket, bound before the model loads (so a port in use fails at
once), with Nagle's algorithm off so that streamed events leave at once; and uvicorn's HTTP protocol with its
answer to a request it cannot parse in the one JSON error shape."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

from ..errors import UserError
from .errors import error_body


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port``, listening, with ``TCP_NODELAY`` (accepted connections inherit it).

    asyncio sets ``TCP_NODELAY`` only on connections whose socket names the TCP protocol number, which a
    socket made by hand does not; without it, each small event of a stream waits for the previous one to
    be acknowledged (up to a client's delayed-acknowledgement timeout, tens of milliseconds, per event).
    uvicorn's own ``--host/--port`` socket has it; this one sets it itself.

    Raises:
        UserError: the address cannot be bound (in use, not this machine's, no permission).
    """
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, dualstack_ipv6=host == "::")
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port or "
                        "--host") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def unparsable_reply(reason: str) -> bytes:
    """The whole HTTP reply to a request the HTTP parser refused (a header that breaks HTTP/1.1: a
    Content-Length that is not a number, say): 400 in the one JSON error shape, and the connection closed."""
    message = (f"the request is not valid HTTP/1.1 ({reason.rstrip('.')}): a request line or header is malformed, "
               "such as a Content-Length that is not a number of bytes; send a well-formed request")
    body = json.dumps(error_body("bad_request", message)).encode()
    head = (f"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n")
    return head.encode("ascii") + body


def send_json_400(protocol: Any, msg: str) -> None:
    """uvicorn's ``send_400_response`` (of its HTTP/1.1 protocols), answering a request the parser refused
    with `unparsable_reply`: such a request never reaches the app, and uvicorn's own answer is plain text.
    A protocol class takes it as its method ``send_400_response``."""
    protocol.transport.write(unparsable_reply(msg))
    protocol.transport.close()


def with_json_errors(protocol: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    """``protocol`` (one of uvicorn's HTTP/1.1 protocols, or a subclass of one) with `send_json_400`."""
    return type(f"JSON{protocol.__name__}", (protocol,), {"send_400_response": send_json_400})


def http_protocol() -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol, the one it chooses itself (httptools where installed, else h11), with
    `send_json_400`."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return with_json_errors(AutoHTTPProtocol)
