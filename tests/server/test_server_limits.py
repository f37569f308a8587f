"""Clients that hold the server's resources, against uvicorn on 127.0.0.1 and a free port: clients that left
while queued, bodies that never end, headers that never end, more connections than the server takes."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

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


def connect(url: str, timeout: float = 30) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (the socket's timeout fails the test)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def parse_reply(data: bytes) -> tuple[int, dict[str, str], Any]:
    """The status, headers and decoded JSON body of one HTTP/1.1 reply."""
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return int(status_line.split()[1]), headers, json.loads(body) if body else None


@contextmanager
def bounded_server(**settings: Any) -> Iterator[str]:
    """A live server over the scripted model, with ``settings``' bounds."""
    app = create_app(Settings(**settings), generator=ScriptedGenerator(respond=lambda req: ANSWER))
    with live_server(app) as url:
        yield url


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
        wait_for(lambda: http.get("/v1/health").json()["queue"] == {"running": 1, "waiting": 0, "queue_size": 8,
                                                                  "parallel": 1},
                 timeout=5)
        ninth: dict[str, httpx.Response] = {}
        waiting = threading.Thread(target=lambda: ninth.setdefault("reply", http.post("/v1/ask", json=LC)),
                                   daemon=True)
        waiting.start()
        wait_for(lambda: http.get("/v1/health").json()["queue"]["waiting"] == 1)
        model.release()
        waiting.join(30)
        first.join(30)
        assert ninth["reply"].status_code == 200 and ninth["reply"].json()["text"] == ANSWER
        assert model.calls == 2  # the first and the ninth: the eight that left never read


HALF_SENT = {"Content-Type": "application/json", "Content-Length": "1000"}


MULTIPART = {"Content-Type": "multipart/form-data; boundary=b0undary", "Content-Length": "1000"}
PART = b'--b0undary\r\nContent-Disposition: form-data; name="file"; filename="a.md"\r\n\r\n# A'


@pytest.mark.parametrize(("path", "headers", "sent"), [
    ("/v1/ask", HALF_SENT, b'{"question"'),
    ("/v1/collections/docs/documents", MULTIPART, PART),
])
def test_a_body_that_stops_arriving_is_408_and_the_connection_closed(path, headers, sent):
    with bounded_server(body_timeout=0.5) as url, connect(url, timeout=10) as sock:
        t0 = time.monotonic()
        sock.sendall(raw_request(url, "POST", path, sent, headers))  # a few bytes of 1000
        reply = read_until_closed(sock)
        elapsed = time.monotonic() - t0
        status, headers, body = parse_reply(reply)
        assert status == 408 and headers["connection"] == "close", reply
        assert body["error"]["code"] == "timeout" and "--body-timeout" in body["error"]["message"]
        assert 0.4 < elapsed < 5, elapsed
        assert httpx.get(f"{url}/v1/health").status_code == 200


def test_a_body_that_trickles_in_is_408_once_its_whole_time_is_up():
    with bounded_server(body_timeout=2.0, body_total_timeout=1.0) as url, connect(url, timeout=10) as sock:
        t0 = time.monotonic()
        sock.sendall(raw_request(url, "POST", "/v1/ask", b"{", HALF_SENT))
        reply = b""
        sock.settimeout(0.2)  # a byte every 0.2 s, each well within the pause allowed, until the server answers
        while not reply and time.monotonic() - t0 < 10:
            try:
                reply = sock.recv(65536)
            except TimeoutError:
                sock.sendall(b" ")
        sock.settimeout(10)
        status, _, body = parse_reply(reply + read_until_closed(sock))
        assert status == 408 and "took more than 1 s" in body["error"]["message"]
        assert "--body-total-timeout" in body["error"]["message"]
        assert time.monotonic() - t0 < 5


def test_a_body_slower_than_the_minimum_rate_is_408_once_its_grace_is_over():
    # a byte every 0.2 s: each within the pause allowed, the whole far within its time, but under 100 bytes a second
    with bounded_server(body_timeout=2.0, body_total_timeout=30.0, min_body_rate=100, body_rate_grace=1.0) as url, \
            connect(url, timeout=10) as sock:
        t0 = time.monotonic()
        sock.sendall(raw_request(url, "POST", "/v1/ask", b"{", HALF_SENT))
        reply = b""
        sock.settimeout(0.2)
        while not reply and time.monotonic() - t0 < 20:
            try:
                reply = sock.recv(65536)
            except TimeoutError:
                sock.sendall(b" ")
        elapsed = time.monotonic() - t0
        sock.settimeout(10)
        status, headers, body = parse_reply(reply + read_until_closed(sock))
        assert status == 408 and headers["connection"] == "close"
        message = body["error"]["message"]
        assert body["error"]["code"] == "timeout" and "fewer than 100 bytes a second" in message
        assert "--min-body-rate" in message and "--body-rate-grace" in message
        assert 0.9 < elapsed < 10, elapsed  # after the grace, long before the whole body's 30 s


def test_headers_that_stop_arriving_close_the_connection():
    with bounded_server(header_timeout=0.5, keep_alive=1) as url:
        with connect(url, timeout=10) as sock:
            sock.sendall(b"POST /v1/ask HTTP/1.1\r\nHost: x\r\nContent-Ty")  # and nothing more
            status, headers, body = parse_reply(read_until_closed(sock))
            assert status == 408 and headers["connection"] == "close"
            assert body["error"]["code"] == "timeout" and "--header-timeout" in body["error"]["message"]
        with connect(url, timeout=10) as sock:  # a connection that never sends anything is closed, silently
            assert read_until_closed(sock) == b""
        with connect(url, timeout=10) as sock:  # after a response: part of the next request, then nothing
            sock.sendall(raw_request(url, "GET", "/v1/health"))
            first = sock.recv(65536)
            assert first.startswith(b"HTTP/1.1 200")
            sock.sendall(b"GET /v1/hea")
            assert parse_reply(read_until_closed(sock))[0] == 408


def test_unfinished_headers_over_the_limit_are_refused():
    with bounded_server(max_header_bytes=1024) as url:
        with connect(url, timeout=10) as sock:  # headers that go on and on, never finished
            sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Filler: " + b"x" * 2000)
            assert read_until_closed(sock).startswith(b"HTTP/1.1 400")
        assert httpx.get(f"{url}/v1/health", headers={"X-Filler": "x" * 500}).status_code == 200


def test_connections_past_the_limit_are_refused_but_the_health_check_answers():
    with bounded_server(max_connections=4, body_timeout=30) as url, ExitStack() as held:
        for _ in range(4):  # four requests that declare more body than they send, held open
            sock = held.enter_context(connect(url, timeout=10))
            sock.sendall(raw_request(url, "POST", "/v1/ask", b'{"question"', HALF_SENT))
        with connect(url, timeout=10) as sock:
            sock.sendall(raw_request(url, "POST", "/v1/ask", json.dumps(LC).encode(),
                                     {"Content-Type": "application/json"}))
            status, headers, body = parse_reply(read_until_closed(sock))
            assert status == 503 and headers["connection"] == "close" and int(headers["retry-after"]) >= 1
            assert body["error"]["code"] == "busy" and "--max-connections" in body["error"]["message"]
        health = httpx.get(f"{url}/v1/health", timeout=10)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert health.headers["connection"] == "close"
        held.close()  # the four leave: their places are free again
        wait_for(lambda: httpx.post(f"{url}/v1/ask", json=LC, timeout=10).status_code == 200)
