"""The web page: served at `/` with its files (nothing from elsewhere), and driven in the system Chromium
through Playwright against the live server on a scripted model whose margins take a little time each, so
that margins arriving while the document is read, and stopping mid-reading, can be seen."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from marginalia.index.embedders import HashingEmbedder
from marginalia.models.fake import ScriptedGenerator
from marginalia.server import Settings, create_app
from marginalia.server.factory import STATIC
from server_support import ANSWER, FACT, MARGIN, QUESTION, REPORT, Slow, index_text, live_server, make_client, respond

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # the browser fixture says so
    sync_playwright = None

pytest.importorskip("lancedb")

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
#: a reference to another origin in a page file: an absolute URL, or a protocol-relative one
EXTERNAL = re.compile(r"""(?:https?:)?//[\w.-]+\.\w|@import\s+url\(\s*["']?(?:https?:)?//""")
LONG = "\n\n".join(f"Paragraph {i}: the weather in Ostervik stayed mild, with light rain." for i in range(40))


# -- the page's files ---------------------------------------------------------------------------------------


def test_the_page_and_its_files_are_served_without_the_key():
    client = make_client(Settings(api_key="sesame"))
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'href="/docs"' in page.text  # the API's description stays one click away
    linked = re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text)
    assert "/static/app.js" in linked and "/static/style.css" in linked
    for path in linked:
        assert client.get(path).status_code == 200, path
    imports = {name for js in STATIC.glob("*.js") for name in re.findall(r'from "\./([\w.]+)"', js.read_text())}
    assert imports == {p.name for p in STATIC.glob("*.js")} - {"app.js"}
    assert all(client.get(f"/static/{name}").status_code == 200 for name in imports)
    assert client.get("/v1/collections").status_code == 401  # the API itself still needs it


@pytest.mark.parametrize("name", sorted(p.name for p in STATIC.iterdir()))
def test_no_page_file_loads_anything_from_elsewhere(name):
    found = EXTERNAL.search((STATIC / name).read_text())
    assert found is None, found


def test_the_page_ships_with_the_package():
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '"server/static/*"' in pyproject


# -- in the browser -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"Chromium not found at {CHROMIUM}: apt-get install chromium")
    if sync_playwright is None:
        pytest.skip("playwright is not installed: pip install -e '.[dev]'")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()




@contextmanager
def serve(delay: float = 0.15, documents: dict[str, str] | None = None) -> Iterator[str]:
    """The live server on a slow scripted model with hashing embeddings; ``documents`` indexed in 'docs'."""
    app = create_app(Settings(embedder="hashing"), generator=ScriptedGenerator(respond=Slow(delay)),
                     embedder=HashingEmbedder())
    with live_server(app) as url:
        if documents:
            with httpx.Client(base_url=url, timeout=30) as http:
                for name, text in documents.items():
                    assert index_text(http, "docs", name, text)["status"] == "done"
        yield url


@contextmanager
def open_page(browser: Any, url: str, width: int = 1280) -> Iterator[Any]:
    """The page, loaded and ready; fails the test on a script error or a request to another origin."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda req: None if req.url.startswith((url, "data:")) else errors.append(req.url))
    page.goto(url)
    page.wait_for_selector("body[data-ready]")
    try:
        yield page
    finally:
        context.close()
    assert not errors, errors


def set_option(page: Any, pattern: str, name: str, value: str) -> None:
    page.click("summary:has-text('Options')")
    page.fill(f"#opt-{pattern}-{name}", value)
    page.click("summary:has-text('Options')")


def ask(page: Any, question: str = QUESTION, segment_tokens: int = 24) -> None:
    """Ask with WiM, whose margins these tests watch (auto, the default, may answer with RAG alone)."""
    page.click("label[for='pattern-wim']")
    set_option(page, "wim", "segment_tokens", str(segment_tokens))
    page.fill("#question", question)
    page.click("#ask-button")


def wait_done(page: Any) -> None:
    page.wait_for_selector("#cost:not(:empty)")


def check_rendered(page: Any, markup: str, marked: tuple[int, int] | None = None) -> None:
    """The document view shows the text's characters at their offsets, in order, each once, leaving out only
    what ``markup`` (a regular expression) matches; with ``marked``, its highlighted characters are exactly the
    ones shown of that span."""
    text = page.evaluate("marginalia.view.text")
    pieces = page.evaluate("marginalia.view.pieces()")
    at = 0
    for piece in pieces:
        start, shown = piece["start"], piece["text"]
        assert shown == text[start:start + len(shown)], piece
        assert start >= at, f"{piece} comes after offset {at}"
        left_out = text[at:start]
        assert re.fullmatch(markup, left_out), f"{left_out!r} at {at} is not shown"
        at = start + len(shown)
        if marked is not None:
            inside = marked[0] <= start and at <= marked[1]
            outside = at <= marked[0] or start >= marked[1]
            assert inside or outside, f"{piece} straddles the highlight's bounds"
            assert ("hl" in piece["marks"]) == (inside and bool(shown)), piece
    assert re.fullmatch(markup, text[at:]), f"{text[at:]!r} at {at} is not shown"


@pytest.mark.browser
def test_upload_a_document_and_see_it_indexed_with_its_section_tree(browser, tmp_path):
    (tmp_path / "report.md").write_text(REPORT)
    with serve() as url, open_page(browser, url) as page:
        assert page.is_visible("#new-collection-name")  # no collection yet: creating one is offered
        page.fill("#new-collection-name", "work")
        page.press("#new-collection-name", "Enter")
        page.wait_for_selector("#collection option[value='work']", state="attached")
        page.set_input_files("#files", str(tmp_path / "report.md"))
        page.click("#upload button")
        page.wait_for_selector(".job[data-status='done']")
        assert "indexed: 3 chunks, 4 sections" in page.inner_text(".job-state")
        doc = page.locator(".document[data-source='report.md']")
        doc.locator("summary").click()
        titles = doc.locator("button.section").all_inner_texts()
        assert titles == ["Harbour report", "Dredging", "Ferries", "Lifeboat"]
        doc.locator("button.section", has_text="Ferries").click()
        expect(page.locator("#doc-title")).to_have_text("Harbour report")
        expect(page.locator("#doc h2 mark.spot").first).to_have_text("Ferries")
        assert page.evaluate("marginalia.view.text").strip() == REPORT.strip()
        # the same text under another name: the page says it was not added, and where it is
        (tmp_path / "copy.md").write_text(REPORT)
        page.set_input_files("#files", str(tmp_path / "copy.md"))
        page.click("#upload button")
        expect(page.locator(".job[data-status='duplicate'] .job-state")).to_have_text(
            "not added: the same text is already here as report.md")
        assert page.locator(".document").count() == 1


@pytest.mark.browser
def test_margins_appear_beside_the_text_one_by_one_while_it_is_read(browser):
    with serve(0.25, {"report.md": REPORT}) as url, open_page(browser, url) as page:
        assert page.input_value("#source") == "document:report.md"
        ask(page)
        page.wait_for_selector("#doc .row .margin.dropped")
        # a margin is shown before the reading is done: no answer yet, Stop still offered
        assert page.inner_text("#cost") == "" and page.is_enabled("#stop-button")
        assert page.locator("#doc .row[data-segment]").count() < page.evaluate("marginalia.asker.total")
        wait_done(page)
        assert page.inner_text("#answer") == ANSWER
        assert re.fullmatch(r"Read \d+ tokens · generated \d+ · \d+\.\d s", page.inner_text("#cost"))
        rows = page.locator("#doc .row[data-segment]")
        assert rows.count() == page.evaluate("marginalia.asker.total") > 3
        # one margin per segment, beside it; the kept one is marked, the dropped ones say why
        kept = page.locator("#doc .row:has(.margin.kept)")
        assert kept.count() == 1 and kept.locator(".margin-text").inner_text() == MARGIN
        assert "pier" in kept.locator(".text").inner_text() or "47" in kept.locator(".text").inner_text()
        dropped = page.locator("#doc .margin.dropped")
        assert dropped.count() == rows.count() - 1
        assert all(reason.strip() for reason in dropped.locator(".reason").all_inner_texts())
        box, margin = kept.locator(".text").bounding_box(), kept.locator(".margin").bounding_box()
        assert margin["x"] >= box["x"] + box["width"] and abs(margin["y"] - box["y"]) < 20  # beside, not below
        # the rows hold the document's text, in order, without its markup
        check_rendered(page, r"[\s#]*")


@pytest.mark.browser
def test_stop_mid_reading_still_answers_from_what_was_read(browser):
    with serve(0.2) as url, open_page(browser, url) as page:
        page.select_option("#source", "paste")
        page.fill("#paste", REPORT + "\n\n" + LONG)
        ask(page, segment_tokens=16)
        page.wait_for_function("() => document.querySelectorAll('#doc .margin.dropped, #doc .margin.kept').length >= 2")
        page.click("#stop-button")
        wait_done(page)
        assert page.inner_text("#answer") == ANSWER
        assert page.inner_text("#status").startswith("Stopped early; answered from what was read.")
        total = page.evaluate("marginalia.asker.total")
        read = page.locator("#doc .row[data-segment]").count()
        assert 2 <= read <= 4 < total, (read, total)
        assert page.is_visible("#doc .row.rest")  # what was not read is still shown
        assert page.is_enabled("#ask-button") and page.is_disabled("#stop-button")


@pytest.mark.browser
def test_a_reference_highlights_its_exact_span(browser):
    with serve(0.02, {"report.md": REPORT}) as url, open_page(browser, url) as page:
        ask(page)
        wait_done(page)
        ref = page.locator("button.ref")
        assert ref.count() == 1
        assert ref.locator(".ref-place").inner_text() == "report.md › Harbour report › Ferries"
        ref.click()
        marks = page.locator("#doc mark.hl")
        highlighted = "".join(marks.all_text_contents())
        start, end = int(ref.get_attribute("data-start")), int(ref.get_attribute("data-end"))
        assert highlighted == page.evaluate(f"marginalia.view.text.slice({start}, {end})") == FACT
        assert ref.locator(".ref-quote").inner_text() == FACT
        marks.first.wait_for()
        page.wait_for_function("() => { const r = document.getElementById('highlight').getBoundingClientRect();"
                               " return r.top >= 0 && r.bottom <= innerHeight; }")


@pytest.mark.browser
def test_the_default_pattern_is_auto_and_the_page_shows_the_route_taken(browser):
    with serve(0.02, {"report.md": REPORT}) as url, open_page(browser, url) as page:
        radios = page.locator("#patterns input[name='pattern']")
        assert radios.first.get_attribute("value") == "auto" and page.is_checked("#pattern-auto")
        assert page.inner_text("#pattern-hint") == "RAG, then WiM where RAG's answer does not stand on its passages"
        assert page.is_hidden("#route")
        # a single-hop question over the collection: RAG's answer stands, no margin is written
        page.select_option("#source", "collection")
        page.fill("#question", QUESTION)
        page.click("#ask-button")
        wait_done(page)
        assert page.inner_text("#answer") == ANSWER
        route = page.locator("#route")
        assert route.get_attribute("data-taken") == "rag"
        assert route.inner_text() == "Answered by RAG: RAG's answer stands on the retrieved passages (support 1.00)."
        assert page.is_hidden("#collection-margins")
        # a question over the whole document: WiM reads it, its margins beside the text, and the page says why
        page.select_option("#source", "document:report.md")
        page.wait_for_selector("#doc .row.rest")
        page.fill("#question", "List all the ships named in the report.")
        page.click("#ask-button")
        wait_done(page)
        assert route.get_attribute("data-taken") == "wim"
        assert route.inner_text() == "Answered by WiM: the question gathers over the whole document."
        rows = page.locator("#doc .row[data-segment]")
        assert rows.count() == page.evaluate("marginalia.asker.total") >= 1
        assert page.locator("#doc .row .margin.kept, #doc .row .margin.dropped").count() == rows.count()
        assert page.inner_text("#status").startswith("Done.")
        # a short pasted text, auto still chosen: the route by size reads it with WiM, no route to show
        page.select_option("#source", "paste")
        page.fill("#paste", REPORT)
        page.fill("#question", QUESTION)
        page.click("#ask-button")
        wait_done(page)
        assert page.is_checked("#pattern-auto") and page.is_hidden("#route")
        assert page.locator("#doc .row[data-segment]").count() == page.evaluate("marginalia.asker.total") >= 1


def tab_to(page: Any, check: str, limit: int = 40) -> None:
    """Press Tab until the focused element passes ``check`` (a JavaScript expression on ``el``)."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate(f"(el => {check})(document.activeElement)"):
            return
    raise AssertionError(f"Tab never reached an element where {check}")


@pytest.mark.browser
def test_asking_with_the_keyboard_only(browser):
    with serve(0.25, {"report.md": REPORT}) as url, open_page(browser, url) as page:
        tab_to(page, "el.name === 'pattern'")  # the chosen pattern, auto; the next is wim
        page.keyboard.press("ArrowRight")
        assert page.is_checked("#pattern-wim")
        tab_to(page, "el.id === 'question'")
        page.keyboard.type(QUESTION)
        tab_to(page, "el.tagName === 'SUMMARY'")  # the options open with Enter
        page.keyboard.press("Enter")
        tab_to(page, "el.id === 'opt-wim-segment_tokens'")
        page.keyboard.press("Control+A")
        page.keyboard.type("24")
        page.keyboard.press("Shift+Tab")
        page.keyboard.press("Enter")  # Enter asks, from any field of the form
        wait_done(page)
        tab_to(page, "el.className === 'ref'")  # on to the reference: Enter shows it
        page.keyboard.press("Enter")
        page.wait_for_selector("#doc mark.hl")
        assert "".join(page.locator("#doc mark.hl").all_text_contents()) == FACT
        page.focus("#question")
        page.keyboard.press("Enter")  # again, and Escape stops it
        page.wait_for_selector("#doc .margin.dropped")
        page.keyboard.press("Escape")
        wait_done(page)
        assert "Stopped early" in page.inner_text("#status") and page.inner_text("#answer") == ANSWER


@pytest.mark.browser
def test_a_narrow_screen_never_scrolls_sideways(browser):
    wide = "A line that does not wrap: " + "x" * 400 + "\n\n| a | wide | table |\n|---|---|---|\n" + "| cell " * 60
    with serve(0.02) as url, open_page(browser, url, width=390) as page:
        def sideways() -> int:
            return page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")

        assert sideways() == 0
        page.select_option("#source", "paste")
        page.fill("#paste", REPORT + "\n\n" + wide)
        page.click("summary:has-text('Options')")  # the options open, too
        assert sideways() == 0
        page.click("summary:has-text('Options')")
        ask(page)
        wait_done(page)
        assert sideways() == 0
        # the margins go below their segment's text, not beside it
        row = page.locator("#doc .row:has(.margin.kept)")
        text, margin = row.locator(".text").bounding_box(), row.locator(".margin").bounding_box()
        assert margin["y"] >= text["y"] + text["height"] - 1


@pytest.mark.browser
def test_the_page_asks_for_the_servers_key_and_uses_it(browser):
    app = create_app(Settings(embedder="hashing", api_key="sesame"), generator=ScriptedGenerator(respond=respond),
                     embedder=HashingEmbedder())
    with live_server(app) as url:
        page = browser.new_page()
        try:
            page.goto(url)
            page.wait_for_selector("#key-form:not([hidden])")
            assert page.evaluate("document.activeElement.id") == "key"
            page.fill("#key", "wrong")
            page.press("#key", "Enter")
            expect(page.locator("#server")).to_have_text(re.compile("refused that key"))
            page.fill("#key", "sesame")
            page.press("#key", "Enter")
            page.wait_for_selector("body[data-ready]")
            assert page.is_hidden("#key-form") and page.is_visible("#new-collection-name")
        finally:
            page.close()


@pytest.mark.browser
def test_the_cost_line_says_when_the_model_server_did_not_report_what_it_read(browser):
    stats = {"prefilled_context_tokens": 1200, "cached_context_tokens": 300, "generated_margin_tokens": 10,
             "generated_answer_tokens": 5, "generated_other_tokens": 0, "total_seconds": 2.0}
    show = "async (stats) => (await import('/static/ask.js')).costLine(stats)"
    with serve() as url, open_page(browser, url) as page:
        assert page.evaluate(show, stats) == "Read 1,500 tokens (300 from cache) · generated 15 · 2.0 s"
        blind = page.evaluate(show, {**stats, "prefilled_context_tokens": None})
        assert blind == "Tokens read not reported by the model server (300 from cache) · generated 15 · 2.0 s"
