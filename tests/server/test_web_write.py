"""The page's Write view, in the system Chromium through Playwright, against the live server on scripted
client and memory models: ghost text after a pause, Tab accepting it, typing and Escape dismissing it, the
memory panel listing its items with their sources, a failing memory model, an empty collection, the keyboard
alone, and a narrow screen."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from marginalia.errors import BackendError
from marginalia.index.embedders import HashingEmbedder
from marginalia.models.fake import Request, ScriptedGenerator
from marginalia.server import Settings, create_app
from server_support import (
    COMPOSE_SETTINGS,
    FACT,
    REPORT,
    SUGGESTION,
    TAKEAWAY,
    ComposeModels,
    index_text,
    live_server,
    respond,
)
from test_web import browser, open_page, tab_to  # noqa: F401 - the browser fixture, shared

pytest.importorskip("lancedb")
pytest.importorskip("rapidfuzz")

TEXT = "The night ferry to Brackwater"


@contextmanager
def serve(models: ComposeModels | None = None, empty: bool = False) -> Iterator[str]:
    """The live server with 'report.md' indexed in 'docs' (and an empty collection 'blank' when ``empty``)."""
    app = create_app(Settings(**COMPOSE_SETTINGS), generator=ScriptedGenerator(respond=respond),
                     embedder=HashingEmbedder(), loader=models or ComposeModels())
    with live_server(app) as url:
        with httpx.Client(base_url=url, timeout=30) as http:
            assert index_text(http, "docs", "report.md", REPORT)["status"] == "done"
            if empty:
                assert http.post("/v1/collections", json={"name": "blank", "embedder": "hashing"}).status_code == 201
        yield url


def write_view(page: Any) -> None:
    """Open the Write view and wait for its session."""
    page.click("#tab-write")
    page.wait_for_selector("#memory[data-state='ready']")


def ghost(page: Any) -> str:
    return str(page.text_content("#ghost"))


def wait_shown(page: Any) -> None:
    page.wait_for_selector("#editor[data-state='shown']")


def set_threshold(page: Any, tokens: int) -> None:
    """Refresh memory after ``tokens`` token edits (the options panel; a new session starts)."""
    page.click("#write-view summary")
    page.fill("#opt-compose-threshold", str(tokens))
    page.press("#opt-compose-threshold", "Enter")  # a change: the session starts again with it
    page.click("#write-view summary")
    page.wait_for_selector("#memory[data-state='ready']")


@pytest.mark.browser
def test_ghost_text_appears_after_a_pause_tab_accepts_it_and_escape_dismisses_it(browser):  # noqa: F811
    with serve() as url, open_page(browser, url) as page:
        write_view(page)
        assert page.input_value("#write-collection") == "docs"
        page.click("#draft")
        page.keyboard.type(TEXT)
        wait_shown(page)
        assert ghost(page) == SUGGESTION
        # the ghost text follows the last word, inside the text area
        box, shown = page.locator("#draft").bounding_box(), page.locator("#ghost").bounding_box()
        assert box["x"] < shown["x"] < box["x"] + box["width"] and box["y"] < shown["y"] < box["y"] + box["height"]
        page.keyboard.press("Tab")
        assert page.input_value("#draft") == TEXT + SUGGESTION and ghost(page) == ""
        assert page.evaluate("document.activeElement.id") == "draft"  # Tab took the suggestion, not the focus
        page.keyboard.press("Control+z")  # one undo step takes it back...
        assert page.input_value("#draft") == TEXT
        page.keyboard.press("Control+Shift+z")  # ...and redo puts it in again
        assert page.input_value("#draft") == TEXT + SUGGESTION
        wait_shown(page)  # the longer text gets its own suggestion
        page.keyboard.type(" It")
        assert ghost(page) == ""  # typing dismissed it at once
        wait_shown(page)
        page.keyboard.press("Escape")
        assert ghost(page) == "" and page.input_value("#draft") == TEXT + SUGGESTION + " It"
        assert page.get_attribute("#editor", "data-state") == "idle"
        page.keyboard.press("Tab")  # no suggestion: Tab leaves the text, as it does anywhere
        assert page.evaluate("document.activeElement.id") != "draft"
        assert page.input_value("#draft") == TEXT + SUGGESTION + " It"


@pytest.mark.browser
def test_the_memory_panel_lists_items_with_their_sources(browser):  # noqa: F811
    with serve() as url, open_page(browser, url) as page:
        write_view(page)
        set_threshold(page, 4)
        page.click("#draft")
        page.keyboard.type(TEXT)
        page.wait_for_selector("#memory[data-state='ready'] .memory-item")
        item = page.locator(".memory-item")
        assert item.count() == 1
        assert item.locator(".memory-text").inner_text() == TAKEAWAY
        assert item.locator(".ref-place").inner_text() == "report.md › Harbour report › Ferries"
        assert page.inner_text("#write-status") == "Memory ready: 1 item."
        source = item.locator(".memory-source")
        start, end = int(source.get_attribute("data-start")), int(source.get_attribute("data-end"))
        source.click()  # the Read view shows the passage it was written from
        page.wait_for_selector("#doc mark.hl")
        assert page.is_hidden("#write-view") and page.get_attribute("#tab-read", "aria-selected") == "true"
        marked = "".join(page.locator("#doc mark.hl").all_text_contents())
        assert marked == page.evaluate(f"marginalia.view.text.slice({start}, {end})") and FACT in marked


def broken(req: Request) -> str:
    raise BackendError("the memory model crashed")


@pytest.mark.browser
def test_a_failing_memory_model_is_said_and_suggestions_go_on(browser):  # noqa: F811
    with serve(ComposeModels(memory=broken)) as url, open_page(browser, url) as page:
        write_view(page)
        set_threshold(page, 4)
        page.click("#draft")
        page.keyboard.type(TEXT)
        page.wait_for_selector("#memory[data-state='failing']")
        status = page.inner_text("#write-status")
        assert status.startswith("Memory model failed: memory could not be refreshed")
        assert "the memory model crashed" in status and "suggestions go on" in status
        wait_shown(page)
        assert ghost(page) == SUGGESTION
        page.keyboard.press("Tab")
        page.keyboard.type(" It sails")  # more memory requests, that fail too: still said, still suggesting
        wait_shown(page)
        assert ghost(page) == SUGGESTION and "the memory model crashed" in page.inner_text("#write-status")
        assert page.locator(".memory-item").count() == 0


@pytest.mark.browser
def test_an_empty_collection_says_what_to_do(browser):  # noqa: F811
    models = ComposeModels()
    with serve(models, empty=True) as url, open_page(browser, url) as page:
        page.click("#tab-write")
        page.wait_for_selector("#write-collection option[value='blank']", state="attached")
        if page.input_value("#write-collection") != "blank":  # the library's collection is chosen first
            page.wait_for_selector("#memory[data-state='ready']")
            page.select_option("#write-collection", "blank")
        page.wait_for_selector("#write-error:not([hidden])")
        assert "holds no documents; index some into it first" in page.inner_text("#write-error")
        page.select_option("#write-collection", "docs")  # back to one with documents: it works again
        page.wait_for_selector("#write-error", state="hidden")
        page.click("#draft")
        page.keyboard.type(TEXT)
        wait_shown(page)
        assert len(models.of("client")) == 1  # the first session's models served the second


@pytest.mark.browser
def test_writing_with_the_keyboard_only(browser):  # noqa: F811
    with serve() as url, open_page(browser, url) as page:
        tab_to(page, "el.id === 'tab-read'")
        page.keyboard.press("ArrowRight")  # to the Write tab, which shows its view
        assert page.evaluate("document.activeElement.id") == "tab-write" and page.is_visible("#write-view")
        page.wait_for_selector("#memory[data-state='ready']")
        tab_to(page, "el.id === 'draft'")
        page.keyboard.type(TEXT)
        wait_shown(page)
        page.keyboard.press("Tab")
        assert page.input_value("#draft") == TEXT + SUGGESTION


@pytest.mark.browser
def test_the_write_view_fits_a_narrow_screen(browser):  # noqa: F811
    with serve() as url, open_page(browser, url, width=390) as page:
        write_view(page)
        set_threshold(page, 4)
        page.click("#draft")
        page.keyboard.type(TEXT + " " + "x" * 120)
        page.wait_for_selector(".memory-item")
        wait_shown(page)
        assert page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth") == 0
        editor, memory = page.locator("#draft").bounding_box(), page.locator("#memory").bounding_box()
        assert memory["y"] >= editor["y"] + editor["height"]  # the memory goes below the text, not beside it
