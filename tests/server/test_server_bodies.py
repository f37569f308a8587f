"""Request bodies: strict about JSON types (a string is not a number nor a boolean, a whole number is a
number), while the options records stay as lenient as the CLI and config files need; and a body with very
many problems gets the first few and a count of the rest, at once."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from marginalia import WimOptions
from marginalia.app import pattern_options
from marginalia.options import CollectionOptions, ComposeOptions
from marginalia.server.errors import MAX_PROBLEMS
from marginalia.server.schemas import AskRequest
from server_support import REPORT, index_text, make_client

pytest.importorskip("lancedb")

ASK = {"question": "Which pier?", "text": REPORT}


def invalid(reply: Any, *fields: str) -> dict[str, Any]:
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert error["code"] == "validation_error"
    assert {f["field"] for f in error["fields"]} >= set(fields), error
    return dict(error)


@pytest.mark.parametrize(("body", "field", "kind"), [
    ({"stream": "yes"}, "stream", "a string"),
    ({"stream": "true"}, "stream", "a string"),
    ({"stream": 1}, "stream", "a number"),
    ({"temperature": "0.5"}, "temperature", "a string"),
    ({"reading": {"segment_tokens": "512"}}, "reading.segment_tokens", "a string"),
    ({"reading": {"segment_tokens": 512.0}}, "reading.segment_tokens", "512.0"),
    ({"reading": {"batch_margins": "false"}}, "reading.batch_margins", "a string"),
    ({"reading": {"pattern": "rag", "top_k": "4"}}, "reading.top_k", "a string"),
    ({"reading": {"pattern": "lc", "max_new_tokens": True}}, "reading.max_new_tokens", "true"),
    ({"reading": {"grounding_threshold": "0.5"}}, "reading.grounding_threshold", "a string"),
    ({"collection_options": {"hits": "5"}}, "collection_options.hits", "a string"),
    ({"collection_options": {"use_questions": 0}}, "collection_options.use_questions", "a number"),
    ({"question": 42}, "question", "a number"),
])
def test_a_value_of_the_wrong_json_type_is_refused_not_converted(body, field, kind):
    error = invalid(make_client().post("/v1/ask", json={**ASK, **body}), field)
    assert f"{field}: " in error["message"] and f"not {kind}" in error["message"], error


def test_a_whole_number_is_a_number():
    reply = make_client().post("/v1/ask", json={**ASK, "temperature": 0, "reading": {
        "pattern": "wim", "segment_tokens": 64, "grounding_threshold": 1, "topic_threshold": 0, "stop_at_score": 1}})
    assert reply.status_code == 200, reply.text
    assert make_client().post("/v1/ask", json={**ASK, "collection_options": {"certain": 1, "uncertain": 0}},
                              ).status_code != 422


def test_every_body_is_strict():
    client = make_client()
    index_text(client, "docs", "report.md", REPORT)
    session = client.post("/v1/sessions", json={"text": REPORT}).json()["id"]
    invalid(client.post(f"/v1/sessions/{session}/messages", json={"message": "q", "stream": "no"}), "stream")
    invalid(client.post("/v1/collections", json={"name": 5}), "name")
    invalid(client.post("/v1/chat/completions", json={
        "model": "marginalia:docs", "stream": "true", "messages": [{"role": "user", "content": "q"}]}), "stream")
    invalid(client.post("/v1/chat/completions", json={
        "model": "marginalia:docs", "messages": [{"role": "user", "content": "q"}],
        "marginalia": {"reading": {"pattern": "rag", "top_k": "2"}}}), "marginalia.reading.top_k")
    invalid(client.post("/chat", json={"message": "q", "collection": "docs", "temperature": "0"}), "temperature")
    invalid(client.post("/v1/compose/sessions", json={"collection": "docs", "options": {"threshold": "4"}}),
            "options.threshold")
    invalid(client.post("/v1/compose/sessions", json={"collection": "docs", "options": {"give_way": "no"}}),
            "options.give_way")
    # docqa's own request still makes its reading (its thresholds become the collection's options)
    assert client.post("/chat", json={"message": "Which pier?", "collection": "docs", "temperature": 0,
                                      "certainty_threshold": 1}).status_code == 200


def test_the_schema_names_the_strict_parts_as_the_records():
    schemas = make_client().get("/openapi.json").json()["components"]["schemas"]
    assert {"CollectionOptions", "ComposeOptions", "WimReading"} <= set(schemas)
    assert schemas["CollectionOptions"]["description"] == CollectionOptions.__doc__
    assert (schemas["CollectionOptions"]["title"], schemas["ComposeOptions"]["title"]) == (
        "CollectionOptions", "ComposeOptions")
    assert schemas["ComposeOptions"]["properties"]["threshold"]["default"] == ComposeOptions().threshold


def test_the_records_stay_as_lenient_as_the_cli_and_config_files_need():
    # the records the CLI and bench configs build are not the request parts: their own conversions stand
    assert pattern_options("wim", segment_tokens="512", grounding_threshold=1).segment_tokens == 512
    assert WimOptions.build(batch_margins="true").batch_margins is True
    assert CollectionOptions(certain=1, uncertain=0).certain == 1.0
    assert ComposeOptions(memory_timeout=5).memory_timeout == 5.0


# -- many problems --


def wide(n: int, prefix: str = "k") -> dict[str, int]:
    return {f"{prefix}{i}": 0 for i in range(n)}


def test_a_body_with_many_unknown_fields_gets_the_first_few_and_a_count():
    raw = json.dumps({**ASK, **wide(200_000)}).encode()
    reply = make_client().post("/v1/ask", content=raw, headers={"content-type": "application/json"})
    error = invalid(reply, "k0", f"k{MAX_PROBLEMS - 1}")
    assert [f["field"] for f in error["fields"]] == [f"k{i}" for i in range(MAX_PROBLEMS)]
    assert {f["message"] for f in error["fields"]} == {"no such field"}
    assert error["more_problems"] == 200_000 - MAX_PROBLEMS
    assert error["message"].endswith(f"; and {200_000 - MAX_PROBLEMS:,} more problems")
    assert len(reply.content) < 5_000


def test_many_unknown_fields_are_one_error_before_validation_makes_one_each():
    # validating a field per key, then an error dict per key, is what took seconds for a wide body
    with pytest.raises(ValidationError) as caught:
        AskRequest.model_validate({**ASK, **wide(10_000)})
    assert caught.value.error_count() == 1
    assert caught.value.errors()[0]["ctx"]["count"] == 10_000


def test_a_few_unknown_fields_are_each_named_with_the_other_problems():
    error = invalid(make_client().post("/v1/ask", json={**ASK, "stream": "yes", **wide(3, "extra")}),
                    "stream", "extra0", "extra1", "extra2")
    assert "more_problems" not in error and len(error["fields"]) == 4


def test_a_nested_part_with_many_unknown_fields_is_capped_too():
    reading = {"pattern": "rag", **wide(5_000, "x")}
    error = invalid(make_client().post("/v1/ask", json={**ASK, "reading": reading}), "reading.x0")
    assert len(error["fields"]) == MAX_PROBLEMS and error["more_problems"] == 5_000 - MAX_PROBLEMS


def test_many_problems_of_any_kind_are_capped():
    messages = [{"role": i} for i in range(1_000)]  # a number is not a role: one problem each
    reply = make_client().post("/v1/chat/completions", json={"model": "marginalia:docs", "messages": messages})
    error = invalid(reply, "messages.0.role")
    assert len(error["fields"]) == MAX_PROBLEMS and error["more_problems"] == 1_000 - MAX_PROBLEMS


def test_a_long_field_name_is_cut_in_the_reply():
    name = "k" * 1_000_000
    reply = make_client().post("/v1/ask", json={**ASK, name: 0})
    (field,) = invalid(reply)["fields"]
    assert field["field"].startswith("k" * 100 + "...") and "1,000,000 characters" in field["field"]
    assert len(reply.content) < 2_000
