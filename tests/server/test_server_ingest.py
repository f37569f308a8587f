"""Uploads that would cost far more than their size fail their job within seconds, with an error that names the
server's limit, while the server goes on answering (the conversion is another process's work); nothing of them
is stored. Uploads wait for their job under the home, and are removed when it ends, fails or is cancelled; what
a killed server left there is swept when the next one starts."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from fuzz_support import MB, pdf_bomb, pdf_of_pages
from marginalia.options import IngestOptions
from marginalia.server import Settings, create_app
from marginalia.server.jobs import OWNER_LOCK, STAGING, JobBoard, StagingArea, sweep_staging
from server_support import index_text, live_server, make_client, scripted, wait_for

pytest.importorskip("lancedb")
pytest.importorskip("uvicorn")

UPLOAD = "/v1/collections/docs/documents"
#: the slowest answer to /v1/health allowed while a bomb is being converted, in seconds (a busy machine's share)
RESPONSIVE = 1.0


def staged(home: Path) -> list[Path]:
    """The uploads staged in every server's folder under the home."""
    folder = home / STAGING
    servers = [entry for entry in folder.iterdir() if entry.is_dir()] if folder.is_dir() else []
    return sorted(upload for server in servers for upload in server.iterdir() if upload.name != OWNER_LOCK)


def test_the_issues_bomb_fails_its_job_quickly_while_the_server_answers(tmp_path):
    pytest.importorskip("pymupdf4llm")
    from marginalia.index.embedders import HashingEmbedder

    home = tmp_path / "home"
    bomb = pdf_bomb(200 * MB)  # about 600 KB, under the default upload limit
    app = create_app(Settings(home=str(home)), generator=scripted(), embedder=HashingEmbedder())
    with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        assert http.post("/v1/collections", json={"name": "docs", "embedder": "hashing"}).status_code == 201
        start = time.monotonic()
        reply = http.post(UPLOAD, files={"file": ("bomb.pdf", bomb)})
        assert reply.status_code == 202, reply.text
        slowest, job = 0.0, reply.json()
        while job["status"] not in ("done", "failed"):  # polled with a deadline: each poll is a request timed
            assert time.monotonic() - start < 30, job
            asked = time.monotonic()
            assert http.get("/v1/health").status_code == 200
            slowest = max(slowest, time.monotonic() - asked)
            job = http.get(reply.headers["location"]).json()
            time.sleep(0.05)  # the pace of polling, not a wait for anything
        took = time.monotonic() - start
        assert job["status"] == "failed" and job["error"]["code"] == "document_too_large", job
        message = job["error"]["message"]
        assert "bomb.pdf" in message and "--max-inflated-mb" in message and str(home) not in message, message
        assert took < 20, took
        assert slowest < RESPONSIVE, slowest
        assert http.get("/v1/collections/docs").json()["documents"] == []
        wait_for(lambda: staged(home) == [])


def test_a_pdf_over_the_servers_page_limit_fails_its_job_and_stores_nothing(tmp_path):
    pytest.importorskip("pymupdf4llm")
    home = tmp_path / "home"
    client = make_client(Settings(home=str(home), ingest=IngestOptions(max_pages=5)))
    index_text(client, "docs", "notes.md", "# Notes\n\nThe ferry leaves from pier 47.\n")
    job = index_text(client, "docs", "long.pdf", pdf_of_pages(8))
    assert job["status"] == "failed" and job["error"]["code"] == "document_too_large", job
    assert "long.pdf has 8 pages" in job["error"]["message"] and "--max-pages" in job["error"]["message"]
    assert [d["source"] for d in client.get("/v1/collections/docs").json()["documents"]] == ["notes.md"]
    wait_for(lambda: staged(home) == [])


# -- staging ------------------------------------------------------------------------------------------------


def test_an_upload_waits_under_the_home_and_goes_when_its_job_ends(tmp_path):
    home = tmp_path / "home"
    board = JobBoard(10, home / STAGING)
    release, seen = threading.Event(), []

    def work(job, copy, board):
        seen.append(copy)
        assert release.wait(10)
        raise ValueError("the job failed")

    job = board.submit("docs", "notes.md", b"# Notes\n", ".md", work)
    wait_for(lambda: seen)
    (copy,) = seen
    assert copy.parent.parent == board.staging and board.staging.parent == home / STAGING
    assert copy.read_bytes() == b"# Notes\n" and copy.parent.name.startswith("upload-")
    release.set()
    wait_for(lambda: board.get(job["id"])["status"] == "failed")
    wait_for(lambda: staged(home) == [])
    board.shutdown()


def test_uploads_still_queued_at_shutdown_are_removed(tmp_path):
    home = tmp_path / "home"
    board = JobBoard(10, home / STAGING)
    release, started = threading.Event(), threading.Event()

    def work(job, copy, board):
        started.set()
        assert release.wait(10)

    board.submit("docs", "first.md", b"one", ".md", work)
    assert started.wait(10)
    board.submit("docs", "second.md", b"two", ".md", work)
    assert len(staged(home)) == 2
    board.shutdown()  # the queued one is cancelled, the server's folder goes with both copies
    assert staged(home) == [] and not board.staging.exists()
    release.set()


def test_a_failed_upload_through_the_server_leaves_nothing_staged(tmp_path):
    home = tmp_path / "home"
    client = make_client(Settings(home=str(home)))
    job = index_text(client, "docs", "page.html", b"<html><script>x()</script></html>")
    assert job["status"] == "failed" and job["error"]["code"] == "empty_document", job
    wait_for(lambda: staged(home) == [])


def test_what_a_killed_server_left_is_swept_when_the_next_starts(tmp_path):
    home = tmp_path / "home"
    folder = home / STAGING
    leftover = folder / "server-a1b2c3"  # a server that is gone staged this: nobody holds its lock
    (leftover / "upload-1").mkdir(parents=True)
    (leftover / OWNER_LOCK).touch()
    (leftover / "upload-1" / "document.pdf").write_bytes(b"%PDF-1.7 half of an upload")
    as_pid_one = folder / "1-d4e5f6"  # an older server's, named by a process id that is always alive (PID 1)
    as_pid_one.mkdir()
    stray = folder / "not-a-folder"
    stray.write_bytes(b"x")
    other = StagingArea(folder)  # a live server on the same home holds its own
    make_client(Settings(home=str(home)))
    assert not leftover.exists() and not as_pid_one.exists() and not stray.exists()
    assert other.folder.is_dir()
    assert sweep_staging(folder) == []
    other.close()
    assert not other.folder.exists()


def test_a_slow_conversion_does_not_hold_the_next_upload(tmp_path):
    pytest.importorskip("pymupdf4llm")
    from marginalia.index.embedders import HashingEmbedder

    # a PDF whose conversion takes seconds, then a note: with two conversions at once (the default) the note is
    # indexed while the PDF is still converted
    settings = Settings(home=str(tmp_path / "home"), ingest=IngestOptions(convert_timeout=120))
    assert settings.index_workers == 2
    app = create_app(settings, generator=scripted(), embedder=HashingEmbedder())
    with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        assert http.post("/v1/collections", json={"name": "docs", "embedder": "hashing"}).status_code == 201
        slow = http.post(UPLOAD, files={"file": ("long.pdf", pdf_of_pages(300))})
        assert slow.status_code == 202, slow.text
        wait_for(lambda: http.get(slow.headers["location"]).json()["status"] == "running", timeout=60)
        note = http.post(UPLOAD, files={"file": ("note.md", b"# Note\n\nThe ferry leaves from pier 47.\n")})
        assert note.status_code == 202, note.text
        done = wait_for(lambda: (j := http.get(note.headers["location"]).json())["status"] in ("done", "failed")
                        and j, timeout=60)
        assert done["status"] == "done", done
        assert http.get(slow.headers["location"]).json()["status"] == "running"
        names = [d["source"] for d in http.get("/v1/collections/docs").json()["documents"]]
        assert names == ["note.md"]
