"""`app.index_paths` with a source name (how the server indexes an upload's saved copy) and into an open
collection."""

from __future__ import annotations

from pathlib import Path

import pytest

from marginalia import app
from marginalia.errors import IngestError, UserError
from marginalia.index.embedders import HashingEmbedder
from marginalia.index.store import Collection

pytest.importorskip("lancedb")


def words(text: str) -> int:
    return len(text.split())


def test_a_file_is_indexed_under_the_source_name_it_is_given(tmp_path: Path):
    copy = tmp_path / "saved" / "document.md"
    copy.parent.mkdir()
    copy.write_text("# Tides\n\nHigh water at the harbour mouth comes at noon.\n")
    seen = []
    report = app.index_paths([copy], "docs", count_tokens=words, home=tmp_path / "home", embedder=HashingEmbedder(),
                             source="tides.md", on_file=lambda done, total, name: seen.append((done, total, name)))
    (item,) = report.indexed
    assert (item.document.source, item.result.source, item.result.status) == ("tides.md", "tides.md", "added")
    assert seen == [(1, 1, "tides.md")]
    store = app.open_collection("docs", home=tmp_path / "home")
    assert [d.source for d in store.documents()] == ["tides.md"]
    assert "document.md" not in store.document(item.result.doc_id).source


def test_an_unreadable_named_file_raises_naming_its_source_not_its_path(tmp_path: Path):
    copy = tmp_path / "document.txt"
    copy.write_bytes(b"\x00\x01binary\x00")
    with pytest.raises(IngestError) as caught:
        app.index_paths([copy], "docs", count_tokens=words, home=tmp_path, embedder=HashingEmbedder(),
                        source="notes.txt")
    assert "notes.txt" in str(caught.value) and str(tmp_path) not in str(caught.value)


def test_a_source_name_goes_with_exactly_one_file(tmp_path: Path):
    for name in ("a.md", "b.md"):
        (tmp_path / name).write_text(f"# {name}\n\ntext\n")
    with pytest.raises(UserError, match="exactly one file"):
        app.index_paths([tmp_path / "a.md", tmp_path / "b.md"], "docs", count_tokens=words, home=tmp_path,
                        embedder=HashingEmbedder(), source="both.md")
    with pytest.raises(UserError, match="exactly one file"):
        app.index_paths([tmp_path], "docs", count_tokens=words, home=tmp_path, embedder=HashingEmbedder(),
                        source="folder.md")


def test_an_open_collection_is_used_with_its_own_embedder(tmp_path: Path):
    class Counting(HashingEmbedder):
        calls = 0

        def _embed(self, texts, kind):
            Counting.calls += 1
            return super()._embed(texts, kind)

    store = Collection.open("docs", home=tmp_path, create=True, embedder=Counting())
    (tmp_path / "a.md").write_text("# A\n\nThe lighthouse keeper rows out at dusk.\n")
    report = app.index_paths([tmp_path / "a.md"], store, count_tokens=words)
    assert report.collection == "docs" and report.indexed[0].result.status == "added"
    assert Counting.calls > 0  # the collection's embedder, not one loaded by name
