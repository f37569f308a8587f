"""The server's listening socket: bound before the model loads (so a port in use fails at once), with
Nagle's algorithm off so that streamed events leave at once."""

from __future__ import annotations

import socket

from ..errors import UserError


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
