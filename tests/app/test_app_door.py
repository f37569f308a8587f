"""`marginalia.app` is the front ends' one door: the WiM-with-a-stored-reading choice is made there, with the
request's temperature, and the helpers the server needs (pasted texts, references placed in sections, uploads
checked by content, collection names) answer as the server relied on them to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from marginalia import LcOptions, WimOptions, app
from marginalia.errors import BadInput, EmptyDocument
from marginalia.models.fake import Request, ScriptedGenerator
from marginalia.records import Reference
from wim_requests import is_margin

FACT = "The night ferry to Brackwater leaves from pier 47."


def answer_params(gen: ScriptedGenerator) -> list[float]:
    return [r.params.temperature for r in gen.requests if not is_margin(r)]


def echo(req: Request) -> str:
    return FACT if is_margin(req) else "Pier 47."


def test_wim_with_a_cache_reads_once_and_samples_the_answer_at_the_given_temperature(
        make_haystack: Callable[..., str], tmp_path: Path) -> None:
    doc = make_haystack(30, FACT, 0.5)
    cache = app.document_cache(tmp_path / "home")
    options = WimOptions(segment_tokens=100)
    gen = ScriptedGenerator(echo)
    first = app.ask_text(doc, "Which pier?", options, generator=gen, cache=cache, temperature=0.7).answer()
    second = app.ask_text(doc, "Where does the ferry leave from?", options, generator=ScriptedGenerator(echo),
                          cache=cache).answer()
    assert first.stats.prefilled_context_tokens > 0 and first.stats.cached_context_tokens == 0
    assert second.stats.prefilled_context_tokens == 0 and second.stats.cached_context_tokens > 0
    assert answer_params(gen) == [0.7]


def test_other_patterns_ignore_the_cache_and_take_the_temperature(tmp_path: Path) -> None:
    gen = ScriptedGenerator(default="Pier 47.")
    cache = app.document_cache(tmp_path / "home")
    answer = app.ask_text(FACT, "Which pier?", LcOptions(), generator=gen, cache=cache, temperature=0.3).answer()
    assert answer.pattern == "lc" and answer_params(gen) == [0.3]
    assert cache.files() == []


def test_a_pasted_text_gets_its_sections_and_references_are_placed_in_them() -> None:
    doc = app.text_document("# Harbour\n\nIntro.\n\n## Ferries\n\n" + FACT + "\n", "text")
    sections = app.document_sections(doc)
    start = doc.text.index(FACT)
    answer = app.ask_text(doc.text, "Which pier?", LcOptions(), generator=ScriptedGenerator(default="Pier 47."),
                          source=doc.source).answer()
    ref = Reference(source=doc.source, text=FACT, start=start, end=start + len(FACT))
    other = Reference(source="elsewhere.md", text="x", start=0, end=1)
    placed = app.locate(replace(answer, references=(ref, other)), doc, sections)
    assert placed.references[0].section_path == ("Harbour", "Ferries")
    assert placed.references[1] == other  # another document's reference is left as it was


@pytest.mark.parametrize(("name", "data", "suffix"), [
    ("notes.md", b"# Notes\n\nText.\n", ".md"),
    ("paper.txt", b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n", ".pdf"),  # the content says PDF: read as one
])
def test_an_upload_takes_the_suffix_its_content_says(name: str, data: bytes, suffix: str) -> None:
    assert app.upload_suffix(name, data) == suffix


@pytest.mark.parametrize(("name", "data", "error"), [
    ("paper.pdf", b"just text, named as a PDF", BadInput),
    ("blank.txt", b"  \n\t\n", EmptyDocument),
    ("binary.txt", b"\x00\x01\x02binary\x00", BadInput),
])
def test_an_upload_that_cannot_be_read_is_refused(name: str, data: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        app.upload_suffix(name, data)


def test_a_name_no_collection_may_have_names_none(tmp_path: Path) -> None:
    assert not app.collection_exists("../etc", home=tmp_path)
    assert not app.collection_exists("docs", home=tmp_path)
    assert app.list_collections(tmp_path) == []
