"""Documents made to break the loaders (random bytes, UTF-8 cut anywhere, one 10 MB line, markdown and HTML
nested thousands of levels deep, nothing at all), through every loader and on into sections and chunks: a
document loads, or is refused with one of the project's errors naming the file; never anything else
(RecursionError, UnicodeDecodeError, IndexError, ...)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_support import (
    HTML_LEVELS,
    MD_LEVELS,
    documents,
    load_and_chunk,
    load_by_name,
    loaders,
    mutated_pdf,
    names,
    nested_html,
    nested_markdown,
)
from marginalia.errors import BadInput, EmptyDocument
from marginalia.ingest.html import html_to_markdown
from marginalia.ingest.loaders import _registry
from marginalia.ingest.sections import parse_sections

pytest.importorskip("lancedb")  # fuzz_support builds the service too

TEXT_SUFFIXES = (".md", ".txt", ".html")


def test_every_loader_is_fuzzed():
    assert {type(loader).__name__ for loader in loaders()} >= {"TextLoader", "MarkdownLoader", "HtmlLoader",
                                                                "PdfLoader"}


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=documents, name=names, loader=st.sampled_from(loaders()))
def test_any_document_through_any_loader_loads_or_is_refused_clearly(data, name, loader):
    assert load_by_name(data, name) in ("ok", "unsupported", "BadInput", "EmptyDocument", "IngestError")
    assert load_and_chunk(loader, data, name) in ("ok", "BadInput", "EmptyDocument", "IngestError")


@pytest.mark.parametrize("level", MD_LEVELS)
def test_markdown_nested_thousands_of_levels_deep(level):
    depth = 2000 if level.endswith(("- ", ". ")) else 5000  # a list's indentation grows with its depth
    data = nested_markdown(depth, level, closed=True).encode()
    for suffix in (".md", ".txt"):
        assert load_and_chunk(_registry()[suffix], data, "deep" + suffix) == "ok"


@pytest.mark.parametrize("closed", [True, False])
@pytest.mark.parametrize("level", HTML_LEVELS)
def test_html_nested_thousands_of_levels_deep(level, closed):
    data = nested_html(5000, level, closed).encode()
    outcome = load_and_chunk(_registry()[".html"], data, "deep.html")
    # script and svg hold no text of the page; everything else keeps its words
    assert outcome == ("EmptyDocument" if level in ("<script>", "<svg>") else "ok")


@pytest.mark.parametrize("suffix", TEXT_SUFFIXES)
def test_one_10_mb_line_loads_with_one_section(suffix):
    data = b"word " * 2_000_000
    doc, _ = _registry()[suffix].load(data, "long" + suffix)
    assert len(doc.text) >= 9_999_999 and doc.text.count("\n") <= 1
    assert len(parse_sections(doc)) == 1


def test_a_long_line_is_cut_into_chunks_inside_the_budget():
    # (a 10 MB line takes tens of seconds to chunk here: benchmarks/server_fuzz.py does that)
    assert load_and_chunk(_registry()[".md"], b"word " * 40_000, "long.md") == "ok"


@pytest.mark.parametrize("data", [b"", b" \n\t", b"\xef\xbb\xbf", b"\xef\xbb\xbf\r\n\r\n"])
@pytest.mark.parametrize("suffix", TEXT_SUFFIXES)
def test_nothing_at_all_is_an_empty_document(suffix, data):
    with pytest.raises(EmptyDocument, match="empty"):
        _registry()[suffix].load(data, "nothing" + suffix)


@pytest.mark.parametrize("html", [b"<html></html>", b"<!doctype html><body><script>x</script><br></body>"])
def test_html_without_text_is_an_empty_document(html):
    with pytest.raises(EmptyDocument, match="no text"):
        _registry()[".html"].load(html, "nothing.html")


@pytest.mark.parametrize(("html", "words"), [
    ("<table><tr><td>the open cell", "the open cell"),
    ("<table><tr><td>a</td><td>b and c", "b and c"),
    ("<p>before</p><pre>print('the open block')", "print('the open block')"),
])
def test_an_html_page_cut_short_keeps_its_open_elements_text(html, words):
    # a table's open cell and an open <pre> were dropped: a truncated page could load as "no text"
    markdown, _ = html_to_markdown(html)
    assert words in markdown


def test_mutated_and_truncated_pdfs_load_or_are_refused_clearly():
    pytest.importorskip("pymupdf4llm")
    pdf = _registry()[".pdf"]

    @settings(max_examples=3, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(seed=st.integers(0, 2**32), flips=st.integers(0, 60), cut=st.floats(0.02, 1.0))
    def loads_or_refused(seed, flips, cut):
        assert load_and_chunk(pdf, mutated_pdf(seed, flips, cut), "paper.pdf") in ("ok", "BadInput", "IngestError")

    loads_or_refused()


@pytest.mark.parametrize("data", [nested_html(3000, "<details><summary>", False).encode(), b"# markdown\n\ntext\n",
                                  b"\x00\x01\x02 random bytes", b"<svg xmlns='http://www.w3.org/2000/svg'/>"])
def test_the_pdf_loader_refuses_what_is_not_a_pdf_before_mupdf_sees_it(data):
    # MuPDF opened deeply nested HTML given to it as a PDF with its HTML reader, and crashed the process
    with pytest.raises(BadInput, match="not a PDF"):
        _registry()[".pdf"].load(data, "misnamed.pdf")
