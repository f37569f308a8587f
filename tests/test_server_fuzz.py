"""Whatever a client sends, the service answers with a status below 500 and, for an error, the one JSON
shape; and a reading that is refused leaves the model free for the next request (hypothesis)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from marginalia.cli.common import _field_type
from marginalia.options import PATTERN_OPTIONS, PATTERNS, CollectionOptions
from server_support import QUESTION, REPORT, make_client

pytest.importorskip("lancedb")

scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 10_000),
                    st.floats(allow_nan=False, allow_infinity=False, width=32), st.text(max_size=30))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=10), inner, max_size=3), max_leaves=6)
def field_values(info) -> st.SearchStrategy:
    """Values of an options field's type, within the usual bounds (the wild bodies try the rest)."""
    kind, choices = _field_type(info.annotation)
    if choices is not None:
        return st.sampled_from(choices)
    if kind is bool:
        return st.booleans()
    if kind is int:
        return st.integers(1, 600)
    return st.floats(0.0, 1.0)


def record_dicts(cls) -> st.SearchStrategy:
    return st.fixed_dictionaries({}, optional={name: field_values(info) for name, info in cls.model_fields.items()})


readings = st.sampled_from(PATTERNS).flatmap(
    lambda p: record_dicts(PATTERN_OPTIONS[p]).map(lambda d, p=p: {"pattern": p, **d}))
sources = st.sampled_from([{"text": REPORT}, {"collection": "docs"}, {"collection": "docs", "document": "report.md"},
                           {"text": REPORT}, {"collection": "docs"}, {"collection": "docs", "document": "other.md"},
                           {"collection": "nowhere"}])
near_valid = st.builds(
    lambda source, question, reading, more: {"question": question, **source, "reading": reading, **more},
    sources, st.sampled_from([QUESTION, "What dredger was hired?", "zebra?"]), readings,
    st.fixed_dictionaries({}, optional={"collection_options": record_dicts(CollectionOptions),
                                        "stream": st.booleans(), "temperature": st.floats(0, 2)}))
wild = st.fixed_dictionaries({}, optional={
    "question": st.sampled_from([QUESTION, "", "  ", "?"]) | scalars,
    "text": st.sampled_from([REPORT, "", "x"]) | scalars,
    "collection": st.sampled_from(["docs", "nowhere", "../x", ""]) | scalars,
    "document": st.sampled_from(["report.md", "other"]) | scalars, "reading": readings | values,
    "collection_options": values, "stream": st.booleans() | scalars, "temperature": st.floats(-1, 3) | scalars,
    "extra": values})
bodies = st.one_of(near_valid, near_valid, near_valid, wild)  # three in four near valid


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
    check(client.post("/v1/ask", json=body))


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=st.fixed_dictionaries(
    {"message": st.sampled_from([QUESTION, "", "zebra?"]) | scalars},
    optional={"temperature": st.floats(0, 2) | scalars, "certainty_threshold": st.floats(-1, 1) | scalars,
              "uncertainty_threshold": st.floats(-1, 1), "collection": st.just("nowhere") | scalars,
              "openai_model": scalars}))
def test_any_docqa_body_is_answered_or_refused_cleanly(client, body):
    check(client.post("/chat", json={"collection": "docs", **body}))


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=st.fixed_dictionaries(
    {"model": st.sampled_from(["marginalia:docs", "marginalia:", "gpt"]) | scalars,
     "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "tool"]),
                                                 "content": st.sampled_from([QUESTION, ""]) | scalars}),
                          max_size=3) | values},
    optional={"stream": st.booleans() | scalars, "n": scalars, "max_tokens": st.integers(-1, 50) | scalars,
              "temperature": scalars, "marginalia": st.fixed_dictionaries({"reading": readings}) | values}))
def test_any_chat_completion_body_is_answered_or_refused_cleanly(client, body):
    check(client.post("/v1/chat/completions", json=body))


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(raw=st.binary(max_size=200))
def test_any_bytes_as_a_body_are_refused_cleanly(client, raw):
    reply = client.post("/v1/ask", content=raw, headers={"content-type": "application/json"})
    assert reply.status_code < 500
    if reply.status_code >= 400:
        assert json.loads(reply.text)["error"]["code"]
