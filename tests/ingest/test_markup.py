"""Extraction markup out of converted markdown: words cut at a change of type joined again, tags and comments gone,
structure kept."""

from __future__ import annotations

import pytest

from marginalia.ingest.markup import clean_markup, join_split_words

PAGE = "PaSa: An LLM Agent for Comprehensive Academic Paper Search to get her together Yichen He∗1, Notes,".split()


@pytest.mark.parametrize("markdown, joined", [
    ("Academic **Pa** per **S** e **a** rch", "Academic Paper Search"),
    ("# **PaSa:** An LLM Agent", "# **PaSa:** An LLM Agent"),  # bold on whole words stays
    ("Yichen He<sup>_∗_1</sup> , and", "Yichen He<sup>∗1</sup>, and"),  # the converter's space before a comma
    ("_No_ tes, or", "Notes, or"),
    ("to get her", "to get her"),  # each stands on the page as a word: not "together"
    ("- Paper\n\n   - Search", "- Paper\n\n   - Search"),  # list markers are structure
    ("Pa  per", "Pa  per"),  # two spaces: not the converter's joint
])
def test_words_cut_where_their_type_changes_are_joined(markdown, joined):
    assert join_split_words(markdown, PAGE) == joined


def test_without_the_pages_words_nothing_is_joined():
    assert join_split_words("**Pa** per", []) == "**Pa** per"


@pytest.mark.parametrize("markdown, clean", [
    ("Ada Lovelace<sup>_∗_1</sup>, Alan Turing<sup>1</sup>", "Ada Lovelace∗¹, Alan Turing¹"),
    ("E = mc<sup>2</sup>, H<sub>2</sub>O, the 4<sup>th</sup> run, 10<sup>-3</sup>", "E = mc², H₂O, the 4ᵗʰ run, 10⁻³"),
    ("Intro.\n\n<!-- Start of picture text -->\nCrawler - Paper Queue<br>?<br>[Search] [Stop]<br>"
     "<!-- End of picture text -->\n\nFigure 1: The crawler.",
     "Intro.\n\nCrawler - Paper Queue ? [Search] [Stop]\n\nFigure 1: The crawler."),
    ("|Pattern|Note|\n|---|---|\n|RAG|first<br>line|", "|Pattern|Note|\n|---|---|\n|RAG|first line|"),
    ("an <u>underlined</u> and <mark>marked</mark> word <!-- a note -->here", "an underlined and marked word here"),
    ("keep `<br>` in code\n\n```\n<sup>1</sup> <!-- x -->\n```\n\nbut not<br>here",
     "keep `<br>` in code\n\n```\n<sup>1</sup> <!-- x -->\n```\n\nbut not here"),
    *[(kept, kept) for kept in ("## Heading\n\n- item **bold** and _italic_\n\n1. first", "a < b and c > d")],
])
def test_markup_goes_and_structure_stays(markdown, clean):
    assert clean_markup(markdown) == clean
