"""The server's listening socket, with Nagle's algorithm off so that streamed events leave at once."""

from __future__ import annotations

import socket

from ..errors import UserError


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port``, listening, with ``TCP_NODELAY`` (accepted connections inherit it).

    uvicorn's own socket leaves Nagle's algorithm on (asyncio sets ``TCP_NODELAY`` only on sockets made
    with an explicit TCP protocol number), which holds each small event of a stream until the previous
    one is acknowledged: up to 40 ms per event against a client that delays its acknowledgements.

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
