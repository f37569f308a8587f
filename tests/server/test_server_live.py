"""The service under uvicorn on 127.0.0.1 and a free port: the official openai client (streaming and not),
and clients that go away (their reading stops within a segment and the model is free again)."""

from __future__ import annotations

import threading

import httpx
import pytest

from marginalia.models.fake import ScriptedGenerator
from marginalia.server import Settings, create_app
from server_support import (
    ANSWER,
    BASE_URL,
    FACT,
    QUESTION,
    REPORT,
    Slow,
    index_text,
    live_server,
    make_client,
    respond,
    wait_for,
)

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytest.importorskip("lancedb")


@pytest.fixture
def served():
    """A live server over a scripted model, with the report indexed in collection 'docs'."""
    from marginalia.index.embedders import HashingEmbedder

    app = create_app(Settings(api_key="sesame"), generator=ScriptedGenerator(respond=respond),
                     embedder=HashingEmbedder())
    with live_server(app) as url:
        with httpx.Client(base_url=url, headers={"Authorization": "Bearer sesame"}) as http:
            index_text(http, "docs", "report.md", REPORT)
        yield url


def test_the_openai_client_lists_collections_as_models(served):
    client = openai.OpenAI(base_url=f"{served}/v1", api_key="sesame")
    assert [m.id for m in client.models.list()] == ["marginalia:docs"]


def test_the_openai_client_gets_an_answer_and_its_references(served):
    client = openai.OpenAI(base_url=f"{served}/v1", api_key="sesame")
    reply = client.chat.completions.create(model="marginalia:docs", temperature=0,
                                           messages=[{"role": "system", "content": "Be brief."},
                                                     {"role": "user", "content": QUESTION}])
    assert reply.choices[0].message.content == ANSWER and reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens > 0
    references = reply.model_extra["marginalia"]["answer"]["references"]
    assert any(FACT in r["text"] and r["source"] == "report.md" for r in references)


def test_the_openai_client_streams_with_the_answer_once_at_the_end(served):
    client = openai.OpenAI(base_url=f"{served}/v1", api_key="sesame")
    chunks = list(client.chat.completions.create(
        model="marginalia:docs", messages=[{"role": "user", "content": QUESTION}], stream=True,
        stream_options={"include_usage": True}, extra_body={"marginalia": {"reading": {"pattern": "rag"}}}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER
    with_answer = [c for c in chunks if "answer" in (c.model_extra or {}).get("marginalia", {})]
    assert with_answer == [chunks[-1]] and chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].model_extra["marginalia"]["answer"]["references"]
    assert chunks[-1].usage.total_tokens > 0


def test_the_openai_client_sees_our_errors(served):
    client = openai.OpenAI(base_url=f"{served}/v1", api_key="sesame", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="marginalia:<collection>"):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError, match="nowhere"):
        client.chat.completions.create(model="marginalia:nowhere", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{served}/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model="marginalia:docs", messages=[{"role": "user", "content": "q"}], n=2)


def test_the_openai_client_through_an_in_process_transport():
    client = make_client()
    index_text(client, "docs", "report.md", REPORT)
    oa = openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key="none", http_client=client)
    reply = oa.chat.completions.create(model="marginalia:docs", messages=[{"role": "user", "content": QUESTION}])
    assert reply.choices[0].message.content == ANSWER
    streamed = oa.chat.completions.create(model="marginalia:docs", stream=True,
                                          messages=[{"role": "user", "content": QUESTION}])
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == ANSWER



def test_the_openai_route_reads_with_auto_and_says_which_reading_answered():
    from marginalia.server.schemas import ChatCompletionRequest, DefaultReading

    assert isinstance(ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "q"}]).marginalia.reading,
                      DefaultReading)
    client = make_client()
    index_text(client, "docs", "report.md", REPORT)
    oa = openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key="none", http_client=client)
    messages = [{"role": "user", "content": QUESTION}]
    reply = oa.chat.completions.create(model="marginalia:docs", messages=messages)
    assert reply.choices[0].message.content == ANSWER
    answer = reply.model_extra["marginalia"]["answer"]
    route = answer["route"]
    assert answer["text"] == ANSWER and answer["pattern"] == "auto"
    assert route["taken"] == "rag" and "stands on the retrieved passages" in route["reason"]
    chunks = list(oa.chat.completions.create(model="marginalia:docs", stream=True, messages=messages))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER
    assert chunks[-1].model_extra["marginalia"]["answer"]["route"] == route
    named = oa.chat.completions.create(model="marginalia:docs", messages=messages,
                                       extra_body={"marginalia": {"reading": {"pattern": "lc"}}})
    assert named.model_extra["marginalia"]["answer"]["route"] is None  # a pattern named reads as named


def test_an_openai_reading_has_an_id_and_can_be_stopped():
    from marginalia.index.embedders import HashingEmbedder

    slow = Slow(0.05)
    app = create_app(Settings(), generator=ScriptedGenerator(respond=slow), embedder=HashingEmbedder())
    with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        index_text(http, "docs", "report.md", REPORT + "\n\n" + LONG[:500])
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        options = {"marginalia": {"reading": {"pattern": "wim", "segment_tokens": 16},
                                  "collection_options": {"scope": "documents"}}}
        whole = client.chat.completions.with_raw_response.create(
            model="marginalia:docs", messages=[{"role": "user", "content": QUESTION}], extra_body=options)
        reply = whole.parse()
        assert reply.model_extra["marginalia"]["reading_id"] == whole.headers["marginalia-reading-id"]
        assert reply.choices[0].message.content == ANSWER
        full_margins = slow.margins
        assert full_margins >= 10, full_margins

        slow.margins = 0
        stream = client.chat.completions.create(model="marginalia:docs", stream=True, extra_body=options,
                                                messages=[{"role": "user", "content": QUESTION}])
        first = next(iter(stream))
        reading = first.model_extra["marginalia"]["reading_id"]
        assert reading != reply.model_extra["marginalia"]["reading_id"]
        wait_for(lambda: slow.margins >= 2)
        stopped = http.post(f"/v1/readings/{reading}/stop")
        assert stopped.status_code == 200 and stopped.json() == {"stopping": reading}
        rest = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in rest if c.choices) == ANSWER  # still answers
        assert rest[-1].choices[0].finish_reason == "stop"
        assert 2 <= slow.margins <= 5 < full_margins, (slow.margins, full_margins)
        assert http.post(f"/v1/readings/{reading}/stop").status_code == 404  # over, and forgotten




LONG = "\n\n".join(f"Paragraph {i}: the weather in Ostervik stayed mild, with light rain." for i in range(60))


def slow_server(slow: Slow, **settings):
    return live_server(create_app(Settings(**settings), generator=ScriptedGenerator(respond=slow)))


def test_a_client_that_leaves_a_stream_stops_its_reading_within_a_segment():
    slow = Slow(0.15)
    with slow_server(slow) as url, httpx.Client(base_url=url, timeout=30) as http:
        body = {"question": QUESTION, "text": LONG, "stream": True, "reading": {"segment_tokens": 16}}
        with http.stream("POST", "/v1/ask", json=body) as reply:
            lines = reply.iter_lines()
            started = next(line for line in lines if line.startswith("data:"))
            assert "segments_total" in started
            while slow.margins < 2:
                next(lines)
        # the connection is closed: the reading stops after the margin in progress
        wait_for(lambda: http.get("/v1/health").json()["queue"]["running"] == 0, timeout=5)
        stopped_at = slow.margins
        assert stopped_at <= 4, stopped_at  # of 60 segments
        # the model is free: a reading after it on the model's one thread answers, and the stopped one wrote
        # no margin meanwhile
        reply = http.post("/v1/ask", json={"question": QUESTION, "text": REPORT, "reading": {"pattern": "lc"}})
        assert reply.status_code == 200 and slow.margins == stopped_at


def test_a_client_that_leaves_a_json_request_frees_the_model():
    slow = Slow(0.15)
    with slow_server(slow) as url:
        body = {"question": QUESTION, "text": LONG, "reading": {"segment_tokens": 16}}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/ask", json=body, timeout=0.6)
        with httpx.Client(base_url=url, timeout=30) as http:
            wait_for(lambda: http.get("/v1/health").json()["queue"]["running"] == 0, timeout=5)
            assert slow.margins <= 8, slow.margins


def test_a_queued_request_whose_client_left_never_reads():
    slow = Slow(0.3)
    with slow_server(slow, queue_size=2) as url, httpx.Client(base_url=url, timeout=30) as http:
        first = threading.Thread(target=lambda: http.post("/v1/ask", json={
            "question": QUESTION, "text": REPORT, "reading": {"segment_tokens": 24}}))
        first.start()
        wait_for(lambda: slow.margins >= 1)
        with pytest.raises(httpx.ReadTimeout):  # waits behind the first, then gives up
            httpx.post(f"{url}/v1/ask", json={"question": QUESTION, "text": LONG, "reading": {"segment_tokens": 16}},
                       timeout=0.3)
        first.join(30)
        wait_for(lambda: http.get("/v1/health").json()["queue"] == {"running": 0, "waiting": 0, "queue_size": 2,
                                                                   "parallel": 1})
        assert slow.margins < 10  # the first one's margins only: the long text was never read
