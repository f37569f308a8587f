"""The page's document view, in the system Chromium through Playwright: a document is shown as rendered text
(headings, emphasis, lists, tables; no markdown source, no extraction markup), and a clicked reference highlights
exactly its span: a markdown document, and a real two-column PDF uploaded through the page."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from test_web import browser, check_rendered, open_page, serve, set_option, wait_done  # noqa: F401 - the fixture

pytest.importorskip("lancedb")

PAPER = Path(__file__).parents[1] / "data" / "pdf" / "paper.pdf"  # how it is built: tests/ingest/test_real_pdf.py
FACT = "The **night ferry** to Brackwater leaves from *pier 47*; it sails at eleven."
NOTES = f"""# Harbour report

## Ferries

{FACT} Tickets are sold on _board_ only.

- Dredging: the `Orla Maye`, hired again
- Lifeboat: 37 launches
  - a new coxswain, \\*Ingrid\\* Tasker

| Boat | Crew |
|---|---|
| Orla Maye | **6** |

> Silt builds up in the inner basin, as the [harbour map](http://harbour.invalid/map) shows.

<!-- a note for the editors -->

Harbour office
==============

Open from nine<br>to five.
"""
#: what the view may leave out of the notes' text: whitespace, markdown, escapes, a link's target, HTML
NOTES_MARKUP = r"(?:[\s#*_`|>=\\-]|\[|\]\([^)]*\)|<[^<>]*>)*"
#: markdown source or extraction markup, seen on the page
SOURCE = re.compile(r"\*\*|(?:^|\n)#|</?[A-Za-z][^<>]*>|<!--|-->|`|\]\(|^\s*[-|]", re.MULTILINE)


def ask_with_rag(page: Any, question: str) -> None:
    page.click("#patterns label[for='pattern-rag']")
    page.fill("#question", question)
    page.click("#ask-button")
    wait_done(page)


def click_reference_with(page: Any, needle: str) -> tuple[int, int]:
    """Click the reference whose quote shows ``needle``; its span, once highlighted."""
    ref = page.locator("button.ref", has_text=needle).first
    quote = ref.locator(".ref-quote").inner_text()
    assert SOURCE.search(quote) is None, quote
    ref.click()
    page.wait_for_selector("#doc mark.hl")
    return int(ref.get_attribute("data-start")), int(ref.get_attribute("data-end"))


@pytest.mark.browser
def test_a_markdown_document_is_shown_rendered_and_a_reference_highlights_its_span(browser):  # noqa: F811
    with serve(0.02, {"notes.md": NOTES}) as url, open_page(browser, url) as page:
        ask_with_rag(page, "Which pier does the night ferry to Brackwater leave from?")
        doc = page.locator("#doc")
        assert doc.locator("h1").all_inner_texts() == ["Harbour report", "Harbour office"]  # ATX and setext
        assert doc.locator("h2").inner_text() == "Ferries"
        assert doc.locator("strong").all_inner_texts() == ["night ferry", "6"]
        assert doc.locator("em").all_inner_texts() == ["pier 47", "board"]
        assert doc.locator("code").inner_text() == "Orla Maye"
        assert doc.locator("ul > li").all_inner_texts() == [
            "Dredging: the Orla Maye, hired again", "Lifeboat: 37 launches", "a new coxswain, *Ingrid* Tasker"]
        assert doc.locator("table th").all_inner_texts() == ["Boat", "Crew"]
        assert doc.locator("p").last.inner_text() == "Open from nine\nto five."  # <br>: a line break
        assert doc.locator("blockquote").inner_text() == (
            "Silt builds up in the inner basin, as the harbour map shows.")
        shown = doc.inner_text()
        assert SOURCE.search(shown) is None, shown
        check_rendered(page, NOTES_MARKUP)
        start, end = click_reference_with(page, "night ferry")
        assert page.evaluate("marginalia.view.text").find(FACT) in range(start, end)
        check_rendered(page, NOTES_MARKUP, marked=(start, end))
        assert "night ferry" in "".join(page.locator("#doc mark.hl").all_text_contents())


@pytest.mark.browser
def test_a_reading_cuts_the_rendered_document_into_rows_without_losing_a_character(browser):  # noqa: F811
    with serve(0.1, {"notes.md": NOTES}) as url, open_page(browser, url) as page:
        page.click("#patterns label[for='pattern-wim']")
        set_option(page, "wim", "segment_tokens", "6")  # rows end inside paragraphs, list items, the table
        page.fill("#question", "Which pier does the night ferry to Brackwater leave from?")
        page.click("#ask-button")
        page.wait_for_function("() => document.querySelectorAll('#doc .row[data-segment]').length >= 5")
        check_rendered(page, NOTES_MARKUP)  # mid-reading: the rows so far, then the rest
        wait_done(page)
        rows = page.locator("#doc .row[data-segment]")
        assert rows.count() == page.evaluate("marginalia.asker.total") > 10
        check_rendered(page, NOTES_MARKUP)
        assert page.locator("#doc li").count() > 3 and page.locator("#doc table").count() >= 1
        assert SOURCE.search(page.locator("#doc").inner_text()) is None


@pytest.mark.browser
def test_a_real_pdf_is_shown_as_clean_rendered_text_and_a_reference_highlights_its_span(browser):  # noqa: F811
    pytest.importorskip("pymupdf4llm")
    with serve(0.02) as url, open_page(browser, url) as page:
        page.fill("#new-collection-name", "papers")
        page.press("#new-collection-name", "Enter")
        page.wait_for_selector("#collection option[value='papers']", state="attached")
        page.set_input_files("#files", str(PAPER))
        page.click("#upload button")
        page.wait_for_selector(".job[data-status='done']", timeout=180_000)
        ask_with_rag(page, "Which boxes does the figure show: Crawler, Paper Queue, Selector, Search?")
        doc = page.locator("#doc")
        assert doc.locator("h1").inner_text() == "Margin Notes for Long Documents: A Test Paper"
        assert doc.locator("h2").all_inner_texts()[:3] == ["Abstract", "1 Introduction", "2 Related Work"]
        assert doc.locator("h3").first.inner_text() == "3.1 Segmenting the Input"
        shown = doc.inner_text()
        assert SOURCE.search(shown) is None, shown[:2000]
        for words in ("Ada Lovelace∗¹, Alan Turing¹, Grace Hopper†²", "We call the method Margin Notes, or MaNo",
                      "Crawler - Paper Queue - Selector ? [Search] [Expand] [Stop]"):
            assert words in shown
        check_rendered(page, r"[\s#]*")
        start, end = click_reference_with(page, "Crawler")
        check_rendered(page, r"[\s#]*", marked=(start, end))
        assert "".join(page.locator("#doc mark.hl").all_text_contents()) == (
            "Crawler - Paper Queue - Selector ? [Search] [Expand] [Stop]")
