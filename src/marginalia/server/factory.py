"""The application factory: `create_app` wires settings, the model, the routes, errors, the key and CORS."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from .. import __version__
from ..app import Generator
from . import errors, limits
from .auth import RequestRate, authenticated
from .common import READING_HEADER, get_service, require_key
from .edge import Edge
from .gate import Gate
from .routes import collections, compose, docqa, evaluate, keys, openai, qa, reading
from .schemas import ErrorReply
from .service import Service
from .settings import Settings

if TYPE_CHECKING:
    from ..app import Embedder

#: the most a request body may exceed the largest upload by (multipart boundaries and headers, form fields)
BODY_SLACK = 1024 * 1024

DESCRIPTION = """Answer questions over long documents with language models: Writing in the Margins (wim),
long context (lc), retrieval (rag), or retrieval first and WiM where it is not enough (auto), over a pasted
text, a document of a collection, or a collection.
Suggest the next words of a text being written, from a memory drawn from a collection (compose).

Every route but `/v1/health` and the web page needs a key when the server has any (`marginalia keys create`,
or `--server-key`), this schema (`/openapi.json`, `/docs`, `/redoc`) included: `Authorization: Bearer <key>`.
A key reads, or also writes, the collections it was given, or is an admin's; what is out of its reach is
answered as not found, and `GET /v1/me` says what it may do. A request must be addressed
to a host the server answers to (`--allowed-host`), and a browser may send one that changes something only
from the server's own page or from an origin given with `--cors-origin`.
Errors are `{"error": {"code", "message"}}`."""

#: what the schema says every operation may answer besides its success (in place of FastAPI's 422 shape)
ERRORS: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorReply, "description": "the request was refused: what was wrong and what to do"},
    "5XX": {"model": ErrorReply, "description": "the server or its model failed"},
}

#: the web page: plain HTML, CSS and JavaScript modules, served as they are (no build step, nothing from elsewhere)
STATIC = Path(__file__).parent / "static"
#: what the page and its files are served with: never framed by another page (clickjacking), never read as
#: another type than the one sent, and running only scripts and styles of its own files (no inline code, nothing
#: from elsewhere), so that a document's text that reached the page as markup could not run
PAGE_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                               "frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
}


class PageFiles(StaticFiles):
    """The page's files, with `PAGE_HEADERS`."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(PAGE_HEADERS)
        return response


def create_app(settings: Settings | None = None, generator: Generator | None = None,
               embedder: Embedder | None = None, loader: Callable[[str], Generator] | None = None) -> FastAPI:
    """The HTTP service.

    Args:
        settings: how it runs (defaults: the embedded model, 127.0.0.1, no key).
        generator: the model to use (default: load ``settings.model`` at startup).
        embedder: an embedder to use wherever its name is asked for (default: load each by name, once).
        loader: loads the models compose sessions use, by spec (default: `marginalia.app.load_model` with
            the settings' home, device, backend and key).
    """
    settings = settings or Settings()
    service = Service(settings, generator, embedder, loader)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(lambda: service.generator)  # load the model before the first request
        try:
            yield
        finally:
            service.shutdown()

    max_body = settings.max_upload_bytes + BODY_SLACK
    # the schema and its pages are routes of their own below, so that they need the key as the API does
    # every route is checked against its scope (`auth.ROUTE_SCOPES`) before anything else runs
    app = FastAPI(title="marginalia", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                  openapi_url=None, docs_url=None, redoc_url=None, dependencies=[Depends(require_key)])
    app.state.service = service
    app.state.rate = RequestRate(settings.key_rate)
    errors.install(app, max_body)
    limits.install(app, settings)
    # the key, the declared length and the room for it, before a byte of the body is read (inside CORS, so that
    # a page of an allowed origin can read its refusal)
    app.add_middleware(Gate, settings=settings, max_body=max_body, room=service.jobs.room_for)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_credentials=False,
                           allow_methods=["GET", "POST", "PATCH", "DELETE"],
                           allow_headers=["Authorization", "Content-Type"],
                           expose_headers=[READING_HEADER])
    app.add_middleware(Edge, settings=settings)  # the outermost: before CORS and the body limit

    # the page and its files need no key (they hold nothing); the page sends the key on its API calls (the
    # static files are a mount, which no dependency reaches: public by construction)
    @app.get("/", include_in_schema=False)
    def root() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache", **PAGE_HEADERS})

    app.mount("/static", PageFiles(directory=STATIC), name="static")

    @app.get("/v1/health", tags=["meta"], responses=ERRORS,
             summary="Whether the server is up; with the key, its version, model (without credentials) and queue")
    def health(request: Request) -> dict[str, Any]:
        current = get_service(request)
        if not authenticated(current.settings, request.headers, request.client.host if request.client else None):
            return {"status": "ok"}  # nothing about the server for a caller without its key
        return {"status": "ok", "version": __version__, "model": current.model_name,
                "queue": current.worker.status(), "sessions": len(current.sessions),
                "compose_sessions": len(current.compose)}

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_schema() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - Swagger UI")

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - ReDoc")

    for router in (keys.router, collections.router, qa.router, evaluate.router, reading.router, compose.router,
                   openai.router, docqa.router):
        app.include_router(router, responses=ERRORS)
    return app
