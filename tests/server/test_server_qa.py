"""Question generation over HTTP: a job over a collection's documents, its progress events and its pairs."""

from __future__ import annotations

import pytest

from marginalia.bench.own import read_pairs
from marginalia.server import Settings
from qa_support import REPORT, respond_qa
from server_support import index_text, make_client, parse_sse, scripted, wait_for

pytest.importorskip("lancedb")


@pytest.fixture
def client(tmp_path):
    return make_client(Settings(home=str(tmp_path)), generator=scripted(respond_qa))


def test_a_job_streams_documents_requests_and_pairs_then_its_result(client, tmp_path):
    assert index_text(client, "harbour", "report.md", REPORT)["status"] == "done"
    reply = client.post("/v1/collections/harbour/qa-jobs", json={})
    assert reply.status_code == 202, reply.text
    job = reply.json()
    assert reply.headers["location"] == f"/v1/qa-jobs/{job['id']}"
    events = parse_sse(client.get(f"/v1/qa-jobs/{job['id']}/events").text)
    names = [name for name, _ in events]
    assert names[0] == "document" and names[-1] == "done"
    document = events[0][1]
    assert document["source"] == "report.md" and document["total"] == 8 and document["sections"] == 3
    assert names.count("request") == 8 and names.count("pair") == 6
    pairs = [data["pair"] for name, data in events if name == "pair"]
    assert {p["kind"] for p in pairs} == {"single", "join", "document", "unanswerable"}
    shown = client.get("/v1/collections/harbour/documents/report.md").json()
    for pair in pairs:
        for span in pair["evidence_spans"]:
            assert span["source"] == "report.md"
            assert shown["text"][span["start"]:span["end"]] == span["text"]
    done = events[-1][1]
    assert done["result"]["new_pairs"] == 6 and done["requests_done"] == done["requests_total"] == 8
    state = client.get(f"/v1/qa-jobs/{job['id']}").json()
    assert state["status"] == "done" and [p["id"] for p in state["pairs"]] == [p["id"] for p in pairs]
    assert [p["id"] for p in read_pairs(tmp_path / "qa" / "harbour.jsonl")] == [p["id"] for p in pairs]

    again = client.post("/v1/collections/harbour/qa-jobs", json={}).json()  # everything done: nothing asked
    finished = wait_for(lambda: (j := client.get(f"/v1/qa-jobs/{again['id']}").json())["finished_at"] and j)
    assert finished["result"]["skipped_documents"] == 1 and finished["pairs"] == []


def test_unknown_collections_jobs_and_bodies(client):
    assert client.post("/v1/collections/nope/qa-jobs", json={}).status_code == 404
    assert client.get("/v1/qa-jobs/nope").status_code == 404
    assert client.get("/v1/qa-jobs/nope/events").status_code == 404
    index_text(client, "harbour", "report.md", REPORT)
    assert client.post("/v1/collections/harbour/qa-jobs", json={"retries": -1}).status_code == 422
    job = client.post("/v1/collections/harbour/qa-jobs", json={"documents": ["other.md"]}).json()
    failed = parse_sse(client.get(f"/v1/qa-jobs/{job['id']}/events").text)[-1]
    assert failed[0] == "failed" and "other.md" in failed[1]["error"]["message"]
