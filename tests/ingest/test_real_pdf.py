"""A real two-column paper typeset by pdflatex keeps its section tree, and no extraction markup reaches its text.

tests/data/pdf/paper.tex is our own text; paper.pdf is built from it with
``SOURCE_DATE_EPOCH=0 FORCE_SOURCE_DATE=1 pdflatex -interaction=nonstopmode paper.tex`` (TeX Live 2022, the
texlive-latex-base package). Besides its sections it holds what pymupdf4llm writes markup for: an author line
with superscript marks (``<sup>∗1</sup>``), a title and a phrase whose first letters are bold inside the words
(``**Te** st **Pa** per``), and a figure whose labels come out as picture text (HTML comments and ``<br>``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("pymupdf4llm")

from marginalia import RagOptions  # noqa: E402
from marginalia.index.embedders import HashingEmbedder  # noqa: E402
from marginalia.ingest.chunking import chunk_sections  # noqa: E402
from marginalia.ingest.loaders import load_document  # noqa: E402
from marginalia.ingest.sections import parse_sections  # noqa: E402
from marginalia.models.fake import ScriptedGenerator  # noqa: E402
from marginalia.patterns import make_pattern  # noqa: E402

HERE = Path(__file__).parents[1] / "data" / "pdf"
#: what a converter's markup looks like in text: HTML tags and comments, bold or italic delimiters
MARKUP = re.compile(r"</?[A-Za-z][^<>]*>|<!--|-->|\*\*|__|(?<!\w)_(?=\S)|(?<=\S)_(?!\w)")


def tex_sections() -> list[tuple[str, str]]:
    """(title, first words of its first paragraph) for each section of the LaTeX source, in order."""
    tex = (HERE / "paper.tex").read_text(encoding="utf-8")
    found = re.findall(r"\\(?:sub)?section\{([^}]*)\}\n(\S+(?: \S+){5})", tex)
    return [(title, words) for title, words in found]


@pytest.fixture(scope="module")
def paper():
    doc = load_document(HERE / "paper.pdf")
    return doc, parse_sections(doc)


def test_headings_form_a_tree_with_latex_levels(paper):
    doc, sections = paper
    tree = [(s.level, s.title) for s in sections[1:]]
    assert tree == [
        (1, "Margin Notes for Long Documents: A Test Paper"),
        (2, "Abstract"),
        (2, "1 Introduction"), (2, "2 Related Work"),
        (2, "3 Method"), (3, "3.1 Segmenting the Input"), (3, "3.2 Writing Margins"), (3, "3.3 Judging Relevance"),
        (2, "4 Experiments"), (3, "4.1 Datasets"), (3, "4.2 Results"),
        (2, "5 Conclusion"),
    ]
    assert sections[6].path == ("Margin Notes for Long Documents: A Test Paper", "3 Method",
                                "3.1 Segmenting the Input")
    assert len(doc.page_starts) == 3


def test_columns_are_read_in_order(paper):
    """Each section's own text starts with its first sentence from the source: no column is read out of turn."""
    doc, sections = paper
    by_title = {re.sub(r"^[\d.]+ ", "", s.title): s for s in sections}
    for title, words in tex_sections():
        section = by_title[title]
        body = " ".join(doc.text[section.body_start:section.body_end].split())
        assert body.startswith(words), (title, body[:80])


def test_every_paragraph_comes_out_in_source_order(paper):
    doc, _ = paper
    tex = (HERE / "paper.tex").read_text(encoding="utf-8")
    body = tex[tex.index("\\begin{abstract}"):]
    blocks = ["\n".join(line for line in block.splitlines() if not line.startswith("\\"))
              for block in re.split(r"\n\s*\n", body)]
    paragraphs = [b for b in blocks if b.strip()]
    text = " ".join(doc.text.split())
    at = 0
    for paragraph in paragraphs:
        opening = " ".join(paragraph.split()[:6])
        found = text.find(opening, at)
        assert found >= 0, opening
        at = found
    assert len(paragraphs) >= 20


def test_the_text_holds_no_extraction_markup_and_keeps_the_words(paper):
    doc, sections = paper
    assert MARKUP.findall(doc.text) == []
    assert sections[1].title == doc.title == "Margin Notes for Long Documents: A Test Paper"
    assert "\n\nAda Lovelace∗¹, Alan Turing¹, Grace Hopper†²\n\n" in doc.text  # the marks, raised
    assert "We call the method Margin Notes, or MaNo for short." in doc.text  # bold letters inside words
    # the figure's labels stay (a question may be about them), as a paragraph of their own
    assert "\n\nCrawler - Paper Queue - Selector ? [Search] [Expand] [Stop]\n\nFigure 1: The crawler" in doc.text


def test_chunks_hold_no_markup_and_their_spans_are_exact(paper):
    doc, sections = paper
    chunks = chunk_sections(doc, sections, lambda text: len(text.split()), min_tokens=20, max_tokens=60)
    assert len(chunks) > 20
    for chunk in chunks:
        assert chunk.text == doc.text[chunk.start:chunk.end]
        assert MARKUP.findall(chunk.text) == [], chunk.text


@pytest.mark.parametrize("question, needle", [
    ("Who wrote it: Ada Lovelace, Alan Turing and Grace Hopper?", "Ada Lovelace∗¹, Alan Turing¹"),
    ("Which boxes does the figure show: Crawler, Paper Queue, Selector, Search?", "Crawler - Paper Queue"),
    ("What is the method called, Margin Notes or MaNo?", "Margin Notes, or MaNo"),
])
def test_an_answers_references_and_what_the_model_reads_hold_no_markup(paper, question, needle):
    doc, _ = paper
    gen = ScriptedGenerator(default="From the paper.")
    rag = make_pattern(RagOptions(top_k=2, chunk_tokens=64), gen, embedder=HashingEmbedder())
    answer = rag.run(doc.text, question, source=doc.source).answer()
    assert any(needle in ref.text for ref in answer.references)
    for ref in answer.references:
        assert ref.text == doc.text[ref.start:ref.end]
        assert MARKUP.findall(ref.text) == [], ref.text
    assert gen.requests and all(MARKUP.findall(req.prefix + req.suffix) == [] for req in gen.requests)
