"""The page's Evaluate view, in the system Chromium through Playwright, against the live server on a scripted
model that writes questions and answers them: generate questions as a job, see a pair's evidence highlighted
in its document, accept, edit and reject pairs, run the readings on the accepted ones, and see the results
table and the plot; a read-only key sees the pairs with no button that would change them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from marginalia.bench.own import read_pairs
from marginalia.index.embedders import HashingEmbedder
from marginalia.models.fake import ScriptedGenerator
from marginalia.server import Settings, create_app
from marginalia.server.keys import Grants, KeyStore
from qa_support import REPORT, SINGLE, respond_qa_and_read
from server_support import index_text, live_server
from test_web import browser, open_page  # noqa: F401 - the browser fixture, shared
from test_web_access import sign_in

pytest.importorskip("lancedb")

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture says so
    expect = None

SERVER_KEY = "operators-key"


@contextmanager
def serve(home: Path, api_key: str | None = None) -> Iterator[str]:
    """The live server with the report indexed in 'docs'."""
    app = create_app(Settings(home=str(home), embedder="hashing", api_key=api_key),
                     generator=ScriptedGenerator(respond=respond_qa_and_read), embedder=HashingEmbedder())
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with live_server(app) as url:
        with httpx.Client(base_url=url, timeout=30, headers=headers) as http:
            assert index_text(http, "docs", "report.md", REPORT)["status"] == "done"
        yield url


def pair(page: Any, question: str) -> Any:
    return page.locator("#eval-pairs .pair", has=page.locator(".pair-question", has_text=question))


def marked(page: Any) -> list[str]:
    return list(page.eval_on_selector_all("#eval-doc mark.hl", "marks => marks.map(m => m.textContent)"))


def generate(page: Any) -> None:
    page.click("#tab-evaluate")
    expect(page.locator("#eval-collection")).to_have_text("docs")
    page.click("#eval-generate")
    expect(page.locator("#eval-pairs .pair")).to_have_count(6)
    page.wait_for_selector("#evaluate-view:not([data-generating])")
    expect(page.locator("#eval-status")).to_have_text(re.compile("Generated 6 new questions"))


@pytest.mark.browser
def test_generate_review_with_evidence_run_and_see_the_results(browser, tmp_path):  # noqa: F811
    with serve(tmp_path / "home") as url, open_page(browser, url) as page:
        generate(page)
        assert page.url.endswith("#evaluate")
        stored = {p["question"]: p for p in read_pairs(tmp_path / "home" / "qa" / "docs.jsonl")}

        # a pair's evidence, highlighted in its document; a join's two spans both
        coxswain = pair(page, SINGLE["Ingrid Tasker"])
        coxswain.locator(".pair-open").click()
        expect(page.locator("#eval-doc mark.hl")).not_to_have_count(0)
        assert "".join(marked(page)) == stored[SINGLE["Ingrid Tasker"]]["evidence"]
        assert "Ingrid Tasker" in "".join(marked(page))
        expect(coxswain).to_have_class(re.compile("selected"))
        join = next(p for p in stored.values() if p["kind"] == "join")
        pair(page, join["question"]).locator(".pair-open").click()
        page.wait_for_function("document.querySelectorAll('#eval-doc mark.hl').length >= 2")
        text = "".join(marked(page))
        assert all(span["text"] in text for span in join["evidence_spans"]) and len(join["evidence_spans"]) == 2
        unanswerable = next(p for p in stored.values() if p["kind"] == "unanswerable")
        pair(page, unanswerable["question"]).locator(".pair-open").click()
        expect(page.locator("#eval-doc-meta")).to_have_text(re.compile("no evidence"))
        assert marked(page) == []

        # accept, edit (saved: accepted), reject
        expect(page.locator("#eval-run")).to_be_disabled()
        coxswain.get_by_role("button", name=re.compile("^Accept")).click()
        expect(coxswain).to_have_attribute("data-status", "accepted")
        pair(page, unanswerable["question"]).get_by_role("button", name=re.compile("^Accept")).click()
        dredger = pair(page, SINGLE["Orla Maye"])
        dredger.get_by_role("button", name=re.compile("^Edit")).click()
        dredger.get_by_label("Question").fill("Which dredger was hired?")
        dredger.get_by_label("Answer").fill("The Orla Maye")
        dredger.get_by_role("button", name="Save and accept").click()
        edited = pair(page, "Which dredger was hired?")
        expect(edited).to_have_attribute("data-status", "accepted")
        expect(edited.locator(".pair-state")).to_have_text("accepted · edited")
        market = pair(page, SINGLE["Tomas Brey"])
        market.get_by_role("button", name=re.compile("^Reject")).click()
        expect(market).to_have_attribute("data-status", "rejected")
        expect(page.locator("#eval-counts")).to_have_text("3 accepted · 1 rejected · 2 to review")
        after = {p["id"]: p for p in read_pairs(tmp_path / "home" / "qa" / "docs.jsonl")}
        assert after[stored[SINGLE["Orla Maye"]]["id"]]["answer"] == "The Orla Maye"
        assert after[stored[SINGLE["Tomas Brey"]]["id"]]["status"] == "rejected"

        # run the readings on the three accepted pairs
        assert page.is_checked("#eval-pattern-rag") and not page.is_checked("#eval-pattern-lc")
        page.uncheck("#eval-pattern-wim")
        expect(page.locator("#eval-run-hint")).to_have_text("on 3 accepted questions")
        page.click("#eval-run")
        page.wait_for_selector("#eval-results[data-state='done']", timeout=30_000)
        rows = page.locator("#eval-table tbody tr")
        expect(rows).to_have_count(2)
        assert [rows.nth(i).get_attribute("data-pattern") for i in range(2)] == ["auto", "rag"]  # the registry's order
        for i in range(2):
            # the coxswain answered, the unanswerable one abstained on, the edited question not found
            expect(rows.nth(i).locator(".score")).to_have_text(re.compile(r"^0\.67 \[0\.\d\d, 0\.\d\d\]$"))
            assert float(rows.nth(i).locator(".seconds").inner_text()) >= 0
        expect(page.locator("#eval-status")).to_have_text("Scored 6 answers.")
        # the results open with a recommendation per kind of question
        first = page.locator("#eval-recommendation li").first
        expect(first).to_have_text(re.compile(r"^single: read with (auto|rag) \(.*Each reading: auto 0\.50 at "))
        plot = page.locator("#eval-plot")
        expect(plot.locator("g.reading")).to_have_count(2)
        expect(plot.locator("g.reading circle.point")).to_have_count(2)
        expect(plot.locator("g.reading line.interval")).to_have_count(2)
        assert plot.bounding_box()["height"] > 100
        ys = [float(plot.locator("g.reading[data-pattern='rag'] line.interval").get_attribute(a)) for a in ("y1", "y2")]
        cy = float(plot.locator("g.reading[data-pattern='rag'] circle").get_attribute("cy"))
        assert ys[1] < cy < ys[0]  # the interval's bar spans its point (y grows downwards)


@pytest.mark.browser
def test_a_read_only_key_sees_the_pairs_and_no_button_that_changes_them(browser, tmp_path):  # noqa: F811
    home = tmp_path / "home"
    with serve(home, api_key=SERVER_KEY) as url:
        with httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {SERVER_KEY}"}) as http:
            job = http.post("/v1/collections/docs/qa-jobs", json={}).json()
            wait = http.get(f"/v1/qa-jobs/{job['id']}/events")  # the stream ends with the job
            assert "event: done" in wait.text
        token = KeyStore.of_home(home).create("reader", Grants(read=frozenset({"docs"})))[1]
        page = browser.new_page()
        try:
            sign_in(page, url, token)
            page.click("#tab-evaluate")
            expect(page.locator("#eval-pairs .pair")).to_have_count(6)
            assert page.is_hidden("#eval-generate") and page.is_hidden("#eval-run-form")
            assert page.locator("#eval-pairs button:has-text('Accept')").count() == 0
            pair(page, SINGLE["Ingrid Tasker"]).locator(".pair-open").click()  # reading the evidence is allowed
            expect(page.locator("#eval-doc mark.hl")).not_to_have_count(0)
        finally:
            page.close()
