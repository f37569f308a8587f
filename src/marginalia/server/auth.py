"""Who is calling, and what each route lets them do: `authenticate` turns a request's credentials into a
`Principal` (a key of the key store, the server's own key, or a user a trusted proxy signed in), and
`ROUTE_SCOPES` is the one table that says which scope each route needs.

A server with no key of its own, no stored key or user and no trusted header is open, as it was before
keys: every caller is an anonymous admin. Storing the first key (``marginalia keys create``) closes it.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import MarginaliaError
from .errors import Busy, Unauthorized
from .keys import Grants, KeyStore
from .settings import Settings

#: the seconds the per-key request bound counts over
RATE_WINDOW = 60.0


class Scope(enum.Enum):
    """What a route asks of its caller."""

    PUBLIC = "public"  # nothing: the page, its files, the health check
    SIGNED = "signed"  # any valid key; what it names (a body's collection, a job) is checked by the route
    READ = "read"  # may read the collection named in the path ({name})
    WRITE = "write"  # may write the collection named in the path ({name})
    ADMIN = "admin"  # an admin key: keys, creating and deleting collections
    OWNER = "owner"  # the session or reading named in the path was opened by this caller


#: every route's scope, by method and path as the app declares it; a route missing here is refused to all
#: but admins, and a test walks the app's routes to fail on one
ROUTE_SCOPES: dict[tuple[str, str], Scope] = {
    ("GET", "/"): Scope.PUBLIC,
    ("GET", "/static"): Scope.PUBLIC,
    ("GET", "/v1/health"): Scope.PUBLIC,
    ("GET", "/openapi.json"): Scope.SIGNED,
    ("GET", "/docs"): Scope.SIGNED,
    ("GET", "/redoc"): Scope.SIGNED,
    ("GET", "/v1/me"): Scope.SIGNED,
    ("GET", "/v1/patterns"): Scope.SIGNED,
    ("GET", "/v1/keys"): Scope.ADMIN,
    ("POST", "/v1/keys"): Scope.ADMIN,
    ("DELETE", "/v1/keys/{key_name}"): Scope.ADMIN,
    ("POST", "/v1/keys/{key_name}/rotate"): Scope.ADMIN,
    ("GET", "/v1/collections"): Scope.SIGNED,
    ("POST", "/v1/collections"): Scope.ADMIN,
    ("GET", "/v1/collections/{name}"): Scope.READ,
    ("DELETE", "/v1/collections/{name}"): Scope.ADMIN,
    ("POST", "/v1/collections/{name}/documents"): Scope.WRITE,
    ("GET", "/v1/collections/{name}/documents/{document:path}"): Scope.READ,
    ("DELETE", "/v1/collections/{name}/documents/{document:path}"): Scope.WRITE,
    ("POST", "/v1/collections/{name}/qa-jobs"): Scope.WRITE,
    ("GET", "/v1/qa-jobs"): Scope.SIGNED,
    ("GET", "/v1/qa-jobs/{job_id}"): Scope.SIGNED,
    ("GET", "/v1/qa-jobs/{job_id}/events"): Scope.SIGNED,
    ("GET", "/v1/collections/{name}/qa-pairs"): Scope.READ,
    ("PATCH", "/v1/collections/{name}/qa-pairs/{pair_id}"): Scope.WRITE,
    ("POST", "/v1/collections/{name}/eval-jobs"): Scope.WRITE,
    ("GET", "/v1/eval-jobs"): Scope.SIGNED,
    ("GET", "/v1/eval-jobs/{job_id}"): Scope.SIGNED,
    ("GET", "/v1/jobs"): Scope.SIGNED,
    ("GET", "/v1/jobs/{job_id}"): Scope.SIGNED,
    ("GET", "/v1/jobs/{job_id}/events"): Scope.SIGNED,
    ("POST", "/v1/ask"): Scope.SIGNED,
    ("POST", "/v1/readings/{reading_id}/stop"): Scope.OWNER,
    ("POST", "/v1/sessions"): Scope.SIGNED,
    ("GET", "/v1/sessions/{session_id}"): Scope.OWNER,
    ("DELETE", "/v1/sessions/{session_id}"): Scope.OWNER,
    ("POST", "/v1/sessions/{session_id}/messages"): Scope.OWNER,
    ("POST", "/v1/compose/sessions"): Scope.SIGNED,
    ("GET", "/v1/compose/sessions/{session_id}"): Scope.OWNER,
    ("GET", "/v1/compose/sessions/{session_id}/memory"): Scope.OWNER,
    ("DELETE", "/v1/compose/sessions/{session_id}"): Scope.OWNER,
    ("POST", "/v1/compose/sessions/{session_id}/suggestions"): Scope.OWNER,
    ("GET", "/v1/models"): Scope.SIGNED,
    ("POST", "/v1/chat/completions"): Scope.SIGNED,
    ("POST", "/chat"): Scope.SIGNED,
}


@dataclass(frozen=True)
class Principal:
    """A caller: ``actor`` names it in the audit log (``key:<name>``, ``user:<name>``, ``server-key``,
    ``anonymous``); ``owner`` owns the sessions and readings it opens (None on an open server, where
    everyone owns everything); ``bounded``: the per-key bounds on requests and readings apply."""

    actor: str
    owner: str | None
    grants: Grants
    bounded: bool = False

    def can_read(self, collection: str) -> bool:
        return self.grants.can_read(collection)

    def can_write(self, collection: str) -> bool:
        return self.grants.can_write(collection)

    def to_dict(self) -> dict[str, object]:
        kind, _, name = self.actor.partition(":")
        return {"signed_in_as": self.actor, "kind": kind, "name": name or None, **self.grants.to_dict()}


#: the caller of a public route (who is not asked)
NOBODY = Principal("nobody", "nobody", Grants())
#: every caller of an open server
ANONYMOUS = Principal("anonymous", None, Grants(admin=True))
SERVER_KEY = Principal("server-key", "server-key", Grants(admin=True))


def authenticate(settings: Settings, authorization_header: str | None, *, peer: str | None = None,
                 forwarded_user: str | None = None, keys: KeyStore | None = None) -> Principal:
    """The caller of a request, from its ``Authorization`` header, or from the trusted header when the
    request comes from a trusted proxy (``peer``: the address it came from; ``forwarded_user``: the
    trusted header's value, if any).

    Raises:
        Unauthorized: the server needs a key and none was sent, or the one sent is no key of this
            server's (revoked, rotated, mistyped), or the proxy's user has no grants. The message never
            repeats what was sent.
    """
    keys = keys or key_store(settings.home)
    if forwarded_user is not None and settings.trusted_header and is_trusted(settings, peer):
        user = keys.user(forwarded_user.strip())
        if user is None:
            raise Unauthorized("the proxy signed in a user who has no grants on this server; an admin gives "
                               "them some with 'marginalia keys grant-user USER --read COLLECTION'")
        return Principal(f"user:{user.name}", f"user:{user.name}", user.grants, bounded=True)
    token = bearer(authorization_header)
    if token:
        if settings.api_key is not None and hmac.compare_digest(token.encode("utf-8", "surrogatepass"),
                                                                settings.api_key.encode()):
            return SERVER_KEY
        record = keys.find(token)
        if record is not None:
            return Principal(f"key:{record.name}", f"key#{record.id}", record.grants, bounded=True)
    if settings.api_key is None and not settings.trusted_header and not keys.has_keys():
        return ANONYMOUS
    if token:
        raise Unauthorized("this server does not know that key (it may have been revoked or rotated); send "
                           "a current one as 'Authorization: Bearer <key>'")
    raise Unauthorized("this server needs a key: send 'Authorization: Bearer <key>' (an admin makes one with "
                       "'marginalia keys create NAME --read COLLECTION')")


def bearer(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header ('' for none or another scheme)."""
    if not header:
        return ""
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def is_trusted(settings: Settings, peer: str | None) -> bool:
    """Whether a request from ``peer`` may name its user in the trusted header."""
    if peer is None:
        return False
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(p, strict=False) for p in settings.trusted_proxies)


_stores: dict[Path, KeyStore] = {}
_stores_lock = threading.Lock()


def key_store(home: str | None) -> KeyStore:
    """The key store of a home (one object per path; it holds no connection)."""
    store = KeyStore.of_home(home)
    with _stores_lock:
        return _stores.setdefault(store.path, store)


class RateExceeded(Busy):
    """A key sent more requests in the last minute than the server allows one key (HTTP 429)."""

    def __init__(self, limit: int, retry_after: int) -> None:
        MarginaliaError.__init__(self, f"this key sent {limit} requests in the last minute, as many as the server "
                                 f"allows one key (--key-rate); try again in {retry_after} s")
        self.retry_after = retry_after


class RequestRate:
    """At most ``limit`` requests per caller in any `RATE_WINDOW` seconds (a sliding log of their times)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def check(self, owner: str, now: float | None = None) -> None:
        """Count a request of ``owner``.

        Raises:
            RateExceeded: it is one too many; Retry-After says when the oldest counted one leaves the window.
        """
        now = time.monotonic() if now is None else now
        with self._lock:
            seen = self._seen.setdefault(owner, deque())
            while seen and now - seen[0] >= RATE_WINDOW:
                seen.popleft()
            if len(seen) >= self.limit:
                raise RateExceeded(self.limit, max(1, int(RATE_WINDOW - (now - seen[0]) + 0.999)))
            seen.append(now)


#: where the gate leaves the caller it authenticated in the request's scope state, so that the routes'
#: dependency does not look the key up a second time
PRINCIPAL = "marginalia_principal"


def caller(settings: Settings, headers: Mapping[str, str], peer: str | None) -> Principal:
    """`authenticate` on a request's headers (``peer``: the address it came from), as the gate, the routes'
    dependency and the health check all ask it."""
    forwarded = headers.get(settings.trusted_header) if settings.trusted_header else None
    return authenticate(settings, headers.get("authorization"), peer=peer, forwarded_user=forwarded)


def authenticated(settings: Settings, headers: Mapping[str, str], peer: str | None) -> bool:
    """Whether `caller` lets a request with these headers in."""
    try:
        caller(settings, headers, peer)
    except Unauthorized:
        return False
    return True
