"""What the web page needs from the API: a document's text (references' spans index it), and stopping a
streamed reading that still answers, from what it has read."""

from __future__ import annotations

import json

import httpx
import pytest

from marginalia.models.fake import ScriptedGenerator
from marginalia.server import Settings, create_app
from server_support import ANSWER, FACT, QUESTION, REPORT, Slow, index_text, live_server, make_client

pytest.importorskip("lancedb")

def test_a_document_comes_with_its_text_pages_and_sections():
    client = make_client()
    job = index_text(client, "docs", "report.md", REPORT)
    assert job["status"] == "done", job
    reply = client.get("/v1/collections/docs/documents/report.md")
    assert reply.status_code == 200, reply.text
    doc = reply.json()
    assert doc["source"] == "report.md" and doc["title"] == "Harbour report" and doc["page_starts"] == []
    assert doc["text"].strip() == REPORT.strip()
    assert [s["title"] for s in doc["sections"]["children"][0]["children"]] == ["Dredging", "Ferries", "Lifeboat"]
    assert client.get(f"/v1/collections/docs/documents/{doc['id']}").json()["text"] == doc["text"]  # by id too
    # a reference's span indexes that text exactly
    answer = client.post("/v1/ask", json={"question": QUESTION, "collection": "docs", "document": "report.md",
                                          "reading": {"pattern": "wim", "segment_tokens": 24}}).json()
    (ref,) = answer["references"]
    assert doc["text"][ref["start"]:ref["end"]] == ref["text"] == FACT


def test_an_unknown_document_is_404():
    client = make_client()
    index_text(client, "docs", "report.md", REPORT)
    reply = client.get("/v1/collections/docs/documents/nothing.md")
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found"
    assert client.get("/v1/collections/nowhere/documents/report.md").status_code == 404




LONG = "\n\n".join(f"Paragraph {i}: the weather in Ostervik stayed mild, with light rain." for i in range(40))


def read_events(lines):
    """(event, data line) pairs from an iterator of SSE lines."""
    event = None
    for line in lines:
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            yield event, line[5:].strip()


def test_a_stopped_reading_still_answers_from_what_it_read():
    slow = Slow(0.1)
    app = create_app(Settings(), generator=ScriptedGenerator(respond=slow))
    with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        body = {"question": QUESTION, "text": REPORT + "\n\n" + LONG, "stream": True,
                "reading": {"segment_tokens": 16}}
        with http.stream("POST", "/v1/ask", json=body) as reply:
            reading = reply.headers["marginalia-reading-id"]
            events = read_events(reply.iter_lines())
            kinds, done, total = [], None, 0
            for kind, data in events:
                kinds.append(kind)
                if kind == "started":
                    total = json.loads(data)["segments_total"]
                if kind == "margin_judged" and kinds.count(kind) == 2:
                    stopped = http.post(f"/v1/readings/{reading}/stop")
                    assert stopped.status_code == 200 and stopped.json() == {"stopping": reading}
                if kind == "done":
                    done = json.loads(data)
        assert done is not None and kinds[-1] == "done"
        assert done["stopped_early"] and done["text"] == ANSWER
        assert 2 <= done["segments_read"] <= 4 < total, (done["segments_read"], total)
        assert len(done["margins"]) == done["segments_read"] == kinds.count("margin_judged")
        assert "answer_delta" in kinds
        # it is over: its id is forgotten, and the model is free
        assert http.post(f"/v1/readings/{reading}/stop").status_code == 404
        assert http.get("/v1/health").json()["queue"]["running"] == 0


def test_stopping_an_unknown_reading_is_404():
    reply = make_client().post("/v1/readings/nothing/stop")
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found"


def test_stopping_needs_the_key():
    assert make_client(Settings(api_key="sesame")).post("/v1/readings/x/stop").status_code == 401
