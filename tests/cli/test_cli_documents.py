"""The collection commands end to end: index, search, questions, collections, and ask --collection."""

from __future__ import annotations

import json

import pytest

from test_cli import run_cli

pytest.importorskip("lancedb")

HARBOUR = """# Harbour report

## Dredging

Silt builds up in the inner basin every year. The dredger hired for the work was the Orla Maye.

The work took six weeks and lifted 18,400 cubic metres of silt.

## Lifeboat

The lifeboat launched 37 times this year. Its new coxswain is Ingrid Tasker.
"""

FERRY = "<html><head><title>Ferries</title></head><body><h1>Night ferry</h1>" \
        "<p>The night ferry to Brackwater leaves from pier 47.</p></body></html>"


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "harbour.md").write_text(HARBOUR, encoding="utf-8")
    (folder / "ferry.html").write_text(FERRY, encoding="utf-8")
    (folder / "photo.jpg").write_bytes(b"\xff\xd8\xff\xe0 not text")
    return folder


def index(corpus, *extra: str) -> tuple[int, str, str]:
    return run_cli("index", str(corpus), "--collection", "docs", "--embedder", "hashing",
                   "--model", "scripted:x", *extra)


def test_index_reports_each_file_and_is_idempotent(corpus):
    code, out, err = index(corpus)
    assert code == 0
    lines = out.splitlines()
    assert any(line.startswith("added") and "harbour.md" in line for line in lines)
    assert any(line.startswith("added") and "ferry.html" in line for line in lines)
    assert any(line.startswith("skipped") and "photo.jpg" in line and "unsupported" in line for line in lines)
    assert "2 added, 1 skipped" in err
    code, out, err = index(corpus)
    assert code == 0
    assert "2 unchanged, 1 skipped" in err
    code, out, _ = run_cli("collections", "list", "--json")
    (info,) = json.loads(out)
    assert (info["name"], info["n_documents"], info["embedder"]) == ("docs", 2, "hashing")


def test_search_shows_section_paths_and_json(corpus):
    index(corpus)
    code, out, _ = run_cli("search", "--collection", "docs", "which dredger was hired", "-k", "2")
    assert code == 0
    first = out.splitlines()[0]
    assert "harbour.md" in first and "Harbour report > Dredging" in first
    code, out, _ = run_cli("search", "--collection", "docs", "night ferry pier", "--json", "--mode", "bm25")
    hits = json.loads(out)
    assert hits[0]["source"].endswith("ferry.html")
    assert hits[0]["section_path"] == ["Night ferry"]
    assert "pier 47" in hits[0]["text"]


def test_ask_a_collection_cites_document_sections(corpus):
    index(corpus)
    code, out, err = run_cli("ask", "--collection", "docs", "Which dredger was hired for the basin?",
                             "--model", "scripted:The Orla Maye.", "--pattern", "lc", "--json", "--uncertain", "0.05")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["text"] == "The Orla Maye."
    assert answer["retrieval"] == "references"
    refs = answer["references"]
    assert any(r["section_path"] == ["Harbour report", "Dredging"] and r["source"].endswith("harbour.md")
               for r in refs)
    text = (corpus / "harbour.md").read_text(encoding="utf-8")
    for ref in refs:
        if ref["source"].endswith("harbour.md"):
            assert text[ref["start"]:ref["end"]] == ref["text"]


def test_ask_a_collection_refuses_when_nothing_is_relevant(corpus):
    index(corpus)
    code, out, err = run_cli("ask", "--collection", "docs", "zzz qqq xxx?", "--model", "scripted:made up",
                             "--uncertain", "0.99", "--certain", "0.999")
    assert code == 0
    assert "No relevant references" in out
    assert "made up" not in out


def ask_json(*argv: str) -> dict:
    code, out, err = run_cli("ask", "--collection", "docs", *argv, "--uncertain", "0.05", "--json", "-q")
    assert code == 0, err
    return json.loads(out)


def test_ask_a_collection_with_no_pattern_answers_at_rags_cost_and_says_so(corpus):
    index(corpus)
    question, model = "Which dredger was hired for the basin?", "scripted:The Orla Maye."
    answer = ask_json(question, "--model", model)
    rag = ask_json(question, "--model", model, "--pattern", "rag")
    assert answer["pattern"] == "auto" and answer["text"] == "The Orla Maye."
    route = answer["route"]
    assert route["taken"] == "rag" and "stands on the retrieved passages" in route["reason"]
    assert route["signals"]["support"] == 1.0
    assert answer["margins"] == [] and answer["references"] == rag["references"]
    costs = ("prefilled_context_tokens", "prefilled_other_tokens", "generated_margin_tokens",
             "generated_answer_tokens", "generated_other_tokens")
    assert [answer["stats"][k] for k in costs] == [rag["stats"][k] for k in costs]


def test_ask_a_collection_reads_with_wim_where_rags_answer_is_not_in_its_passages(corpus):
    index(corpus)
    question, model = "Which dredger was hired for the basin?", "scripted:Captain Ahab."
    answer = ask_json(question, "--model", model)
    rag = ask_json(question, "--model", model, "--pattern", "rag")
    route = answer["route"]
    assert route["taken"] == "wim" and "not in the retrieved passages" in route["reason"]
    assert route["signals"]["support"] < 0.5
    assert answer["margins"]  # WiM read the retrieved sections
    assert {r["section_path"][-1] for r in answer["references"]} >= {"Dredging"}
    # the cost counts both readings
    assert answer["stats"]["generated_answer_tokens"] > rag["stats"]["generated_answer_tokens"]
    assert answer["stats"]["prefilled_context_tokens"] > rag["stats"]["prefilled_context_tokens"]
    # the human output says the route before WiM reads, and in the summary line
    code, out, err = run_cli("ask", "--collection", "docs", question, "--model", model, "--uncertain", "0.05")
    assert code == 0 and out.strip() == "Captain Ahab."
    said = err.index("route: RAG's answer is not in the retrieved passages")
    assert err.index("reading with WiM", said) < err.index("with wim (") < err.index("auto \u2192 wim: ")


def test_a_question_over_the_whole_collection_goes_to_wim_at_once(corpus):
    index(corpus)
    answer = ask_json("List all the boats named in the reports.", "--model", "scripted:The Orla Maye.")
    assert answer["route"] == {"taken": "wim", "reason": "the question gathers over the whole document",
                               "signals": {}}
    assert answer["margins"]


def test_nothing_relevant_in_a_collection_is_not_read_again(corpus):
    index(corpus)
    code, out, err = run_cli("ask", "--collection", "docs", "zzz qqq xxx?", "--model", "scripted:made up",
                             "--uncertain", "0.99", "--certain", "0.999")
    assert code == 0 and "No relevant references" in out
    assert err.count("retrieval: no relevant references") == 1 and "with wim" not in err
    assert "route: nothing in the collection is relevant to it" in err and "auto \u2192 rag" in err


def test_questions_generate_and_export(corpus, tmp_path):
    index(corpus)
    reply = 'Which dredger was hired for the work?", "answer": "the Orla Maye"'
    code, out, err = run_cli("questions", "generate", "--collection", "docs", "--density", "dense",
                             "--model", f"scripted:{reply}", "--doc", str(corpus / "harbour.md"))
    assert code == 0, err
    assert "1 pairs (1 new)" in out  # the same question for every chunk is kept once
    target = tmp_path / "bank.jsonl"
    code, _, err = run_cli("questions", "export", "--collection", "docs", "-o", str(target), "--system", "")
    assert code == 0
    (line,) = target.read_text(encoding="utf-8").splitlines()
    assert json.loads(line)["messages"] == [
        {"role": "user", "content": "Which dredger was hired for the work?"},
        {"role": "assistant", "content": "the Orla Maye"},
    ]
    # a close question is now answered from the bank, without the model
    code, out, err = run_cli("ask", "--collection", "docs", "Which dredger was hired for the work?",
                             "--model", "scripted:should not be used", "--json", "--certain", "0.95")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["retrieval"] == "direct"
    assert answer["text"] == "the Orla Maye"
    # by default auto reads, and the bank's answer stands: it is not read again with WiM
    assert answer["pattern"] == "auto" and answer["margins"] == []
    assert answer["route"]["taken"] == "rag" and "a stored question" in answer["route"]["reason"]


def test_collections_delete_a_document_then_the_collection(corpus):
    index(corpus)
    code, _, err = run_cli("collections", "delete", "docs", "--doc", str(corpus / "ferry.html"), "--yes")
    assert code == 0, err
    _, out, _ = run_cli("collections", "show", "docs", "--json")
    assert [d["source"] for d in json.loads(out)] == [f"{corpus.name}/harbour.md"]  # named from the folder down
    code, _, err = run_cli("collections", "delete", "docs", "--yes")
    assert code == 0
    code, _, err = run_cli("search", "--collection", "docs", "dredger")
    assert code == 2 and "no collection named 'docs'" in err and "marginalia index add --collection docs" in err


@pytest.mark.parametrize("argv, message", [
    (["index", "/no/such/folder", "--collection", "x"], "no file or folder at /no/such/folder"),
    (["search", "--collection", "nope", "q"], "no collection named 'nope'"),
    (["search", "--collection", "bad/name", "q"], "collection name"),
    (["ask", "What?"], "give the document to read"),
    (["questions", "export", "--collection", "nope"], "no collection named 'nope'"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message):
    code, out, err = run_cli(*argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_index_skips_a_pdf_over_a_document_limit_saying_which(corpus):
    pytest.importorskip("pymupdf4llm")
    from fuzz_support import pdf_of_pages

    (corpus / "long.pdf").write_bytes(pdf_of_pages(8))
    code, out, err = index(corpus, "--max-pages", "5")
    assert code == 0, err
    (line,) = [line for line in out.splitlines() if "long.pdf" in line]
    assert line.startswith("skipped") and "has 8 pages" in line and "--max-pages" in line
    assert "2 added, 2 skipped" in err
