"""A real two-column paper typeset by pdflatex (tests/data/pdf/paper.tex, our own text) keeps its section tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("pymupdf4llm")

from marginalia.ingest.loaders import load_document  # noqa: E402
from marginalia.ingest.sections import parse_sections  # noqa: E402

HERE = Path(__file__).parents[1] / "data" / "pdf"


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
