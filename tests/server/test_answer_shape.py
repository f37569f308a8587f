"""One answer shape: the same question asked through the CLI (``ask --json``) and over HTTP, with the same scripted
model, gives documents with the same keys all the way down (and the same values, timings aside); every route
that sends an answer sends that document; docs/answer.schema.json is the record's schema as it is now."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from marginalia.cli import main
from marginalia.models.fake import ScriptedGenerator
from marginalia.records import ANSWER_SCHEMA, Answer, Reference
from marginalia.server import Settings
from marginalia.server.events import QUOTE_CHARS, answer_dict
from server_support import FACT, QUESTION, REPORT, index_text, make_client, parse_sse

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "answer.schema.json"
READING = ["--pattern", "wim", "--segment-tokens", "24"]


def keys(value: Any) -> Any:
    """The shape of a JSON document: its keys, recursively, with lists of objects item by item."""
    if isinstance(value, dict):
        return {key: keys(inner) for key, inner in value.items()}
    if isinstance(value, list):
        return [keys(inner) for inner in value if isinstance(inner, dict | list)]
    return None


def cli_answer(tmp_path: Path) -> dict[str, Any]:
    doc = tmp_path / "text"  # named as the service names a pasted text, so that the references agree
    doc.write_text(REPORT, encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    code = main(["ask", str(doc), QUESTION, "--model", f"scripted:{FACT}", *READING, "--no-cache", "--json", "-q",
                 "--home", str(tmp_path / "home")], out=out, err=err)
    assert code == 0, err.getvalue()
    data: dict[str, Any] = json.loads(out.getvalue())
    for ref in data["references"]:  # the CLI names a file by its path as given
        ref["source"] = Path(ref["source"]).name
    return data


def http_answer(**more: Any) -> dict[str, Any]:
    client = make_client(Settings(cache_readings=False), generator=ScriptedGenerator(default=FACT))
    reply = client.post("/v1/ask", json={"question": QUESTION, "text": REPORT,
                                         "reading": {"pattern": "wim", "segment_tokens": 24}, **more})
    assert reply.status_code == 200, reply.text
    if more.get("stream"):
        events = parse_sse(reply.text)
        assert events[-1][0] == "done"
        return dict(events[-1][1])
    return dict(reply.json())


def test_the_cli_and_http_answers_have_the_same_keys(tmp_path: Path) -> None:
    cli, http = cli_answer(tmp_path), http_answer()
    assert keys(cli) == keys(http)
    assert cli["schema"] == http["schema"] == ANSWER_SCHEMA
    assert cli["margins"] and cli["references"]  # the comparison reaches into both
    # the same reading, so the same answer; only the timings differ, and the service places references in the
    # document's sections
    for key in set(cli) - {"stats", "references"}:
        assert cli[key] == http[key], key
    unplaced = [{**ref, "section_path": [], "page": None} for ref in http["references"]]
    assert cli["references"] == unplaced
    assert cli["text"] == FACT and cli["references"][0]["text"] == FACT
    assert http_answer(stream=True) | {"stats": None} == http | {"stats": None}  # the SSE done event


def test_the_documents_follow_the_committed_schema(tmp_path: Path) -> None:
    jsonschema_rs = pytest.importorskip("jsonschema_rs")  # schemathesis's validator (the dev extra)
    validator = jsonschema_rs.validator_for(json.loads(SCHEMA_FILE.read_text("utf-8")))
    for document in (cli_answer(tmp_path), http_answer()):
        validator.validate(document)
    document = http_answer()
    for broken in ({**document, "text": None}, {k: v for k, v in document.items() if k != "schema"},
                   {**document, "references": [{**document["references"][0], "quote": "old name"}]}):
        assert not validator.is_valid(broken)


def test_the_committed_schema_is_the_records() -> None:
    """docs/answer.schema.json is written from `Answer.json_schema`: `make answer-schema` writes it again."""
    assert json.loads(SCHEMA_FILE.read_text("utf-8")) == Answer.json_schema()


def test_http_cuts_long_quotes_and_keeps_the_keys() -> None:
    long = Answer(question="q", text="a", pattern="lc", model="m",
                  references=(Reference("doc", 0, 5000, "x" * 5000), Reference("doc", 0, 3, "abc")))
    whole, cut = long.to_dict(), answer_dict(long)
    assert keys(whole) == keys(cut)
    assert len(whole["references"][0]["text"]) == 5000
    assert len(cut["references"][0]["text"]) == QUOTE_CHARS and cut["references"][0]["text"].endswith("\u2026")
    assert cut["references"][1]["text"] == "abc"


def test_docqa_and_openai_carry_the_same_document() -> None:
    client = make_client(Settings(default_collection="docs"))
    index_text(client, "docs", "report.md", REPORT)
    body = {"question": QUESTION, "collection": "docs"}
    asked = client.post("/v1/ask", json=body).json()
    docqa = client.post("/chat", json={"message": QUESTION}).json()
    openai = client.post("/v1/chat/completions", json={
        "model": "marginalia:docs", "messages": [{"role": "user", "content": QUESTION}]}).json()
    stream = parse_sse(client.post("/v1/chat/completions", json={
        "model": "marginalia:docs", "stream": True, "messages": [{"role": "user", "content": QUESTION}]}).text)
    last = json.loads(stream[-2][1]) if isinstance(stream[-2][1], str) else stream[-2][1]
    for document in (docqa["metadata"], openai["marginalia"]["answer"], last["marginalia"]["answer"]):
        assert keys(document) == keys(asked)
        assert document["text"] == asked["text"] and document["references"] == asked["references"]
    assert [r["content"] for r in docqa["references"]] == [r["text"] for r in asked["references"]]
