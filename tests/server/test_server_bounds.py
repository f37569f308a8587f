"""What the service holds for its clients is bounded: the numbers a request sets, the uploads waiting to be
indexed, the text chat sessions keep; and a compose session's models come back whatever its timeout."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from marginalia.compose import threads
from marginalia.errors import NotFound
from marginalia.index.embedders import HashingEmbedder
from marginalia.server import Settings, create_app
from server_support import BASE_URL, COMPOSE_SETTINGS, QUESTION, REPORT, ComposeModels, index_text, scripted, wait_for

pytest.importorskip("lancedb")

from fastapi.testclient import TestClient  # noqa: E402


@pytest.fixture(autouse=True)
def normal_class_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory threads in the normal class (see test_server_compose.py): these tests wait for them to end."""
    monkeypatch.setattr(threads, "IDLE_CLASS", False)


@contextmanager
def serving(models: ComposeModels | None = None, **settings: Any) -> Iterator[TestClient]:
    app = create_app(Settings(**{**COMPOSE_SETTINGS, **settings}), generator=scripted(), embedder=HashingEmbedder(),
                     loader=models or ComposeModels())
    with TestClient(app, base_url=BASE_URL) as client:
        yield client


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/compose/sessions", {"collection": "docs", "options": {"memory_timeout": 1e308}}, "options.memory_timeout"),
    ("/v1/ask", {"question": QUESTION, "text": REPORT, "reading": {"segment_tokens": 10**12}},
     "reading.segment_tokens"),
    ("/v1/ask", {"question": QUESTION, "collection": "docs", "collection_options": {"hits": 10**9}},
     "collection_options.hits"),
    ("/v1/chat/completions", {"model": "marginalia:docs", "messages": [{"role": "user", "content": QUESTION}],
                              "max_tokens": 10**30}, "max_tokens"),
])
def test_a_number_past_its_bound_is_422_naming_it(path, body, field):
    with serving() as client:
        reply = client.post(path, json=body)
    assert reply.status_code == 422, reply.text
    assert [f["field"] for f in reply.json()["error"]["fields"]] == [field]
    assert "less than or equal to" in reply.json()["error"]["message"]


def test_a_compose_session_with_a_huge_memory_timeout_gives_its_models_back():
    with serving() as client:
        index_text(client, "docs", "report.md", REPORT)
        service = client.app.state.service  # type: ignore[attr-defined]
        options = {"threshold": 4, "min_similarity": -1.0, "debounce": 0.0}
        reply = client.post("/v1/compose/sessions", json={"collection": "docs", "options": options})
        assert reply.status_code == 201, reply.text
        sid = reply.json()["id"]
        # a suggestion asks for memory: the session's memory thread runs, and retiring it waits for that thread
        suggested = client.post(f"/v1/compose/sessions/{sid}/suggestions", json={"text": "The night ferry sails"})
        assert suggested.status_code == 200, suggested.text
        session = service.compose.get(sid)
        # as a session built by a library caller that skipped validation: past what a thread can wait
        session.options = session.options.model_copy(update={"memory_timeout": 1e308})
        assert client.delete(f"/v1/compose/sessions/{sid}").status_code == 200
        wait_for(lambda: service.compose.pool.free() == 2, timeout=10)  # the client and the memory model


class GatedEmbedder(HashingEmbedder):
    """The hashing embedder, whose first document batch waits until `release` (a slow indexing job)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.released = threading.Event()

    def _embed(self, texts: Any, kind: Any) -> Any:
        if kind == "document" and not self.entered.is_set():
            self.entered.set()
            self.released.wait(30)
        return super()._embed(texts, kind)


def upload(client: TestClient, name: str, size: int) -> Any:
    text = f"# {name}\n\n" + "The night ferry leaves from pier 47. " * (size // 37 + 1)
    return client.post("/v1/collections/docs/documents", files={"file": (name, text[:size].encode())})


def test_uploads_waiting_behind_a_slow_job_are_bounded_in_number():
    embedder = GatedEmbedder()
    app = create_app(Settings(embedder="hashing", upload_queue=3), generator=scripted(), embedder=embedder)
    with TestClient(app, base_url=BASE_URL) as client:
        assert client.post("/v1/collections", json={"name": "docs", "embedder": "hashing"}).status_code == 201
        try:
            assert upload(client, "slow.md", 1000).status_code == 202
            assert embedder.entered.wait(10)  # the first job is being indexed, and waits
            assert [upload(client, f"{i}.md", 1000).status_code for i in range(2)] == [202, 202]
            refused = upload(client, "late.md", 1000)
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "busy"
            assert "3 uploads are waiting" in refused.json()["error"]["message"]
            assert "--upload-queue" in refused.json()["error"]["message"]
            assert int(refused.headers["retry-after"]) >= 1
        finally:
            embedder.released.set()
        jobs = wait_for(lambda: (js := client.get("/v1/jobs").json()) and all(j["status"] == "done" for j in js)
                        and js)
        assert len(jobs) == 3  # the refused one left no job
        assert upload(client, "late.md", 1000).status_code == 202  # room again


def test_uploads_waiting_behind_a_slow_job_are_bounded_in_bytes():
    embedder = GatedEmbedder()
    settings = Settings(embedder="hashing", upload_queue_bytes=5000, max_upload_bytes=8000)
    with TestClient(create_app(settings, generator=scripted(), embedder=embedder), base_url=BASE_URL) as client:
        assert client.post("/v1/collections", json={"name": "docs", "embedder": "hashing"}).status_code == 201
        try:
            assert upload(client, "slow.md", 6000).status_code == 202  # alone: in, though over the bound
            assert embedder.entered.wait(10)
            refused = upload(client, "small.md", 100)
            assert refused.status_code == 429
            assert "would pass this server's bound" in refused.json()["error"]["message"]
            assert "--upload-queue-mb" in refused.json()["error"]["message"]
        finally:
            embedder.released.set()
        wait_for(lambda: all(j["status"] == "done" for j in client.get("/v1/jobs").json()))
        assert upload(client, "small.md", 100).status_code == 202


def test_the_texts_chat_sessions_keep_are_bounded_in_bytes_together():
    from marginalia.server.schemas import SessionRequest
    from marginalia.server.sessions import SessionStore

    big = SessionRequest(text="x" * (40 * 1024 * 1024))  # one text, kept by every session (counted each time)
    store = SessionStore(ttl=60, limit=100)  # the defaults: a hundred sessions, 256 MiB
    ids = [store.create(big).id for _ in range(8)]
    assert len(store) == 6  # 6 × 40 MiB fit: the two least recently used made room
    for sid in ids[:2]:
        with pytest.raises(NotFound):
            store.get(sid)
    assert [store.get(sid).id for sid in ids[2:]] == ids[2:]
    assert store.held() <= 256 * 1024 * 1024


def test_sessions_that_hold_too_much_refuse_a_new_one_saying_what_to_do():
    text = "The night ferry leaves from pier 47. " * 3000  # about 110 KB
    size = len(text)
    with serving(session_bytes=int(2.5 * size)) as client:
        service = client.app.state.service  # type: ignore[attr-defined]
        first, second = (client.post("/v1/sessions", json={"text": text}).json()["id"] for _ in range(2))
        third = client.post("/v1/sessions", json={"text": text}).json()["id"]
        assert client.get(f"/v1/sessions/{first}").status_code == 404  # the least recently used made room
        assert client.get(f"/v1/sessions/{second}").status_code == 200
        leases = [service.sessions.lease(sid) for sid in (second, third)]  # both answering a message
        busy = client.post("/v1/sessions", json={"text": text})
        assert busy.status_code == 429 and busy.json()["error"]["code"] == "busy", busy.text
        assert "--session-mb" in busy.json()["error"]["message"] and busy.headers["retry-after"]
        assert client.post("/v1/sessions", json={"text": "a short text"}).status_code == 201  # it fits beside them
        huge = client.post("/v1/sessions", json={"text": text * 3})
        assert huge.status_code == 413 and "POST /v1/ask" in huge.json()["error"]["message"]
        for lease in leases:
            lease.release()
        assert client.post("/v1/sessions", json={"text": text}).status_code == 201
