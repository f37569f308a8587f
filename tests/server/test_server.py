"""The HTTP service's core: asking a pasted text (JSON and server-sent events), validation, errors, the key,
CORS, per-request state and the bounded queue. The model is the scripted fake; the app runs in process."""

from __future__ import annotations

import threading

import pytest

from marginalia import AutoOptions, LcOptions, RagOptions, WimOptions
from marginalia.options import ROUTE_TOKENS
from marginalia.records import ANSWER_SCHEMA
from marginalia.server import Settings
from server_support import ANSWER, FACT, MARGIN, QUESTION, REPORT, make_client, parse_sse, respond, scripted, wait_for
from wim_requests import is_margin


def ask(client, **body):
    return client.post("/v1/ask", json={"question": QUESTION, "text": REPORT, **body})


def test_health_needs_no_key_and_names_the_model_only_with_it():
    client = make_client(Settings(api_key="sesame"))
    reply = client.get("/v1/health")
    assert reply.status_code == 200 and reply.json() == {"status": "ok"}  # nothing for a stranger
    assert client.get("/v1/health", headers={"Authorization": "Bearer wrong"}).json() == {"status": "ok"}
    reply = client.get("/v1/health", headers={"Authorization": "Bearer sesame"})
    data = reply.json()
    assert data["status"] == "ok" and data["model"] == "scripted"
    assert data["queue"] == {"running": 0, "waiting": 0, "queue_size": Settings().queue_size,
                             "parallel": 1}


def test_ask_a_text_answers_with_references_in_sections():
    client = make_client()
    reply = ask(client, reading={"pattern": "wim", "segment_tokens": 24})
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["text"] == ANSWER and data["pattern"] == "wim" and data["schema"] == ANSWER_SCHEMA
    assert data["segments_total"] > 3 and data["segments_read"] == data["segments_total"]
    kept = [m for m in data["margins"] if m["relevant"]]
    assert [m["text"] for m in kept] == [MARGIN]
    (ref,) = data["references"]
    assert ref["source"] == "text" and ref["section_path"] == ["Harbour report", "Ferries"]
    assert REPORT[ref["start"]:ref["end"]] == ref["text"] == FACT


def test_stream_sends_one_event_per_step_and_the_same_answer_as_json():
    client = make_client()
    body = {"reading": {"pattern": "wim", "segment_tokens": 24}}
    whole = ask(client, **body).json()
    reply = ask(client, stream=True, **body)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(reply.text)
    kinds = [k for k, _ in events]
    assert kinds[0] == "started" and kinds[-1] == "done"
    n = events[0][1]["segments_total"]
    assert kinds.count("segment_read") == kinds.count("margin_written") == kinds.count("margin_judged") == n
    assert kinds.index("answer_delta") > max(i for i, k in enumerate(kinds) if k == "margin_judged")
    done = events[-1][1]
    assert "".join(d["text"] for k, d in events if k == "answer_delta").strip() == done["text"]
    # the references travel once, in done; what differs between the two runs is only timing
    assert all(FACT not in str(d) for k, d in events[:-1])
    for key in ("text", "references", "margins", "segments_read", "pattern"):
        assert done[key] == whole[key]


@pytest.mark.parametrize("pattern", ["lc", pytest.param("rag", marks=pytest.mark.slow)])  # rag loads MiniLM
def test_other_patterns_read_a_text(pattern):
    client = make_client()
    reply = ask(client, reading={"pattern": pattern})
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["pattern"] == pattern and data["text"] == ANSWER
    if pattern == "rag":
        assert any(FACT in r["text"] for r in data["references"])


def test_a_text_that_names_no_pattern_is_read_by_its_size():
    client = make_client(Settings(embedder="hashing"))  # auto's RAG reading embeds the text's chunks
    weather = "\n\n".join(f"Paragraph {i}: the weather in Ostervik stayed mild, with light rain."
                          for i in range(160))
    assert client.app.state.service.generator.tokenizer.count(REPORT) <= ROUTE_TOKENS
    assert client.app.state.service.generator.tokenizer.count(REPORT + weather) > ROUTE_TOKENS
    short = ask(client, reading={"segment_tokens": 24}).json()  # a short text: WiM, with the values given
    assert short["pattern"] == "wim" and short["route"] is None and short["segments_total"] > 3
    long = ask(client, text=REPORT + weather).json()
    assert long["pattern"] == "auto" and long["route"]["taken"] == "rag" and long["text"] == ANSWER
    assert long["margins"] == [] and any(FACT in r["text"] for r in long["references"])
    # a pattern named is read as named, whatever the size
    named = ask(client, reading={"pattern": "auto"}).json()
    assert named["pattern"] == "auto" and named["route"]["taken"] == "rag"


def test_the_body_reuses_the_records_defaults():
    from marginalia.server.schemas import AskRequest, DefaultReading, record

    body = AskRequest(question="q", text="t")
    assert isinstance(body.reading, DefaultReading) and body.by_size  # no pattern named: the route by size
    assert record(body.reading) == AutoOptions()
    schemas = AskRequest.model_json_schema()["$defs"]
    for reading, options in [("AutoReading", AutoOptions), ("WimReading", WimOptions), ("RagReading", RagOptions),
                             ("LcReading", LcOptions), ("DefaultReading", AutoOptions)]:
        schema = schemas[reading]["properties"]
        assert set(schema) == {"pattern", *options.model_fields}, reading
        for name, info in options.model_fields.items():
            assert schema[name]["default"] == info.default, (reading, name)
            assert schema[name]["description"] == info.description, (reading, name)


@pytest.mark.parametrize(("body", "field"), [
    ({"reading": {"pattern": "lc", "segment_tokens": 5}}, "reading.segment_tokens"),
    ({"reading": {"pattern": "wim", "segment_tokens": 0}}, "reading.segment_tokens"),
    ({"reading": {"pattern": "wim", "judge": "vibes"}}, "reading.judge"),
    ({"reading": {"pattern": "memory"}}, "reading"),
    ({"collection_options": {"certain": 0.2, "uncertain": 0.5}}, "collection_options"),
    ({"question": ""}, "question"),
    ({"question": "   "}, "question"),
    ({"colour": "blue"}, "colour"),
    # options no longer offered are refused as any unknown field is
    ({"reading": {"pattern": "wim", "tally_lists": False}}, "reading.tally_lists"),
    ({"reading": {"pattern": "wim", "kept_as": "sentence"}}, "reading.kept_as"),
    ({"reading": {"pattern": "wim", "margin_decoding": "copy"}}, "reading.margin_decoding"),
    ({"reading": {"pattern": "wim", "margin_style": "extract"}}, "reading.margin_style"),
    ({"reading": {"pattern": "wim", "instructions": "margin"}}, "reading.instructions"),
    ({"reading": {"pattern": "wim", "judge": "fused"}}, "reading.judge"),
    ({"reading": {"pattern": "wim", "judge": "combined"}}, "reading.judge"),
    ({"reading": {"pattern": "lc", "answer_style": "short"}}, "reading.answer_style"),
    ({"reading": {"pattern": "lc", "answer_decoding": "distinct"}}, "reading.answer_decoding"),
    ({"reading": {"pattern": "rag", "split": "tokens"}}, "reading.split"),
])
def test_validation_errors_are_422_naming_the_field(body, field):
    reply = ask(make_client(), **body)
    assert reply.status_code == 422
    error = reply.json()["error"]
    assert error["code"] == "validation_error"
    assert field in [f["field"] for f in error["fields"]]
    assert error["message"].startswith(field)


def test_text_and_collection_together_are_refused():
    reply = make_client().post("/v1/ask", json={"question": "q", "text": "t", "collection": "c"})
    assert reply.status_code == 422 and "either 'text' or 'collection'" in reply.json()["error"]["message"]


def test_overflow_is_400_with_both_numbers_and_what_to_do():
    client = make_client(generator=scripted(context_window=300))
    reply = ask(client, text="word " * 2000, reading={"pattern": "lc"})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["code"] == "context_overflow" and error["window_tokens"] == 300 and error["needed_tokens"] > 300
    assert '"pattern": "rag"' in error["message"]


def test_unknown_collection_is_404_naming_it():
    reply = make_client().post("/v1/ask", json={"question": QUESTION, "collection": "nowhere"})
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "not_found" and "'nowhere'" in reply.json()["error"]["message"]


def test_unknown_route_is_json_404():
    reply = make_client().get("/v1/nothing")
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found"


def failing_after(margins: int):
    """A responder that writes ``margins`` margins, then fails as an unexpected bug would."""
    seen = []

    def fail(req):
        if is_margin(req):
            seen.append(req)
            if len(seen) > margins:
                raise RuntimeError("secret internal detail /srv/model.py line 12")
        return respond(req)

    return fail


def test_an_unexpected_failure_is_500_without_a_traceback_and_keeps_the_margins():
    client = make_client(generator=scripted(failing_after(2)))
    reply = ask(client, reading={"pattern": "wim", "segment_tokens": 24})
    assert reply.status_code == 500
    body = reply.text
    assert "Traceback" not in body and "secret" not in body and "model.py" not in body
    error = reply.json()["error"]
    assert error["code"] == "internal_error" and len(error["margins"]) == 2


def test_a_failure_mid_stream_is_an_error_event_with_the_margins_so_far():
    client = make_client(generator=scripted(failing_after(2)))
    reply = ask(client, stream=True, reading={"pattern": "wim", "segment_tokens": 24})
    assert reply.status_code == 200  # the stream had started
    events = parse_sse(reply.text)
    kind, data = events[-1]
    assert kind == "error" and data["error"]["code"] == "internal_error"
    assert len(data["error"]["margins"]) == 2 and "secret" not in reply.text
    assert "done" not in [k for k, _ in events]


def test_a_failure_before_the_first_event_keeps_its_status_when_streaming():
    client = make_client(generator=scripted(context_window=300))
    reply = ask(client, stream=True, text="word " * 2000, reading={"pattern": "lc"})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "context_overflow"


def test_the_key_is_checked_on_every_route_but_health():
    client = make_client(Settings(api_key="sesame"))
    routes = [("get", "/v1/collections"), ("post", "/v1/ask"), ("get", "/v1/models"), ("post", "/chat"),
              ("post", "/v1/sessions"), ("get", "/v1/jobs"), ("post", "/v1/chat/completions")]
    for method, path in routes:
        reply = getattr(client, method)(path)
        assert reply.status_code == 401, path
        assert reply.json()["error"]["code"] == "unauthorized" and reply.headers["www-authenticate"] == "Bearer"
    wrong = client.get("/v1/collections", headers={"Authorization": "Bearer open-up"})
    assert wrong.status_code == 401
    right = client.get("/v1/collections", headers={"Authorization": "Bearer sesame"})
    assert right.status_code == 200 and right.json() == []
    assert client.get("/v1/health").status_code == 200


def test_cors_is_off_unless_an_origin_is_given():
    origin = {"Origin": "https://notes.example"}
    plain = make_client().get("/v1/collections", headers=origin)
    assert "access-control-allow-origin" not in plain.headers
    opened = make_client(Settings(cors_origins=("https://notes.example",)))
    assert opened.get("/v1/collections", headers=origin).headers["access-control-allow-origin"] == origin["Origin"]
    other = opened.get("/v1/collections", headers={"Origin": "https://elsewhere.example"})
    assert "access-control-allow-origin" not in other.headers


def test_a_body_over_the_limit_is_413():
    client = make_client(Settings(max_upload_bytes=1000))
    reply = ask(client, text="word " * 400_000)  # 2 MB, over the limit plus the multipart slack
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "too_large"


def test_each_request_has_its_own_options_and_temperature():
    gen = scripted()
    client = make_client(generator=gen)
    ask(client, temperature=0.7, reading={"pattern": "lc", "max_new_tokens": 7})
    first = gen.requests[-1].params
    ask(client, reading={"pattern": "lc"})
    second = gen.requests[-1].params
    assert (first.temperature, first.max_new_tokens) == (0.7, 7)
    assert (second.temperature, second.max_new_tokens) == (0.0, WimOptions().max_new_tokens)
    # wim: the answer at the request's temperature, its margins greedy; the next request greedy again
    wim = {"pattern": "wim", "segment_tokens": 24}
    ask(client, temperature=0.9, reading=wim)
    warm = [r.params for r in gen.requests if not is_margin(r)][-1]
    ask(client, reading=wim)
    again = [r.params for r in gen.requests if not is_margin(r)][-1]
    assert warm.temperature == 0.9 and again.temperature == 0.0
    assert not any(r.params.temperature for r in gen.requests if is_margin(r))


def test_a_full_queue_answers_429_with_retry_after():
    release = threading.Event()
    entered = threading.Event()

    def slow(req):
        entered.set()
        release.wait(10)
        return ANSWER

    client = make_client(Settings(queue_size=0), generator=scripted(slow))
    results = {}
    first = threading.Thread(target=lambda: results.setdefault("first", ask(client, reading={"pattern": "lc"})))
    first.start()
    try:
        assert entered.wait(10)
        busy = ask(client, reading={"pattern": "lc"})
        assert busy.status_code == 429 and busy.json()["error"]["code"] == "busy"
        assert int(busy.headers["retry-after"]) >= 1
        assert client.get("/v1/health").json()["queue"]["running"] == 1
    finally:
        release.set()
        first.join(10)
    assert results["first"].status_code == 200
    wait_for(lambda: client.get("/v1/health").json()["queue"]["running"] == 0)
    assert ask(client, reading={"pattern": "lc"}).status_code == 200


def test_root_is_the_page_that_links_the_api():
    reply = make_client().get("/")
    assert reply.status_code == 200 and 'href="/docs"' in reply.text
    assert make_client().get("/openapi.json").json()["info"]["title"] == "marginalia"


def test_a_streamed_body_over_the_limit_is_413_as_it_is_read():
    client = make_client(Settings(max_upload_bytes=1000))

    def chunks():  # no Content-Length: the limit is found while reading
        yield b'{"question": "q", "text": "'
        for _ in range(100):
            yield b"word " * 10_000
        yield b'"}'

    reply = client.post("/v1/ask", content=chunks(), headers={"content-type": "application/json"})
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "too_large"


def test_a_body_that_is_not_json_is_422_saying_so():
    reply = make_client().post("/v1/ask", content=b'{"question": ', headers={"content-type": "application/json"})
    assert reply.status_code == 422
    assert reply.json()["error"]["message"].startswith("body: not valid JSON")
