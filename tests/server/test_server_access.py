"""Access: every route of the app against every kind of caller (no key, a wrong key, a revoked key, a reader
of collection A, a writer of A, an admin) and a resource in A or in B, with the status each cell must get;
collections, models and jobs listed as each key may see them; sessions owned by their key; a revoked key
refused from its next request; per-key bounds; tokens kept out of logs and replies; the trusted proxy."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from marginalia.errors import UserError
from marginalia.index.embedders import HashingEmbedder
from marginalia.models.fake import ScriptedGenerator
from marginalia.server import Settings, auth, create_app
from marginalia.server.auth import ROUTE_SCOPES, Scope
from marginalia.server.keys import Grants, KeyStore
from server_support import BASE_URL, COMPOSE_SETTINGS, REPORT, ComposeModels, index_text, respond, wait_for

pytest.importorskip("lancedb")
pytest.importorskip("rapidfuzz")

from fastapi.testclient import TestClient  # noqa: E402

SERVER_KEY = "the-operators-own-server-key"
#: a sentence only collection B holds: no reply to a key of A may carry it
SECRET_B = "The vault under the lighthouse opens with the word Calloway."
DOC_B = f"# Lighthouse\n\n## Vault\n\n{SECRET_B}\n"
CALLERS = ("none", "wrong", "revoked", "reader", "writer", "admin")
TARGETS = ("A", "B")
WRONG = "mgl_" + "x" * 43


@dataclass
class World:
    """An app with collections A (the harbour report) and B (the lighthouse), and a key of each kind."""

    client: TestClient
    home: Path
    tokens: dict[str, str]
    jobs: dict[str, str]
    store: KeyStore
    qa_jobs: dict[str, str]

    def headers(self, caller: str) -> dict[str, str]:
        token = {"none": None, "wrong": WRONG, "revoked": self.tokens.get("revoked"),
                 "admin": self.tokens.get("admin"), "reader": self.tokens.get("reader"),
                 "writer": self.tokens.get("writer"), "server": SERVER_KEY}[caller]
        return {"Authorization": f"Bearer {token}"} if token else {}

    def as_(self, caller: str, method: str, url: str, **kw: Any) -> Any:
        return self.client.request(method, url, headers=self.headers(caller), **kw)

    def owner_of(self, caller: str, target: str) -> str:
        """Who opens a session a cell then asks for: the caller itself in A (where it may), another key in B."""
        return caller if target == "A" and caller in ("reader", "writer", "admin") else "server"


def make_world(home: Path) -> World:
    settings = Settings(api_key=SERVER_KEY, home=str(home), **COMPOSE_SETTINGS)
    app = create_app(settings, generator=ScriptedGenerator(respond=respond), embedder=HashingEmbedder(),
                     loader=ComposeModels())
    client = TestClient(app, base_url=BASE_URL, headers={"Authorization": f"Bearer {SERVER_KEY}"})
    jobs = {"A": index_text(client, "A", "report.md", REPORT)["id"],
            "B": index_text(client, "B", "vault.md", DOC_B)["id"]}
    qa_jobs = {t: client.post(f"/v1/collections/{t}/qa-jobs").json()["id"] for t in TARGETS}
    client.headers.pop("Authorization")
    store = KeyStore.of_home(home)
    tokens = {"reader": store.create("reader-a", Grants(read=frozenset({"A"})))[1],
              "writer": store.create("writer-a", Grants(write=frozenset({"A"})))[1],
              "admin": store.create("boss", Grants(admin=True))[1],
              "revoked": store.create("gone", Grants(read=frozenset({"A"})))[1]}
    store.revoke("gone")
    return World(client, home, tokens, jobs, store, qa_jobs)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return make_world(tmp_path / "home")


# -- what each route's cell sends -------------------------------------------------------------------------

Build = Callable[[World, str, str], tuple[str, dict[str, Any]]]  # (url, request kwargs) for caller, target


def chat_session(w: World, caller: str, target: str) -> str:
    reply = w.as_(w.owner_of(caller, target), "POST", "/v1/sessions", json={"collection": target})
    assert reply.status_code == 201, reply.text
    return str(reply.json()["id"])


def compose_session(w: World, caller: str, target: str) -> str:
    reply = w.as_(w.owner_of(caller, target), "POST", "/v1/compose/sessions",
                  json={"collection": target, "options": {"debounce": 0.0}})
    assert reply.status_code == 201, reply.text
    return str(reply.json()["id"])


def victim_document(w: World, caller: str, target: str) -> str:
    name = f"victim-{caller}.md"
    assert w.as_("server", "POST", f"/v1/collections/{target}/documents",
                 files={"file": (name, f"# Victim\n\nA page {caller} may delete.\n".encode())}).status_code == 202
    wait_for(lambda: any(d["source"] == name for d in
                         w.as_("server", "GET", f"/v1/collections/{target}").json()["documents"]))
    return name


def victim_key(w: World, caller: str, target: str) -> str:
    name = f"victim-{caller}-{target}"
    w.store.create(name, Grants(read=frozenset({target})))
    return name


def victim_pair(w: World, caller: str, target: str, status: str = "pending") -> str:
    """A pair in the target's QA file, once its question job has finished writing there (a review waits for it)."""
    from marginalia.bench.own import collection_pairs_path, read_pairs, write_pairs

    wait_for(lambda: w.as_("server", "GET", f"/v1/qa-jobs/{w.qa_jobs[target]}").json()["finished_at"])
    path = collection_pairs_path(target, w.home)
    pid = f"pair-{caller}"
    pair = {"id": pid, "question": "What opens the vault?", "answer": "Calloway" if target == "B" else "pier 47",
            "status": status, "source": "report.md", "doc_id": "d", "start": 0, "end": 1}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_pairs(path, [p for p in read_pairs(path) if p["id"] != pid] + [pair])
    return pid


def eval_job(w: World, caller: str, target: str) -> str:
    victim_pair(w, "evaluated", target, "accepted")
    reply = w.as_("server", "POST", f"/v1/collections/{target}/eval-jobs", json={"patterns": ["rag"]})
    assert reply.status_code == 202, reply.text
    job = str(reply.json()["id"])
    wait_for(lambda: w.as_("server", "GET", f"/v1/eval-jobs/{job}").json()["finished_at"])
    return job


REQUESTS: dict[tuple[str, str], Build] = {
    ("GET", "/"): lambda w, c, t: ("/", {}),
    ("GET", "/static"): lambda w, c, t: ("/static/app.js", {}),
    ("GET", "/v1/health"): lambda w, c, t: ("/v1/health", {}),
    ("GET", "/openapi.json"): lambda w, c, t: ("/openapi.json", {}),
    ("GET", "/docs"): lambda w, c, t: ("/docs", {}),
    ("GET", "/redoc"): lambda w, c, t: ("/redoc", {}),
    ("GET", "/v1/me"): lambda w, c, t: ("/v1/me", {}),
    ("GET", "/v1/keys"): lambda w, c, t: ("/v1/keys", {}),
    ("POST", "/v1/keys"): lambda w, c, t: ("/v1/keys", {"json": {"name": f"new-{c}-{t}", "read": [t]}}),
    ("DELETE", "/v1/keys/{key_name}"): lambda w, c, t: (f"/v1/keys/{victim_key(w, c, t)}", {}),
    ("POST", "/v1/keys/{key_name}/rotate"): lambda w, c, t: (f"/v1/keys/{victim_key(w, c, t)}/rotate", {}),
    ("GET", "/v1/collections"): lambda w, c, t: ("/v1/collections", {}),
    ("POST", "/v1/collections"): lambda w, c, t: ("/v1/collections", {"json": {"name": f"new-{c}-{t}",
                                                                               "embedder": "hashing"}}),
    ("GET", "/v1/collections/{name}"): lambda w, c, t: (f"/v1/collections/{t}", {}),
    ("DELETE", "/v1/collections/{name}"): lambda w, c, t: (f"/v1/collections/{t}", {}),
    ("POST", "/v1/collections/{name}/documents"): lambda w, c, t: (
        f"/v1/collections/{t}/documents", {"files": {"file": (f"up-{c}.md", b"# Up\n\nUploaded text.\n")}}),
    ("GET", "/v1/collections/{name}/documents/{document:path}"): lambda w, c, t: (
        f"/v1/collections/{t}/documents/{'report.md' if t == 'A' else 'vault.md'}", {}),
    ("DELETE", "/v1/collections/{name}/documents/{document:path}"): lambda w, c, t: (
        f"/v1/collections/{t}/documents/{victim_document(w, c, t)}", {}),
    ("GET", "/v1/jobs"): lambda w, c, t: ("/v1/jobs", {}),
    ("GET", "/v1/jobs/{job_id}"): lambda w, c, t: (f"/v1/jobs/{w.jobs[t]}", {}),
    ("GET", "/v1/jobs/{job_id}/events"): lambda w, c, t: (f"/v1/jobs/{w.jobs[t]}/events", {}),
    ("POST", "/v1/collections/{name}/qa-jobs"): lambda w, c, t: (f"/v1/collections/{t}/qa-jobs", {}),
    ("GET", "/v1/qa-jobs"): lambda w, c, t: ("/v1/qa-jobs", {}),
    ("GET", "/v1/qa-jobs/{job_id}"): lambda w, c, t: (f"/v1/qa-jobs/{w.qa_jobs[t]}", {}),
    ("GET", "/v1/qa-jobs/{job_id}/events"): lambda w, c, t: (f"/v1/qa-jobs/{w.qa_jobs[t]}/events", {}),
    ("GET", "/v1/collections/{name}/qa-pairs"): lambda w, c, t: (f"/v1/collections/{t}/qa-pairs", {}),
    ("PATCH", "/v1/collections/{name}/qa-pairs/{pair_id}"): lambda w, c, t: (
        f"/v1/collections/{t}/qa-pairs/{victim_pair(w, c, t)}", {"json": {"status": "accepted"}}),
    ("POST", "/v1/collections/{name}/eval-jobs"): lambda w, c, t: (
        f"/v1/collections/{t}/eval-jobs", {"json": {"patterns": ["rag"]}} if victim_pair(w, c, t, "accepted") else {}),
    ("GET", "/v1/eval-jobs"): lambda w, c, t: ("/v1/eval-jobs", {}),
    ("GET", "/v1/eval-jobs/{job_id}"): lambda w, c, t: (f"/v1/eval-jobs/{eval_job(w, c, t)}", {}),
    ("GET", "/v1/patterns"): lambda w, c, t: ("/v1/patterns", {}),
    ("POST", "/v1/ask"): lambda w, c, t: ("/v1/ask", {"json": {"question": "What opens the vault?",
                                                               "collection": t}}),
    ("POST", "/v1/readings/{reading_id}/stop"): lambda w, c, t: ("/v1/readings/0123456789abcdef/stop", {}),
    ("POST", "/v1/sessions"): lambda w, c, t: ("/v1/sessions", {"json": {"collection": t}}),
    ("GET", "/v1/sessions/{session_id}"): lambda w, c, t: (f"/v1/sessions/{chat_session(w, c, t)}", {}),
    ("DELETE", "/v1/sessions/{session_id}"): lambda w, c, t: (f"/v1/sessions/{chat_session(w, c, t)}", {}),
    ("POST", "/v1/sessions/{session_id}/messages"): lambda w, c, t: (
        f"/v1/sessions/{chat_session(w, c, t)}/messages", {"json": {"message": "What opens the vault?"}}),
    ("POST", "/v1/compose/sessions"): lambda w, c, t: (
        "/v1/compose/sessions", {"json": {"collection": t, "options": {"debounce": 0.0}}}),
    ("GET", "/v1/compose/sessions/{session_id}"): lambda w, c, t: (
        f"/v1/compose/sessions/{compose_session(w, c, t)}", {}),
    ("GET", "/v1/compose/sessions/{session_id}/memory"): lambda w, c, t: (
        f"/v1/compose/sessions/{compose_session(w, c, t)}/memory", {}),
    ("DELETE", "/v1/compose/sessions/{session_id}"): lambda w, c, t: (
        f"/v1/compose/sessions/{compose_session(w, c, t)}", {}),
    ("POST", "/v1/compose/sessions/{session_id}/suggestions"): lambda w, c, t: (
        f"/v1/compose/sessions/{compose_session(w, c, t)}/suggestions", {"json": {"text": "The vault"}}),
    ("GET", "/v1/models"): lambda w, c, t: ("/v1/models", {}),
    ("POST", "/v1/chat/completions"): lambda w, c, t: (
        "/v1/chat/completions", {"json": {"model": f"marginalia:{t}",
                                          "messages": [{"role": "user", "content": "What opens the vault?"}]}}),
    ("POST", "/chat"): lambda w, c, t: ("/chat", {"json": {"message": "What opens the vault?", "collection": t}}),
}

#: the success status of each route that does not answer 200
CREATED = {("POST", "/v1/keys"): 201, ("POST", "/v1/collections"): 201, ("POST", "/v1/sessions"): 201,
           ("POST", "/v1/compose/sessions"): 201, ("POST", "/v1/collections/{name}/documents"): 202,
           ("POST", "/v1/collections/{name}/qa-jobs"): 202, ("POST", "/v1/collections/{name}/eval-jobs"): 202}
#: routes whose every valid caller gets 404: the stop route names a reading nobody runs
NOTHING_THERE = {("POST", "/v1/readings/{reading_id}/stop")}


def expected(route: tuple[str, str], caller: str, target: str) -> int:
    """The status a cell must get."""
    scope = ROUTE_SCOPES[route]
    ok = CREATED.get(route, 200)
    if scope is Scope.PUBLIC:
        return ok
    if caller in ("none", "wrong", "revoked"):
        return 401
    if route in NOTHING_THERE:
        return 404
    if scope is Scope.OWNER:  # its own session in A; another key's in B, whoever asks
        return ok if target == "A" else 404
    if caller == "admin":
        return ok
    if scope is Scope.ADMIN:
        return 403
    if route in JOB_ROUTES or scope is not Scope.SIGNED \
            or route in BODY_NAMES_COLLECTION:
        if target == "B":
            return 404
        if scope is Scope.WRITE and caller == "reader":
            return 403
    return ok


#: routes that name a job of a collection (checked by the route, under the signed scope)
JOB_ROUTES = {("GET", "/v1/jobs/{job_id}"), ("GET", "/v1/jobs/{job_id}/events"), ("GET", "/v1/qa-jobs/{job_id}"),
              ("GET", "/v1/qa-jobs/{job_id}/events"), ("GET", "/v1/eval-jobs/{job_id}")}
#: routes whose body names the collection (checked by the route, under the signed scope)
BODY_NAMES_COLLECTION = {("POST", "/v1/ask"), ("POST", "/v1/sessions"), ("POST", "/v1/compose/sessions"),
                         ("POST", "/v1/chat/completions"), ("POST", "/chat")}


def app_routes(app: Any) -> set[tuple[str, str]]:
    """(method, path) of every route the app answers (HEAD aside; a mount as GET), included routers opened."""
    out: set[tuple[str, str]] = set()

    def walk(routes: list[Any]) -> None:
        for route in routes:
            if hasattr(route, "effective_candidates"):  # an included router: its routes with their prefix
                walk(route.effective_candidates())
                continue
            methods = getattr(route, "methods", None) or {"GET"}
            out.update((m, route.path) for m in methods if m != "HEAD")

    walk(app.routes)
    return out


def test_every_route_of_the_app_declares_a_scope_and_has_a_row_in_the_matrix(tmp_path):
    app = create_app(Settings(home=str(tmp_path)), generator=ScriptedGenerator(respond=respond),
                     embedder=HashingEmbedder())
    routes = app_routes(app)
    assert routes - set(ROUTE_SCOPES) == set(), "a route with no declared scope (add it to auth.ROUTE_SCOPES)"
    assert set(ROUTE_SCOPES) - routes == set(), "a scope for a route the app no longer has"
    assert routes - set(REQUESTS) == set(), "a route the access matrix does not try"


def test_a_key_is_looked_up_once_per_request(world, monkeypatch):
    calls = []
    find = KeyStore.find

    def counted(self: KeyStore, token: str) -> Any:
        calls.append(token)
        return find(self, token)

    monkeypatch.setattr(KeyStore, "find", counted)
    assert world.as_("reader", "POST", "/v1/ask", json={"question": "What opens the vault?",
                                                        "collection": "A"}).status_code == 200
    assert len(calls) == 1  # by the gate, before the body; the routes' dependency takes its answer


def test_a_route_missing_from_the_table_is_refused_to_all_but_admins(world, monkeypatch):
    monkeypatch.delitem(ROUTE_SCOPES, ("GET", "/v1/models"))
    assert world.as_("reader", "GET", "/v1/models").status_code == 403
    assert world.as_("admin", "GET", "/v1/models").status_code == 200


@pytest.mark.parametrize("route", sorted(ROUTE_SCOPES), ids=lambda r: f"{r[0]} {r[1]}")
def test_the_access_matrix(route, tmp_path):
    w = make_world(tmp_path / "home")
    wrong = []
    for caller in CALLERS:  # the admin last: its cells may delete what the others' need
        for target in TARGETS:
            url, kw = REQUESTS[route](w, caller, target)
            reply = w.as_(caller, route[0], url, **kw)
            want = expected(route, caller, target)
            if reply.status_code != want:
                wrong.append(f"{caller} on {target}: {reply.status_code}, expected {want}: {reply.text[:200]}")
            if caller in ("reader", "writer"):
                assert SECRET_B not in reply.text and "Calloway" not in reply.text, (caller, target, url)
            assert w.tokens["admin"] not in reply.text and WRONG not in reply.text
    assert wrong == []


# -- what each key sees -----------------------------------------------------------------------------------


def test_each_key_lists_and_asks_only_its_own_collection(world):
    other = world.store.create("reader-b", Grants(read=frozenset({"B"})))[1]
    world.tokens["other"] = other
    b = {"Authorization": f"Bearer {other}"}
    assert [c["name"] for c in world.as_("reader", "GET", "/v1/collections").json()] == ["A"]
    assert [c["name"] for c in world.client.get("/v1/collections", headers=b).json()] == ["B"]
    assert [m["id"] for m in world.as_("reader", "GET", "/v1/models").json()["data"]] == ["marginalia:A"]
    assert [m["id"] for m in world.client.get("/v1/models", headers=b).json()["data"]] == ["marginalia:B"]
    assert [j["collection"] for j in world.as_("reader", "GET", "/v1/jobs").json()] == ["A"]
    # a name out of reach is answered exactly as a name that does not exist
    hidden = world.as_("reader", "GET", "/v1/collections/B")
    missing = world.as_("reader", "GET", "/v1/collections/C")
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["error"]["message"].replace("'B'", "'C'") == missing.json()["error"]["message"]
    assert "(existing: A)" in hidden.json()["error"]["message"]
    asked = world.client.post("/v1/ask", headers=b, json={"question": "What opens the vault?", "collection": "B"})
    assert asked.status_code == 200 and "vault.md" in json.dumps(asked.json()["references"])
    completion = world.as_("reader", "POST", "/v1/chat/completions", json={
        "model": "marginalia:B", "messages": [{"role": "user", "content": "What opens the vault?"}]})
    assert completion.status_code == 404


def test_me_says_what_the_key_may_do(world):
    assert world.as_("reader", "GET", "/v1/me").json() == {
        "signed_in_as": "key:reader-a", "kind": "key", "name": "reader-a", "read": ["A"], "write": [],
        "admin": False}
    assert world.as_("writer", "GET", "/v1/me").json()["write"] == ["A"]
    assert world.as_("admin", "GET", "/v1/me").json()["admin"] is True


def test_a_readers_refused_upload_says_why(world):
    reply = world.as_("reader", "POST", "/v1/collections/A/documents", files={"file": ("x.md", b"# X\n\nx\n")})
    assert reply.status_code == 403
    assert "may read collection 'A' but not change it" in reply.json()["error"]["message"]


# -- sessions and revocation ------------------------------------------------------------------------------


def test_a_revoked_key_is_refused_from_its_next_request_its_sessions_included(world):
    token = world.store.create("temp", Grants(read=frozenset({"A"})))[1]
    headers = {"Authorization": f"Bearer {token}"}
    session = world.client.post("/v1/sessions", headers=headers, json={"collection": "A"}).json()["id"]
    compose = world.client.post("/v1/compose/sessions", headers=headers,
                                json={"collection": "A", "options": {"debounce": 0.0}}).json()["id"]
    asked = world.client.post(f"/v1/sessions/{session}/messages", headers=headers, json={"message": "Which pier?"})
    assert asked.status_code == 200
    assert world.as_("admin", "DELETE", "/v1/keys/temp").status_code == 200
    assert world.client.post(f"/v1/sessions/{session}/messages", headers=headers,
                             json={"message": "Which pier?"}).status_code == 401
    assert world.client.post(f"/v1/compose/sessions/{compose}/suggestions", headers=headers,
                             json={"text": "The ferry"}).status_code == 401
    assert world.client.get("/v1/collections", headers=headers).status_code == 401


def test_a_rotated_key_keeps_its_sessions_and_the_old_token_stops(world):
    old = world.store.create("turn", Grants(read=frozenset({"A"})))[1]
    session = world.client.post("/v1/sessions", headers={"Authorization": f"Bearer {old}"},
                                json={"collection": "A"}).json()["id"]
    new = world.as_("admin", "POST", "/v1/keys/turn/rotate").json()["token"]
    assert world.client.get(f"/v1/sessions/{session}", headers={"Authorization": f"Bearer {old}"}).status_code == 401
    assert world.client.get(f"/v1/sessions/{session}", headers={"Authorization": f"Bearer {new}"}).status_code == 200


def test_a_session_over_a_collection_the_key_lost_is_not_found(world):
    token = world.store.create("shrinking", Grants(read=frozenset({"A", "B"})))[1]
    headers = {"Authorization": f"Bearer {token}"}
    session = world.client.post("/v1/sessions", headers=headers, json={"collection": "B"}).json()["id"]
    world.store.revoke("shrinking")
    world.store.create("shrinking", Grants(read=frozenset({"A"})))
    # a new key of the same name is another key: the old session is not its own
    token = world.as_("admin", "POST", "/v1/keys/shrinking/rotate").json()["token"]
    reply = world.client.post(f"/v1/sessions/{session}/messages", headers={"Authorization": f"Bearer {token}"},
                              json={"message": "What opens the vault?"})
    assert reply.status_code == 404 and SECRET_B not in reply.text


def test_only_the_key_that_started_a_reading_may_stop_it(world):
    from marginalia.server.worker import ModelWorker

    worker = ModelWorker(1)
    found = []

    class Stub:
        id, owner = "r1", "key#1"

    worker.track(Stub())  # type: ignore[arg-type]
    found.append(worker.reading("r1", "key#1"))
    with pytest.raises(Exception) as refused:
        worker.reading("r1", "key#2")
    assert found and type(refused.value).__name__ == "NotFound"
    worker.shutdown()


# -- bounds -----------------------------------------------------------------------------------------------


def test_a_key_past_its_requests_per_minute_gets_429_with_retry_after(tmp_path):
    settings = Settings(home=str(tmp_path), key_rate=3)
    client = TestClient(create_app(settings, generator=ScriptedGenerator(respond=respond),
                                   embedder=HashingEmbedder()), base_url=BASE_URL)
    token = KeyStore.of_home(tmp_path).create("fast", Grants(read=frozenset({"A"})))[1]
    other = KeyStore.of_home(tmp_path).create("calm", Grants(read=frozenset({"A"})))[1]
    codes = [client.get("/v1/collections", headers={"Authorization": f"Bearer {token}"}).status_code
             for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    last = client.get("/v1/collections", headers={"Authorization": f"Bearer {token}"})
    assert 1 <= int(last.headers["retry-after"]) <= 60
    assert client.get("/v1/collections", headers={"Authorization": f"Bearer {other}"}).status_code == 200


def test_a_key_with_as_many_readings_as_it_may_gets_429():
    from marginalia.server.worker import ModelWorker, TooManyReadings

    worker = ModelWorker(8)

    class Stub:
        def __init__(self, i: int, owner: str) -> None:
            self.id, self.owner = f"r{i}", owner

    worker.track(Stub(1, "key#1"), limit=2)  # type: ignore[arg-type]
    worker.track(Stub(2, "key#1"), limit=2)  # type: ignore[arg-type]
    worker.track(Stub(3, "key#2"), limit=2)  # type: ignore[arg-type]
    with pytest.raises(TooManyReadings) as refused:
        worker.track(Stub(4, "key#1"), limit=2)  # type: ignore[arg-type]
    assert refused.value.retry_after > 0
    worker.shutdown()


# -- tokens -----------------------------------------------------------------------------------------------


def test_keys_are_compared_in_constant_time(world, monkeypatch):
    seen = []
    original = hmac.compare_digest

    def compare(a: Any, b: Any) -> bool:
        seen.append((type(a).__name__, type(b).__name__))
        return original(a, b)

    monkeypatch.setattr(hmac, "compare_digest", compare)  # the module auth and keys call it through
    assert world.as_("server", "GET", "/v1/me").status_code == 200
    assert world.as_("reader", "GET", "/v1/me").status_code == 200
    assert len(seen) >= 3  # the server key; then the server key and the stored hash


def test_tokens_are_never_in_logs_urls_audit_or_error_replies(world, caplog):
    caplog.set_level(logging.DEBUG)
    token = world.tokens["reader"]
    replies = [world.as_("reader", "GET", "/v1/collections/B"), world.as_("wrong", "GET", "/v1/collections"),
               world.as_("revoked", "GET", "/v1/collections"),
               world.client.get("/v1/collections", headers={"Authorization": f"Bearer {token}x"}),
               world.as_("reader", "POST", "/v1/collections/A/documents", files={"file": ("x.md", b"# x\n\nx")}),
               world.as_("admin", "GET", "/v1/keys")]
    for reply in replies:
        assert token not in reply.text and WRONG not in reply.text
        assert world.tokens["revoked"] not in reply.text
    assert all(t not in caplog.text for t in world.tokens.values())
    audit = (world.home / "audit.jsonl").read_text()
    assert all(t not in audit for t in world.tokens.values())
    stored = (world.home / "access.sqlite").read_bytes()
    assert all(t.encode() not in stored for t in world.tokens.values())
    # a token in the URL is no way in
    assert world.client.get(f"/v1/collections?key={token}").status_code == 401


def test_the_audit_log_says_who_did_what_and_questions_only_when_asked(tmp_path):
    world = make_world(tmp_path / "home")
    world.as_("reader", "POST", "/v1/ask", json={"question": "Which pier is it?", "collection": "A"})
    world.as_("writer", "DELETE", "/v1/collections/A/documents/report.md")
    world.as_("admin", "POST", "/v1/keys", json={"name": "later", "read": ["A"]})
    world.as_("admin", "DELETE", "/v1/keys/later")
    lines = [json.loads(line) for line in (world.home / "audit.jsonl").read_text().splitlines()]
    actions = [(r["actor"], r["action"]) for r in lines]
    assert ("key:reader-a", "ask") in actions and ("key:writer-a", "delete_document") in actions
    assert ("key:boss", "create_key") in actions and ("key:boss", "revoke_key") in actions
    assert ("server-key", "upload") in actions
    asked = next(r for r in lines if r["action"] == "ask" and r["actor"] == "key:reader-a")
    assert asked["collection"] == "A" and "question" not in asked and asked["time"]
    assert "Which pier" not in (world.home / "audit.jsonl").read_text()

    home = tmp_path / "other"
    settings = Settings(home=str(home), audit_questions=True)
    client = TestClient(create_app(settings, generator=ScriptedGenerator(respond=respond),
                                   embedder=HashingEmbedder()), base_url=BASE_URL)
    assert client.post("/v1/ask", json={"question": "Which pier is it?", "text": REPORT}).status_code == 200
    assert "Which pier is it?" in (home / "audit.jsonl").read_text()


# -- behind a proxy ---------------------------------------------------------------------------------------


def test_the_trusted_header_counts_only_from_the_trusted_proxy(tmp_path):
    store = KeyStore.of_home(tmp_path)
    store.grant_user("ana", Grants(read=frozenset({"A"})))
    with pytest.raises(UserError, match="not an address"):
        Settings(home=str(tmp_path), trusted_header="X-Forwarded-User", trusted_proxies=("proxy.example",))
    settings = Settings(home=str(tmp_path), trusted_header="X-Forwarded-User", trusted_proxies=("10.1.2.0/24",))
    assert auth.authenticate(settings, None, peer="10.1.2.9", forwarded_user="ana").actor == "user:ana"
    assert auth.authenticate(settings, None, peer="10.1.2.9", forwarded_user="ana").can_read("A")
    with pytest.raises(auth.Unauthorized):
        auth.authenticate(settings, None, peer="10.9.9.9", forwarded_user="ana")  # not the proxy: ignored
    with pytest.raises(auth.Unauthorized):
        auth.authenticate(settings, None, peer="10.1.2.9", forwarded_user="mallory")  # no grants
    # TestClient's peer is 'testclient', no address: the header from it is ignored
    client = TestClient(create_app(settings, generator=ScriptedGenerator(respond=respond),
                                   embedder=HashingEmbedder()), base_url=BASE_URL)
    assert client.get("/v1/me", headers={"X-Forwarded-User": "ana"}).status_code == 401


def test_a_server_with_no_key_anywhere_stays_open_and_the_first_key_closes_it(tmp_path):
    client = TestClient(create_app(Settings(home=str(tmp_path)), generator=ScriptedGenerator(respond=respond),
                                   embedder=HashingEmbedder()), base_url=BASE_URL)
    assert client.get("/v1/me").json()["signed_in_as"] == "anonymous"
    KeyStore.of_home(tmp_path).create("first", Grants(admin=True))
    assert client.get("/v1/collections").status_code == 401
