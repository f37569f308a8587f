"""The section tree: a golden markdown file, heading rules, and invariants over random markdown."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from marginalia.ingest.loaders import content_id
from marginalia.ingest.sections import clean_heading, format_tree, iter_headings, parse_sections
from marginalia.records import Document

GOLDEN = """Preface before any heading.

# Harbour Guide

Welcome to the harbour.

## Tides ##

High tide is at **noon**.

```
# a comment in code, not a heading
```

### Spring tides

Twice a month.

#### Deep *detail*

Below a skipped level.
# Second Part

#hashtag is not a heading

    # indented code is not a heading either

##### Far down

Nested under the second part.

~~~python
## also code
~~~
"""


def doc_of(text: str, fmt: str = "markdown", title: str = "") -> Document:
    return Document(source="t.md", text=text, doc_id=content_id(text), format=fmt, title=title)


def test_golden_tree() -> None:
    doc = doc_of(GOLDEN, title="Guide")
    sections = parse_sections(doc)
    assert [(s.index, s.level, s.title, s.path, s.parent, s.children) for s in sections] == [
        (0, 0, "Guide", (), None, (1, 5)),
        (1, 1, "Harbour Guide", ("Harbour Guide",), 0, (2,)),
        (2, 2, "Tides", ("Harbour Guide", "Tides"), 1, (3,)),
        (3, 3, "Spring tides", ("Harbour Guide", "Tides", "Spring tides"), 2, (4,)),
        (4, 4, "Deep detail", ("Harbour Guide", "Tides", "Spring tides", "Deep detail"), 3, ()),
        (5, 1, "Second Part", ("Second Part",), 0, (6,)),
        (6, 5, "Far down", ("Second Part", "Far down"), 5, ()),
    ]
    bodies = [GOLDEN[s.body_start:s.body_end] for s in sections]
    assert bodies == [
        "Preface before any heading.",
        "Welcome to the harbour.",
        "High tide is at **noon**.\n\n```\n# a comment in code, not a heading\n```",
        "Twice a month.",
        "Below a skipped level.",
        "#hashtag is not a heading\n\n    # indented code is not a heading either",
        "Nested under the second part.\n\n~~~python\n## also code\n~~~",
    ]
    spans = [GOLDEN[s.start:s.end] for s in sections]
    assert spans[0] == GOLDEN
    assert spans[1] == GOLDEN[GOLDEN.index("# Harbour Guide"):GOLDEN.index("# Second Part")]
    assert spans[3] == "### Spring tides\n\nTwice a month.\n\n#### Deep *detail*\n\nBelow a skipped level.\n"
    assert spans[4] == "#### Deep *detail*\n\nBelow a skipped level.\n"
    assert spans[5] == GOLDEN[GOLDEN.index("# Second Part"):]
    assert spans[6] == GOLDEN[GOLDEN.index("##### Far down"):]
    assert all(s.doc_id == doc.doc_id for s in sections)


def test_format_tree() -> None:
    sections = parse_sections(doc_of(GOLDEN, title="Guide"))
    assert format_tree(sections) == (
        "Guide\n"
        "  Harbour Guide\n"
        "    Tides\n"
        "      Spring tides\n"
        "        Deep detail\n"
        "  Second Part\n"
        "    Far down\n"
    )
    assert format_tree(parse_sections(doc_of("no headings\n"))) == "(document)\n"
    assert format_tree([]) == ""


def test_format_tree_with_pages() -> None:
    text = "# One\n\nfirst page\n\n# Two\n\nsecond page\n"
    doc = Document("p.pdf", text, content_id(text), "pdf", "Paper", page_starts=(0, text.index("# Two")))
    assert format_tree(parse_sections(doc), doc) == "Paper\n  One  (p. 1)\n  Two  (p. 2)\n"


def test_clean_heading() -> None:
    assert clean_heading("  **Bold** and _it_ and *em* ##  ") == "Bold and it and em"
    assert clean_heading("The `parse()` [function](http://x.org) \\#1") == "The parse() function #1"
    assert clean_heading("C# notes") == "C# notes"
    assert clean_heading("snake_case_name") == "snake_case_name"
    assert clean_heading("#") == ""


def test_clean_heading_drops_superscript_marks_and_inline_html() -> None:
    """PDF converters write a title's footnote and affiliation marks as <sup>, and styling as inline HTML."""
    assert clean_heading("PaSa: An LLM Agent Yichen He<sup>\u2217</sup><sup>1</sup> Guanhua Huang<sup>1</sup>") == (
        "PaSa: An LLM Agent Yichen He Guanhua Huang")
    assert clean_heading("A Title<sup>*,\u2020</sup>") == "A Title"
    assert clean_heading("H<sub>2</sub>O and <u>under</u> <mark>marked</mark><br>next") == "H2O and under marked next"
    assert clean_heading("x<sup>n</sup> grows") == "xn grows"  # a superscript that is not a mark keeps its text
    assert clean_heading("Using <div> in HTML") == "Using <div> in HTML"  # other tags are text


def test_heading_rules() -> None:
    text = ("#\n\n# Real\n\n####### seven is text\n\n   ### Indented three\n\n"
            "Setext one\n==========\n\nSetext two\n---\n\nA paragraph of\ntwo lines\n---\n\n- item\n---\n")
    titles = [(h.level, h.title) for h in iter_headings(text)]
    assert titles == [(1, "Real"), (3, "Indented three"), (1, "Setext one"), (2, "Setext two")]
    assert [(h.level, h.title) for h in iter_headings(text, setext=False)] == [(1, "Real"), (3, "Indented three")]
    setext = next(h for h in iter_headings(text) if h.title == "Setext one")
    assert text[setext.start:setext.end] == "Setext one\n==========\n"


def test_setext_only_in_markdown() -> None:
    text = "Title\n=====\n\nbody\n"
    assert [s.title for s in parse_sections(doc_of(text))] == ["", "Title"]
    assert [s.title for s in parse_sections(doc_of(text, fmt="html"))] == [""]
    assert [s.title for s in parse_sections(doc_of("# Heading\n\nbody\n", fmt="text"))] == [""]


def test_empty_bodies_and_no_trailing_newline() -> None:
    text = "# A\n# B\n\n\n## C\ntext of C"
    sections = parse_sections(doc_of(text))
    assert [(s.title, text[s.body_start:s.body_end]) for s in sections] == [
        ("", ""), ("A", ""), ("B", ""), ("C", "text of C")]
    assert sections[1].body_start == sections[1].body_end == len("# A\n")
    assert sections[0].body_start == sections[0].body_end == 0
    assert sections[3].end == len(text)


def test_unclosed_fence_hides_later_headings() -> None:
    text = "# Top\n\n```\ncode\n\n# inside\n"
    assert [s.title for s in parse_sections(doc_of(text))] == ["", "Top"]


# -- invariants over random markdown ---------------------------------------------

_words = st.lists(st.sampled_from(["mill", "weir", "tide", "rope", "*bold*", "x_y", "C#", "2.1"]), min_size=1,
                  max_size=6).map(" ".join)
_block = st.one_of(
    st.tuples(st.integers(1, 6), _words).map(lambda t: "#" * t[0] + " " + t[1]),
    _words,
    _words.map(lambda w: f"```\n# inside {w}\n\n## inside\n```"),
    st.just(""),
    st.just("   "),
)


@given(st.lists(_block, max_size=25), st.sampled_from(["\n", "\n\n"]), st.booleans())
def test_tree_invariants(blocks: list[str], joiner: str, final_newline: bool) -> None:
    text = joiner.join(blocks) + ("\n" if final_newline else "")
    sections = parse_sections(doc_of(text))
    root = sections[0]
    assert (root.index, root.level, root.start, root.end, root.parent) == (0, 0, 0, len(text), None)
    assert not any("inside" in s.title for s in sections)
    covered = [False] * len(text)
    for s in sections:
        assert s.index == sections.index(s)
        assert s.start <= s.body_start <= s.body_end <= s.end
        assert all(sections[c].parent == s.index for c in s.children)
        assert [sections[c].start for c in s.children] == sorted(sections[c].start for c in s.children)
        for c in s.children:
            child = sections[c]
            assert s.start <= child.start and child.end <= s.end and child.level > s.level
            assert child.path == (*s.path, child.title)
            assert s.body_end <= child.start
        if s.parent is not None:
            assert s.index in sections[s.parent].children
            heading_line = text[s.start:text.find("\n", s.start) if "\n" in text[s.start:] else len(text)]
            assert heading_line.startswith("#" * s.level + " ")
            covered[s.start:s.start + len(heading_line)] = [True] * len(heading_line)
        body = text[s.body_start:s.body_end]
        assert body == "" or (body[0] != "\n" and not body[-1].isspace())
        assert not any(covered[s.body_start:s.body_end]), "bodies overlap each other or a heading"
        covered[s.body_start:s.body_end] = [True] * (s.body_end - s.body_start)
    # nothing but whitespace lies outside the bodies and the heading lines
    assert all(done or ch.isspace() for done, ch in zip(covered, text, strict=True))
