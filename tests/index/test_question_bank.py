"""The question bank writer: JSON parsing, validation, grounding, retries and export."""

from __future__ import annotations

import json
import threading

import pytest

from marginalia.errors import UserError
from marginalia.index.question_bank import QuestionWriter, locate, parse_pairs, plan_units, to_chat_jsonl
from marginalia.models.fake import ScriptedGenerator
from marginalia.records import Chunk, Document, Section

TEXT = (
    "# Harbour\n\n"
    "The harbour keeps 214 moorings for local boats. Fees rose in spring.\n\n"
    "The dredger Orla Maye cleared the inner basin in June.\n\n"
    "# Lifeboat\n\n"
    "The lifeboat launched 37 times. Its coxswain is Ingrid Tasker.\n"
)


def _doc() -> tuple[Document, list[Section], list[Chunk]]:
    doc = Document("report.md", TEXT, "d1", format="markdown")
    h2 = TEXT.index("# Lifeboat")
    sections = [
        Section("d1", 0, 0, "", (), 0, len(TEXT), 0, 0, None, (1, 2)),
        Section("d1", 1, 1, "Harbour", ("Harbour",), 0, h2, 10, h2, 0),
        Section("d1", 2, 1, "Lifeboat", ("Lifeboat",), h2, len(TEXT), h2 + 11, len(TEXT), 0),
    ]
    paras = [p for p in TEXT.split("\n\n") if p.strip() and not p.startswith("#")]
    chunks = []
    for i, p in enumerate(paras):
        start = TEXT.index(p)
        sec = 1 if start < h2 else 2
        chunks.append(Chunk("d1", sec, i, start, start + len(p), p, sections[sec].path, len(p.split())))
    return doc, sections, chunks


def test_parse_pairs_takes_json_out_of_prose_and_fences():
    reply = 'Sure!\n```json\n[{"question": "How many moorings?", "answer": "214"}]\n```'
    assert parse_pairs(reply) == [{"question": "How many moorings?", "answer": "214"}]
    assert parse_pairs('{"question": "Who?", "answer": "x"} trailing') == [{"question": "Who?", "answer": "x"}]
    # a list cut short still gives its complete objects
    cut = '[{"question": "A is what?", "answer": "b"}, {"question": "C'
    assert parse_pairs(cut) == [{"question": "A is what?", "answer": "b"}]
    with pytest.raises(ValueError):
        parse_pairs("no json here [not, json]")


def test_locate_finds_the_supporting_sentence_and_refuses_invented_answers():
    span = locate(TEXT, 0, len(TEXT), "Which dredger cleared the basin?", "the Orla Maye")
    assert span is not None
    assert TEXT[span[0]:span[1]] == "The dredger Orla Maye cleared the inner basin in June."
    assert locate(TEXT, 0, len(TEXT), "Which dredger?", "the Sea Queen") is None


def test_plan_units_dense_is_one_per_chunk_and_sparse_one_request_per_top_section():
    doc, sections, chunks = _doc()
    dense = plan_units(doc, sections, chunks, "dense", lambda t: len(t.split()))
    assert [(u.start, u.end, u.want) for u in dense] == [(c.start, c.end, 1) for c in chunks]
    sparse = plan_units(doc, sections, chunks, "sparse", lambda t: len(t.split()))
    assert len(sparse) == 2  # two top-level sections
    assert sparse[0].want == 2 and sparse[1].want == 1  # about one per paragraph
    with pytest.raises(UserError):
        plan_units(doc, sections, chunks, "medium", len)


def _replying(replies: dict[str, list[str]]):
    """A responder that answers by which paragraph the prompt shows (replies consumed in order)."""

    def respond(request) -> str:
        for key, queue in replies.items():
            if key in request.prompt and queue:
                return queue.pop(0)
        return "nonsense"

    return respond


def test_writer_validates_retries_skips_and_cites():
    doc, sections, chunks = _doc()
    gen = ScriptedGenerator(_replying({
        # the reply is started for the model with '{"question": "'; it continues from there
        "214 moorings": ['How many moorings does the harbour keep?", "answer": "214 moorings"'],
        "Orla Maye": ['garbage', 'Which dredger cleared the inner basin?", "answer": "Orla Maye"'],
        "Ingrid Tasker": ['bad', 'worse', 'still bad'],
    }))
    report = QuestionWriter(gen, retries=2).write(doc, sections, chunks, density="dense")
    assert [p.answer for p in report.pairs] == ["214 moorings", "Orla Maye"]
    first, second = report.pairs
    assert TEXT[first.start:first.end] == "The harbour keeps 214 moorings for local boats."
    assert first.section_path == ("Harbour",)
    assert second.doc_id == "d1" and second.source == "report.md"
    assert report.requests == 1 + 2 + 3
    assert report.retries == 1 + 2
    assert report.skipped["malformed reply"] == 1
    # retries sample with another seed
    seeds = [r.params.seed for r in gen.requests]
    assert seeds[:3] == [0, 0, 1]


def test_writer_sends_independent_requests_side_by_side_when_the_model_allows():
    doc, sections, chunks = _doc()
    threads: set[str] = set()
    overlapped: list[bool] = []

    def writer(concurrency: int) -> QuestionWriter:
        replies = _replying({
            "214 moorings": ['How many moorings does the harbour keep?", "answer": "214 moorings"'],
            "Orla Maye": ['garbage', 'Which dredger cleared the inner basin?", "answer": "Orla Maye"'],
            "Ingrid Tasker": ['Who is the coxswain?", "answer": "Ingrid Tasker"'],
        })
        arrived, second = [], threading.Event()
        lock = threading.Lock()

        def respond(request) -> str:
            threads.add(threading.current_thread().name)
            with lock:
                arrived.append(request)
                n = len(arrived)
            if n == 2:
                second.set()
            if n == 1 and concurrency > 1:  # the first reply waits for a second request to come beside it
                overlapped.append(second.wait(5))
            return replies(request)

        gen = ScriptedGenerator(respond)
        gen.concurrency = concurrency
        return QuestionWriter(gen, retries=2)

    progress: list[tuple[int, int]] = []
    one = writer(1).write(doc, sections, chunks, density="dense")
    assert threads == {threading.current_thread().name}
    three = writer(3).write(doc, sections, chunks, density="dense", progress=lambda *a: progress.append(a))
    assert any(name.startswith("questions") for name in threads)
    assert overlapped == [True]  # a second request came while the first was still being answered
    # taken in order: the same bank and the same counts
    def bank(report):
        return [(p.question, p.answer, p.start) for p in report.pairs]

    assert bank(three) == bank(one)
    assert (three.requests, three.retries, three.skipped) == (one.requests, one.retries, one.skipped) == (4, 1, {})
    assert progress == [(1, 3), (2, 3), (3, 3)]


def test_writer_skips_ungrounded_and_invalid_pairs():
    doc, sections, chunks = _doc()
    gen = ScriptedGenerator(_replying({
        "214 moorings": ['Who won the cup?", "answer": "The Rovers"'],
        "Orla Maye": ['no question mark", "answer": "x"'],
        "Ingrid Tasker": ['Who is the coxswain?", "answer": "Ingrid Tasker", "long_answer": "It is Ingrid."'],
    }))
    report = QuestionWriter(gen, retries=0, long_answers=True).write(doc, sections, chunks, density="dense")
    assert [p.question for p in report.pairs] == ["Who is the coxswain?"]
    assert report.pairs[0].long_answer == "It is Ingrid."
    assert report.skipped == {"answer not in the text": 1, "invalid pair": 1}
    assert "long_answer" in gen.requests[0].prompt


def test_chat_jsonl_export():
    doc, sections, chunks = _doc()
    gen = ScriptedGenerator(_replying({
        "Ingrid Tasker": ['Who is the coxswain?", "answer": "Ingrid Tasker", "long_answer": "It is Ingrid."'],
    }))
    pairs = QuestionWriter(gen, retries=0).write(doc, sections, chunks, density="dense").pairs
    lines = list(to_chat_jsonl(pairs, system="Be brief."))
    assert json.loads(lines[0]) == {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Who is the coxswain?"},
        {"role": "assistant", "content": "Ingrid Tasker"},
    ]}
    long = json.loads(next(iter(to_chat_jsonl(pairs, system="", long=True))))
    assert long["messages"] == [{"role": "user", "content": "Who is the coxswain?"},
                                {"role": "assistant", "content": "It is Ingrid."}]
