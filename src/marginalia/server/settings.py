"""The service's settings: what the server loads, where it keeps things, its limits and who may call it."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from ..app import DEFAULT_EMBEDDER
from ..errors import UserError
from ..options import IngestOptions

#: the environment variable that holds the key clients must send (``Authorization: Bearer <key>``)
ENV_SERVER_KEY = "MARGINALIA_SERVER_KEY"
#: the environment variable that lists more host names requests may be addressed to, separated by commas
ENV_ALLOWED_HOSTS = "MARGINALIA_ALLOWED_HOSTS"
#: the host names a server bound to a loopback address answers to besides that address
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
MIB = 1024 * 1024


@dataclass(frozen=True)
class Settings:
    """How one server runs. Every request gets its own reading state; these are shared by all of them.

    Args:
        home: marginalia's home directory (collections live under it).
        model: the model spec (see `marginalia.models.registry`), loaded once per process.
        device: where an in-process model runs.
        backend: the engine for GGUF models.
        model_api_key: the key sent to an ``openai:`` model server (not the key clients send here).
        embedder: the embedder for new collections and for rag over a pasted text or a document.
        api_key: the server's own key, an admin's, sent as a bearer token; None: only the key store's keys
            (`marginalia keys`), and none at all while it holds none.
        cors_origins: origins a browser may call from (none: CORS stays off; ``*``: any); a state-changing
            request a browser sends from any other origin but the server's own is refused.
        host: the address the server listens on; requests addressed to it (their ``Host`` header) are
            answered, and to ``localhost``, ``127.0.0.1`` and ``[::1]`` too; when it is a wildcard address
            (``0.0.0.0``, ``::``), to any IP address.
        allowed_hosts: more host names requests may be addressed to (a name, or ``*.example.org`` for its
            subdomains); ``*``: any (behind a proxy that checks them). Anything else is refused, so that a
            web page cannot reach the server through a DNS name of its own (DNS rebinding).
        max_upload_bytes: the largest request body (an uploaded file, a pasted text).
        queue_size: requests that may wait for the model while those it reads at once run; more get 429.
        session_ttl: seconds a chat or compose session lives without a message.
        max_sessions: chat sessions kept at once (the least recently used idle one makes room).
        session_bytes: the most bytes chat sessions' pasted texts take together, in memory (the least
            recently used idle sessions make room; when those answering messages hold too much, 429).
        compose_memory_model: the model spec that writes compose sessions' memory (None: ``model``).
        max_compose_sessions: compose sessions kept at once; each holds its own loads of the client and
            memory models (the least recently used idle one makes room).
        max_jobs: finished indexing jobs remembered (the oldest are forgotten first).
        upload_queue: uploads that may wait to be indexed, the one being indexed included; more get 429.
        upload_queue_bytes: the most bytes those uploads may hold (one upload alone always gets in).
        index_workers: uploads converted and indexed at once, each conversion in a process of its own (their
            additions to one collection go one after another).
        body_bytes_in_flight: the most bytes of request bodies being received at once, over all connections
            (counted by their Content-Length, or as they arrive); one more is refused with 503 at once.
        header_timeout: seconds a connection has to send its next request's headers (from when it opens or
            its last response ended); past them it is closed.
        body_timeout: seconds a request body may pause between two pieces; past them, 408.
        body_total_timeout: seconds a whole request body may take; past them, 408.
        min_body_rate: the fewest bytes per second a request body must average once ``body_rate_grace``
            seconds have passed since it began; slower, 408.
        body_rate_grace: seconds a request body may arrive at any rate before ``min_body_rate`` applies.
        max_connections: connections kept open at once; one more gets 503 for all but the health check.
        keep_alive: seconds an idle connection stays open after a response.
        shutdown_timeout: seconds the server waits for open requests (streams) to end when it stops.
        max_header_bytes: the most bytes of a request line and headers held while they are unfinished
            (h11's incomplete-event size; more: 400).
        default_collection: the collection the docqa-compatible ``/chat`` answers from.
        cache_readings: keep full WiM readings of documents on disk under ``home``, so a later question
            about the same document reads no document token (off: every question reads it again).
        ingest: the bounds on converting an uploaded document (a PDF's pages, inflated size, seconds and
            memory); a client cannot change them.
        trusted_header: a request header naming the user a proxy in front signed in (``X-Forwarded-User``),
            taken only from ``trusted_proxies``; the user's grants are those of the key store's user entry.
        trusted_proxies: the addresses or networks (``10.0.0.0/8``) of the proxies the trusted header is
            taken from; from any other address it is ignored.
        key_rate: the most requests one key or proxy user may send in a minute (more get 429).
        key_readings: the most readings one key or proxy user may have waiting or running at once (more get
            429).
        audit_questions: write the text of each question to the audit log (else only who asked what, when).
    """

    home: str | None = None
    model: str = "smollm2"
    device: str = "auto"
    backend: str = "auto"
    model_api_key: str | None = None
    embedder: str = DEFAULT_EMBEDDER
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    max_upload_bytes: int = 50 * MIB
    queue_size: int = 8
    session_ttl: float = 30 * 60.0
    max_sessions: int = 100
    session_bytes: int = 256 * MIB
    max_jobs: int = 1000
    upload_queue: int = 16
    upload_queue_bytes: int = 256 * MIB
    index_workers: int = 2
    body_bytes_in_flight: int = 512 * MIB
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    body_total_timeout: float = 600.0
    min_body_rate: int = 1024
    body_rate_grace: float = 10.0
    max_connections: int = 256
    keep_alive: int = 5
    shutdown_timeout: int = 10
    max_header_bytes: int = 16 * 1024
    default_collection: str | None = None
    compose_memory_model: str | None = None
    max_compose_sessions: int = 2
    cache_readings: bool = True
    ingest: IngestOptions = field(default_factory=IngestOptions)
    trusted_header: str | None = None
    trusted_proxies: tuple[str, ...] = ()
    key_rate: int = 600
    key_readings: int = 4
    audit_questions: bool = False

    def __post_init__(self) -> None:
        for name in ("max_upload_bytes", "max_sessions", "max_jobs", "max_compose_sessions", "upload_queue",
                     "upload_queue_bytes", "session_bytes", "header_timeout", "body_timeout", "body_total_timeout",
                     "max_connections", "keep_alive", "shutdown_timeout", "max_header_bytes", "index_workers",
                     "body_bytes_in_flight", "min_body_rate", "body_rate_grace", "key_rate", "key_readings"):
            if getattr(self, name) <= 0:
                raise UserError(f"{name} must be positive, got {getattr(self, name)}")
        if self.queue_size < 0:
            raise UserError(f"queue_size must be 0 or more, got {self.queue_size}")
        if self.session_ttl <= 0:
            raise UserError(f"session_ttl must be positive, got {self.session_ttl}")
        if self.api_key is not None and not self.api_key.strip():
            raise UserError("the server key is empty; give a non-empty key or none")
        for name in self.allowed_hosts:
            check_host_name(name)
        if self.trusted_header is not None and not self.trusted_proxies:
            raise UserError("--trusted-header needs --trusted-proxy ADDRESS: the header is taken only from the "
                            "proxy's address, else any client could name any user")
        for proxy in self.trusted_proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise UserError(f"{proxy!r} is not an address or network; give the proxy's address as in "
                                "127.0.0.1, 10.0.0.5 or 10.0.0.0/24") from None
        for origin in self.cors_origins:
            if origin != "*" and origin_of(origin) is None:
                raise UserError(f"{origin!r} is not an origin; give a page's scheme, host and port, as in "
                                "https://notes.example.org or http://localhost:3000")


def check_host_name(name: str) -> None:
    """Refuse what cannot be an allowed host name: empty, a URL, a path, a port, a space.

    Raises:
        UserError: naming the value and the form it takes.
    """
    bare = "example" if name == "*" else name.removeprefix("*.")
    if not bare or any(c in bare for c in "/ @?#,*") or split_host(bare) != (bare.lower().rstrip("."), ""):
        raise UserError(f"{name!r} is not a host name; give a name or address as clients write it in a URL, "
                        "without scheme or port: notes.example.org, 192.168.1.20, [fe80::1], *.example.org "
                        "(its subdomains), or * (any)")


def split_host(host: str) -> tuple[str, str]:
    """A ``Host`` header's name (lower-case, without a trailing dot; an IPv6 address keeps its brackets)
    and the text of its port ('' when it names none)."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            return host, ""
        rest = host[end + 1:]
        return host[:end + 1], rest[1:] if rest.startswith(":") else rest
    name, _, port = host.partition(":")
    return name.rstrip("."), port


def host_name(host: str) -> str:
    """The name in a ``Host`` header or in ``--host``, as `split_host` gives it; a bare IPv6 address
    (``::1``, as ``--host`` takes it) in brackets, as a ``Host`` header writes it."""
    if host.count(":") > 1 and not host.startswith("["):
        return f"[{host.strip().lower()}]"
    return split_host(host)[0]


def origin_of(url: str) -> tuple[str, str, int] | None:
    """A web origin's scheme, host name and port (the scheme's default when it names none); None when
    ``url`` is not an http(s) origin (``null``, a file URL, a URL with a path)."""
    scheme, sep, rest = url.strip().lower().partition("://")
    if not sep or scheme not in ("http", "https") or any(c in rest for c in "/?#@ "):
        return None
    name, port = split_host(rest)
    if not name:
        return None
    if not port:
        return scheme, name, 443 if scheme == "https" else 80
    if not (port.isascii() and port.isdigit()) or int(port) > 65535:
        return None
    return scheme, name, int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_binding(host: str, api_key: str | None, no_auth: bool, keys_stored: bool = False) -> str | None:
    """Refuse to expose an unauthenticated server beyond this machine; return a warning to print, if any.
    ``keys_stored``: the home's key store holds keys or users (or a trusted proxy signs users in), so
    every caller is asked for one.

    Raises:
        UserError: ``host`` is not a loopback address, no key is given and ``no_auth`` is false.
    """
    if api_key and no_auth:
        raise UserError("give either a server key or --no-auth, not both")
    if api_key or is_loopback(host) or (keys_stored and not no_auth):
        return None
    if no_auth:
        return (f"warning: serving on {host} without a key: anyone who can reach this address can read "
                "and change your collections and use the model")
    raise UserError(
        f"binding {host} makes the server reachable from other machines, so it needs a key: pass "
        f"--server-key KEY (or set ${ENV_SERVER_KEY}) and have clients send 'Authorization: Bearer KEY', "
        "or pass --no-auth to serve without one"
    )
