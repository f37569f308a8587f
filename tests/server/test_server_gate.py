"""The gate before the body: the key, the declared length and the bytes in flight; the page's headers; echoes."""

from __future__ import annotations

import json

from marginalia.server import Settings
from server_support import make_client


def test_a_keyless_body_is_refused_before_it_is_read():
    client = make_client(Settings(api_key="sesame"))
    reply = client.post("/v1/ask", content=b"x" * 1000, headers={"Content-Type": "application/json"})
    assert reply.status_code == 401 and reply.json()["error"]["code"] == "unauthorized"
    assert reply.headers["connection"] == "close"


def test_bodies_past_the_bytes_in_flight_are_refused_at_once():
    client = make_client(Settings(body_bytes_in_flight=100))
    reply = client.post("/v1/ask", content=b"{" + b" " * 200 + b"}", headers={"Content-Type": "application/json"})
    assert reply.status_code == 503 and reply.json()["error"]["code"] == "overloaded"
    assert "--max-inflight-mb" in reply.json()["error"]["message"] and reply.headers["retry-after"]


def test_the_page_cannot_be_framed_or_sniffed():
    client = make_client()
    for path in ("/", "/static/app.js"):
        headers = client.get(path).headers
        assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert "script-src 'self';" in headers["content-security-policy"]


def test_a_huge_name_is_not_echoed():
    client = make_client()
    reply = client.post("/v1/ask", json={"question": "What?", "collection": "c" * 5_000_000})
    assert reply.status_code == 422 and len(reply.content) < 10_000


def test_the_loop_answers_health_while_large_bodies_are_checked():
    import threading
    import time

    import httpx

    from server_support import live_server

    # unknown keys holding a million values or four: decoded and checked in a worker thread, the second refused
    # by its count of values before it is decoded (decoding holds the interpreter's lock, whatever the thread)
    bodies = [(f'{{"question": "What?", "text": "x", "zzz": [{",".join(["0"] * n)}]}}').encode()
              for n in (900_000, 4_000_000)]
    with live_server(make_client().app) as url, httpx.Client(base_url=url, timeout=60) as http:
        replies: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: replies.extend(
            httpx.post(f"{url}/v1/ask", content=body, headers={"Content-Type": "application/json"}, timeout=60)
            for body in bodies))
        began = time.monotonic()
        sender.start()
        times = []
        while sender.is_alive():
            start = time.monotonic()
            assert http.get("/v1/health").status_code == 200
            times.append(time.monotonic() - start)
        sender.join()
        took = time.monotonic() - began
        decoded, counted = replies
        assert decoded.status_code == 422 and "zzz: no such field" in decoded.json()["error"]["message"]
        assert counted.status_code == 413 and "more than the 1,000,000" in counted.json()["error"]["message"]
        assert len(decoded.content) < 10_000 and len(counted.content) < 10_000
        # a loop held by the decoding would keep a health check waiting about as long as the bodies took: none
        # waited half that (relative, so that a loaded machine slowing both does not fail it)
        assert len(times) > 2 and max(times) < took / 2, (took, times)


def test_a_large_body_is_counted_by_its_values_outside_strings():
    from marginalia.server.common import MAX_VALUES, OFF_LOOP_BYTES, _values

    text = 'a, "b": c ' * (MAX_VALUES // 2)  # more commas and colons than values, all inside one string
    assert _values(json.dumps({"question": "q?", "text": text}).encode()) == 3  # two colons, a comma
    keys = ", ".join(f'"k{i}": 0' for i in range(MAX_VALUES))
    assert _values(f"{{{keys}}}".encode()) > MAX_VALUES
    # a lone surrogate deep in a large body is still found
    client = make_client()
    body = '{"question": "q?", "text": "' + "x" * OFF_LOOP_BYTES + ' \\udc00"}'
    reply = client.post("/v1/ask", content=body, headers={"Content-Type": "application/json"})
    assert reply.status_code == 422 and "not valid Unicode" in reply.json()["error"]["message"]
