"""Schemathesis against the service's own OpenAPI schema: requests for every operation, valid by the schema
and not, sent through the ASGI app with the server's key, are answered below 500 and every error in the one
JSON shape. (``benchmarks/server_fuzz.py`` runs thousands; this runs a few per operation.)"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("schemathesis")

from fuzz_support import FuzzedService  # noqa: E402

#: generated requests per operation (about 20 operations)
PER_OPERATION = 20


@pytest.fixture
def service(tmp_path):
    # one per test: schemathesis's pytest plugin ends the app's lifespan (its model worker and indexing
    # thread) when a test that reached it over ASGI ends
    return FuzzedService(tmp_path / "fuzz-home")


def test_the_schema_has_every_route(service):
    labels = {f"{op.method.upper()} {op.path}" for op in service.operations()}
    assert {"POST /v1/ask", "POST /v1/collections/{name}/documents", "POST /v1/chat/completions", "POST /chat",
            "GET /v1/jobs/{job_id}/events", "DELETE /v1/sessions/{session_id}"} <= labels
    assert len(labels) >= 20


def test_every_operation_answers_generated_requests_cleanly(service):
    seen = 0
    for operation in service.operations():
        @settings(max_examples=PER_OPERATION, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
        @given(case=service.cases(operation), aim=st.booleans())
        def answered_cleanly(case, aim):
            assert service.send_case(case, aim) == []

        before = service.tally.requests
        answered_cleanly()
        assert service.tally.requests > before, f"no request was made for {operation.label}"
        seen += 1
    assert seen >= 20
    assert service.tally.server_errors == 0 and service.tally.unhandled == 0, service.tally.problems
    # the generated requests reach the handlers, not only the key check and validation
    assert {200, 404, 422} <= set(service.tally.statuses)


def test_the_schema_documents_the_one_error_shape(service):
    schema = service.app.openapi()
    assert "HTTPValidationError" not in json.dumps(schema)  # FastAPI's own 422 shape, which we never send
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for status in ("4XX", "5XX"):
                ref = operation["responses"][status]["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorReply"), (method, path, status)
    error = schema["components"]["schemas"]["ErrorDetail"]
    assert set(error["required"]) == {"code", "message"}
    streamed = schema["paths"]["/v1/ask"]["post"]["responses"]["200"]["content"]
    assert set(streamed) == {"application/json", "text/event-stream"}
