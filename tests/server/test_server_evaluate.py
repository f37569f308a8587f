"""Reviewing generated QA pairs over HTTP, and evaluation jobs that run readings on the accepted ones."""

from __future__ import annotations

import threading

import pytest

from marginalia.bench.own import read_pairs, write_pairs
from marginalia.models.fake import Request
from marginalia.server import Settings
from marginalia.server.eval_jobs import recommendations
from qa_support import REPORT, SINGLE, respond_qa_and_read
from server_support import index_text, make_client, scripted, wait_for

pytest.importorskip("lancedb")


@pytest.fixture
def client(tmp_path):
    return make_client(Settings(home=str(tmp_path)), generator=scripted(respond_qa_and_read))


def generated(client) -> list[dict]:
    """The harbour report indexed and its pairs generated; the pairs as listed."""
    assert index_text(client, "harbour", "report.md", REPORT)["status"] == "done"
    job = client.post("/v1/collections/harbour/qa-jobs", json={}).json()
    wait_for(lambda: client.get(f"/v1/qa-jobs/{job['id']}").json()["status"] == "done")
    listed = client.get("/v1/collections/harbour/qa-pairs").json()
    assert listed["counts"] == {"pending": 6, "accepted": 0, "rejected": 0} and listed["generating"] is None
    return listed["pairs"]


def by_question(pairs: list[dict], question: str) -> dict:
    return next(p for p in pairs if p["question"] == question)


def test_a_pair_is_accepted_edited_or_rejected_and_stored_in_the_qa_file(client, tmp_path):
    pairs = generated(client)
    url = "/v1/collections/harbour/qa-pairs/"
    coxswain = by_question(pairs, SINGLE["Ingrid Tasker"])
    dredger = by_question(pairs, SINGLE["Orla Maye"])
    market = by_question(pairs, SINGLE["Tomas Brey"])
    accepted = client.patch(url + coxswain["id"], json={"status": "accepted"})
    assert accepted.status_code == 200 and accepted.json()["status"] == "accepted"
    assert "edited" not in accepted.json()
    edited = client.patch(url + dredger["id"], json={"status": "accepted", "question": "Which dredger was hired?",
                                                     "answer": "The Orla Maye"}).json()
    assert (edited["question"], edited["answer"], edited["edited"]) == ("Which dredger was hired?", "The Orla Maye",
                                                                       True)
    assert client.patch(url + market["id"], json={"status": "rejected"}).status_code == 200
    stored = {p["id"]: p for p in read_pairs(tmp_path / "qa" / "harbour.jsonl")}
    assert [stored[p["id"]]["status"] for p in (coxswain, dredger, market)] == ["accepted", "accepted", "rejected"]
    assert stored[dredger["id"]]["question"] == "Which dredger was hired?"
    assert stored[dredger["id"]]["evidence_spans"] == dredger["evidence_spans"]  # the rest of the pair is kept
    assert client.get("/v1/collections/harbour/qa-pairs").json()["counts"] == {"pending": 3, "accepted": 2,
                                                                              "rejected": 1}
    assert client.patch(url + market["id"], json={"status": "pending"}).json()["status"] == "pending"

    assert client.patch(url + market["id"], json={"status": "maybe"}).status_code == 422
    assert client.patch(url + market["id"], json={"status": "accepted", "question": ""}).status_code == 422
    assert client.patch(url + market["id"], json={"status": "accepted", "answer": "   "}).status_code == 400
    missing = client.patch(url + "0123456789ab", json={"status": "accepted"})
    assert missing.status_code == 404 and "0123456789ab" in missing.json()["error"]["message"]
    assert client.get("/v1/collections/nope/qa-pairs").status_code == 404


def test_no_review_while_a_question_job_writes_into_the_file(tmp_path):
    release = threading.Event()

    def held(request: Request) -> str:
        release.wait(10)
        return respond_qa_and_read(request)

    client = make_client(Settings(home=str(tmp_path)), generator=scripted(held))
    index_text(client, "harbour", "report.md", REPORT)
    (tmp_path / "qa").mkdir()
    write_pairs(tmp_path / "qa" / "harbour.jsonl", [{"id": "a1", "question": "Q?", "answer": "A", "status": "pending",
                                                     "source": "report.md", "doc_id": "d", "start": 0, "end": 1}])
    job = client.post("/v1/collections/harbour/qa-jobs", json={}).json()
    assert client.get("/v1/collections/harbour/qa-pairs").json()["generating"] == job["id"]
    refused = client.patch("/v1/collections/harbour/qa-pairs/a1", json={"status": "accepted"})
    assert refused.status_code == 409 and job["id"] in refused.json()["error"]["message"]
    release.set()
    wait_for(lambda: client.get(f"/v1/qa-jobs/{job['id']}").json()["status"] == "done")
    assert client.patch("/v1/collections/harbour/qa-pairs/a1", json={"status": "accepted"}).status_code == 200


def test_an_evaluation_job_scores_each_reading_on_the_accepted_pairs(client):
    pairs = generated(client)
    refused = client.post("/v1/collections/harbour/eval-jobs", json={"patterns": ["rag"]})
    assert refused.status_code == 400 and "no accepted QA pairs" in refused.json()["error"]["message"]
    accepted = [by_question(pairs, q) for q in SINGLE.values()]
    accepted += [next(p for p in pairs if p["kind"] == kind) for kind in ("unanswerable", "join")]
    for pair in accepted:
        client.patch(f"/v1/collections/harbour/qa-pairs/{pair['id']}", json={"status": "accepted"})
    unknown = client.post("/v1/collections/harbour/eval-jobs", json={"patterns": ["rag", "nope"]})
    assert unknown.status_code == 400 and "nope" in unknown.json()["error"]["message"]

    reply = client.post("/v1/collections/harbour/eval-jobs", json={"patterns": ["rag", "auto", "rag"]})
    assert reply.status_code == 202, reply.text
    job = reply.json()
    assert reply.headers["location"] == f"/v1/eval-jobs/{job['id']}"
    assert job["patterns"] == ["rag", "auto"] and job["pairs"] == 5 and job["answers_total"] == 10
    done = wait_for(lambda: (j := client.get(f"/v1/eval-jobs/{job['id']}").json())["status"] == "done" and j,
                    timeout=60)
    assert done["answers_done"] == 10
    for reading in done["readings"]:
        # the three single facts answered right, the unanswerable one abstained on, the join missed
        assert reading["status"] == "done" and reading["n"] == 5
        assert reading["f1"]["mean"] == pytest.approx(0.8) and reading["contains"]["mean"] == pytest.approx(0.8)
        assert reading["f1"]["low"] < 0.8 < reading["f1"]["high"]
        assert reading["seconds_per_answer"] > 0
        scored = {a["question"]: a for a in reading["answers"]}
        assert scored[SINGLE["Tomas Brey"]]["answer"] == "Tomas Brey" and scored[SINGLE["Tomas Brey"]]["f1"] == 1.0
        assert {a["pair"] for a in reading["answers"]} == {p["id"] for p in accepted}
    auto = done["readings"][1]
    assert {a["route"] for a in auto["answers"]} <= {"rag", "wim"}
    assert done["readings"][0]["answers"][0]["route"] is None
    # a recommendation per kind of question: rag and auto score alike on each, so the cheaper is named
    recommended = {r["kind"]: r for r in done["recommendations"]}
    assert set(recommended) == {"single", "unanswerable", "join"}
    for kind, r in recommended.items():
        assert r["reading"] in ("rag", "auto") and r["text"].startswith(f"{kind}: read with {r['reading']} (")
    assert "rag 1.00" in recommended["single"]["text"] and "(3 items)" in recommended["single"]["text"]
    listed = client.get("/v1/eval-jobs").json()
    assert [j["id"] for j in listed] == [job["id"]] and "answers" not in listed[0]["readings"][0]
    assert client.get("/v1/eval-jobs/nope").status_code == 404


def test_the_recommendation_names_the_cheapest_reading_within_the_best_ones_interval():
    def reading(pattern, right, seconds):
        return {"pattern": pattern, "answers": [{"pair": f"p{i}", "kind": "single", "contains": float(i < right),
                                                 "seconds": seconds} for i in range(20)]}

    # wim is right far more often: nothing cheaper is within its interval
    found = recommendations([reading("rag", 4, 1.0), reading("wim", 18, 9.0)])
    assert [(r["kind"], r["best"], r["reading"]) for r in found] == [("single", "wim", "wim")]
    # one item apart: rag is within wim's interval, and nine times cheaper
    found = recommendations([reading("rag", 17, 1.0), reading("wim", 18, 9.0)])
    assert [(r["best"], r["reading"]) for r in found] == [("wim", "rag")]
    assert found[0]["text"].startswith("single: read with rag (within wim's interval (-0.05 [")
    assert recommendations([{"pattern": "rag", "answers": []}]) == []
