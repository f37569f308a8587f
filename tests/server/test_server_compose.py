"""Compose sessions over HTTP, on scripted client and memory models: suggestions (JSON and events), a newer
request or a streaming client that leaves cancelling the one in flight, memory items with their sources,
the memory model failing or timing out (reported once, suggestions going on), refusals, and sessions that
end, expire and lend their models on."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from marginalia.compose import threads
from marginalia.errors import BackendError
from marginalia.index.embedders import HashingEmbedder
from marginalia.models.base import GenerationParams
from marginalia.models.fake import Request, ScriptedGenerator
from marginalia.server import Settings, create_app
from server_support import (
    BASE_URL,
    COMPOSE_SETTINGS,
    FACT,
    REPORT,
    SUGGESTION,
    TAKEAWAY,
    ComposeModels,
    index_text,
    live_server,
    parse_sse,
    scripted,
    wait_for,
)

pytest.importorskip("lancedb")
pytest.importorskip("rapidfuzz")

from fastapi.testclient import TestClient  # noqa: E402


@pytest.fixture(autouse=True)
def normal_class_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory threads in the normal class, only nicer: these tests wait on memory work, which in the idle class
    gets no core while any other process wants one (a loaded machine would fail them; test_compose.py covers
    the idle class)."""
    monkeypatch.setattr(threads, "IDLE_CLASS", False)


TEXT = "The night ferry to Brackwater"
#: refresh memory after a few tokens, from every chunk, with no wait before suggesting
OPTIONS = {"threshold": 4, "min_similarity": -1.0, "debounce": 0.0}


@contextmanager
def composing(models: ComposeModels | None = None, documents: bool = True, **settings: Any) -> Iterator[TestClient]:
    """The app with 'report.md' indexed in 'docs', compose models from ``models``; shut down after."""
    settings = {**COMPOSE_SETTINGS, **settings}
    app = create_app(Settings(**settings),
                     generator=scripted(), embedder=HashingEmbedder(), loader=models or ComposeModels())
    with TestClient(app, base_url=BASE_URL) as client:
        if documents:
            assert index_text(client, "docs", "report.md", REPORT)["status"] == "done"
        yield client


def start(client: TestClient, **options: Any) -> str:
    reply = client.post("/v1/compose/sessions", json={"collection": "docs", "options": {**OPTIONS, **options}})
    assert reply.status_code == 201, reply.text
    return str(reply.json()["id"])


def suggest(client: TestClient, sid: str, text: str, **more: Any) -> Any:
    return client.post(f"/v1/compose/sessions/{sid}/suggestions", json={"text": text, **more})


def test_a_suggestion_continues_the_text_and_memory_comes_with_its_sources():
    models = ComposeModels()
    with composing(models) as client:
        sid = start(client)
        reply = suggest(client, sid, TEXT)
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["suggestion"] == SUGGESTION and not body["cancelled"]
        assert body["context_chars"] == len(TEXT) and body["generated_tokens"] > 0
        (client_model,) = models.of("client")
        assert client_model.requests[-1].prompt.endswith("<|assistant|>\n" + TEXT)  # it continues the text
        # the text asked for memory; the memory model wrote one takeaway, from the chunk about the ferry
        memory = wait_for(lambda: (m := client.get(f"/v1/compose/sessions/{sid}/memory").json())["items"]
                          and not m["refreshing"] and m)
        (item,) = memory["items"]
        assert item["text"] == TAKEAWAY and item["kind"] == "takeaway" and item["document"] == "report.md"
        assert item["section_path"] == ["Harbour report", "Ferries"]
        doc = client.get("/v1/collections/docs/documents/report.md").json()
        assert FACT in doc["text"][item["start"]:item["end"]] and item["doc_id"] == doc["id"]
        assert memory["version"] == 1 and not memory["failing"] and memory["notices"] == []
        # the next suggestion runs with that memory in its prompt, and says so
        again = suggest(client, sid, TEXT + " leaves").json()
        assert again["memory_version"] == again["memory"]["in_use"] == 1
        assert TAKEAWAY in client_model.requests[-1].prompt
        session = client.get(f"/v1/compose/sessions/{sid}").json()
        assert session["collection"] == "docs" and session["options"]["threshold"] == 4
        assert session["model"] == "client" and session["memory_model"] == "memory"
        assert session["memory"]["items"] == memory["items"]


def test_a_streamed_suggestion_sends_its_pieces_then_the_whole():
    with composing() as client:
        sid = start(client)
        reply = suggest(client, sid, TEXT, stream=True)
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(reply.text)
        kinds = [kind for kind, _ in events]
        assert kinds[-1] == "done" and set(kinds[:-1]) == {"delta"} and len(kinds) > 2
        assert "".join(data["text"] for kind, data in events if kind == "delta") == SUGGESTION
        assert events[-1][1]["suggestion"] == SUGGESTION and "memory" in events[-1][1]


class Gate:
    """A client model's replies: the first waits until the gate opens."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.calls = 0

    def __call__(self, req: Request) -> str:
        self.calls += 1
        if self.calls == 1:
            assert self.open.wait(10)
        return SUGGESTION


def test_a_newer_request_cancels_the_suggestion_in_flight():
    gate = Gate()
    models = ComposeModels(client=gate)
    with composing(models) as client:
        sid = start(client, threshold=1000)
        replies: dict[str, Any] = {}

        def send(name: str, text: str) -> None:
            replies[name] = suggest(client, sid, text)

        first = threading.Thread(target=send, args=("first", "The ferry"))
        first.start()
        wait_for(lambda: gate.calls == 1)  # the first is being written
        second = threading.Thread(target=send, args=("second", "The ferry sails"))
        second.start()
        service = client.app.state.service  # type: ignore[attr-defined]
        wait_for(lambda: service.compose.get(sid).composer.text == "The ferry sails")  # the second has arrived
        gate.open.set()
        first.join(10)
        second.join(10)
        old, new = replies["first"].json(), replies["second"].json()
        assert old["cancelled"] and old["suggestion"] == "" and old["context_chars"] == len("The ferry")
        assert not new["cancelled"] and new["suggestion"] == SUGGESTION
        assert gate.calls == 2


def test_when_every_session_is_busy_a_new_one_waits():
    gate = Gate()
    with composing(ComposeModels(client=gate), max_compose_sessions=1) as client:
        sid = start(client)
        writing = threading.Thread(target=suggest, args=(client, sid, TEXT))
        writing.start()
        wait_for(lambda: gate.calls == 1)
        full = client.post("/v1/compose/sessions", json={"collection": "docs"})
        gate.open.set()
        writing.join(10)
        assert full.status_code == 429 and full.headers["retry-after"] == "2"
        assert "compose sessions are writing suggestions" in full.json()["error"]["message"]
        assert client.post("/v1/compose/sessions", json={"collection": "docs"}).status_code == 201  # idle now


class SlowDecoding(ScriptedGenerator):
    """Decodes one token per 50 ms."""

    def _sample_tokens(self, params: GenerationParams) -> Iterator[int]:
        for token in super()._sample_tokens(params):
            time.sleep(0.05)
            yield token


def test_a_streaming_client_that_leaves_cancels_its_suggestion():
    models = ComposeModels()
    words = " " + " ".join(f"word{i}" for i in range(20))

    def load(spec: str) -> ScriptedGenerator:
        return SlowDecoding(default=words, name="client") if spec == "client" else models(spec)

    app = create_app(Settings(**COMPOSE_SETTINGS), generator=scripted(), embedder=HashingEmbedder(), loader=load)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        index_text(http, "docs", "report.md", REPORT)
        sid = http.post("/v1/compose/sessions", json={"collection": "docs", "options": OPTIONS}).json()["id"]
        with http.stream("POST", f"/v1/compose/sessions/{sid}/suggestions",
                         json={"text": TEXT, "stream": True}) as reply:
            assert next(line for line in reply.iter_lines() if line.startswith("event:")) == "event: delta"
        # the client has gone after its first piece: the suggestion stops well before its 15 tokens
        composer = app.state.service.compose.get(sid).composer
        (result,) = wait_for(lambda: [e for e in composer.events if e.kind == "suggested"])
        assert result.cancelled and 1 <= result.generated_tokens < 10
        assert result.text and words.startswith(result.text)  # what was written before it stopped


def test_an_empty_collection_is_refused_before_any_model_loads():
    models = ComposeModels()
    with composing(models, documents=False) as client:
        assert client.post("/v1/collections", json={"name": "empty", "embedder": "hashing"}).status_code == 201
        reply = client.post("/v1/compose/sessions", json={"collection": "empty"})
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "bad_request"
        assert "holds no documents; index some into it first" in reply.json()["error"]["message"]
        unknown = client.post("/v1/compose/sessions", json={"collection": "nowhere"})
        assert unknown.status_code == 404 and "POST /v1/collections" in unknown.json()["error"]["message"]
        assert models.loaded == []


def test_a_model_that_cannot_be_loaded_is_named_and_what_was_loaded_is_kept():
    models = ComposeModels()
    with composing(models, compose_memory_model="nosuchmodel") as client:
        reply = client.post("/v1/compose/sessions", json={"collection": "docs"})
        assert reply.status_code == 400
        message = reply.json()["error"]["message"]
        assert message.startswith("the memory model (nosuchmodel) could not be loaded: unknown model spec")
        assert client.app.state.service.compose.pool.free() == 1  # type: ignore[attr-defined]  # the client
        other = client.post("/v1/compose/sessions", json={"collection": "docs", "options": {"memory_model": "x"}})
        assert other.status_code == 400 and "leave options.memory_model out" in other.json()["error"]["message"]
        bad = client.post("/v1/compose/sessions", json={"collection": "docs", "options": {"threshold": 0}})
        assert bad.status_code == 422 and bad.json()["error"]["fields"][0]["field"] == "options.threshold"


def failing(req: Request) -> str:
    raise BackendError("the memory model crashed")


def slow(req: Request) -> str:
    time.sleep(0.4)
    return TAKEAWAY


@pytest.mark.parametrize(("memory", "options", "why"), [
    (failing, {"hits": 1}, "the memory model crashed"),
    (slow, {"hits": 1, "memory_timeout": 0.1}, "the memory model took more than 0.1 s"),
])
def test_a_failing_memory_model_is_reported_once_and_suggestions_go_on(memory, options, why):
    models = ComposeModels(memory=memory)
    with composing(models) as client:
        sid = start(client, **options)
        notices: list[str] = []

        def memory_now() -> dict[str, Any]:
            state = client.get(f"/v1/compose/sessions/{sid}/memory").json()
            notices.extend(state["notices"])
            return state  # type: ignore[no-any-return]

        (memory_model,) = models.of("memory")
        text = TEXT
        for round_ in range(1, 4):
            text += " and on"  # four tokens more: each suggestion asks for memory again
            reply = suggest(client, sid, text).json()
            notices.extend(reply["memory"]["notices"])
            assert reply["suggestion"] == SUGGESTION and not reply["cancelled"]
            wait_for(lambda n=round_: len(memory_model.requests) >= n and memory_now()["failing"]
                     and not memory_now()["refreshing"])
        state = memory_now()
        assert state["failing"] and why in state["error"] and state["items"] == [] and state["version"] == 0
        assert len(memory_model.requests) == 3
        (notice,) = notices  # said once, not once per failure
        assert why in notice and "suggestions go on" in notice


def test_sessions_end_and_their_models_serve_the_next_one():
    models = ComposeModels()
    with composing(models, max_compose_sessions=1) as client:
        service = client.app.state.service  # type: ignore[attr-defined]
        first = start(client)
        assert client.get("/v1/health").json()["compose_sessions"] == 1
        assert client.delete(f"/v1/compose/sessions/{first}").json() == {"deleted": first}
        gone = suggest(client, first, TEXT)
        assert gone.status_code == 404 and "POST /v1/compose/sessions" in gone.json()["error"]["message"]
        wait_for(lambda: service.compose.pool.free() == 2)  # the client and the memory model came back
        second = start(client)
        assert len(models.loaded) == 2  # nothing loaded again
        assert suggest(client, second, TEXT).json()["suggestion"] == SUGGESTION
        third = start(client)  # the store is full: the idle one makes room
        assert client.get(f"/v1/compose/sessions/{second}").status_code == 404
        assert client.get(f"/v1/compose/sessions/{third}").status_code == 200
        # one idle past the time to live expires
        service.compose.clock = lambda: time.time() + service.settings.session_ttl + 1
        assert client.get(f"/v1/compose/sessions/{third}").status_code == 404
        assert client.get("/v1/health").json()["compose_sessions"] == 0


def test_composing_needs_the_key_and_is_in_the_schema():
    with composing(documents=False, api_key="sesame") as client:
        assert client.post("/v1/compose/sessions", json={"collection": "docs"}).status_code == 401
        assert client.post("/v1/compose/sessions/x/suggestions", json={"text": "a"}).status_code == 401
        assert client.get("/openapi.json").status_code == 401  # the schema needs the key too
        schema = client.get("/openapi.json", headers={"Authorization": "Bearer sesame"}).json()
    paths = schema["paths"]
    assert {"/v1/compose/sessions", "/v1/compose/sessions/{session_id}", "/v1/compose/sessions/{session_id}/memory",
            "/v1/compose/sessions/{session_id}/suggestions"} <= set(paths)
    options = schema["components"]["schemas"]["ComposeOptions"]["properties"]
    assert options["threshold"]["default"] == 20 and "token edits" in options["threshold"]["description"]
