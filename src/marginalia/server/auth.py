"""Who may call the server: the one decision on a request's ``Authorization`` header, taken by the gate before
a byte of a body is read (`gate.Gate`), by the routes' key dependency (`common.require_key`) and by the health
check (which says more to a caller with the key)."""

from __future__ import annotations

import secrets

from .errors import Unauthorized
from .settings import Settings

#: the scheme of the header that carries the key
BEARER = "bearer"


def authenticate(settings: Settings, authorization: str | None) -> None:
    """Let a request in, or refuse it: the server's key must come as ``Authorization: Bearer <key>`` when the
    server has one (``settings.api_key``); a server without one lets every request in.

    Raises:
        Unauthorized: the key is missing or wrong.
    """
    key = settings.api_key
    if key is None:
        return
    scheme, _, given = (authorization or "").strip().partition(" ")
    if scheme.lower() != BEARER or not secrets.compare_digest(given.strip().encode(), key.encode()):
        raise Unauthorized("this server needs its key: send 'Authorization: Bearer <key>'")


def authenticated(settings: Settings, authorization: str | None) -> bool:
    """Whether `authenticate` lets a request with this header in."""
    try:
        authenticate(settings, authorization)
    except Unauthorized:
        return False
    return True
