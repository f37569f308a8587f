"""Question generation of four kinds: exact evidence, near duplicates dropped, each pair written as it is made,
and a run that resumes inside a document."""

from __future__ import annotations

import pytest

from marginalia.bench.own import (
    DocumentStarted,
    PairWritten,
    RequestDone,
    generate_pairs,
    load_own,
    read_pairs,
    requests_path,
)
from marginalia.bench.qa_writer import pick_facts, plan, short_answer, similar
from marginalia.models.fake import ScriptedGenerator
from qa_support import REPORT, respond_qa


@pytest.fixture
def report(tmp_path):
    path = tmp_path / "report.md"
    path.write_text(REPORT, encoding="utf-8")
    return path


def test_four_kinds_each_with_evidence_that_slices_the_text_exactly(report, tmp_path):
    out = tmp_path / "qa.jsonl"
    summary = generate_pairs([report], ScriptedGenerator(respond_qa), out, retries=0)
    pairs = read_pairs(out)
    by_kind = {p["kind"]: p for p in pairs}
    assert set(by_kind) == {"single", "join", "document", "unanswerable"}
    assert summary.kinds == {"single": 3, "join": 1, "document": 1, "unanswerable": 1}
    for pair in pairs:
        for span in pair["evidence_spans"]:
            assert REPORT[span["start"]:span["end"]] == span["text"]
            assert span["source"] == pair["source"] and span["doc_id"] == pair["doc_id"]
    singles = [p for p in pairs if p["kind"] == "single"]
    assert [p["evidence"] for p in singles] == [
        "The dredger hired for the work was the Orla Maye.",
        "Its new coxswain is Ingrid Tasker.",
        "Its manager is Tomas Brey.",
    ]
    join = by_kind["join"]
    assert [s["text"] for s in join["evidence_spans"]] == [singles[0]["evidence"], singles[1]["evidence"]]
    document = by_kind["document"]
    assert [s["text"] for s in document["evidence_spans"]] == [singles[1]["evidence"], singles[2]["evidence"]]
    unanswerable = by_kind["unanswerable"]
    assert unanswerable["answer"] == "" and unanswerable["evidence_spans"] == [] and unanswerable["start"] is None
    # the three document forms got the same question: two dropped as near duplicates
    assert summary.skipped_pairs >= 2


def test_a_question_that_gives_its_answer_away_is_dropped_after_each_fact_of_its_chunk(report, tmp_path):
    def tells(request):
        if "Write the question that this sentence answers" in request.prompt:
            return " Was it the Orla Maye, Ingrid Tasker, Tomas Brey, 37 or March?"
        return "not a question"

    out = tmp_path / "qa.jsonl"
    events = []
    summary = generate_pairs([report], ScriptedGenerator(tells), out, retries=0, on_event=events.append)
    assert summary.new_pairs == 0 and read_pairs(out) == []
    done = [e for e in events if isinstance(e, RequestDone) and e.kind == "single"]
    # the harbour has one fact to ask about; the lifeboat and the market two each (a name and a number or month)
    assert [e.dropped for e in done] == [{"the question gives its answer away": n} for n in (1, 2, 2)]


def test_the_next_fact_of_a_chunk_is_asked_when_a_question_names_its_answer(report, tmp_path):
    def names_the_coxswain(request):
        if 'answers with "Ingrid Tasker"' in request.prompt:
            return " Is Ingrid Tasker the coxswain?"
        if 'answers with "37"' in request.prompt:
            return " How many times did the lifeboat launch this year?"
        return respond_qa(request)

    out = tmp_path / "qa.jsonl"
    generate_pairs([report], ScriptedGenerator(names_the_coxswain), out, retries=0)
    singles = [p for p in read_pairs(out) if p["kind"] == "single"]
    lifeboat = next(p for p in singles if p["section_path"][-1] == "Lifeboat")
    assert lifeboat["answer"] == "37" and lifeboat["evidence"] == "The lifeboat launched 37 times this year."


def test_a_fact_the_document_repeats_everywhere_is_asked_last():
    text = "# Ada Brook\n\nAda Brook sailed with Tom Reed. Ada Brook won. Ada Brook left in 1901."
    facts = [text[slice(*answer)] for _, answer in pick_facts(text, 0, len(text))]
    assert facts[0] == "Tom Reed" and "1901" in facts


def test_a_single_facts_answer_and_sentence_are_chosen_by_rule_and_exact():
    text = "# Fleet\n\nThe oldest boat is the Bramble Lark. She was built in 1938.\n\nNo names here at all."
    (sentence, answer), *_ = pick_facts(text, 0, len(text))
    assert text[slice(*sentence)] == "The oldest boat is the Bramble Lark." and text[slice(*answer)] == "Bramble Lark"
    (sentence, answer), *_ = pick_facts(text, text.index("She"), len(text))
    assert text[slice(*sentence)] == "She was built in 1938." and text[slice(*answer)] == "1938"
    assert pick_facts(text, text.index("No names"), len(text)) == []


def test_each_field_is_asked_for_in_turn_and_ends_at_its_line(report, tmp_path):
    gen = ScriptedGenerator(respond_qa)
    generate_pairs([report], gen, tmp_path / "qa.jsonl", retries=0)
    single = gen.requests[0]
    assert single.prompt.endswith("<|assistant|>\nQuestion:") and 'answers with "Orla Maye"' in single.prompt
    assert single.params.stop == ("\n",) and single.params.max_new_tokens == 32
    join = [r for r in gen.requests if "needs both facts" in r.prompt]
    assert len(join) == 2
    assert join[1].prompt.endswith("\nQuestion: Which dredger worked in the year Ingrid Tasker became coxswain?\n"
                                   "Answer:")


def test_near_duplicates():
    assert similar("Which dredger was hired for the work?", "which dredger was hired for the work")
    assert similar("Which dredger was hired?", "Which dredger was hired for the work?")  # a subset of its words
    assert not similar("Which dredger was hired?", "Who is the new coxswain?")


def test_a_line_per_document_and_each_pair_on_disk_when_announced(report, tmp_path):
    out = tmp_path / "qa.jsonl"
    seen_on_disk = []

    def on_event(event):
        if isinstance(event, PairWritten):
            seen_on_disk.append(event.pair["id"] in {p["id"] for p in read_pairs(out)})

    events = []
    generate_pairs([report], ScriptedGenerator(respond_qa), out, retries=0,
                   on_event=lambda e: (events.append(e), on_event(e)))
    started = events[0]
    assert isinstance(started, DocumentStarted)
    assert started.sections == 3 and started.done == 0
    assert started.planned == {"single": 3, "unanswerable": 1, "join": 1, "document": 3}
    assert seen_on_disk and all(seen_on_disk)
    dones = [e for e in events if isinstance(e, RequestDone)]
    assert [e.done for e in dones] == list(range(1, started.total + 1))


class Interrupt(Exception):
    pass


def test_a_run_resumes_inside_a_document_skipping_the_requests_done(report, tmp_path):
    out = tmp_path / "qa.jsonl"
    asked = []

    def dies_in_the_third_request(request):
        asked.append(request.prompt)
        if len(asked) == 3:
            raise Interrupt
        return respond_qa(request)

    with pytest.raises(Interrupt):
        generate_pairs([report], ScriptedGenerator(dies_in_the_third_request), out, retries=0)
    first = read_pairs(out)
    assert [p["kind"] for p in first] == ["single", "single"]  # written before the crash, not at the document's end
    with open(out, "a", encoding="utf-8") as f:
        f.write('{"id": "half a li')  # a line the crash cut

    gen = ScriptedGenerator(respond_qa)
    events = []
    summary = generate_pairs([report], gen, out, retries=0, on_event=events.append)
    assert events[0].done == 2 and summary.resumed_requests == 2
    asked_again = [r for r in gen.requests if r.prompt.endswith("<|assistant|>\nQuestion:")]
    assert len(asked_again) == 8 - 2
    assert not any('answers with "Orla Maye"' in r.prompt for r in gen.requests)
    whole = tmp_path / "whole.jsonl"
    generate_pairs([report], ScriptedGenerator(respond_qa), whole, retries=0)
    assert [p["question"] for p in read_pairs(out)] == [p["question"] for p in read_pairs(whole)]
    # all done: a third run asks nothing, and a request that made no pair is not asked again
    again = ScriptedGenerator(respond_qa)
    assert generate_pairs([report], again, out).skipped_documents == 1 and again.requests == []
    assert len(requests_path(out).read_text().splitlines()) == 8


def test_plan_joins_sections_and_spreads_unanswerable_questions():
    from marginalia.records import Chunk

    units = [Chunk("d", i, i, i * 10, i * 10 + 9, "text", (f"S{i // 3}",)) for i in range(12)]
    planned = plan(units)
    kinds = [p.kind for p in planned]
    assert kinds[:12] == ["single"] * 12 and kinds.count("unanswerable") == 2 and kinds.count("document") == 3
    joins = [p for p in planned if p.kind == "join"]
    assert len(joins) == 3
    assert all(units[a].section_path != units[b].section_path for a, b in (p.units for p in joins))
    assert len({p.key for p in planned}) == len(planned)


def test_own_dataset_reads_every_kind(report, tmp_path):
    import io

    from marginalia.bench.own import review

    out = tmp_path / "qa.jsonl"
    generate_pairs([report], ScriptedGenerator(respond_qa), out, retries=0)
    review(out, io.StringIO("a\n" * 10), io.StringIO())
    examples = {e.meta["kind"]: e for e in load_own(out)}
    assert examples["unanswerable"].answers == () and not any(p.gold for p in examples["unanswerable"].passages)
    assert sum(p.gold for p in examples["join"].passages) == 2
    singles = [e for e in load_own(out) if e.meta["kind"] == "single"]
    assert [e.answers for e in singles] == [("Orla Maye",), ("Ingrid Tasker",), ("Tomas Brey",)]


class FirstPair(Exception):
    pass


@pytest.mark.slow
def test_the_embedded_model_writes_a_first_pair_with_exact_evidence_on_the_demo_report(smollm2_llamacpp, tmp_path):
    from importlib import resources

    demo = resources.files("marginalia").joinpath("data", "demo", "harbour_report.md")
    path = tmp_path / "harbour_report.md"
    path.write_text(demo.read_text("utf-8"), encoding="utf-8")
    out = tmp_path / "qa.jsonl"
    events = []

    def stop_at_the_first_pair(event):
        events.append(event)
        if isinstance(event, PairWritten):
            raise FirstPair

    with pytest.raises(FirstPair):
        generate_pairs([path], smollm2_llamacpp.fork(keep_cache=False), out, on_event=stop_at_the_first_pair)
    assert isinstance(events[0], DocumentStarted) and events[0].total > 20
    (pair,) = read_pairs(out)
    text = path.read_text("utf-8")
    assert pair["evidence_spans"] and all(text[s["start"]:s["end"]] == s["text"] for s in pair["evidence_spans"])


def test_an_answer_that_restates_the_question_is_cut_to_its_fact():
    assert short_answer("The new coxswain is Ingrid Tasker.", "Who is the new coxswain?") == "Ingrid Tasker"
    assert short_answer("The lifeboat was launched 37 times.", "Who is the new coxswain?") == (
        "The lifeboat was launched 37 times")


def test_a_name_loses_the_word_opening_its_sentence_and_its_possessive():
    text = "# Ends\n\nAlthough Dick Rifenburg was hurt, he played. It was the University of Michigan's year. although."
    facts = [text[slice(*answer)] for _, answer in pick_facts(text, 0, len(text))]
    assert facts[:2] == ["Dick Rifenburg", "University of Michigan"]


@pytest.mark.parametrize(("question", "kept"), [("What colour is the harbour cat?", True),
                                                 ("What is the name of the dredger hired?", False)])
def test_an_unanswerable_question_needs_a_word_the_document_lacks_beyond_its_frame(report, tmp_path, question, kept):
    def asks(request):
        if "does not answer" in request.prompt:
            return " " + question
        return respond_qa(request)

    out = tmp_path / "qa.jsonl"
    events = []
    generate_pairs([report], ScriptedGenerator(asks), out, retries=0, on_event=events.append)
    made = [p for p in read_pairs(out) if p["kind"] == "unanswerable"]
    assert [p["question"] for p in made] == ([question] if kept else [])
    if not kept:
        done = [e for e in events if isinstance(e, RequestDone) and e.kind == "unanswerable"]
        assert done and all(e.dropped == {"the document may answer it": 1} for e in done)
