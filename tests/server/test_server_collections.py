"""Collections over HTTP: create, upload (checked by content, indexed as a background job), show with the
section tree, ask a collection or one of its documents, delete; and docqa's /chat over a collection."""

from __future__ import annotations

import json
import os

import pytest

from marginalia.index.embedders import HashingEmbedder
from marginalia.options import CollectionOptions
from marginalia.server import Settings
from server_support import (
    ANSWER,
    FACT,
    MARGIN,
    PDF_TIMEOUT,
    QUESTION,
    REPORT,
    index_text,
    make_client,
    parse_sse,
    respond,
    scripted,
    wait_for,
)
from wim_requests import is_margin

pytest.importorskip("lancedb")

FERRY_HTML = (b"<!doctype html><html><head><title>Ferries</title></head><body><h1>Night ferry</h1>"
              b"<p>The night ferry to Brackwater leaves from pier 47.</p></body></html>")


@pytest.fixture
def client():
    return make_client()


def test_create_list_show_delete(client):
    created = client.post("/v1/collections", json={"name": "docs", "embedder": "hashing"})
    assert created.status_code == 201
    assert created.json()["name"] == "docs" and created.json()["documents"] == []
    again = client.post("/v1/collections", json={"name": "docs"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    (listed,) = client.get("/v1/collections").json()
    assert (listed["name"], listed["embedder"], listed["documents"]) == ("docs", "hashing", 0)
    assert client.delete("/v1/collections/docs").json() == {"deleted": "docs"}
    assert client.get("/v1/collections").json() == []
    assert client.get("/v1/collections/docs").status_code == 404
    assert client.delete("/v1/collections/docs").status_code == 404


@pytest.mark.parametrize(("body", "status"), [
    ({"name": "../escape", "embedder": "hashing"}, 400),
    ({"name": "ok", "embedder": "st:/etc"}, 400),  # a client may not make the server load a folder
    ({"name": "ok", "embedder": "hashing", "extra": 1}, 422),
])
def test_create_refuses_bad_names_and_embedders(client, body, status):
    reply = client.post("/v1/collections", json=body)
    assert reply.status_code == status, reply.text
    assert "error" in reply.json()


def test_upload_is_indexed_as_a_job_and_shown_with_its_section_tree(client):
    job = index_text(client, "docs", "report.md", REPORT)
    assert job["status"] == "done" and job["stage"] == "finished"
    result = job["result"]
    assert (result["status"], result["source"]) == ("added", "report.md")
    assert result["chunks"] == job["chunks_done"] == job["chunks_total"] >= 1
    shown = client.get("/v1/collections/docs").json()
    (doc,) = shown["documents"]
    assert (doc["source"], doc["title"], doc["format"]) == ("report.md", "Harbour report", "markdown")
    tree = doc["sections"]
    (top,) = tree["children"]
    assert top["title"] == "Harbour report"
    assert [c["title"] for c in top["children"]] == ["Dredging", "Ferries", "Lifeboat"]
    assert top["children"][1]["path"] == ["Harbour report", "Ferries"]
    assert "sections" not in client.get("/v1/collections/docs?tree=false").json()["documents"][0]
    # the same content again changes nothing; a new version of the same name replaces it
    assert index_text(client, "docs", "report.md", REPORT)["result"]["status"] == "unchanged"
    assert index_text(client, "docs", "report.md", REPORT + "\nMore.\n")["result"]["status"] == "replaced"
    assert len(client.get("/v1/collections/docs").json()["documents"]) == 1


def test_html_without_a_suffix_is_read_as_html(client):
    job = index_text(client, "docs", "ferry", FERRY_HTML)
    assert job["status"] == "done", job
    (doc,) = client.get("/v1/collections/docs").json()["documents"]
    assert (doc["source"], doc["format"], doc["title"]) == ("ferry", "html", "Ferries")


def test_the_file_name_never_becomes_a_path(client, tmp_path):
    client.post("/v1/collections", json={"name": "docs", "embedder": "hashing"})
    before = set(os.listdir(tmp_path))
    job = index_text(client, "docs", "../../../../tmp/evil\\..\\notes.md", "# Notes\n\nplain words\n")
    assert job["status"] == "done"
    assert job["document"] == job["result"]["source"] == "notes.md"
    assert set(os.listdir(tmp_path)) == before
    assert not any("notes.md" in name for name in os.listdir("/tmp"))


@pytest.mark.parametrize(("name", "data", "what"), [
    ("photo.jpg", b"\xff\xd8\xff\xe0 a jpeg", "unsupported file type"),
    ("report.pdf", b"# Not a PDF\n\nJust markdown.\n", "not one"),
    ("notes.txt", b"\x00\x01binary\x00", "binary"),
    ("notes.md", "caf\u00e9".encode("latin-1") + b" and more", "UTF-8"),
])
def test_an_upload_is_checked_by_its_content(client, name, data, what):
    client.post("/v1/collections", json={"name": "docs", "embedder": "hashing"})
    reply = client.post("/v1/collections/docs/documents", files={"file": (name, data)})
    assert reply.status_code == 415, reply.text
    error = reply.json()["error"]
    assert error["code"] == "unsupported_type" and what in error["message"]
    assert client.get("/v1/jobs").json() == []


def test_a_pdf_by_content_is_read_as_pdf_whatever_its_name(client):
    pytest.importorskip("pymupdf4llm")
    from pathlib import Path

    pdf = next(Path(__file__).parents[1].joinpath("data").rglob("*.pdf"), None)
    if pdf is None:
        pytest.skip("no sample PDF in tests/data")
    job = index_text(client, "docs", "paper.txt", pdf.read_bytes(), timeout=PDF_TIMEOUT)
    assert job["status"] == "done", job
    (doc,) = client.get("/v1/collections/docs").json()["documents"]
    assert doc["format"] == "pdf"


def test_upload_limits_and_unknown_collection():
    client = make_client(Settings(max_upload_bytes=2000))
    assert client.post("/v1/collections/nowhere/documents", files={"file": ("a.md", b"# A\n\nx\n")}).status_code == 404
    client.post("/v1/collections", json={"name": "docs", "embedder": "hashing"})
    big = client.post("/v1/collections/docs/documents", files={"file": ("a.md", b"word " * 1000)})
    assert big.status_code == 413 and big.json()["error"]["code"] == "too_large"
    bad = client.post("/v1/collections/docs/documents?min_tokens=50&max_tokens=20",
                      files={"file": ("a.md", b"# A\n\nx\n")})
    assert bad.status_code == 422 and "smallest chunk" in bad.json()["error"]["message"]
    missing = client.post("/v1/collections/docs/documents", data={"nofile": "x"})
    assert missing.status_code == 422 and missing.json()["error"]["fields"][0]["field"] == "file"


def test_chunking_options_come_from_the_query(client):
    small = index_text(client, "small", "report.md", REPORT)
    client.post("/v1/collections", json={"name": "big", "embedder": "hashing"})
    reply = client.post("/v1/collections/big/documents?min_tokens=400&max_tokens=800",
                        files={"file": ("report.md", REPORT.encode())})
    big = wait_for(lambda: (j := client.get(reply.headers["location"]).json())["status"] == "done" and j)
    assert big["result"]["chunks"] <= small["result"]["chunks"]


def test_following_a_job_streams_progress_then_done(client):
    client.post("/v1/collections", json={"name": "docs", "embedder": "hashing"})
    reply = client.post("/v1/collections/docs/documents", files={"file": ("report.md", REPORT.encode())})
    job_id = reply.json()["id"]
    events = parse_sse(client.get(f"/v1/jobs/{job_id}/events").text)
    assert events[-1][0] == "done" and events[-1][1]["result"]["status"] == "added"
    assert all(kind == "progress" for kind, _ in events[:-1])
    assert client.get("/v1/jobs/nope").status_code == 404
    assert client.get("/v1/jobs/nope/events").status_code == 404


def test_the_same_text_under_a_new_name_says_it_was_not_added_and_where_it_is():
    client = make_client()
    assert index_text(client, "docs", "report.md", REPORT)["result"]["status"] == "added"
    job = index_text(client, "docs", "report-copy.md", REPORT)
    assert job["status"] == "done" and job["document"] == "report-copy.md"
    result = job["result"]
    assert (result["status"], result["source"]) == ("duplicate", "report.md")
    message = result["message"]
    for words in ("already in collection 'docs' as 'report.md'", "nothing was added as 'report-copy.md'", "delete"):
        assert words in message, message
    # a collection holds each text once: the document is there under its first name only
    assert [d["source"] for d in client.get("/v1/collections/docs").json()["documents"]] == ["report.md"]
    assert client.get("/v1/collections/docs/documents/report-copy.md").status_code == 404
    # as the message says: deleted under its first name, the text is kept under the new one
    assert client.delete("/v1/collections/docs/documents/report.md").status_code == 200
    assert index_text(client, "docs", "report-copy.md", REPORT)["result"]["status"] == "added"
    assert "message" not in index_text(client, "docs", "report-copy.md", REPORT)["result"]  # unchanged


class FailingEmbedder(HashingEmbedder):
    """Embeds until ``fail`` is set, then fails like a crashed embedding server."""

    fail = False

    def _embed(self, texts, kind):
        if self.fail and kind == "document":
            raise RuntimeError("embedding server went away")
        return super()._embed(texts, kind)


def test_a_failed_job_leaves_the_collection_at_its_last_good_state():
    embedder = FailingEmbedder()
    client = make_client(embedder=embedder)
    assert index_text(client, "docs", "first.md", REPORT)["status"] == "done"
    embedder.fail = True
    failed = index_text(client, "docs", "second.md", "# Second\n\nAnother document entirely.\n")
    assert failed["status"] == "failed" and failed["error"]["code"] == "internal_error"
    assert "went away" not in json.dumps(failed)
    assert [d["source"] for d in client.get("/v1/collections/docs").json()["documents"]] == ["first.md"]
    embedder.fail = False
    again = index_text(client, "docs", "second.md", "# Second\n\nAnother document entirely.\n")
    assert again["result"]["status"] == "added"


def test_ask_a_collection_with_each_pattern(client):
    index_text(client, "docs", "report.md", REPORT)
    for pattern in ("wim", "lc", "rag"):
        reply = client.post("/v1/ask", json={"question": QUESTION, "collection": "docs",
                                             "reading": {"pattern": pattern}})
        assert reply.status_code == 200, reply.text
        data = reply.json()
        assert data["text"] == ANSWER and data["retrieval"] == "references" and data["pattern"] == pattern
        assert all(r["source"] == "report.md" for r in data["references"])
        assert any(FACT in r["text"] and r["section_path"] == ["Harbour report", "Ferries"]
                   for r in data["references"]), data["references"]


def test_a_collection_answer_is_sampled_at_the_requests_temperature_alone():
    gen = scripted()
    client = make_client(generator=gen)
    index_text(client, "docs", "report.md", REPORT)
    for pattern in ("wim", "lc", "rag"):
        for temperature in (0.8, None):
            body = {"question": QUESTION, "collection": "docs", "reading": {"pattern": pattern}}
            reply = client.post("/v1/ask", json={**body, **({"temperature": temperature} if temperature else {})})
            assert reply.status_code == 200, reply.text
            answer = [r.params for r in gen.requests if not is_margin(r)][-1]
            assert answer.temperature == (temperature or 0.0), (pattern, temperature)
    assert not any(r.params.temperature for r in gen.requests if is_margin(r))


def test_ask_a_collection_streams_retrieved_before_reading(client):
    index_text(client, "docs", "report.md", REPORT)
    reply = client.post("/v1/ask", json={"question": QUESTION, "collection": "docs", "stream": True})
    events = parse_sse(reply.text)
    assert [k for k, _ in events[:2]] == ["retrieved", "started"]
    retrieved = events[0][1]
    assert retrieved["outcome"] == "references" and isinstance(retrieved["references"], int)
    assert events[-1][0] == "done" and events[-1][1]["references"]


def test_nothing_relevant_found_is_said_not_guessed(client):
    index_text(client, "docs", "report.md", REPORT)
    reply = client.post("/v1/ask", json={"question": "zebra quantum marmalade?", "collection": "docs",
                                         "collection_options": {"uncertain": 0.8, "certain": 0.9}})
    data = reply.json()
    assert data["retrieval"] == "none" and "No relevant references" in data["text"]
    # auto, the default, does not search again for WiM: the same search would find nothing again
    assert data["pattern"] == "auto" and data["route"]["taken"] == "rag"
    assert data["route"]["reason"] == "nothing in the collection is relevant to it: WiM would find nothing to read"


def ask_stream(client, **body) -> list[tuple[str, dict]]:
    reply = client.post("/v1/ask", json={"question": QUESTION, "collection": "docs", "stream": True, **body})
    assert reply.status_code == 200, reply.text
    return parse_sse(reply.text)


def test_a_collection_with_no_pattern_answers_at_rags_cost_and_sends_the_route(client):
    index_text(client, "docs", "report.md", REPORT)
    whole = client.post("/v1/ask", json={"question": QUESTION, "collection": "docs"}).json()
    rag = client.post("/v1/ask", json={"question": QUESTION, "collection": "docs",
                                       "reading": {"pattern": "rag"}}).json()
    assert whole["pattern"] == "auto" and whole["text"] == ANSWER and whole["margins"] == []
    assert whole["route"]["taken"] == "rag" and "stands on the retrieved passages" in whole["route"]["reason"]
    assert whole["route"]["signals"]["support"] == 1.0
    costs = ("prefilled_context_tokens", "prefilled_other_tokens", "generated_answer_tokens", "generated_margin_tokens")
    assert [whole["stats"][k] for k in costs] == [rag["stats"][k] for k in costs]
    events = ask_stream(client)
    kinds = [k for k, _ in events]
    assert kinds.count("retrieved") == kinds.count("started") == kinds.count("routed") == 1
    assert [d["pattern"] for k, d in events if k == "started"] == ["rag"]
    # the route is sent before the answer, which is sent only once it is known to stand
    assert kinds.index("routed") < kinds.index("answer_delta")
    routed = dict(events)["routed"]
    assert {k: routed[k] for k in ("taken", "reason", "signals")} == whole["route"] and routed["elapsed"] >= 0
    assert events[-1] == ("done", {**events[-1][1], "route": whole["route"]})


def test_a_collection_reads_with_wim_where_rags_answer_does_not_stand(client):
    def made_up(req):  # margins as the scripted model writes them; an answer no passage holds
        return respond(req) if is_margin(req) else "Captain Ahab's pier."

    client = make_client(generator=scripted(made_up))
    index_text(client, "docs", "report.md", REPORT)
    events = ask_stream(client)
    kinds = [k for k, _ in events]
    routed = dict(events)["routed"]
    assert routed["taken"] == "wim" and "not in the retrieved passages" in routed["reason"]
    assert [d["pattern"] for k, d in events if k == "started"] == ["rag", "wim"]
    # WiM reads the retrieved sections after the route is sent; RAG's answer is never sent
    at = kinds.index("routed")
    assert "answer_delta" not in kinds[:at] and "margin_judged" in kinds[at:] and "retrieved" in kinds[at:]
    done = events[-1][1]
    assert done["pattern"] == "auto" and done["route"]["taken"] == "wim" and done["margins"]
    assert done["text"] == "Captain Ahab's pier."
    assert any(m["relevant"] and m["text"] == MARGIN for m in done["margins"])


def test_a_question_over_the_whole_collection_goes_to_wim_at_once(client):
    index_text(client, "docs", "report.md", REPORT)
    data = client.post("/v1/ask", json={"question": "List all the ships named in the report.",
                                        "collection": "docs"}).json()
    assert data["route"] == {"taken": "wim", "reason": "the question gathers over the whole document", "signals": {}}
    assert data["margins"]


def test_ask_one_document_of_a_collection(client):
    index_text(client, "docs", "report.md", REPORT)
    index_text(client, "docs", "ferry", FERRY_HTML)
    doc_id = next(d["id"] for d in client.get("/v1/collections/docs").json()["documents"]
                  if d["source"] == "report.md")
    for name in ("report.md", doc_id):
        reply = client.post("/v1/ask", json={"question": QUESTION, "collection": "docs", "document": name,
                                             "reading": {"pattern": "wim", "segment_tokens": 24}})
        assert reply.status_code == 200, reply.text
        (ref,) = reply.json()["references"]
        assert (ref["source"], ref["section_path"], ref["text"]) == (
            "report.md", ["Harbour report", "Ferries"], FACT)
    missing = client.post("/v1/ask", json={"question": QUESTION, "collection": "docs", "document": "other.md"})
    assert missing.status_code == 404 and "other.md" in missing.json()["error"]["message"]


def test_delete_a_document(client):
    index_text(client, "docs", "report.md", REPORT)
    index_text(client, "docs", "ferry", FERRY_HTML)
    reply = client.delete("/v1/collections/docs/documents/report.md")
    assert reply.status_code == 200 and reply.json()["source"] == "report.md"
    assert [d["source"] for d in client.get("/v1/collections/docs").json()["documents"]] == ["ferry"]
    assert client.delete("/v1/collections/docs/documents/report.md").status_code == 404


def test_docqa_chat_answers_from_the_servers_collection():
    client = make_client(Settings(default_collection="docs"))
    index_text(client, "docs", "report.md", REPORT)
    reply = client.post("/chat", json={"message": QUESTION, "temperature": 0.0, "certainty_threshold": 0.95,
                                       "uncertainty_threshold": 0.1, "openai_model": "gpt-whatever"})
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert set(data) == {"answer", "references", "metadata"} and data["answer"] == ANSWER
    assert all({"source", "content"} <= set(r) for r in data["references"])
    assert any(FACT in r["content"] for r in data["references"])
    assert data["metadata"]["retrieval"] == "references" and data["metadata"]["model"] == "scripted"
    # read with auto, the default over a collection: RAG's answer stood
    assert data["metadata"]["pattern"] == "auto" and data["metadata"]["route"]["taken"] == "rag"


def test_docqa_chat_checks_its_thresholds_and_needs_a_collection(client):
    reply = client.post("/chat", json={"message": "q", "certainty_threshold": 0.2, "uncertainty_threshold": 0.5})
    assert reply.status_code == 422 and "uncertain" in reply.json()["error"]["message"]
    no_collection = client.post("/chat", json={"message": "q"})
    assert no_collection.status_code == 400 and "--collection" in no_collection.json()["error"]["message"]


def test_docqa_defaults_are_the_records():
    from marginalia.server.schemas import DocqaChatRequest

    body = DocqaChatRequest(message="q")
    assert body.collection_options() == CollectionOptions()


def test_a_damaged_pdf_fails_its_job_saying_why(client):
    pytest.importorskip("pymupdf4llm")
    job = index_text(client, "docs", "broken.pdf", b"%PDF-1.4\n" + b"\x00garbage" * 100)
    assert job["status"] == "failed", job
    assert job["error"]["code"] == "unreadable_document" and "broken.pdf" in job["error"]["message"]
    assert "/tmp" not in job["error"]["message"]  # the saved copy's path is never shown


def test_a_collection_with_no_pattern_reads_with_its_profile_for_the_model(client):
    from marginalia.app import open_collection
    from marginalia.app.profiles import Profile, save_profile

    def made_up(req):
        return respond(req) if is_margin(req) else "Captain Ahab's pier."

    client = make_client(generator=scripted(made_up))
    index_text(client, "docs", "report.md", REPORT)

    def route(**body):
        reply = client.post("/v1/ask", json={"question": QUESTION, "collection": "docs", **body})
        assert reply.status_code == 200, reply.text
        return reply.json()["route"]

    assert route()["taken"] == "wim"
    save_profile(open_collection("docs"), Profile(model="scripted", run="pairs", made="2026-01-01T00:00:00Z",
                                                  options={"escalate": "rag"}))
    profiled = route()
    assert profiled["taken"] == "rag" and profiled["reason"].endswith("profile from run pairs")
    assert route(reading={"pattern": "auto"})["taken"] == "wim"  # a named pattern reads without it
    chat = client.post("/v1/chat/completions", json={"model": "marginalia:docs",
                                                     "messages": [{"role": "user", "content": QUESTION}]})
    assert chat.status_code == 200, chat.text
    assert chat.json()["marginalia"]["answer"]["route"]["reason"].endswith("profile from run pairs")
