"""Hostile uploads: empty files, truncated PDFs, huge or malformed declared lengths, path-like names, text in
other encodings, content that is not what its name says. Each is refused with a clear 4xx in the one JSON
error shape, or accepted safely (its name never a path); and uploads made by hypothesis likewise."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from fuzz_support import SAMPLE_PDF, FuzzedService, check_reply, upload_contents, upload_names
from marginalia.server import Settings
from marginalia.server.jobs import MAX_NAME, display_name
from server_support import PDF_TIMEOUT, index_text, make_client, wait_for

pytest.importorskip("lancedb")

UPLOAD = "/v1/collections/docs/documents"
NOTES = b"# Notes\n\nplain words about the harbour\n"


@pytest.fixture
def client():
    client = make_client()
    assert client.post("/v1/collections", json={"name": "docs", "embedder": "hashing"}).status_code == 201
    return client


def refused(reply, status: int, code: str, *words: str) -> dict:
    assert reply.status_code == status, reply.text
    assert check_reply(reply.status_code, reply.headers["content-type"], reply.content) == []
    error = reply.json()["error"]
    assert error["code"] == code, error
    for word in words:
        assert word in error["message"], error
    return error


def finished(client, reply, timeout: float = 10.0) -> dict:
    assert reply.status_code == 202, reply.text
    return wait_for(lambda: (j := client.get(reply.headers["location"]).json())["status"] in ("done", "failed") and j,
                    timeout=timeout)


@pytest.mark.parametrize("data", [b"", b"   \n\t\r\n", b"\xef\xbb\xbf", b"\xef\xbb\xbf\n\n"])
@pytest.mark.parametrize("name", ["notes.md", "notes.txt", "page.html", "notes"])
def test_an_empty_file_is_refused_as_empty(client, name, data):
    refused(client.post(UPLOAD, files={"file": (name, data)}), 422, "empty_document", name, "empty")
    assert client.get("/v1/jobs").json() == []


def test_markup_without_text_fails_its_job_as_empty(client):
    job = finished(client, client.post(UPLOAD, files={"file": ("page.html", b"<html><script>x()</script></html>")}))
    assert job["status"] == "failed" and job["error"]["code"] == "empty_document", job


@pytest.mark.parametrize("fraction", [0.0001, 0.001, 0.5, 0.99])
def test_a_truncated_pdf_fails_its_job_saying_so(client, fraction):
    pytest.importorskip("pymupdf4llm")
    data = SAMPLE_PDF.read_bytes()
    job = finished(client, client.post(UPLOAD, files={"file": ("paper.pdf", data[:max(8, int(len(data) * fraction))])}),
                   timeout=PDF_TIMEOUT)
    assert job["status"] == "failed", job
    assert job["error"]["code"] == "unreadable_document" and "paper.pdf" in job["error"]["message"]
    assert "/tmp" not in job["error"]["message"]  # the saved copy's path is never shown


def test_a_huge_declared_length_is_refused_before_the_body_is_read(client):
    reply = client.post(UPLOAD, content=b"x", headers={"content-length": str(10**15),
                                                       "content-type": "multipart/form-data; boundary=b"})
    refused(reply, 413, "too_large", "larger than this server accepts")


def asgi_post(app, headers: list[tuple[bytes, bytes]], body: bytes) -> tuple[int, bytes]:
    """One POST straight to the ASGI app, with headers an HTTP client would refuse to send."""
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "http_version": "1.1", "method": "POST", "path": UPLOAD, "raw_path": UPLOAD.encode(),
             "root_path": "", "scheme": "http", "query_string": b"", "headers": headers, "client": ("fuzz", 1),
             "server": ("fuzz", 80)}
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


@pytest.mark.parametrize("declared", [b"\xb2", b"12\xb3", b"1e9", b"-5", b" 10", b"0x10", b""])
def test_a_content_length_that_is_not_a_number_is_a_bad_request(client, declared):
    # '²' and '³' pass str.isdigit() but not int(): this was an unhandled ValueError, a 500
    status, body = asgi_post(client.app, [(b"content-type", b"multipart/form-data; boundary=b"),
                                          (b"content-length", declared)], b"x")
    assert status == 400, body
    assert check_reply(status, "application/json", body) == []
    assert b"Content-Length" in body


@pytest.mark.parametrize(("filename", "shown"), [
    ("../../etc/passwd", "passwd"),
    ("/etc/passwd", "passwd"),
    ("..\\..\\boot.ini", "boot.ini"),
    ("C:\\Windows\\system.md", "system.md"),
    ("a\x00b.md", None),
    ("notes.md\x00.pdf", None),
    ("~/.ssh/id_rsa.md", "id_rsa.md"),
    ("...", "upload"),
    ("émigré.md", "_migr_.md"),
    ("x" * 2000 + ".md", "x" * (MAX_NAME - 3) + ".md"),
])
def test_a_path_like_name_never_becomes_a_path(client, tmp_path, filename, shown):
    before = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")}
    passwd = os.stat("/etc/passwd").st_mtime if os.path.exists("/etc/passwd") else None
    reply = client.post(UPLOAD, files={"file": (filename, NOTES)})
    if reply.status_code != 202:  # a name that makes the content a type it is not: refused, said why
        refused(reply, 415, "unsupported_type")
        return
    job = finished(client, reply)
    assert job["status"] == "done", job
    document = job["document"]
    assert document == display_name(document)  # a plain name: no separators, no leading dot, not too long
    assert "/" not in document and "\\" not in document and "\x00" not in document and len(document) <= MAX_NAME
    if shown is not None:
        assert document == shown
    # nothing was written outside the home (which holds the store), nor beside /etc/passwd
    new = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")} - before
    assert all(p.parts[0] == "marginalia-home" for p in new), new
    assert passwd is None or os.stat("/etc/passwd").st_mtime == passwd
    assert not Path("/tmp/passwd").exists() and not Path("/boot.ini").exists()


def test_a_name_too_long_for_a_multipart_header_is_refused_cleanly(client):
    reply = client.post(UPLOAD, files={"file": ("x" * 100_000 + ".md", NOTES)})
    assert 400 <= reply.status_code < 500
    assert check_reply(reply.status_code, reply.headers["content-type"], reply.content) == []


def test_a_file_without_a_name_is_not_a_file(client):
    refused(client.post(UPLOAD, files={"file": ("", NOTES)}), 422, "validation_error", "file")


@pytest.mark.parametrize(("name", "data", "words"), [
    ("notes.txt", "café au lait".encode("latin-1"), ("UTF-8", "iconv")),
    ("notes.md", "ein Übermaß".encode("cp1252"), ("UTF-8",)),
    ("notes.txt", "hello".encode("utf-16"), ("binary",)),
    ("notes.md", "déjà vu".encode()[:2], ("UTF-8",)),  # cut inside a character
    ("notes.md", b"ok text " + "é".encode()[:1] + b" more", ("UTF-8",)),
])
def test_text_that_is_not_utf8_is_refused_saying_so(client, name, data, words):
    refused(client.post(UPLOAD, files={"file": (name, data)}), 415, "unsupported_type", name, *words)


@pytest.mark.parametrize(("name", "data", "words"), [
    ("paper.pdf", b"# Not a PDF\n\nJust markdown.\n", ("named as a PDF",)),
    ("paper.pdf", b"<html><body><p>a page</p></body></html>", ("named as a PDF",)),
    ("photo.html", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01", ("binary",)),
    ("notes.txt", bytes(range(256)), ("binary",)),
    ("setup.exe", b"MZ\x90\x00\x03", ("unsupported file type",)),
    ("archive.zip", b"PK\x03\x04", ("unsupported file type",)),
])
def test_content_that_does_not_match_its_name_is_refused(client, name, data, words):
    refused(client.post(UPLOAD, files={"file": (name, data)}), 415, "unsupported_type", *words)
    assert client.get("/v1/jobs").json() == []


def test_a_pdf_under_a_text_name_is_read_as_the_pdf_it_is(client):
    pytest.importorskip("pymupdf4llm")
    job = finished(client, client.post(UPLOAD, files={"file": ("notes.md", SAMPLE_PDF.read_bytes())}),
                   timeout=PDF_TIMEOUT)
    assert job["status"] == "done", job
    (doc,) = client.get("/v1/collections/docs").json()["documents"]
    assert (doc["source"], doc["format"]) == ("notes.md", "pdf")


def test_an_upload_over_the_limit_is_refused_and_one_at_it_accepted():
    client = make_client(Settings(max_upload_bytes=4000))
    job = index_text(client, "docs", "limit.md", b"# L\n\n" + b"w" * (4000 - 5))
    assert job["status"] == "done", job
    refused(client.post(UPLOAD, files={"file": ("over.md", b"# L\n\n" + b"w" * 4000)}), 413, "too_large")


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=upload_names, data=upload_contents)
def test_any_upload_is_indexed_or_refused_cleanly(fuzzed, name, data):
    assert fuzzed.upload(name, data) == []
    assert fuzzed.tally.server_errors == 0


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    return FuzzedService(tmp_path_factory.mktemp("uploads"))
