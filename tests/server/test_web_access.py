"""The page with keys, in the system Chromium through Playwright: a read-only key signs in and finds no upload
control and only its own collection; a writer's key finds the upload form; a user signed in by a trusted
proxy arrives signed in."""

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
from marginalia.server.keys import Grants, KeyStore
from server_support import REPORT, index_text, live_server, respond
from test_web import browser  # noqa: F401 - the browser fixture, shared

pytest.importorskip("lancedb")

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture says so
    expect = None

SERVER_KEY = "operators-key"


@contextmanager
def serve(home: Path, **settings: Any) -> Iterator[tuple[str, KeyStore]]:
    """The live server with collections 'handbook' and 'contracts', each holding the report."""
    app = create_app(Settings(home=str(home), api_key=SERVER_KEY, embedder="hashing", **settings),
                     generator=ScriptedGenerator(respond=respond), embedder=HashingEmbedder())
    with live_server(app) as url:
        with httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {SERVER_KEY}"}) as http:
            for name in ("handbook", "contracts"):
                assert index_text(http, name, "report.md", REPORT)["status"] == "done"
        yield url, KeyStore.of_home(home)


def sign_in(page: Any, url: str, token: str) -> None:
    page.goto(url)
    page.wait_for_selector("#key-form:not([hidden])")
    page.fill("#key", token)
    page.press("#key", "Enter")
    page.wait_for_selector("body[data-ready]")


def collections(page: Any) -> list[str]:
    return list(page.eval_on_selector_all("#collection option", "options => options.map(o => o.value)"))


@pytest.mark.browser
def test_a_read_only_key_signs_in_and_finds_no_upload_control(browser, tmp_path):  # noqa: F811
    with serve(tmp_path / "home") as (url, store):
        token = store.create("reader", Grants(read=frozenset({"handbook"})))[1]
        page = browser.new_page()
        try:
            sign_in(page, url, token)
            expect(page.locator("#server")).to_have_text(re.compile("signed in as key reader: reads handbook"))
            assert collections(page) == ["handbook"]
            assert page.is_hidden("#upload") and page.is_hidden("#files")
            assert page.locator("input[type=file]:visible").count() == 0
            assert page.is_hidden("#new-collection-box")
            assert page.evaluate("sessionStorage.getItem('marginalia.server-key')") == token
            assert token not in page.url
        finally:
            page.close()


@pytest.mark.browser
def test_a_writers_key_finds_the_upload_form_for_its_collection_only(browser, tmp_path):  # noqa: F811
    with serve(tmp_path / "home") as (url, store):
        token = store.create("writer", Grants(read=frozenset({"contracts"}), write=frozenset({"handbook"})))[1]
        page = browser.new_page()
        try:
            sign_in(page, url, token)
            assert sorted(collections(page)) == ["contracts", "handbook"]
            page.select_option("#collection", "handbook")
            expect(page.locator("#upload")).to_be_visible()
            page.select_option("#collection", "contracts")
            expect(page.locator("#upload")).to_be_hidden()
        finally:
            page.close()


@pytest.mark.browser
def test_a_revoked_key_is_asked_to_sign_in_again(browser, tmp_path):  # noqa: F811
    with serve(tmp_path / "home") as (url, store):
        token = store.create("leaving", Grants(read=frozenset({"handbook"})))[1]
        page = browser.new_page()
        try:
            sign_in(page, url, token)
            store.revoke("leaving")
            page.reload()
            page.wait_for_selector("#key-form:not([hidden])")
            expect(page.locator("#server")).to_have_text(re.compile("refused that key"))
        finally:
            page.close()


@pytest.mark.browser
def test_a_user_the_trusted_proxy_signed_in_arrives_signed_in(browser, tmp_path):  # noqa: F811
    home = tmp_path / "home"
    KeyStore.of_home(home).grant_user("ana", Grants(read=frozenset({"contracts"})))
    with serve(home, trusted_header="X-Forwarded-User", trusted_proxies=("127.0.0.1",)) as (url, _):
        context = browser.new_context(extra_http_headers={"X-Forwarded-User": "ana"})
        page = context.new_page()
        try:
            page.goto(url)
            page.wait_for_selector("body[data-ready]")
            expect(page.locator("#server")).to_have_text(re.compile("signed in as ana \\(through the proxy\\)"))
            assert collections(page) == ["contracts"] and page.is_hidden("#upload")
        finally:
            context.close()
