"""Clients that hold the server's resources, against uvicorn on 127.0.0.1 and a free port: clients that left
while queued, bodies that never end, headers that never end, more connections than the server takes."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
import pytest

from marginalia.models.fake import ScriptedGenerator
from marginalia.server import Settings, create_app
from server_support import ANSWER, QUESTION, REPORT, live_server, wait_for

pytest.importorskip("uvicorn")

LC = {"question": QUESTION, "text": REPORT, "reading": {"pattern": "lc"}}


class Blocking:
    """A model whose first answer waits until `release`; the others answer at once."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()
        self.calls = 0

    def __call__(self, request: object) -> str:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            self.released.wait(30)
        return ANSWER

    def release(self) -> None:
        self.released.set()


@contextmanager
def blocked_server(**settings: object) -> Iterator[tuple[str, Blocking]]:
    model = Blocking()
    app = create_app(Settings(**settings), generator=ScriptedGenerator(respond=model))  # type: ignore[arg-type]
    try:
        with live_server(app) as url:
            yield url, model
    finally:
        model.release()


def raw_request(url: str, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    """An HTTP/1.1 request as bytes, for a socket of our own (``url`` gives the Host)."""
    host = url.removeprefix("http://")
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    if body and not any(k.lower() == "content-length" for k in headers or {}):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    return sock


def test_clients_that_left_the_queue_free_their_places_at_once():
    with blocked_server(queue_size=8) as (url, model), httpx.Client(base_url=url, timeout=30) as http:
        first = threading.Thread(target=lambda: http.post("/v1/ask", json=LC), daemon=True)
        first.start()
        assert model.entered.wait(10)
        body = json.dumps(LC).encode()
        with ExitStack() as stack:
            for _ in range(8):
                sock = stack.enter_context(connect(url))
                sock.sendall(raw_request(url, "POST", "/v1/ask", body, {"Content-Type": "application/json"}))
            wait_for(lambda: http.get("/v1/health").json()["queue"]["waiting"] == 8)
            assert http.post("/v1/ask", json=LC).status_code == 429  # the queue is full
        # the eight clients have gone while the first reading still runs: their places are free
        wait_for(lambda: http.get("/v1/health").json()["queue"] == {"running": 1, "waiting": 0, "queue_size": 8},
                 timeout=5)
        ninth: dict[str, httpx.Response] = {}
        waiting = threading.Thread(target=lambda: ninth.setdefault("reply", http.post("/v1/ask", json=LC)),
                                   daemon=True)
        waiting.start()
        wait_for(lambda: http.get("/v1/health").json()["queue"]["waiting"] == 1)
        model.release()
        waiting.join(30)
        first.join(30)
        assert ninth["reply"].status_code == 200 and ninth["reply"].json()["answer"] == ANSWER
        assert model.calls == 2  # the first and the ninth: the eight that left never read
