"""Own documents: QA generation into a review file, the terminal review loop, and the `own` dataset."""

from __future__ import annotations

import io
import json

import pytest

from marginalia.bench.own import generate_pairs, load_own, read_pairs, review
from marginalia.errors import UserError
from marginalia.models.fake import ScriptedGenerator

DOC = """# Harbour

Silt builds up in the inner basin every year. The dredger hired for the work was the Orla Maye.

The market hall got a new roof in spring.

# Lifeboat

The lifeboat launched 37 times this year. Its new coxswain is Ingrid Tasker.
"""


def respond(request) -> str:
    """The question for whichever of the two facts the request shows."""
    if 'answers with "Orla Maye"' in request.prompt:
        return " Which dredger was hired for the work?"
    if 'answers with "Ingrid Tasker"' in request.prompt:
        return " Who is the new coxswain?"
    return "not a question"


@pytest.fixture
def qa_file(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "report.md").write_text(DOC, encoding="utf-8")
    target = tmp_path / "qa.jsonl"
    summary = generate_pairs([tmp_path / "docs"], ScriptedGenerator(respond), target, retries=0)
    assert summary.documents == 1 and summary.new_pairs == 2
    return target


def test_generate_writes_pending_pairs_with_evidence_and_resumes(qa_file, tmp_path):
    pairs = read_pairs(qa_file)
    assert [p["status"] for p in pairs] == ["pending", "pending"]
    assert pairs[0]["evidence"] == "The dredger hired for the work was the Orla Maye."
    assert pairs[0]["section_path"] == ["Harbour"]
    gen = ScriptedGenerator(respond)
    again = generate_pairs([tmp_path / "docs"], gen, qa_file)
    assert again.skipped_documents == 1 and again.new_pairs == 0
    assert gen.requests == []  # nothing asked again
    assert len(read_pairs(qa_file)) == 2


def test_review_accepts_edits_rejects_and_saves_each_decision(qa_file):
    out = io.StringIO()
    counts = review(qa_file, io.StringIO("e\nWhat vessel dredged the basin?\n\nr\n"), out)
    assert counts == {"accepted": 1, "rejected": 1, "pending": 0}
    first, second = read_pairs(qa_file)
    assert first["question"] == "What vessel dredged the basin?"
    assert first["answer"] == "Orla Maye"  # empty line: kept
    assert first["edited"] is True and first["status"] == "accepted"
    assert second["status"] == "rejected"
    assert "Q: Which dredger was hired for the work?" in out.getvalue()


def test_review_quits_midway_and_keeps_what_was_decided(qa_file):
    review(qa_file, io.StringIO("a\nq\n"), io.StringIO())
    assert [p["status"] for p in read_pairs(qa_file)] == ["accepted", "pending"]
    # a second session starts at the pending one; end of input also stops cleanly
    out = io.StringIO()
    review(qa_file, io.StringIO("x\n"), out)
    assert "[1/1]" in out.getvalue() and "unknown choice" in out.getvalue()


def test_own_dataset_uses_only_accepted_pairs_with_the_evidence_paragraph_as_gold(qa_file):
    with pytest.raises(UserError, match="no accepted pairs"):
        load_own(qa_file)
    review(qa_file, io.StringIO("a\nr\n"), io.StringIO())
    (example,) = load_own(qa_file)
    assert example.dataset == "own"
    assert example.answers == ("Orla Maye",)
    gold = [p for p in example.passages if p.gold]
    assert len(gold) == 1 and "Orla Maye" in gold[0].text
    assert any("coxswain" in p.text for p in example.passages if not p.gold)


def test_own_dataset_refuses_a_changed_document(qa_file, tmp_path):
    review(qa_file, io.StringIO("a\na\n"), io.StringIO())
    (tmp_path / "docs" / "report.md").write_text(DOC + "\nA new line.\n", encoding="utf-8")
    with pytest.raises(UserError, match="changed since"):
        load_own(qa_file)


def test_damaged_qa_file_names_the_line(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"id": "1"}) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match="line 1 has no 'question'"):
        read_pairs(path)


def test_own_items_build_at_a_target_length_and_depth(qa_file):
    from marginalia.bench.items import TaskSpec
    from marginalia.bench.tasks import build_items
    from marginalia.models.fake import WordTokenizer

    review(qa_file, io.StringIO("a\na\n"), io.StringIO())
    spec = TaskSpec(dataset="own", path=str(qa_file), lengths=(60,), depths=(0.0, 1.0), limit=5)
    items = build_items(spec, WordTokenizer())
    assert len(items) == 4
    for item in items:
        (gold,) = item.gold_spans
        assert item.answers[0].lower() in item.context[gold[0]:gold[1]].lower()
        assert 50 <= item.context_tokens <= 60
        assert "# " not in item.context
    first, last = items[0], items[1]
    assert first.context.index(first.answers[0]) < last.context.index(last.answers[0])


@pytest.mark.parametrize(("patterns", "offered"), [(("rag", "lc"), True), (("rag",), False)])
def test_a_run_on_a_collections_pairs_offers_calibration(tmp_path, patterns, offered):
    from marginalia.cli import main as cli_main

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "report.md").write_text(DOC, encoding="utf-8")
    (tmp_path / "qa").mkdir()
    pairs = tmp_path / "qa" / "harbour.jsonl"  # where 'qa-generate --collection harbour' writes
    generate_pairs([tmp_path / "docs"], ScriptedGenerator(respond), pairs, retries=0)
    review(pairs, io.StringIO("a\na\n"), io.StringIO())
    config = tmp_path / "mine.toml"
    config.write_text('model = "scripted:Orla Maye"\nembedder = "hashing"\n\n[[tasks]]\ndataset = "own"\n'
                      f'path = "{pairs}"\nlengths = [60]\n'
                      + "".join(f'\n[[patterns]]\nkind = "{p}"\n' for p in patterns), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    assert cli_main(["bench", "run", str(config), "--out", str(tmp_path / "run"), "--no-report"], out, err) == 0
    said = [line for line in err.getvalue().splitlines() if line.startswith("next: marginalia bench calibrate")]
    assert said == ([f"next: marginalia bench calibrate {tmp_path / 'run'} --collection harbour   (a reading "
                     "profile for scripted:Orla Maye from this run; --dry-run shows the choice first)"]
                    if offered else [])
