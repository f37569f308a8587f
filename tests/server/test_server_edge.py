"""The HTTP edge: a request addressed to a host the server does not answer to is refused (DNS rebinding), a
state-changing request a browser sends from another origin is refused (cross-site requests), the schema
follows the key rule, and a request uvicorn cannot parse gets the one JSON error shape. Host and
Content-Length go over real sockets, as a browser or curl would send them."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from marginalia.errors import UserError
from marginalia.server import Settings, create_app
from marginalia.server.settings import host_name, origin_of
from server_support import REPORT, index_text, live_server, make_client, scripted

pytest.importorskip("uvicorn")
pytest.importorskip("lancedb")

EVIL = "https://evil.example"


@contextmanager
def served(**settings: Any) -> Iterator[tuple[str, int]]:
    """A live server on a free loopback port: its base URL and port."""
    app = create_app(Settings(embedder="hashing", **settings), generator=scripted())
    with live_server(app) as url:
        yield url, int(url.rsplit(":", 1)[1])


def refused(reply: httpx.Response, status: int, code: str, *words: str) -> str:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert error["code"] == code, error
    for word in words:
        assert word in error["message"], error
    return str(error["message"])


# -- Host: the names the server answers to --


def test_a_page_reaching_the_server_through_its_own_dns_name_is_refused():
    with served() as (url, port), httpx.Client(base_url=url) as http:
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io", "localhost.evil.example"):
            message = refused(http.get("/v1/collections", headers={"Host": host}), 421, "host_not_allowed",
                              "--allowed-host", "localhost", "127.0.0.1")
            assert host.split(":")[0] in message
        # nothing is served to such a page: not the API, nor the page, nor a change
        refused(http.get("/", headers={"Host": "attacker.example"}), 421, "host_not_allowed")
        refused(http.post("/v1/collections", json={"name": "x"}, headers={"Host": "attacker.example"}), 421,
                "host_not_allowed")
        assert http.get("/v1/collections").json() == []


def test_the_bound_address_and_the_loopback_names_are_answered_with_and_without_a_port():
    with served() as (url, port), httpx.Client(base_url=url) as http:
        for host in ("127.0.0.1", f"127.0.0.1:{port}", "localhost", f"localhost:{port}", f"LOCALHOST:{port}",
                     "[::1]", f"[::1]:{port}", "localhost."):
            assert http.get("/v1/health", headers={"Host": host}).status_code == 200, host


def test_more_names_are_answered_when_given():
    with served(allowed_hosts=("notes.example.org", "*.lan.example")) as (url, port), \
            httpx.Client(base_url=url) as http:
        for host in ("notes.example.org", f"notes.example.org:{port}", "box.lan.example", "a.b.lan.example"):
            assert http.get("/v1/collections", headers={"Host": host}).status_code == 200, host
        for host in ("lan.example", "other.example.org", "notes.example.org.evil.example"):
            refused(http.get("/v1/collections", headers={"Host": host}), 421, "host_not_allowed",
                    "notes.example.org", "*.lan.example")


def test_any_name_is_answered_with_a_star():
    with served(allowed_hosts=("*",)) as (url, _), httpx.Client(base_url=url) as http:
        assert http.get("/v1/collections", headers={"Host": "anything.example"}).status_code == 200


def test_the_key_does_not_stand_in_for_an_allowed_host():
    with served(api_key="sesame") as (url, _), httpx.Client(base_url=url) as http:
        headers = {"Host": "attacker.example", "Authorization": "Bearer sesame"}
        refused(http.get("/v1/collections", headers=headers), 421, "host_not_allowed")
        refused(http.get("/v1/health", headers=headers), 421, "host_not_allowed")
        assert http.get("/v1/collections", headers={"Authorization": "Bearer sesame"}).status_code == 200


def test_a_server_on_every_address_answers_to_any_ip_address_but_not_to_other_names():
    # an IP address names the machine itself: no DNS answer can point it elsewhere
    client = make_client(Settings(host="0.0.0.0"))
    for host in ("192.168.1.20:8000", "10.0.0.7", "[fe80::1]:8000", "localhost"):
        assert client.get("/v1/collections", headers={"Host": host}).status_code == 200, host
    refused(client.get("/v1/collections", headers={"Host": "attacker.example"}), 421, "host_not_allowed",
            "any IP address")


@pytest.mark.parametrize("name", ["http://notes.example", "notes.example:8000", "notes.example/x", "", " ",
                                  "a b", "*.", "**", "x,y"])
def test_an_allowed_host_that_is_not_a_name_is_refused(name):
    with pytest.raises(UserError, match="not a host name"):
        Settings(allowed_hosts=(name,))


def test_host_names_and_origins_are_read_as_browsers_write_them():
    assert [host_name(h) for h in ("Example.ORG:80", "[::1]:8000", "::1", "localhost.", "10.0.0.1")] == [
        "example.org", "[::1]", "[::1]", "localhost", "10.0.0.1"]
    assert origin_of("https://Notes.example") == ("https", "notes.example", 443)
    assert origin_of("http://127.0.0.1:8000") == ("http", "127.0.0.1", 8000)
    assert origin_of("http://[::1]:8000") == ("http", "[::1]", 8000)
    for bad in ("null", "file://", "https://a.example/path", "ftp://a.example", "https://a.example:99999", "x"):
        assert origin_of(bad) is None, bad
    with pytest.raises(UserError, match="not an origin"):
        Settings(cors_origins=("https://notes.example/",))


# -- Origin: who may change something --


def test_a_cross_site_upload_cannot_replace_a_document():
    client = make_client()
    index_text(client, "docs", "report.md", REPORT)
    before = client.get("/v1/collections/docs/documents/report.md").json()["text"]
    reply = client.post("/v1/collections/docs/documents", headers={"Origin": EVIL},
                        files={"file": ("report.md", b"# Replaced\n\nNothing about ferries.\n")})
    refused(reply, 403, "origin_not_allowed", EVIL, "--cors-origin")
    assert len(client.get("/v1/jobs").json()) == 1  # the first upload's job only
    assert client.get("/v1/collections/docs/documents/report.md").json()["text"] == before


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/v1/collections", {"name": "planted"}),
    ("DELETE", "/v1/collections/docs", None),
    ("DELETE", "/v1/collections/docs/documents/report.md", None),
    ("POST", "/v1/ask", {"question": "q", "text": "t"}),
    ("POST", "/v1/sessions", {"text": "t"}),
    ("POST", "/v1/chat/completions", {"model": "marginalia:docs", "messages": [{"role": "user", "content": "q"}]}),
    ("POST", "/chat", {"message": "q", "collection": "docs"}),
    ("PUT", "/v1/collections", {"name": "planted"}),
    ("PATCH", "/v1/collections/docs", {"name": "planted"}),
])
def test_every_state_changing_request_from_another_origin_is_refused(method, path, body):
    client = make_client()
    index_text(client, "docs", "report.md", REPORT)
    for origin in (EVIL, "null", "http://localhost:9999", "http://127.0.0.1"):
        reply = client.request(method, path, json=body, headers={"Origin": origin})
        refused(reply, 403, "origin_not_allowed", method, "--cors-origin")
    assert [c["name"] for c in client.get("/v1/collections").json()] == ["docs"]
    assert client.get("/v1/collections/docs/documents/report.md").status_code == 200


def test_a_browser_request_without_an_origin_from_another_site_is_refused():
    client = make_client()
    for site in ("cross-site", "same-site"):
        refused(client.post("/v1/collections", json={"name": "x"}, headers={"Sec-Fetch-Site": site}), 403,
                "origin_not_allowed", site)
    reply = client.post("/v1/collections", json={"name": "x"}, headers={"Sec-Fetch-Site": "same-origin"})
    assert reply.status_code == 201
    assert client.post("/v1/collections", json={"name": "y"}, headers={"Sec-Fetch-Site": "none"}).status_code == 201


def test_reads_from_another_origin_and_requests_without_an_origin_pass():
    client = make_client()
    # a read: the browser keeps its reply from the other page (CORS is off), so it changes nothing
    assert client.get("/v1/collections", headers={"Origin": EVIL}).status_code == 200
    assert client.post("/v1/collections", json={"name": "curl"}).status_code == 201  # curl and SDKs send none


def test_the_servers_own_origin_and_listed_origins_may_change_things():
    with served(cors_origins=("https://notes.example",)) as (url, port), httpx.Client(base_url=url) as http:
        own = http.post("/v1/collections", json={"name": "own"}, headers={"Origin": url})
        assert own.status_code == 201, own.text
        assert http.post("/v1/collections", json={"name": "own-localhost"},
                         headers={"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}).status_code == 201
        listed = http.post("/v1/collections", json={"name": "listed"}, headers={"Origin": "https://notes.example"})
        assert listed.status_code == 201
        assert listed.headers["access-control-allow-origin"] == "https://notes.example"
        # the same host on another port, or another of the allowed names, is another origin
        refused(http.post("/v1/collections", json={"name": "x"}, headers={"Origin": f"http://127.0.0.1:{port + 1}"}),
                403, "origin_not_allowed")
        refused(http.post("/v1/collections", json={"name": "x"}, headers={"Origin": f"http://localhost:{port}"}),
                403, "origin_not_allowed")
        assert sorted(c["name"] for c in http.get("/v1/collections").json()) == ["listed", "own", "own-localhost"]


def test_behind_a_proxy_the_origin_matches_the_host_without_a_port():
    client = make_client(Settings(allowed_hosts=("notes.example.org",)))
    for origin in ("https://notes.example.org", "http://notes.example.org"):
        reply = client.post("/v1/collections", json={"name": origin.split(":")[0]},
                            headers={"Host": "notes.example.org", "Origin": origin})
        assert reply.status_code == 201, reply.text
    refused(client.post("/v1/collections", json={"name": "x"},
                        headers={"Host": "notes.example.org", "Origin": "https://notes.example.org:8443"}),
            403, "origin_not_allowed")


def test_any_origin_with_a_star():
    client = make_client(Settings(cors_origins=("*",)))
    assert client.post("/v1/collections", json={"name": "x"}, headers={"Origin": EVIL}).status_code == 201


# -- the schema follows the key rule --


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc"])
def test_the_schema_and_its_pages_need_the_key_when_there_is_one(path):
    keyed = make_client(Settings(api_key="sesame"))
    refused(keyed.get(path), 401, "unauthorized", "key")
    refused(keyed.get(path, headers={"Authorization": "Bearer wrong"}), 401, "unauthorized")
    assert keyed.get(path, headers={"Authorization": "Bearer sesame"}).status_code == 200
    assert make_client().get(path).status_code == 200  # without a key, open as every route
    assert keyed.get("/").status_code == 200 and keyed.get("/v1/health").status_code == 200


def test_the_schema_is_the_apps_and_the_docs_load_it():
    client = make_client()
    assert client.get("/openapi.json").json()["paths"].keys() == client.app.openapi()["paths"].keys()
    assert "/openapi.json" in client.get("/docs").text and "/openapi.json" in client.get("/redoc").text


# -- what uvicorn refuses before the app sees it --


def raw_request(port: int, head: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``head`` (a request line and headers) over a socket; the reply's status, headers and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


@pytest.mark.parametrize("declared", [b"abc", b"12abc", b"-5", b"0x10", b"1e9", b"5, 6", b"\xb2"])
def test_a_content_length_that_is_not_a_number_gets_the_json_error_over_a_socket(declared):
    with served() as (_, port):
        status, headers, body = raw_request(port, b"POST /v1/collections HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                  b"Content-Type: application/json\r\nContent-Length: " + declared
                                                  + b"\r\n\r\n{}")
    assert status == 400
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)["error"]
    assert error["code"] == "bad_request" and "Content-Length" in error["message"], error


def test_a_well_formed_request_over_a_socket_is_answered_as_before():
    with served() as (_, port):
        status, headers, body = raw_request(port, b"GET /v1/collections HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                  b"Connection: close\r\n\r\n")
    assert (status, json.loads(body)) == (200, [])
