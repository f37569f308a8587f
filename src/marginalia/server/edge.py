"""The checks a request meets before any route: it is addressed to a host this server answers to (against
DNS rebinding: a web page whose own name resolves to this machine), and a state-changing request that a
browser sends comes from this server's own page or from an origin let in with ``--cors-origin`` (against
cross-site requests, which a browser sends without asking, an upload included).

Clients that are not browsers (curl, SDKs) send no ``Origin`` and pass the second check; a browser always
sends one with a POST, PUT, PATCH or DELETE.
"""

from __future__ import annotations

import ipaddress

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import HostNotAllowed, OriginNotAllowed, error_response
from .settings import ENV_ALLOWED_HOSTS, LOOPBACK_NAMES, Settings, host_name, origin_of, split_host

#: the methods that may change something, which a cross-site page must not send
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: the addresses that mean every address of this machine (as ``--host``, in `host_name`'s form)
WILDCARDS = frozenset({"0.0.0.0", "[::]", ""})
#: what a browser says in ``Sec-Fetch-Site`` of a request a page of another origin made
FOREIGN_SITES = frozenset({"cross-site", "same-site"})
#: the most characters of a client's header shown back in an error
SHOWN = 100


def is_address(name: str) -> bool:
    """Whether a host name is an IP address (which no DNS answer can point elsewhere)."""
    try:
        ipaddress.ip_address(name[1:-1] if name.startswith("[") else name)
    except ValueError:
        return False
    return True


class Hosts:
    """The host names a server answers to: the address it listens on, the loopback names, any IP address
    when it listens on all of them, and those given (``*.example.org``: its subdomains; ``*``: any)."""

    def __init__(self, settings: Settings) -> None:
        given = [name.lower().rstrip(".") for name in settings.allowed_hosts]
        self.any = "*" in given
        bound = host_name(settings.host)
        self.any_address = bound in WILDCARDS
        self.names = frozenset({bound, *LOOPBACK_NAMES, *(n for n in given if not n.startswith("*"))}) - WILDCARDS
        self.suffixes = tuple(n[1:] for n in given if n.startswith("*."))

    def allows(self, name: str) -> bool:
        return (self.any or name in self.names or (bool(self.suffixes) and name.endswith(self.suffixes))
                or (self.any_address and is_address(name)))

    def listed(self) -> str:
        """The allowed names, in words."""
        names = sorted(self.names) + [f"*{s}" for s in self.suffixes]
        return ", ".join(names) + (" and any IP address" if self.any_address else "")


class Edge:
    """Answer a request addressed to a host the server does not answer to with 421, and a state-changing
    request from a web page of another origin with 403, both in the one JSON error shape, before any
    route (or CORS) sees them."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.hosts = Hosts(settings)
        self.any_origin = "*" in settings.cors_origins
        self.origins = frozenset(o for o in (origin_of(c) for c in settings.cors_origins) if o is not None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope["method"], Headers(scope=scope))
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, method: str, headers: Headers) -> Exception | None:
        """Why a request is refused, or None. A request without ``Host`` (HTTP/1.0) is not a browser's."""
        hosts = headers.getlist("host")
        for host in hosts:
            name = split_host(host)[0]
            if not self.hosts.allows(name):
                return HostNotAllowed(
                    f"this server does not answer to the host {name[:SHOWN]!r} (the request's Host header): it "
                    f"answers to {self.hosts.listed()}; to add a name clients use for it, start it with "
                    f"--allowed-host NAME (or ${ENV_ALLOWED_HOSTS}), or --allowed-host '*' behind a proxy that "
                    "checks the host itself")
        if method not in STATE_CHANGING or self.any_origin:
            return None
        origin = headers.get("origin")
        if origin is None:
            site = headers.get("sec-fetch-site", "")
            if site in FOREIGN_SITES:
                return OriginNotAllowed(
                    f"a browser sent this {method} from a page of another site (Sec-Fetch-Site: {site}); this "
                    "server takes requests that change something from its own page only, and from the origins "
                    "given with --cors-origin")
            return None
        parsed = origin_of(origin)
        if parsed in self.origins or (len(hosts) == 1 and is_own(parsed, hosts[0])):
            return None
        if parsed is None:
            return OriginNotAllowed(
                f"a page whose origin is {origin[:SHOWN]!r} (a sandboxed frame or a local file, say) may not send "
                f"this {method}: this server takes requests that change something from its own page and from the "
                "origins given with --cors-origin; serve that page from an http(s) origin and give it that way")
        return OriginNotAllowed(
            f"a web page at {origin[:SHOWN]!r} may not send this {method}: this server takes requests that change "
            "something from its own page and from the origins given with --cors-origin; to let that page in, "
            f"start the server with --cors-origin {origin[:SHOWN]}")


def is_own(origin: tuple[str, str, int] | None, host: str) -> bool:
    """Whether ``origin`` is the server's own: the host name and port the request was addressed to (its
    ``Host``). Without a port in ``Host``, the origin's scheme's default port: a proxy in front may have
    ended TLS, so the scheme is not compared."""
    if origin is None:
        return False
    scheme, name, port = origin
    addressed, addressed_port = split_host(host)
    if name != addressed:
        return False
    if not addressed_port:
        return port == (443 if scheme == "https" else 80)
    return addressed_port.isascii() and addressed_port.isdigit() and int(addressed_port) == port
