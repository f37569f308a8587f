"""serve: the document QA HTTP service (collections, uploads, questions, chat and compose sessions,
OpenAI-compatible)."""

from __future__ import annotations

import argparse
import os
from typing import Any, TextIO

from .. import app
from ..errors import MissingDependency
from .common import (
    MODEL_NOTE,
    Formatter,
    Reporter,
    load_model,
    model_options,
    non_negative_int,
    port_number,
    positive_int,
)

SERVE_INSTALL = "pip install 'marginalia[serve]'"


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add serve."""
    from ..server.settings import ENV_ALLOWED_HOSTS, ENV_SERVER_KEY, MIB, Settings

    defaults = Settings()
    serve = sub.add_parser(
        "serve", parents=[common, model_options()], formatter_class=Formatter, usage="%(prog)s [options]",
        help="serve collections and questions over HTTP (JSON, server-sent events, OpenAI-compatible)",
        description="Start the HTTP service: create collections and upload documents (indexed in the "
                    "background), ask a pasted text, a document or a collection with wim, lc or rag (as JSON or "
                    "as server-sent events, one per reading step), hold chat sessions, and answer OpenAI clients "
                    "(model 'marginalia:<collection>') and docqa clients (POST /chat), and suggest what comes next "
                    "in a text being written (compose sessions; the page's Write view). One model per process "
                    "reads one request at a time; the others wait in a bounded queue. The API is described at "
                    "/docs once it runs. It listens on 127.0.0.1 only, unless --host says otherwise; any other "
                    f"address needs a key (--server-key or ${ENV_SERVER_KEY}) or --no-auth.",
        epilog=MODEL_NOTE,
    )
    server = serve.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on")
    server.add_argument("--port", type=port_number, default=8000, help="port to listen on")
    server.add_argument("--server-key", default=None, metavar="KEY",
                        help=f"the key clients send as 'Authorization: Bearer KEY' (default: ${ENV_SERVER_KEY})")
    server.add_argument("--no-auth", action="store_true", help="serve a non-loopback address without a key")
    server.add_argument("--cors-origin", action="append", default=None, metavar="ORIGIN",
                        help="let a web page from ORIGIN call the API (repeatable); pages of other origins may "
                             "not change anything")
    server.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                        help="another host name clients reach the server by, besides --host and localhost "
                             "(repeatable; *.example.org: its subdomains; '*': any, behind a proxy; default: "
                             f"${ENV_ALLOWED_HOSTS}, comma-separated)")
    server.add_argument("--max-upload-mb", type=positive_int, default=defaults.max_upload_bytes // MIB, metavar="MB",
                        help="the largest upload (and request body), in MiB")
    server.add_argument("--queue", type=non_negative_int, default=defaults.queue_size, metavar="N",
                        help="requests that may wait for the model (more get 429)")
    reading = serve.add_argument_group("reading")
    reading.add_argument("--embedder", default=defaults.embedder, metavar="SPEC",
                         help="for new collections and rag: minilm, hashing or st:<folder>")
    reading.add_argument("--collection", "-c", default=None, metavar="NAME",
                         help="what docqa's POST /chat answers from when a request names none")
    reading.add_argument("--no-cache", action="store_true",
                         help="neither use nor keep stored WiM readings of documents")
    sessions = serve.add_argument_group("sessions")
    sessions.add_argument("--session-ttl", type=positive_int, default=int(defaults.session_ttl), metavar="SECONDS",
                          help="a chat or compose session ends after this long idle")
    sessions.add_argument("--max-sessions", type=positive_int, default=defaults.max_sessions, metavar="N",
                          help="chat sessions kept at once (the least recently used makes room)")
    sessions.add_argument("--compose-memory-model", default=None, metavar="SPEC",
                          help="the model that writes compose sessions' memory (default: --model)")
    sessions.add_argument("--max-compose-sessions", type=positive_int, default=defaults.max_compose_sessions,
                          metavar="N", help="compose sessions kept at once, each with its own loads of the models")
    serve.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        import uvicorn

        from ..server import Settings, create_app
        from ..server.net import http_protocol, listening_socket
        from ..server.settings import ENV_ALLOWED_HOSTS, ENV_SERVER_KEY, MIB, check_binding
    except ImportError as exc:
        raise MissingDependency("the HTTP service's packages (fastapi, uvicorn, sse-starlette)", SERVE_INSTALL) from exc

    key = args.server_key or os.environ.get(ENV_SERVER_KEY) or None
    warning = check_binding(args.host, key, args.no_auth)
    hosts = args.allowed_host or [h.strip() for h in os.environ.get(ENV_ALLOWED_HOSTS, "").split(",") if h.strip()]
    settings = Settings(home=args.home, model=args.model, device=args.device, backend=args.backend,
                        model_api_key=args.api_key, embedder=args.embedder, api_key=key,
                        cors_origins=tuple(args.cors_origin or ()), host=args.host, allowed_hosts=tuple(hosts),
                        max_upload_bytes=args.max_upload_mb * MIB,
                        queue_size=args.queue, session_ttl=float(args.session_ttl), max_sessions=args.max_sessions,
                        default_collection=args.collection, compose_memory_model=args.compose_memory_model,
                        max_compose_sessions=args.max_compose_sessions, cache_readings=not args.no_cache)
    if args.collection:
        app.open_collection(args.collection, home=args.home)  # fail now, not at the first /chat
    sock = listening_socket(args.host, args.port)  # before the model loads: a port in use fails at once
    reporter = Reporter(False, err)
    generator = load_model(args, reporter)
    if warning:
        print(warning, file=err, flush=True)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"marginalia serving {generator.name} on http://{shown}:{args.port} (web page at /, API at /v1, "
          f"docs at /docs; {'a key is needed' if key else 'no key'}); Ctrl-C stops it", file=err, flush=True)
    config = uvicorn.Config(create_app(settings, generator=generator), host=args.host, port=args.port,
                            http=http_protocol(), log_level="info" if args.verbose else "warning")
    with sock:
        uvicorn.Server(config).run(sockets=[sock])
    return 0
