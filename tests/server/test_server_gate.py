"""The gate before the body: the key, the declared length and the bytes in flight; the page's headers; echoes."""

from __future__ import annotations

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
