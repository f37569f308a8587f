"""`marginalia bench qa-generate`: a line per document and progress on a stderr that is not a terminal, pairs
on disk as they are made, from files or a collection."""

from __future__ import annotations

import io
import json

import pytest

from marginalia.bench.own import read_pairs
from marginalia.cli import main
from marginalia.models import registry
from marginalia.models.fake import ScriptedGenerator
from qa_support import REPORT, respond_qa


@pytest.fixture
def qa_model(monkeypatch):
    monkeypatch.setitem(registry._NAMED, "qa", (lambda arg, ctx: ScriptedGenerator(respond_qa), "test"))


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()  # not terminals
    return main(list(argv), out=out, err=err), out.getvalue(), err.getvalue()


def test_progress_lines_on_a_stderr_that_is_not_a_terminal(qa_model, tmp_path):
    doc = tmp_path / "report.md"
    doc.write_text(REPORT, encoding="utf-8")
    target = tmp_path / "qa.jsonl"
    code, out, err = run("bench", "qa-generate", str(doc), "-o", str(target), "--model", "qa",
                         "--home", str(tmp_path / "home"))
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0].endswith("report.md: 3 sections; 8 requests planned (3 single, 1 unanswerable, 1 join, "
                             "3 document)")
    steps = [line for line in lines if line.startswith("qa ")]
    assert [s.split()[1] for s in steps] == [f"{n}/8" for n in range(1, 9)]
    assert "single:0: 1 new" in steps[0]
    assert "  [single] Which dredger was hired for the work?" in lines
    assert "6 new pairs (3 single, 1 unanswerable, 1 join, 1 document)" in out
    assert len(read_pairs(target)) == 6

    code, out, err = run("bench", "qa-generate", str(doc), "-o", str(target), "--model", "qa", "-q",
                         "--home", str(tmp_path / "home"))
    assert code == 0 and err.startswith("next:") and "1 documents were done before" in out


def test_from_a_collection_into_its_qa_file(qa_model, tmp_path):
    pytest.importorskip("lancedb")
    home = tmp_path / "home"
    doc = tmp_path / "report.md"
    doc.write_text(REPORT, encoding="utf-8")
    code, _, err = run("index", str(doc), "--collection", "harbour", "--embedder", "hashing", "--home", str(home),
                       "--model", "qa")
    assert code == 0, err
    code, out, err = run("bench", "qa-generate", "--collection", "harbour", "--model", "qa", "--home", str(home))
    assert code == 0, err
    target = home / "qa" / "harbour.jsonl"
    assert out.startswith(f"{target}: 6 new pairs")
    pairs = read_pairs(target)
    stored = json.loads(json.dumps(pairs))
    assert {p["kind"] for p in stored} == {"single", "join", "document", "unanswerable"}
    assert all(s["text"] in REPORT for p in pairs for s in p["evidence_spans"])


@pytest.mark.parametrize("argv", [["bench", "qa-generate", "--model", "qa"],
                                  ["bench", "qa-generate", "x.md", "--collection", "c", "--model", "qa"],
                                  ["bench", "qa-generate", "x.md", "--model", "qa"]])
def test_documents_or_a_collection_and_where_to_write(qa_model, argv, tmp_path):
    code, _, err = run(*argv, "--home", str(tmp_path))
    assert code == 2  # a usage error, said before any model loads
    assert "--collection NAME" in err or "--out FILE" in err
