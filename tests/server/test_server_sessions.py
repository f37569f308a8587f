"""Chat sessions over HTTP: start one over a text, a document or a collection, send messages (JSON and
events), read its history, end it; idle sessions expire and the store is bounded."""

from __future__ import annotations

import pytest

from marginalia.server import Settings
from marginalia.server.schemas import SessionRequest
from marginalia.server.sessions import SessionStore
from server_support import ANSWER, QUESTION, REPORT, index_text, make_client, parse_sse


def test_a_session_over_a_text_answers_each_message_and_keeps_the_history():
    client = make_client()
    created = client.post("/v1/sessions", json={"text": REPORT, "reading": {"pattern": "lc"}})
    assert created.status_code == 201
    session = created.json()
    assert session["pattern"] == "lc" and session["history"] == []
    url = f"/v1/sessions/{session['id']}"
    first = client.post(f"{url}/messages", json={"message": QUESTION})
    assert first.status_code == 200 and first.json()["text"] == ANSWER
    streamed = client.post(f"{url}/messages", json={"message": "And the lifeboat?", "stream": True})
    assert parse_sse(streamed.text)[-1][0] == "done"
    history = client.get(url).json()["history"]
    assert [h["question"] for h in history] == [QUESTION, "And the lifeboat?"]
    assert all(h["answer"] == ANSWER for h in history)
    assert client.delete(url).json() == {"deleted": session["id"]}
    gone = client.post(f"{url}/messages", json={"message": QUESTION})
    assert gone.status_code == 404 and "POST /v1/sessions" in gone.json()["error"]["message"]


def test_a_session_over_a_collection_or_a_document():
    pytest.importorskip("lancedb")
    client = make_client()
    index_text(client, "docs", "report.md", REPORT)
    for body in ({"collection": "docs"}, {"collection": "docs", "document": "report.md"}):
        sid = client.post("/v1/sessions", json=body).json()["id"]
        reply = client.post(f"/v1/sessions/{sid}/messages", json={"message": QUESTION})
        assert reply.status_code == 200 and reply.json()["references"], reply.text
    assert client.post("/v1/sessions", json={"collection": "nowhere"}).status_code == 404
    assert client.post("/v1/sessions", json={"collection": "docs", "document": "x.md"}).status_code == 404


def test_a_failed_message_leaves_the_session_usable():
    client = make_client(generator=None)
    sid = client.post("/v1/sessions", json={"text": "word " * 10}).json()["id"]
    empty = client.post(f"/v1/sessions/{sid}/messages", json={"message": ""})
    assert empty.status_code == 422
    assert client.post(f"/v1/sessions/{sid}/messages", json={"message": QUESTION}).status_code == 200


def test_the_server_bounds_its_sessions():
    client = make_client(Settings(max_sessions=2))
    ids = [client.post("/v1/sessions", json={"text": REPORT}).json()["id"] for _ in range(3)]
    assert client.get(f"/v1/sessions/{ids[0]}").status_code == 404  # the least recently used made room
    assert all(client.get(f"/v1/sessions/{sid}").status_code == 200 for sid in ids[1:])
    assert client.get("/v1/health").json()["sessions"] == 2


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_idle_sessions_expire_and_busy_ones_do_not():
    clock = Clock()
    store = SessionStore(ttl=60, limit=3, clock=clock)
    target = SessionRequest(text="t")
    idle, busy = store.create(target), store.create(target)
    held = store.acquire(busy.id)
    clock.now += 61
    with pytest.raises(Exception, match="expired"):
        store.get(idle.id)
    assert store.get(busy.id) is held  # answering a message: never expired under it
    store.release(held)
    clock.now += 30
    assert store.get(busy.id) is held  # used 30 s ago
    clock.now += 61
    assert len(store) == 0


def test_a_full_store_of_busy_sessions_refuses_a_new_one():
    store = SessionStore(ttl=60, limit=1)
    store.acquire(store.create(SessionRequest(text="t")).id)
    from marginalia.server.errors import Busy

    with pytest.raises(Busy):
        store.create(SessionRequest(text="t"))


def two_messages(client) -> tuple[dict, dict]:
    index_text(client, "docs", "report.md", REPORT)
    sid = client.post("/v1/sessions", json={"collection": "docs", "document": "report.md",
                                            "reading": {"pattern": "wim", "segment_tokens": 64}}).json()["id"]
    first = client.post(f"/v1/sessions/{sid}/messages", json={"message": QUESTION}).json()
    second = client.post(f"/v1/sessions/{sid}/messages", json={"message": "And the lifeboat?"}).json()
    return first, second


def test_a_wim_session_reads_its_document_once():
    pytest.importorskip("lancedb")
    first, second = two_messages(make_client())
    assert first["stats"]["prefilled_context_tokens"] == first["stats"]["context_tokens"] > 0
    assert second["stats"]["prefilled_context_tokens"] == 0
    assert second["stats"]["cached_context_tokens"] == first["stats"]["context_tokens"]


def test_without_the_reading_cache_every_question_reads_the_document(tmp_path):
    pytest.importorskip("lancedb")
    first, second = two_messages(make_client(Settings(home=str(tmp_path), cache_readings=False)))
    for reply in (first, second):
        assert reply["text"] == ANSWER
        assert reply["stats"]["prefilled_context_tokens"] == reply["stats"]["context_tokens"] > 0
    assert not (tmp_path / "cache" / "documents").exists() or not any((tmp_path / "cache" / "documents").iterdir())


def test_the_bounded_store_ends_items_once_and_a_lease_releases_once():
    from dataclasses import dataclass

    from marginalia.errors import NotFound
    from marginalia.server.sessions import BoundedStore

    @dataclass
    class Item:
        id: str
        busy: int = 0
        last_used: float = 0.0

    now = [0.0]
    ended: list[str] = []
    store: BoundedStore[Item] = BoundedStore(10, 2, "thing", "POST /things", lambda n: RuntimeError(f"{n} busy"),
                                             on_end=lambda items: ended.extend(i.id for i in items),
                                             clock=lambda: now[0])
    store.add(Item("a"))
    store.add(Item("b"))
    lease = store.lease("a")
    store.add(Item("c"))  # full: the least recently used idle item ("b") makes room
    assert ended == ["b"]
    lease.release()
    lease.release()  # a second release changes nothing
    assert store.get("a").busy == 0
    with pytest.raises(RuntimeError, match="2 busy"):
        store.acquire("a"), store.acquire("c"), store.add(Item("d"))
    store.release(store.get("a"))
    store.release(store.get("c"))
    now[0] = 11.0  # both idle past the ttl: they end when the store is next looked at
    assert len(store) == 0 and sorted(ended) == ["a", "b", "c"]
    with pytest.raises(NotFound, match="no thing 'a': it expired after 10 s idle.*POST /things"):
        store.get("a")
