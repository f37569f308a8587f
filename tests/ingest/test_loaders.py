"""Loaders: markdown, text, HTML and PDF into Document records; folders with bad files; PDF headings and errors."""

from __future__ import annotations

import hashlib
import io
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from marginalia.errors import BadInput, EmptyDocument, MissingDependency
from marginalia.ingest.html import html_to_markdown
from marginalia.ingest.loaders import LoadReport, Skipped, content_id, load_document, load_paths, read_document
from marginalia.ingest.pdf import RawHeading, _Box, _two_column_order, heading_levels, numbering_depth, split_byline
from marginalia.ingest.sections import parse_sections
from marginalia.records import Document

# -- markdown, text, html -----------------------------------------------------------

MARKDOWN = "Intro line.\n\n# The Granary\n\nIt stores barley.\n\n## Roof\n\nSlate, mended in May.\n"


def test_markdown_loads_as_is(tmp_path: Path) -> None:
    path = tmp_path / "granary.md"
    path.write_text(MARKDOWN, encoding="utf-8")
    doc = load_document(path)
    assert isinstance(doc, Document)
    assert (doc.source, doc.text, doc.format, doc.title, doc.page_starts) == (
        str(path), MARKDOWN, "markdown", "The Granary", ())
    assert doc.doc_id == hashlib.sha256(MARKDOWN.encode()).hexdigest()[:20] == content_id(MARKDOWN)


def test_same_text_same_id_other_text_other_id(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text(MARKDOWN, encoding="utf-8")
    (tmp_path / "b.markdown").write_text(MARKDOWN, encoding="utf-8")
    (tmp_path / "c.md").write_text(MARKDOWN + "more\n", encoding="utf-8")
    ids = [load_document(tmp_path / name).doc_id for name in ("a.md", "b.markdown", "c.md")]
    assert ids[0] == ids[1] != ids[2]


@pytest.mark.parametrize("name", ["notes.txt", "notes.text", "notes.rst", "notes"])
def test_plain_text_stays_text_without_headings(tmp_path: Path, name: str) -> None:
    text = "# not a heading in a text file\n\nJust words.\n"
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    doc = load_document(path)
    assert (doc.text, doc.format, doc.title) == (text, "text", "notes")
    sections = parse_sections(doc)
    assert len(sections) == 1 and sections[0].body_start == 0


def test_read_document_returns_the_record(tmp_path: Path) -> None:
    path = tmp_path / "granary.md"
    path.write_text(MARKDOWN, encoding="utf-8")
    doc = read_document(path)
    assert isinstance(doc, Document) and doc.format == "markdown" and doc.text == MARKDOWN
    piped = read_document("-", stdin=io.BytesIO(b"piped words\n"))
    assert isinstance(piped, Document)
    assert (piped.source, piped.text, piped.format, piped.doc_id) == (
        "<stdin>", "piped words\n", "text", content_id("piped words\n"))


def test_unsupported_suffix(tmp_path: Path) -> None:
    path = tmp_path / "letter.docx"
    path.write_bytes(b"PK\x03\x04 zipped")
    with pytest.raises(BadInput) as info:
        load_document(path)
    assert "'.docx'" in str(info.value) and ".pdf" in str(info.value) and info.value.path == str(path)


HTML = """<!DOCTYPE html>
<html><head><title> Mill &amp; Weir </title>
<style>h1 { color: red }</style><script>document.write("<p>injected</p>")</script></head>
<body>
<nav><a href="/">Home</a> <a href="/about">About</a></nav>
<h1>The <em>Mill</em></h1>
<p>Built in   1802 by the <b>river</b>,<br>rebuilt in 1870.</p>
<h2>Parts</h2>
<ul><li>Wheel</li><li>Stones<ol><li>upper</li><li>lower</li></ol></li></ul>
<pre><code>turn(wheel)
    grind(barley)   # slowly
</code></pre>
<p># of sacks: 40</p>
<blockquote><p>A fine mill.</p></blockquote>
<table><tr><th>Part</th><th>Age</th></tr><tr><td>Wheel</td><td>12 | 13</td></tr></table>
<h3>Visiting</h3>Open on <code>Sundays</code>.
<footer><p>Page footer</p></footer>
</body></html>
"""

HTML_MARKDOWN = """# The Mill

Built in 1802 by the river,
rebuilt in 1870.

## Parts

- Wheel

- Stones

  1. upper

  2. lower

```
turn(wheel)
    grind(barley)   # slowly
```

\\# of sacks: 40

> A fine mill.

| Part | Age |
| --- | --- |
| Wheel | 12 \\| 13 |

### Visiting

Open on `Sundays`.

Page footer
"""


def test_html_to_markdown_golden() -> None:
    markdown, title = html_to_markdown(HTML)
    assert markdown == HTML_MARKDOWN
    assert title == "Mill & Weir"


def test_html_loader(tmp_path: Path) -> None:
    path = tmp_path / "mill.html"
    path.write_text(HTML, encoding="utf-8")
    doc = load_document(path)
    assert (doc.text, doc.format, doc.title) == (HTML_MARKDOWN, "html", "Mill & Weir")
    assert [s.title for s in parse_sections(doc)[1:]] == ["The Mill", "Parts", "Visiting"]
    # a page without <title> takes its first heading; one without a suffix is recognised by its content
    bare = tmp_path / "page"
    bare.write_text("<!doctype html><body><h2>Weir</h2><p>Water.</p></body>", encoding="utf-8")
    doc = load_document(bare)
    assert (doc.format, doc.title, doc.text) == ("html", "Weir", "## Weir\n\nWater.\n")


def test_html_without_text_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.html"
    path.write_text("<html><head><script>x()</script></head><body><nav>menu</nav></body></html>", encoding="utf-8")
    with pytest.raises(BadInput) as info:
        load_document(path)
    assert "no text" in str(info.value) and str(path) in str(info.value)


# -- folders ----------------------------------------------------------------------------


def test_load_paths_mixed_folder(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "b.md").write_text("# Bee\n\nHoney.\n", encoding="utf-8")
    (root / "a.txt").write_text("Apples.\n", encoding="utf-8")
    (root / "sub" / "c.html").write_text("<h1>Sea</h1><p>Salt.</p>", encoding="utf-8")
    (root / "sub" / "copy.md").write_text("# Bee\n\nHoney.\n", encoding="utf-8")
    (root / "latin.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    (root / "empty.md").write_bytes(b"  \n")
    (root / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (root / "bin").write_bytes(b"\x00\x01\x02")
    (root / ".hidden.md").write_text("# Hidden\n", encoding="utf-8")
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n", encoding="utf-8")
    calls: list[tuple[int, int, str]] = []

    report = load_paths([root, root / "b.md", tmp_path / "missing.md"], progress=lambda *a: calls.append(a))

    assert isinstance(report, LoadReport)
    # named from the folder given down, never by where it lies
    assert [d.source for d in report.documents] == ["docs/a.txt", "docs/b.md", "docs/sub/c.html"]
    reasons = {Path(s.path).name: s.reason for s in report.skipped}
    assert sorted(reasons) == ["bin", "copy.md", "empty.md", "latin.txt", "missing.md", "photo.png"]
    assert "binary" in reasons["bin"]
    assert "same text as" in reasons["copy.md"] and reasons["copy.md"].endswith("b.md")
    assert "empty" in reasons["empty.md"]
    assert "UTF-8" in reasons["latin.txt"] and "iconv" in reasons["latin.txt"]
    assert "no such file" in reasons["missing.md"]
    assert "'.png'" in reasons["photo.png"]
    assert report.notes == ()
    assert [c[:2] for c in calls] == [(i, 9) for i in range(1, 10)]
    assert calls[-1][2] == str(tmp_path / "missing.md")
    # the same call gives the same report; without recursion the subfolder is left out
    assert load_paths([root, root / "b.md", tmp_path / "missing.md"]) == report
    flat = load_paths([root], recursive=False)
    assert [Path(d.source).name for d in flat.documents] == ["a.txt", "b.md"]


def test_load_paths_survives_a_link_loop(tmp_path: Path) -> None:
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "doc.md").write_text("# Loop\n\nSafe.\n", encoding="utf-8")
    (tmp_path / "inner" / "up").symlink_to(tmp_path, target_is_directory=True)
    report = load_paths([tmp_path])
    assert [Path(d.source).name for d in report.documents] == ["doc.md"] and report.skipped == ()


def test_text_that_mentions_pdf_is_not_a_pdf(tmp_path: Path) -> None:
    path = tmp_path / "notes.md"
    path.write_text("# Formats\n\nA PDF file starts with %PDF-1.7 and ends with %%EOF.\n", encoding="utf-8")
    assert load_document(path).format == "markdown"


# -- PDF: heading levels and reading order (pure functions) ------------------------


def test_numbering_depth() -> None:
    cases = {"1 Introduction": 1, "2.1 Data": 2, "3.2.1. Notes": 3, "10 Conclusion": 1, "A.1 Proofs": 2,
             "Appendix B Tables": 1, "IV. RESULTS": 1, "Abstract": None, "2019 in review": None,
             "3D scenes": None, "References": None}
    assert {title: numbering_depth(title) for title in cases} == cases


def _levels(spec: list[tuple[int, str, int]]) -> tuple[list[int], int | None]:
    return heading_levels([RawHeading(rank, title, page) for rank, title, page in spec])


def test_levels_follow_numbering_not_font_ranks() -> None:
    # title 18 pt, sections 12 pt, "Abstract" 11 pt, subsections 10 pt: font ranks 1, 2, 3, 4
    levels, title = _levels([(1, "Tidal Ledgers", 1), (3, "Abstract", 1), (2, "1 Introduction", 1),
                             (2, "2 Method", 1), (4, "2.1 Data", 2), (4, "2.2 Analysis", 2),
                             (2, "3 Results", 2), (2, "References", 3)])
    assert title == 0
    assert levels == [1, 2, 2, 2, 3, 3, 2, 2]


def test_small_numbered_lines_do_not_become_sections() -> None:
    # a manual's appendix with a licence whose numbered clauses are small bold lines
    levels, title = _levels([(1, "Manual", 1), (2, "1 Introduction", 2), (3, "1.1 Scope", 2),
                             (4, "parse_tree", 3), (2, "Appendix A Copying", 4), (3, "A.1 Licence", 4),
                             (5, "0. PREAMBLE", 4), (5, "1. APPLICABILITY", 5), (5, "2. COPYING", 5)])
    assert title == 0
    assert levels == [1, 2, 3, 4, 2, 3, 5, 5, 5]


def test_levels_without_numbers_are_font_ranks() -> None:
    levels, title = _levels([(2, "Overview", 1), (4, "Setup", 1), (4, "Usage", 2), (2, "Notes", 3)])
    assert (levels, title) == ([1, 2, 2, 1], None)
    assert _levels([]) == ([], None)


def test_no_title_when_the_largest_font_repeats() -> None:
    levels, title = _levels([(1, "Part One", 1), (2, "1 Start", 1), (1, "Part Two", 2), (2, "2 End", 2)])
    assert title is None
    assert levels == [1, 1, 1, 1]


def _box(x0: float, y0: float, x1: float, y1: float, name: str) -> _Box:
    return _Box("text", (x0, y0, x1, y1), name)


def test_two_column_order() -> None:
    title = _box(150, 60, 450, 80, "title")
    l1, l2, l_tail = _box(50, 100, 290, 300, "l1"), _box(50, 310, 290, 700, "l2"), _box(50, 701, 200, 712, "l-tail")
    r1, r2 = _box(310, 100, 550, 400, "r1"), _box(310, 410, 550, 700, "r2")
    figure = _box(50, 720, 550, 800, "figure")
    # pymupdf4llm's order for this page put the left column's last line after the right column
    order = _two_column_order([title, l1, l2, r1, r2, l_tail, figure])
    assert [b.text for b in order] == ["title", "l1", "l2", "l-tail", "r1", "r2", "figure"]
    # a box that sits beside both columns means the page is not cleanly two-column: the order stays
    wide = _box(50, 350, 550, 360, "wide")
    given = [title, l1, wide, r1]
    assert _two_column_order(given) == given


def test_split_byline_cuts_where_the_titles_words_end() -> None:
    markdown = "**PaSa: An LLM Agent** for Search Yichen He<sup>\u2217</sup><sup>1</sup> Guanhua Huang<sup>1</sup>"
    assert split_byline(markdown, "PaSa: An LLM Agent for Search") == (
        "**PaSa: An LLM Agent** for Search", "Yichen He<sup>\u2217</sup><sup>1</sup> Guanhua Huang<sup>1</sup>")
    assert split_byline("Title<sup>*</sup> Ada Lovelace", "Title*") == ("Title<sup>*</sup>", "Ada Lovelace")
    # words that do not line up, a title that is the whole heading, or no title: nothing is cut
    assert split_byline(markdown, "PaSa: A different title") is None
    assert split_byline("Only a Title", "Only a Title") is None
    assert split_byline("Only a Title", "") is None


# -- PDF files (pymupdf) ------------------------------------------------------------

W, H, MARGIN, GUTTER = 595.0, 842.0, 56.0, 18.0
COLUMN = (W - 2 * MARGIN - GUTTER) / 2
WORDS = ("harbour tide ledger granary canal barley lantern rope quarry orchard meadow mill bridge market "
         "council choir bakery ferry beacon cellar survey sample estimate measure record").split()


def paragraph(seed: int, sentences: int = 6) -> str:
    rng = random.Random(seed)
    return " ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))).capitalize() + "."
                    for _ in range(sentences))


def _wrap(pymupdf: Any, text: str, font: str, size: float, width: float) -> list[str]:
    lines: list[str] = []
    line = ""
    for word in text.split():
        trial = f"{line} {word}".strip()
        if pymupdf.get_text_length(trial, fontname=font, fontsize=size) <= width:
            line = trial
        else:
            lines.append(line)
            line = word
    return lines + [line] if line else lines


PAPER = [
    ("h1", "1 Introduction"), ("p", paragraph(1)), ("p", paragraph(2)),
    ("h1", "2 Method"), ("p", paragraph(3)),
    ("h2", "2.1 Data Collection"), ("p", paragraph(4)), ("p", paragraph(5)),
    ("h2", "2.2 Analysis"), ("p", paragraph(6)), ("p", paragraph(7)),
    ("h1", "3 Results"), ("p", paragraph(8)), ("p", paragraph(9)), ("p", paragraph(10)),
    ("h2", "3.1 Main Findings"), ("p", paragraph(11)), ("p", paragraph(12)),
    ("h2", "3.2 Limits"), ("p", paragraph(13)), ("p", paragraph(14)),
    ("h1", "4 Discussion"), ("p", paragraph(15)), ("p", paragraph(16)),
    ("h2", "4.1 Threats to Validity"), ("p", paragraph(17)), ("p", paragraph(18)), ("p", paragraph(19)),
    ("h1", "5 Conclusion"), ("p", paragraph(20)), ("p", paragraph(21)),
    ("h1", "References"), ("p", paragraph(22, 3)),
]


def write_paper(pymupdf: Any, path: Path) -> None:
    """A two-column academic-style paper: title, authors, abstract across the page, then two columns of
    numbered sections (12 pt), subsections (10 pt) and body text (9 pt) over three pages, with a running
    head and page numbers."""
    doc = pymupdf.open()
    page = doc.new_page(width=W, height=H)

    def centred(y: float, text: str, font: str, size: float) -> None:
        x = (W - pymupdf.get_text_length(text, fontname=font, fontsize=size)) / 2
        page.insert_text((x, y), text, fontname=font, fontsize=size)

    centred(80, "Tidal Ledgers of Small Harbours", "hebo", 18)
    centred(104, "Ada Author and Ben Writer", "helv", 11)
    centred(136, "Abstract", "hebo", 11)
    y = 152.0
    for line in _wrap(pymupdf, paragraph(0, 5), "helv", 9, W - 2 * MARGIN - 80):
        page.insert_text((MARGIN + 40, y), line, fontname="helv", fontsize=9)
        y += 11
    top = y + 20
    column, y = 0, top
    styles = {"h1": ("hebo", 12.0, 14.0, 5.0), "h2": ("hebo", 10.0, 10.0, 4.0), "p": ("helv", 9.0, 0.0, 6.0)}
    for kind, text in PAPER:
        font, size, before, after = styles[kind]
        for i, line in enumerate(_wrap(pymupdf, text, font, size, COLUMN)):
            need = size * 1.25 + (before if i == 0 else 0) + (33 if kind != "p" else 0)  # keep a heading with text
            if y + need > H - 70:
                column, y = column + 1, top
                if column == 2:
                    page = doc.new_page(width=W, height=H)
                    column, y = 0, 70.0
                    top = y
            if i == 0 and y > top + 1:
                y += before
            page.insert_text((MARGIN + column * (COLUMN + GUTTER), y + size), line, fontname=font, fontsize=size)
            y += size * 1.25
        y += after
    for number, p in enumerate(doc, 1):
        p.insert_text((W / 2 - 3, H - 36), str(number), fontname="helv", fontsize=8)
        if number > 1:
            p.insert_text((MARGIN, 40), "Tidal Ledgers - preprint", fontname="helv", fontsize=8)
    doc.set_metadata({"title": "Metadata Title"})
    doc.save(path)


@pytest.fixture(scope="module")
def pdf_libs() -> Any:
    pytest.importorskip("pymupdf4llm")
    return pytest.importorskip("pymupdf")


@pytest.fixture(scope="module")
def paper(pdf_libs: Any, tmp_path_factory: pytest.TempPathFactory) -> Document:
    path = tmp_path_factory.mktemp("paper") / "paper.pdf"
    write_paper(pdf_libs, path)
    assert len(pdf_libs.open(path)) == 3
    return load_document(path)


def _squash(text: str) -> str:
    return " ".join(text.replace("**", "").split())


def test_two_column_paper_section_tree(paper: Document) -> None:
    sections = parse_sections(paper)
    tree = [(s.level, s.title) for s in sections[1:]]
    assert tree == [
        (1, "Tidal Ledgers of Small Harbours"), (2, "Abstract"), (2, "1 Introduction"), (2, "2 Method"),
        (3, "2.1 Data Collection"), (3, "2.2 Analysis"), (2, "3 Results"), (3, "3.1 Main Findings"),
        (3, "3.2 Limits"), (2, "4 Discussion"), (3, "4.1 Threats to Validity"), (2, "5 Conclusion"),
        (2, "References"),
    ]
    by_title = {s.title: s for s in sections}
    assert by_title["2.2 Analysis"].path == ("Tidal Ledgers of Small Harbours", "2 Method", "2.2 Analysis")
    assert by_title["2 Method"].children == (by_title["2.1 Data Collection"].index, by_title["2.2 Analysis"].index)
    assert (paper.format, paper.title) == ("pdf", "Tidal Ledgers of Small Harbours")


def test_two_column_paper_text_in_reading_order(paper: Document) -> None:
    flat = _squash(paper.text)
    # every paragraph comes out whole (columns are not interleaved, a paragraph cut by a column or
    # page break is joined again), and in the order it was written
    positions = [flat.find(_squash(text)) for kind, text in PAPER if kind == "p"]
    assert -1 not in positions
    assert positions == sorted(positions)
    blocks = {_squash(block) for block in paper.text.split("\n\n")}
    assert [text for kind, text in PAPER if kind == "p" and _squash(text) not in blocks] == []
    assert flat.find(_squash(paragraph(0, 5))) < flat.find("1 Introduction")
    # the running head and the page numbers are gone; the author line stays
    assert "preprint" not in paper.text and "Ada Author and Ben Writer" in paper.text
    assert not any(line.strip().isdigit() for line in paper.text.splitlines())


def test_two_column_paper_pages(paper: Document) -> None:
    assert len(paper.page_starts) == 3 and paper.page_starts[0] == 0
    assert list(paper.page_starts) == sorted(paper.page_starts)
    assert paper.page_at(paper.text.index("# 1 Introduction")) == 1
    assert paper.page_at(paper.text.index("# References")) == 3
    last_words = _squash(paragraph(22, 3))[-40:]
    assert paper.page_at(paper.text.index(last_words[-20:])) == 3


def test_a_title_box_holding_the_byline_keeps_only_the_title(pdf_libs: Any, tmp_path: Path) -> None:
    """An arXiv-style first page whose title and author line (affiliation marks as superscripts) the layout
    model puts in one title box: the byline becomes text under the title, not part of every section path."""
    pymupdf = pdf_libs
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_text((100, 90), "PaSa: An LLM Agent for Comprehensive", fontsize=17, fontname="hebo")
    page.insert_text((150, 111), "Academic Paper Search", fontsize=17, fontname="hebo")
    x = 110.0
    for name, mark in [("Yichen He", "*1"), ("Guanhua Huang", "1"), ("Peiyuan Feng", "2")]:
        page.insert_text((x, 124), name, fontsize=11, fontname="helv")
        x += pymupdf.get_text_length(name, "helv", 11) + 1
        page.insert_text((x, 120.15), mark, fontsize=7.15, fontname="helv")
        x += pymupdf.get_text_length(mark, "helv", 7.15) + 8
    page.insert_text((140, 139), "1 ByteDance Research  2 Peking University", fontsize=10, fontname="helv")
    page.insert_text((72, 179), "Abstract", fontsize=12, fontname="hebo")
    for i in range(12):
        page.insert_text((72, 197 + 13 * i), f"We introduce PaSa, an advanced paper search agent powered by "
                                             f"models, line {i}.", fontsize=10, fontname="helv")
    path = tmp_path / "pasa.pdf"
    doc.save(path)
    import pymupdf4llm

    raw = pymupdf4llm.to_markdown(str(path), page_chunks=True, header=True, footer=True, show_progress=False)
    assert "Search** Yichen He<sup>*1</sup> Guanhua" in raw[0]["text"]  # one heading, as on the real paper

    loaded = load_document(path)
    title = "PaSa: An LLM Agent for Comprehensive Academic Paper Search"
    assert loaded.title == title
    sections = parse_sections(loaded)
    assert [s.path for s in sections[1:]] == [(title,), (title, "Abstract")]
    byline = loaded.text[sections[1].body_start:sections[1].body_end]
    assert byline.startswith("Yichen He∗¹ Guanhua Huang¹") and "Peking University" in byline  # marks raised


def _image_page(pymupdf: Any, doc: Any) -> None:
    pixmap = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 40, 40), False)
    pixmap.clear_with(180)
    doc.new_page().insert_image(pymupdf.Rect(72, 72, 400, 400), pixmap=pixmap)


def _text_page(doc: Any, text: str) -> None:
    page = doc.new_page()
    for i, line in enumerate(text.split("\n")):
        page.insert_text((72, 100 + 16 * i), line, fontsize=11)


def test_corrupt_pdf(pdf_libs: Any, tmp_path: Path) -> None:
    path = tmp_path / "broken.pdf"
    path.write_bytes(b"%PDF-1.7\n1 0 obj <</Type /Catalog garbage\n")
    with pytest.raises(BadInput) as info:
        load_document(path)
    message = str(info.value)
    assert "not a readable PDF" in message and str(path) in message and info.value.path == str(path)


def test_encrypted_pdf(pdf_libs: Any, tmp_path: Path) -> None:
    doc = pdf_libs.open()
    _text_page(doc, "A secret ledger.")
    path = tmp_path / "locked.pdf"
    doc.save(path, encryption=pdf_libs.PDF_ENCRYPT_AES_256, user_pw="secret", owner_pw="owner")
    with pytest.raises(BadInput) as info:
        load_document(path)
    assert "password-protected" in str(info.value) and "qpdf --decrypt" in str(info.value)


def test_pdf_without_pages(pdf_libs: Any, tmp_path: Path) -> None:
    # a well-formed file (with a correct cross-reference table) whose page tree is empty
    objects = [b"<</Type/Catalog/Pages 2 0 R>>", b"<</Type/Pages/Kids[]/Count 0>>"]
    data = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(data))
        data += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(data)
    data += b"xref\n0 3\n0000000000 65535 f \n" + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    data += b"trailer\n<</Size 3/Root 1 0 R>>\nstartxref\n%d\n%%%%EOF\n" % xref
    path = tmp_path / "zero.pdf"
    path.write_bytes(data)
    with pytest.raises(BadInput) as info:
        load_document(path)
    assert "no pages" in str(info.value)


def test_pdf_with_blank_pages(pdf_libs: Any, tmp_path: Path) -> None:
    doc = pdf_libs.open()
    doc.new_page()
    doc.new_page()
    path = tmp_path / "blank.pdf"
    doc.save(path)
    with pytest.raises(BadInput) as info:
        load_document(path)
    assert "no text" in str(info.value) and "blank" in str(info.value)


def test_scanned_pdf_needs_ocr(pdf_libs: Any, tmp_path: Path) -> None:
    doc = pdf_libs.open()
    _image_page(pdf_libs, doc)
    _image_page(pdf_libs, doc)
    path = tmp_path / "scan.pdf"
    doc.save(path)
    with pytest.raises(BadInput) as info:
        load_document(path)
    assert "no text layer" in str(info.value) and f"ocrmypdf {path}" in str(info.value)
    assert info.value.page == 1 and info.value.path == str(path)


def test_partly_scanned_pdf_loads_with_a_note(pdf_libs: Any, tmp_path: Path) -> None:
    doc = pdf_libs.open()
    _image_page(pdf_libs, doc)
    _text_page(doc, "The ferry runs at noon.\nIt stops at the mill.")
    _image_page(pdf_libs, doc)
    path = tmp_path / "part.pdf"
    doc.save(path)
    report = load_paths([path])
    (loaded,) = report.documents
    assert "The ferry runs at noon." in loaded.text
    assert len(loaded.page_starts) == 3
    assert loaded.page_at(loaded.text.index("ferry")) == 2
    (note,) = report.notes
    assert note.path == str(path)
    assert "pages 1, 3 have no text layer" in note.message and "ocrmypdf part.pdf" in note.message


def test_truncated_pdf_loads_what_remains_with_a_note(pdf_libs: Any, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    doc = pdf_libs.open()
    _text_page(doc, "First page, about the mill.")
    _text_page(doc, "Second page, about the weir.")
    data = doc.tobytes()
    path = tmp_path / "cut.pdf"
    path.write_bytes(data[: len(data) // 2])
    notes: list[str] = []
    with caplog.at_level(logging.WARNING):
        loaded = load_document(path, notes=notes)
    assert "First page, about the mill." in loaded.text
    assert len(notes) == 1 and "is damaged" in notes[0] and "startxref" in notes[0]
    assert caplog.messages == []
    with caplog.at_level(logging.WARNING):  # without a list to take them, the notes are logged
        load_document(path)
    assert caplog.messages == notes


def test_pdf_problems_in_a_folder_are_skips(pdf_libs: Any, tmp_path: Path) -> None:
    (tmp_path / "bad.pdf").write_bytes(b"%PDF-1.7 not really")
    doc = pdf_libs.open()
    _text_page(doc, "Harbour dues are paid in May.")
    doc.save(tmp_path / "good.pdf")
    (tmp_path / "note.md").write_text("# Dues\n\nPaid yearly.\n", encoding="utf-8")
    report = load_paths([tmp_path])
    assert [Path(d.source).name for d in report.documents] == ["good.pdf", "note.md"]
    assert [(Path(s.path).name, "not a readable PDF" in s.reason) for s in report.skipped] == [("bad.pdf", True)]
    assert report.documents[0].format == "pdf" and "Harbour dues" in report.documents[0].text


def test_pdf_content_wins_over_suffix(pdf_libs: Any, tmp_path: Path) -> None:
    doc = pdf_libs.open()
    _text_page(doc, "Nets are mended on Tuesdays.")
    path = tmp_path / "download"
    doc.save(path)
    loaded = load_document(path)
    assert loaded.format == "pdf" and "Nets are mended on Tuesdays." in loaded.text
    assert read_document(path) == loaded  # the CLI's reader takes PDFs too


def test_pdf_without_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pymupdf4llm", None)  # makes `import pymupdf4llm` fail
    path = tmp_path / "paper.pdf"
    path.write_bytes(b"%PDF-1.7 whatever")
    with pytest.raises(MissingDependency) as info:
        load_document(path)
    assert "pip install 'marginalia[pdf]'" in str(info.value)
    report = load_paths([path])
    assert report.skipped == (Skipped(str(path), str(info.value)),)


def test_documents_are_named_without_the_file_system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    papers = tmp_path / "home" / "someone" / "papers"
    (papers / "2024").mkdir(parents=True)
    (papers / "2024" / "x.md").write_text("# X\n\nAbout x.\n", encoding="utf-8")
    single = tmp_path / "notes.txt"
    single.write_text("Notes on y.\n", encoding="utf-8")
    monkeypatch.chdir(papers)

    report = load_paths([papers, single, "."])

    assert [d.source for d in report.documents] == ["papers/2024/x.md", "notes.txt"]
    assert all(str(tmp_path) not in d.source for d in report.documents)


def test_a_page_of_unterminated_tags_converts_in_linear_time(tmp_path: Path) -> None:
    # each would cost the standard library's parser minutes at this size (a rescan to the end per tag)
    for unit in ("<a", "<?", "</", "<!--", '<a x="', "<a b='>"):
        page = tmp_path / "hostile.html"
        page.write_text(unit * (300_000 // len(unit)) + "<p>the end</p>", encoding="utf-8")
        started = time.monotonic()
        try:
            doc = load_document(page)
        except EmptyDocument:
            doc = None
        assert time.monotonic() - started < 10, unit
        assert doc is None or len(doc.text) < 400_000


def test_a_path_names_the_document_whatever_folder_was_indexed(tmp_path: Path) -> None:
    from marginalia.ingest.loaders import best_name, document_name, names_for

    papers = tmp_path / "papers"
    file = papers / "2024" / "x.md"
    # indexed as the file alone, from its folder, from the folder above: each name is one of the path's
    for given in (file, papers, papers / "2024"):
        assert document_name(file, given) in names_for(str(file))
    assert names_for("/home/me/papers/x.md") == {"/home/me/papers/x.md", "home/me/papers/x.md", "me/papers/x.md",
                                                 "papers/x.md", "x.md"}
    assert "y.md" not in names_for("papers/x.md")
    # the most specific name wins where two documents share a file name
    assert best_name(str(file), ["x.md", "2024/x.md", "other/x.md"]) == "2024/x.md"
    assert best_name(str(file), ["y.md"]) is None and best_name("x.md", ["x.md"]) == "x.md"
