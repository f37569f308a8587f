"""Whatever a client sends, the service answers with a status below 500 and, for an error, the one JSON
shape; and a reading that is refused leaves the model free for the next request (hypothesis)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fuzz_support import ask_bodies as bodies
from fuzz_support import post_json, readings, scalars, values
from server_support import QUESTION, REPORT, make_client

pytest.importorskip("lancedb")


@pytest.fixture(scope="module")
def client():
    from server_support import index_text

    client = make_client()
    index_text(client, "docs", "report.md", REPORT)
    return client


def check(reply) -> None:
    event(f"status {reply.status_code}")
    assert reply.status_code < 500, reply.text
    if reply.status_code >= 400:
        error = reply.json()["error"]
        assert isinstance(error["code"], str) and isinstance(error["message"], str) and error["message"]
    elif reply.headers["content-type"].startswith("application/json"):
        data = reply.json()
        assert isinstance(data.get("answer", data.get("choices")), str | list)
    else:
        assert any(end in reply.text for end in ("event: done", "event: error", "data: [DONE]"))


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=bodies)
def test_any_ask_body_is_answered_or_refused_cleanly(client, body):
    check(post_json(client, "/v1/ask", body))


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=st.fixed_dictionaries(
    {"message": st.sampled_from([QUESTION, "", "zebra?"]) | scalars},
    optional={"temperature": st.floats(0, 2) | scalars, "certainty_threshold": st.floats(-1, 1) | scalars,
              "uncertainty_threshold": st.floats(-1, 1), "collection": st.just("nowhere") | scalars,
              "openai_model": scalars}))
def test_any_docqa_body_is_answered_or_refused_cleanly(client, body):
    check(post_json(client, "/chat", {"collection": "docs", **body}))


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=st.fixed_dictionaries(
    {"model": st.sampled_from(["marginalia:docs", "marginalia:", "gpt"]) | scalars,
     "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "tool"]),
                                                 "content": st.sampled_from([QUESTION, ""]) | scalars}),
                          max_size=3) | values},
    optional={"stream": st.booleans() | scalars, "n": scalars, "max_tokens": st.integers(-1, 50) | scalars,
              "temperature": scalars, "marginalia": st.fixed_dictionaries({"reading": readings}) | values}))
def test_any_chat_completion_body_is_answered_or_refused_cleanly(client, body):
    check(post_json(client, "/v1/chat/completions", body))


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(raw=st.binary(max_size=200))
def test_any_bytes_as_a_body_are_refused_cleanly(client, raw):
    reply = client.post("/v1/ask", content=raw, headers={"content-type": "application/json"})
    assert reply.status_code < 500
    if reply.status_code >= 400:
        assert json.loads(reply.text)["error"]["code"]


@pytest.mark.parametrize(("route", "body", "where"), [
    ("/v1/ask", '{"question": "q?", "text": "a \\ud800 b"}', "text, at character 2"),
    ("/v1/ask", '{"question": "q?", "text": "x", "reading": {"pattern": "lc", "\\udc00": 1}}',
     "a field name in reading"),
    ("/v1/sessions", '{"text": "\\udfff"}', "text, at character 0"),
    ("/v1/collections", '{"name": "docs\\ud800"}', "name"),
    ("/v1/chat/completions", '{"model": "marginalia:docs", "messages": [{"role": "user", "content": '
                             '[{"type": "text", "text": "\\ud83d"}]}]}', "messages.0.content.0.text"),
    ("/chat", '{"message": "q?", "openai_model": "\\ud800"}', "openai_model"),
])
def test_a_lone_surrogate_is_refused_as_invalid_unicode(client, route, body, where):
    # JSON's \ud800 escapes decode to strings UTF-8 cannot encode: a pasted text with one was a 500
    reply = client.post(route, content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert error["code"] == "validation_error" and "not valid Unicode" in error["message"]
    assert where in error["message"]


def test_a_surrogate_pair_is_valid_unicode(client):
    body = '{"question": "Which pier? \\ud83d\\ude00", "text": "pier 47 \\ud83d\\ude00", "reading": {"pattern": "lc"}}'
    reply = client.post("/v1/ask", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("name", ["a" * 300, "a" * 5000, ".hidden", "a b", "é"])
def test_a_name_no_collection_may_have_is_not_found(client, name):
    # a long one made the file system refuse the path: an unhandled OSError, a 500
    for method, url, body in [("GET", f"/v1/collections/{name}", None),
                              ("DELETE", f"/v1/collections/{name}", None),
                              ("GET", f"/v1/collections/{name}/documents/report.md", None),
                              ("POST", "/v1/ask", {"question": "q?", "collection": name}),
                              ("POST", "/v1/sessions", {"collection": name})]:
        reply = client.request(method, url, json=body)
        assert reply.status_code == 404, (method, url, reply.text)
        assert reply.json()["error"]["code"] == "not_found"
