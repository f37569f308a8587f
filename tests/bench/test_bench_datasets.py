"""Dataset loaders on tiny files written here in each official format, their errors, and the real dev files."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

from marginalia.bench.datasets import DatasetFormatError, load_examples, load_pool, register_loader
from marginalia.bench.items import Example
from marginalia.errors import UserError

DATA = Path(os.environ.get("BENCH_DATA_DIR") or Path(__file__).parents[3] / "shared" / "data")


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: list[Any], gz: bool = False) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        path.write_bytes(gzip.compress(text.encode("utf-8")))
    else:
        path.write_text(text, encoding="utf-8")
    return path


def squad_doc(impossible: bool = False) -> dict[str, Any]:
    def qa(qid: str, question: str, answer: str) -> dict[str, Any]:
        return {"id": qid, "question": question, "answers": [{"text": answer, "answer_start": 0}] * 2}

    second: dict[str, Any] = qa("b2", "Who keeps the lighthouse?", "Ines")
    if impossible:
        second = {"id": "b2", "question": "Who painted the lighthouse?", "answers": [],
                  "plausible_answers": [{"text": "Ines", "answer_start": 0}], "is_impossible": True}
    return {"version": "v2.0" if impossible else "1.1", "data": [
        {"title": "Harbour", "paragraphs": [
            {"context": "The harbour opens at dawn. Boats leave at six.",
             "qas": [qa("a1", "When does the harbour open?", "at dawn"), qa("a2", "When do boats leave?", "six")]},
            {"context": "The fish market sells cod and herring.",
             "qas": [qa("a3", "What does the market sell?", "cod and herring")]},
        ]},
        {"title": "Lighthouse", "paragraphs": [
            {"context": "Ines keeps the lighthouse on the northern cape.",
             "qas": [qa("b1", "Where is the lighthouse?", "the northern cape"), second]},
        ]},
    ]}


def test_squad_v1(tmp_path: Path) -> None:
    examples = load_examples("squad", write_json(tmp_path / "dev.json", squad_doc()))
    assert [e.id for e in examples] == ["a1", "a2", "a3", "b1", "b2"]
    first = examples[0]
    assert first.dataset == "squad"
    assert first.question == "When does the harbour open?"
    assert first.answers == ("at dawn",)  # repeated annotations collapse
    assert len(first.passages) == 1 and first.passages[0].gold
    assert first.passages[0].title == "Harbour"
    assert first.passages[0].text == "The harbour opens at dawn. Boats leave at six."
    assert first.meta["title"] == "Harbour"


def test_squad_v2_unanswerable_has_no_answers(tmp_path: Path) -> None:
    examples = load_examples("squad2", write_json(tmp_path / "dev.json", squad_doc(impossible=True)))
    b2 = examples[-1]
    assert b2.answers == ()
    assert b2.meta["is_impossible"] is True and b2.meta["plausible_answers"] == ("Ines",)
    assert b2.passages[0].gold  # the paragraph stays the gold passage


def test_squad_limit_spreads_over_articles_in_file_order(tmp_path: Path) -> None:
    path = write_json(tmp_path / "dev.json", squad_doc())
    # round robin: a1 (Harbour p0), b1 (Lighthouse p0), a3 (Harbour p1), ...; returned in file order
    assert [e.id for e in load_examples("squad", path, limit=2)] == ["a1", "b1"]
    assert [e.id for e in load_examples("squad", path, limit=3)] == ["a1", "a3", "b1"]
    assert [e.id for e in load_examples("squad", path, limit=4)] == ["a1", "a3", "b1", "b2"]


def hotpot_rows() -> list[dict[str, Any]]:
    return [{
        "_id": "h1", "question": "Which town has the older bridge?", "answer": "Carrow", "type": "comparison",
        "level": "easy", "supporting_facts": [["Carrow Bridge", 0], ["Lind Bridge", 1]],
        "context": [["Old Mill", ["The mill burned.", " It was rebuilt."]],
                    ["Carrow Bridge", ["Carrow Bridge dates from 1620.", " It has five arches."]],
                    ["Lind Bridge", ["Lind Bridge was built in 1702."]]],
    }, {
        "_id": "h2", "question": "Is Lind older than Carrow?", "answer": "no", "type": "comparison",
        "level": "hard", "supporting_facts": [["Lind", 0]],
        "context": [["Lind", ["Lind is a town."]], ["Ferry", ["A ferry crosses the river."]]],
    }]


def test_hotpotqa(tmp_path: Path) -> None:
    examples = load_examples("hotpotqa", write_json(tmp_path / "hotpot.json", hotpot_rows()))
    h1 = examples[0]
    assert h1.id == "h1" and h1.answers == ("Carrow",)
    assert [(p.title, p.gold) for p in h1.passages] == [
        ("Old Mill", False), ("Carrow Bridge", True), ("Lind Bridge", True)]
    assert h1.passages[1].text == "Carrow Bridge dates from 1620. It has five arches."
    assert h1.meta["type"] == "comparison" and h1.meta["level"] == "easy"
    assert [e.id for e in load_examples("hotpotqa", tmp_path / "hotpot.json", limit=1)] == ["h1"]


def nq_rows() -> list[dict[str, Any]]:
    return [
        {"question": "who keeps the lighthouse", "answers": ["Ines", "Ines Vara"],
         "ctxs": [{"title": "Cape", "text": "The cape is windy.", "hasanswer": False, "isgold": False},
                  {"title": "Lighthouse", "text": "Ines keeps the lighthouse.", "hasanswer": True, "isgold": True}]},
        {"question": "when does the harbour open", "answers": ["dawn"],
         "ctxs": [{"title": "Harbour", "text": "The harbour opens at dawn.", "isgold": True}]},
    ]


def test_nq_gzipped_finds_the_gold_ctx(tmp_path: Path) -> None:
    examples = load_examples("nq", write_jsonl(tmp_path / "nq.jsonl.gz", nq_rows(), gz=True))
    assert [e.id for e in examples] == ["0", "1"]
    assert examples[0].answers == ("Ines", "Ines Vara")
    assert [(p.title, p.gold) for p in examples[0].passages] == [("Cape", False), ("Lighthouse", True)]


def test_nq_falls_back_to_the_annotated_gold(tmp_path: Path) -> None:
    row = {"question": "q", "answers": ["a"], "ctxs": [],
           "nq_annotated_gold": {"title": "T", "long_answer": "a long answer", "chunked_long_answer": "a chunk"}}
    (example,) = load_examples("nq", write_jsonl(tmp_path / "nq.jsonl", [row]))
    assert [(p.title, p.text, p.gold) for p in example.passages] == [("T", "a chunk", True)]
    del row["nq_annotated_gold"]
    with pytest.raises(DatasetFormatError) as err:
        load_examples("nq", write_jsonl(tmp_path / "nq.jsonl", [row]))
    assert err.value.where == "line 1" and err.value.field == "isgold"


def multihop_rows() -> list[dict[str, Any]]:
    ev = {"author": "A", "category": "c", "published_at": "2023-10-01", "url": "u"}
    return [
        {"query": "Did both reports name Ines?", "question_type": "comparison_query", "answer": "Yes",
         "evidence_list": [{**ev, "title": "Report one", "source": "Daily", "fact": "Ines was named."},
                           {**ev, "title": "Report two", "source": "Weekly", "fact": "They named Ines."}]},
        {"query": "Who won the 2031 regatta?", "question_type": "null_query", "answer": "Insufficient information.",
         "evidence_list": []},
    ]


def test_multihop(tmp_path: Path) -> None:
    examples = load_examples("multihop", write_jsonl(tmp_path / "mh.jsonl", multihop_rows()))
    first, null = examples
    assert first.answers == ("Yes",)
    assert [(p.title, p.text, p.gold) for p in first.passages] == [
        ("Report one", "Ines was named.", True), ("Report two", "They named Ines.", True)]
    assert first.meta["question_type"] == "comparison_query" and first.meta["sources"] == ["Daily", "Weekly"]
    assert null.answers == () and null.passages == ()  # unanswerable: right only when the model abstains


def test_multihop_as_one_json_list(tmp_path: Path) -> None:
    """The upstream release is one JSON list; it reads the same."""
    examples = load_examples("multihop", write_json(tmp_path / "MultiHopRAG.json", multihop_rows()))
    assert [e.answers for e in examples] == [("Yes",), ()]


def test_babilong_file_and_folder(tmp_path: Path) -> None:
    folder = tmp_path / "babilong"
    folder.mkdir()
    write_json(folder / "babilong_16k.json", {"context": "Mary went to the garden.", "query": "Where is Mary? ",
                                              "target": "garden"})
    write_json(folder / "babilong_8k.json", {"input": "John went to the hall.", "question": "Where is John?",
                                             "target": "hall"})
    examples = load_examples("babilong", folder)
    assert [(e.id, e.question, e.answers, e.context) for e in examples] == [
        ("babilong_8k", "Where is John?", ("hall",), "John went to the hall."),
        ("babilong_16k", "Where is Mary?", ("garden",), "Mary went to the garden."),
    ]
    assert examples[0].meta["nominal_length"] == "8k"
    assert load_examples("babilong", folder / "babilong_16k.json")[0].answers == ("garden",)


def test_pool_reads_gzip_and_undoes_wikitext_markers(tmp_path: Path) -> None:
    rows = [{"title": "Bridge", "text": "A five @-@ arch bridge , 1 @,@ 200 feet long ."}, {"id": "e1", "text": " "},
            {"id": "e2", "text": "Second text."}]
    pool = load_pool(write_jsonl(tmp_path / "pool.jsonl.gz", rows, gz=True))
    assert [(p.title, p.text) for p in pool] == [
        ("Bridge", "A five-arch bridge , 1,200 feet long ."), ("", "Second text.")]


# -- bad input ---------------------------------------------------------------------------------------------------


def test_missing_file_names_the_path_and_the_format(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(UserError) as err:
        load_examples("squad", missing)
    assert str(missing) in str(err.value) and "SQuAD v1.1" in str(err.value)
    with pytest.raises(UserError, match="pool.jsonl"):
        load_pool(tmp_path / "pool.jsonl")


def test_unknown_dataset_suggests_a_name(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="did you mean 'hotpotqa'"):
        load_examples("hotpot", tmp_path / "x.json")


def test_squad_missing_field_names_the_place(tmp_path: Path) -> None:
    doc = squad_doc()
    del doc["data"][0]["paragraphs"][1]["qas"][0]["question"]
    with pytest.raises(DatasetFormatError) as err:
        load_examples("squad", write_json(tmp_path / "dev.json", doc))
    assert err.value.where == "data[0].paragraphs[1].qas[0]" and err.value.field == "question"
    assert "data[0].paragraphs[1].qas[0]" in str(err.value) and "'question'" in str(err.value)


def test_squad_not_json_and_wrong_shape(tmp_path: Path) -> None:
    bad = tmp_path / "dev.json"
    bad.write_text('{"data": [', encoding="utf-8")
    with pytest.raises(DatasetFormatError, match="not JSON"):
        load_examples("squad", bad)
    with pytest.raises(DatasetFormatError) as err:
        load_examples("squad", write_json(bad, {"version": "1.1"}))
    assert err.value.field == "data"


def test_jsonl_line_that_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "mh.jsonl"
    path.write_text(json.dumps(multihop_rows()[0]) + "\n\n{not json}\n", encoding="utf-8")
    with pytest.raises(DatasetFormatError) as err:
        load_examples("multihop", path)
    assert err.value.where == "line 3" and "line 3" in str(err.value)


def test_jsonl_missing_field_names_the_line(tmp_path: Path) -> None:
    rows = nq_rows()
    del rows[1]["answers"]
    with pytest.raises(DatasetFormatError) as err:
        load_examples("nq", write_jsonl(tmp_path / "nq.jsonl.gz", rows, gz=True))
    assert (err.value.where, err.value.field) == ("line 2", "answers")


def test_hotpotqa_bad_item(tmp_path: Path) -> None:
    rows = hotpot_rows()
    del rows[1]["context"]
    with pytest.raises(DatasetFormatError) as err:
        load_examples("hotpotqa", write_json(tmp_path / "h.json", rows))
    assert (err.value.where, err.value.field) == ("item 1", "context")
    rows = hotpot_rows()
    rows[0]["supporting_facts"].append(["Nowhere", 0])
    with pytest.raises(DatasetFormatError, match="Nowhere"):
        load_examples("hotpotqa", write_json(tmp_path / "h.json", rows))


def test_babilong_and_pool_missing_fields(tmp_path: Path) -> None:
    with pytest.raises(DatasetFormatError) as err:
        load_examples("babilong", write_json(tmp_path / "b.json", {"context": "x", "target": "y"}))
    assert err.value.field == "query"
    with pytest.raises(DatasetFormatError) as err:
        load_pool(write_jsonl(tmp_path / "p.jsonl", [{"text": "ok"}, {"title": "no text"}]))
    assert (err.value.where, err.value.field) == ("line 2", "text")


def test_register_loader_adds_a_dataset(tmp_path: Path) -> None:
    def load_own(path: Path) -> list[Example]:
        return [Example(id=f"own{i}", dataset="own", question="q", answers=("a",)) for i in range(3)]

    register_loader("own-test", load_own)
    try:
        assert [e.id for e in load_examples("own-test", tmp_path, limit=2)] == ["own0", "own1"]
    finally:
        from marginalia.bench.datasets import LOADERS

        LOADERS.pop("own-test")


# -- the real development files -------------------------------------------------------------------------------------


def real(name: str) -> Path:
    path = DATA / name
    if not path.exists():
        pytest.skip(f"the development data ({path}) is not here")
    return path


def test_real_files_load() -> None:
    squad = load_examples("squad", real("squad-v1.1-dev.part1.json"))
    assert len(squad) > 4000 and all(len(e.passages) == 1 and e.answers for e in squad)
    squad2 = load_examples("squad2", real("squad-v2.0-dev.part1.json"))
    assert any(not e.answers for e in squad2) and any(e.answers for e in squad2)
    hotpot = load_examples("hotpotqa", real("hotpotqa-dev-distractor.part1.json"))
    assert len(hotpot) == 50 and all(sum(p.gold for p in e.passages) == 2 for e in hotpot)
    nq = load_examples("nq", real("nq-open-oracle.part1.jsonl.gz"))
    assert len(nq) == 1300 and all(sum(p.gold for p in e.passages) == 1 for e in nq)
    multihop = load_examples("multihop", real("multihop-rag-queries.part1.jsonl"))
    assert len(multihop) == 250 and all(bool(e.answers) == bool(e.passages) for e in multihop)
    babilong = load_examples("babilong", real("babilong"))
    assert [e.id for e in babilong] == ["babilong_8k", "babilong_16k", "babilong_32k", "babilong_64k"]
    assert len(load_pool(real("paul-graham-essays.jsonl"))) == 49
