"""What the server tests share: a scripted model that writes margins, the app on it, SSE parsing, a live
uvicorn server on a free port, a document to read, and scripted compose models."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from wim_requests import is_margin

pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")

from fastapi.testclient import TestClient  # noqa: E402

from marginalia.errors import UserError  # noqa: E402
from marginalia.index.embedders import HashingEmbedder  # noqa: E402
from marginalia.models.fake import Request, ScriptedGenerator  # noqa: E402
from marginalia.server import Settings, create_app  # noqa: E402

#: where the test client addresses the app: a host name the server answers to (TestClient's own default,
#: ``testserver``, is not one, and is refused as a DNS-rebinding page's name would be)
BASE_URL = "http://localhost"

FACT = "The night ferry to Brackwater leaves from pier 47."
QUESTION = "Which pier does the night ferry leave from?"
MARGIN = "The night ferry leaves from pier 47."
ANSWER = "Pier 47."

REPORT = f"""# Harbour report

## Dredging

Silt builds up in the inner basin every year. The dredger hired for the work was the Orla Maye.

## Ferries

{FACT} It sails at eleven.

## Lifeboat

The lifeboat launched 37 times this year. Its new coxswain is Ingrid Tasker.
"""


def respond(req: Request) -> str:
    """A margin naming pier 47 once the cache holds it, nothing useful before; the answer otherwise."""
    if is_margin(req):
        return MARGIN if "pier 47" in req.prefix else "Nothing about ferries here."
    return ANSWER


class Slow:
    """The scripted replies, with margins that take ``seconds`` each; counts the margin requests."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.margins = 0

    def __call__(self, req: Request) -> str:
        if is_margin(req):
            self.margins += 1
            time.sleep(self.seconds)
        return respond(req)


SUGGESTION = " leaves from pier 47."
TAKEAWAY = "The night ferry leaves from pier 47."


def takeaway(req: Request) -> str:
    """A memory model: a takeaway from the passage about the ferry, NONE from the others."""
    return TAKEAWAY if "pier 47" in req.prompt else "NONE"


class ComposeModels:
    """What a server loads compose models with (its ``loader``): scripted 'client' and 'memory' models, each
    load kept."""

    def __init__(self, client: Callable[[Request], str] | None = None,
                 memory: Callable[[Request], str] = takeaway) -> None:
        self.client = client
        self.memory = memory
        self.loaded: list[tuple[str, ScriptedGenerator]] = []

    def __call__(self, spec: str) -> ScriptedGenerator:
        if spec == "client":
            model = ScriptedGenerator(self.client, default=SUGGESTION, name="client")
        elif spec == "memory":
            model = ScriptedGenerator(self.memory, name="memory")
        else:
            raise UserError(f"unknown model spec {spec!r}")
        self.loaded.append((spec, model))
        return model

    def of(self, spec: str) -> list[ScriptedGenerator]:
        return [m for s, m in self.loaded if s == spec]


#: the server settings that compose with `ComposeModels`
COMPOSE_SETTINGS = {"model": "client", "compose_memory_model": "memory", "embedder": "hashing"}


def scripted(respond_with: Callable[[Request], str] = respond, **kw: Any) -> ScriptedGenerator:
    return ScriptedGenerator(respond=respond_with, **kw)


def make_client(settings: Settings | None = None, generator: Any = None, embedder: Any = None) -> TestClient:
    app = create_app(settings or Settings(), generator=generator or scripted(),
                     embedder=embedder or HashingEmbedder())
    return TestClient(app, base_url=BASE_URL)


def parse_sse(text: str) -> list[tuple[str, Any]]:
    """(event name, decoded data) for each event of a server-sent event stream ('message' when unnamed)."""
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if data:
            raw = "\n".join(data)
            try:
                out.append((name, json.loads(raw)))
            except ValueError:
                out.append((name, raw))
    return out


def wait_for(check: Callable[[], Any], timeout: float = 10.0, step: float = 0.02) -> Any:
    """Poll ``check`` until it returns something true (or fail after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"not true after {timeout} s: {check}")


#: seconds an upload of a real PDF may take to be indexed: its converting process imports pymupdf4llm and runs
#: its layout model over every page, which takes tens of seconds on a busy machine of two cores
PDF_TIMEOUT = 90.0


def index_text(client: TestClient, collection: str, name: str, text: str | bytes,
               embedder: str = "hashing", timeout: float = 10.0) -> dict[str, Any]:
    """Create the collection if needed, upload one document and wait for its job to finish (``timeout``
    seconds at most)."""
    if client.get(f"/v1/collections/{collection}").status_code == 404:
        assert client.post("/v1/collections", json={"name": collection, "embedder": embedder}).status_code == 201
    data = text.encode() if isinstance(text, str) else text
    reply = client.post(f"/v1/collections/{collection}/documents", files={"file": (name, data)})
    assert reply.status_code == 202, reply.text
    job_url = reply.headers["location"]
    return wait_for(lambda: (j := client.get(job_url).json())["status"] in ("done", "failed") and j,  # type: ignore
                    timeout=timeout)


@contextmanager
def live_server(app: Any) -> Iterator[str]:
    """The app served by uvicorn on 127.0.0.1 and a free port, in a thread, as `marginalia serve` serves it (with
    its settings' bounds); yields the base URL."""
    import uvicorn

    from marginalia.server.limits import server_config
    from marginalia.server.net import listening_socket

    sock = listening_socket("127.0.0.1", 0)  # as marginalia serve makes it
    port = sock.getsockname()[1]
    settings = dataclasses.replace(app.state.service.settings, shutdown_timeout=2)
    server = uvicorn.Server(server_config(app, settings, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
