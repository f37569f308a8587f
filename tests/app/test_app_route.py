"""The route by size: a reading that names no pattern reads a collection or a long text with auto and a short
text with WiM; auto's WiM reading of a text takes the stored reading where there is one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from marginalia import AutoOptions, WimOptions, app
from marginalia.index.embedders import HashingEmbedder
from marginalia.models.fake import Request, ScriptedGenerator
from marginalia.options import ROUTE_TOKENS
from marginalia.records import Routed, SegmentRead
from wim_requests import is_margin

FACT = "The night ferry to Brackwater leaves from pier 47."
QUESTION = "Which pier does the night ferry leave from?"


def unsupported(req: Request) -> str:
    """Margins quote the fact; the answer names what no passage says, so RAG's answer never stands."""
    return FACT if is_margin(req) else "Captain Ahab's pier."


def test_the_route_by_size_counts_the_models_tokens() -> None:
    gen = ScriptedGenerator()
    at_most = "w " * (ROUTE_TOKENS // 2)  # a word and a space: two tokens each
    assert gen.tokenizer.count(at_most) == ROUTE_TOKENS
    assert app.default_options(at_most, gen) == WimOptions()
    assert app.default_options(at_most + "w", gen) == AutoOptions()
    assert app.default_options(None, gen) == AutoOptions()  # a collection
    # the values given are kept, on whichever record the route takes
    given = AutoOptions(segment_tokens=100, top_k=2, max_new_tokens=20)
    assert app.default_options(at_most, gen, given) == WimOptions(segment_tokens=100, max_new_tokens=20)
    assert app.default_options(at_most + "w", gen, given) == given


def test_no_options_reads_a_short_text_with_wim_and_a_long_one_with_auto(
        make_haystack: Callable[..., str]) -> None:
    short = app.ask_text(FACT, QUESTION, generator=ScriptedGenerator(default="Pier 47."),
                         embedder=HashingEmbedder()).answer()
    assert short.pattern == "wim" and short.route is None
    long = make_haystack(400, FACT, 0.5)
    gen = ScriptedGenerator(default="Pier 47.")
    assert gen.tokenizer.count(long) > ROUTE_TOKENS
    answer = app.ask_text(long, QUESTION, generator=gen, embedder=HashingEmbedder()).answer()
    assert answer.pattern == "auto" and answer.route is not None and answer.route.taken == "rag"
    assert answer.margins == ()


def test_auto_reads_wim_from_the_stored_reading(make_haystack: Callable[..., str], tmp_path: Path) -> None:
    doc = make_haystack(60, FACT, 0.5)
    cache = app.document_cache(tmp_path / "home")
    options = AutoOptions(segment_tokens=100)

    def ask() -> list[object]:
        return list(app.ask_text(doc, QUESTION, options, generator=ScriptedGenerator(unsupported),
                                 embedder=HashingEmbedder(), cache=cache))

    def wim_reads(events: list[object]) -> list[SegmentRead]:  # RAG's retrieved chunks come before Routed
        routed = next(e for e in events if isinstance(e, Routed))
        assert routed.route.taken == "wim" and "not in the retrieved passages" in routed.route.reason
        return [e for e in events[events.index(routed):] if isinstance(e, SegmentRead)]

    first, second = ask(), ask()
    assert wim_reads(first) and not any(e.cached for e in wim_reads(first))
    assert len(wim_reads(second)) == len(wim_reads(first))
    assert all(e.cached for e in wim_reads(second))  # no document token prefilled again for WiM
    answer = second[-1].answer  # type: ignore[attr-defined]
    assert answer.pattern == "auto" and answer.stats.cached_context_tokens > 0
    assert any(FACT == m.text and m.relevant for m in answer.margins)
