"""serve: the document QA HTTP service (collections, uploads, questions, chat and compose sessions,
OpenAI-compatible)."""

from __future__ import annotations

import argparse
import os
from typing import Any, TextIO

from .. import app
from ..errors import MissingDependency, UserError
from ..options import IngestOptions
from .common import (
    MODEL_NOTE,
    Formatter,
    Reporter,
    ingest_options,
    load_model,
    model_options,
    non_negative_int,
    port_number,
    positive_int,
    record_from_args,
)

SERVE_INSTALL = "pip install 'marginalia[serve]'"


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add serve."""
    from ..server.settings import ENV_ALLOWED_HOSTS, ENV_SERVER_KEY, MIB, Settings

    defaults = Settings()
    serve = sub.add_parser(
        "serve", parents=[common, model_options("--model-api-key"), ingest_options()], formatter_class=Formatter,
        usage="%(prog)s [options]",
        help="serve collections and questions over HTTP (JSON, server-sent events, OpenAI-compatible)",
        description="Start the HTTP service: create collections and upload documents (indexed in the "
                    "background), ask a pasted text, a document or a collection with wim, lc or rag (as JSON or "
                    "as server-sent events, one per reading step), hold chat sessions, and answer OpenAI clients "
                    "(model 'marginalia:<collection>') and docqa clients (POST /chat), and suggest what comes next "
                    "in a text being written (compose sessions; the page's Write view). One model per process "
                    "reads one request at a time (over vLLM or SGLang, as many as the spec's concurrency=<n>); "
                    "the others wait in a bounded queue. The API is described at "
                    "/docs once it runs. It listens on 127.0.0.1 only, unless --host says otherwise; any other "
                    f"address needs a key (--server-key or ${ENV_SERVER_KEY}) or --no-auth. An uploaded PDF is "
                    "converted in a process of its own, stopped at the document limits.",
        epilog=MODEL_NOTE,
    )
    server = serve.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on")
    server.add_argument("--port", type=port_number, default=8000, help="port to listen on")
    server.add_argument("--server-key", default=None, metavar="KEY",
                        help=f"the key clients send as 'Authorization: Bearer KEY' (default: ${ENV_SERVER_KEY})")
    server.add_argument("--no-auth", action="store_true", help="serve a non-loopback address without a key")
    # refused with a message that names both keys: a user who means to protect the server must not get an open one
    server.add_argument("--api-key", dest="misnamed_key", default=None, help=argparse.SUPPRESS)
    access = serve.add_argument_group("access")
    access.add_argument("--trusted-header", default=None, metavar="HEADER",
                        help="a header naming the user a proxy in front signed in (e.g. X-Forwarded-User), taken "
                             "only from --trusted-proxy addresses; users get grants with marginalia keys grant-user")
    access.add_argument("--trusted-proxy", action="append", default=None, metavar="ADDRESS",
                        help="the address or network of a proxy the trusted header is taken from (repeatable)")
    access.add_argument("--key-rate", type=positive_int, default=defaults.key_rate, metavar="N",
                        help="requests one key or proxy user may send per minute (more get 429)")
    access.add_argument("--key-readings", type=positive_int, default=defaults.key_readings, metavar="N",
                        help="readings one key or proxy user may have waiting or running at once (more get 429)")
    access.add_argument("--audit-questions", action="store_true",
                        help="write each question's text to the audit log (audit.jsonl in the home)")
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
    server.add_argument("--upload-queue", type=positive_int, default=defaults.upload_queue, metavar="N",
                        help="uploads that may wait to be indexed, the one being indexed included (more get 429)")
    server.add_argument("--upload-queue-mb", type=positive_int, default=defaults.upload_queue_bytes // MIB,
                        metavar="MB", help="the most MiB the uploads waiting to be indexed may hold (more get 429)")
    server.add_argument("--index-workers", type=positive_int, default=defaults.index_workers, metavar="N",
                        help="uploads converted and indexed at once, each conversion in a process of its own")
    add_connection_options(serve, defaults)
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
    sessions.add_argument("--session-mb", type=positive_int, default=defaults.session_bytes // MIB, metavar="MB",
                          help="the most MiB of pasted text chat sessions keep together (the least recently used "
                               "make room)")
    sessions.add_argument("--compose-memory-model", default=None, metavar="SPEC",
                          help="the model that writes compose sessions' memory (default: --model)")
    sessions.add_argument("--max-compose-sessions", type=positive_int, default=defaults.max_compose_sessions,
                          metavar="N", help="compose sessions kept at once, each with its own loads of the models")
    serve.set_defaults(handler=cmd_serve)


#: the longest any of the connection timeouts may be, in seconds (a day)
MAX_TIMEOUT = 86400.0


def seconds(text: str) -> float:
    """An argparse type: a time in seconds, above 0 and at most `MAX_TIMEOUT`."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value <= MAX_TIMEOUT:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be above 0 and at most {MAX_TIMEOUT:g}, got {text}")
    return value


def whole_seconds(text: str) -> int:
    """`seconds`, whole (what uvicorn takes)."""
    value = positive_int(text)
    seconds(str(value))
    return value


def add_connection_options(serve: argparse.ArgumentParser, defaults: Any) -> None:
    """The flags that bound what one client's connection may hold."""
    group = serve.add_argument_group("connections")
    group.add_argument("--max-connections", type=positive_int, default=defaults.max_connections, metavar="N",
                       help="connections kept open at once (one more gets 503, but for /v1/health)")
    group.add_argument("--header-timeout", type=seconds, default=defaults.header_timeout, metavar="SECONDS",
                       help="time a connection has to send a request's headers (then it is closed)")
    group.add_argument("--body-timeout", type=seconds, default=defaults.body_timeout, metavar="SECONDS",
                       help="the longest pause within a request body (then 408)")
    group.add_argument("--body-total-timeout", type=seconds, default=defaults.body_total_timeout,
                       metavar="SECONDS", help="the longest a whole request body may take to arrive (then 408)")
    group.add_argument("--min-body-rate", type=positive_int, default=defaults.min_body_rate, metavar="BYTES",
                       help="the fewest bytes a second a request body must average after --body-rate-grace "
                            "(then 408)")
    group.add_argument("--body-rate-grace", type=seconds, default=defaults.body_rate_grace, metavar="SECONDS",
                       help="how long a request body may arrive at any rate before --min-body-rate applies")
    group.add_argument("--max-inflight-mb", type=positive_int, default=defaults.body_bytes_in_flight // 2**20,
                       metavar="MB", help="the most MiB of request bodies received at once over all connections "
                                          "(more: 503 at once)")
    group.add_argument("--keep-alive", type=whole_seconds, default=defaults.keep_alive, metavar="SECONDS",
                       help="how long an idle connection stays open after a response")
    group.add_argument("--shutdown-timeout", type=whole_seconds, default=defaults.shutdown_timeout,
                       metavar="SECONDS", help="how long stopping waits for open requests and streams to end")
    group.add_argument("--max-header-kb", type=positive_int, default=defaults.max_header_bytes // 1024,
                       metavar="KB", help="the most KiB of an unfinished request line and headers held (more: 400)")


def bounds(args: argparse.Namespace) -> dict[str, Any]:
    """The settings that bound what clients may hold, from their flags."""
    from ..server.settings import MIB

    return {"upload_queue": args.upload_queue, "upload_queue_bytes": args.upload_queue_mb * MIB,
            "session_bytes": args.session_mb * MIB, "max_connections": args.max_connections,
            "header_timeout": args.header_timeout, "body_timeout": args.body_timeout,
            "body_total_timeout": args.body_total_timeout, "keep_alive": args.keep_alive,
            "shutdown_timeout": args.shutdown_timeout, "max_header_bytes": args.max_header_kb * 1024,
            "min_body_rate": args.min_body_rate, "body_rate_grace": args.body_rate_grace,
            "body_bytes_in_flight": args.max_inflight_mb * MIB, "index_workers": args.index_workers}


def cmd_serve(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        import uvicorn

        from ..server import Settings, create_app
        from ..server.keys import KeyStore
        from ..server.limits import server_config
        from ..server.net import listening_socket
        from ..server.settings import ENV_ALLOWED_HOSTS, ENV_SERVER_KEY, MIB, check_binding
    except ImportError as exc:
        raise MissingDependency("the HTTP service's packages (fastapi, uvicorn, sse-starlette)", SERVE_INSTALL) from exc

    if args.misnamed_key is not None:
        raise UserError("serve takes no --api-key: give the key clients must send with --server-key KEY (or "
                        f"${ENV_SERVER_KEY}), and the key sent to an openai: model server with --model-api-key KEY")
    key = args.server_key or os.environ.get(ENV_SERVER_KEY) or None
    stored = KeyStore.of_home(args.home).has_keys()
    warning = check_binding(args.host, key, args.no_auth, keys_stored=stored or bool(args.trusted_header))
    hosts = args.allowed_host or [h.strip() for h in os.environ.get(ENV_ALLOWED_HOSTS, "").split(",") if h.strip()]
    settings = Settings(home=args.home, model=args.model, device=args.device, backend=args.backend,
                        model_api_key=args.api_key, embedder=args.embedder, api_key=key,
                        cors_origins=tuple(args.cors_origin or ()), host=args.host, allowed_hosts=tuple(hosts),
                        max_upload_bytes=args.max_upload_mb * MIB,
                        queue_size=args.queue, session_ttl=float(args.session_ttl), max_sessions=args.max_sessions,
                        default_collection=args.collection, compose_memory_model=args.compose_memory_model,
                        max_compose_sessions=args.max_compose_sessions, cache_readings=not args.no_cache,
                        ingest=record_from_args(IngestOptions, args), trusted_header=args.trusted_header,
                        trusted_proxies=tuple(args.trusted_proxy or ()), key_rate=args.key_rate,
                        key_readings=args.key_readings, audit_questions=args.audit_questions, **bounds(args))
    if args.collection:
        app.open_collection(args.collection, home=args.home)  # fail now, not at the first /chat
    sock = listening_socket(args.host, args.port)  # before the model loads: a port in use fails at once
    reporter = Reporter(False, err)
    generator = load_model(args, reporter)
    if warning:
        print(warning, file=err, flush=True)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"marginalia serving {app.public_spec(generator.name)} on http://{shown}:{args.port} (web page at /, "
          f"API at /v1, docs at /docs; {'a key is needed' if key or stored or args.trusted_header else 'no key'}); "
          "Ctrl-C stops it", file=err, flush=True)
    config = server_config(create_app(settings, generator=generator), settings, host=args.host, port=args.port,
                           log_level="info" if args.verbose else "warning")
    with sock:
        uvicorn.Server(config).run(sockets=[sock])
    return 0
