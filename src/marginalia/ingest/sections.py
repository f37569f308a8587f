"""The section tree of a markdown document: headings, what each one owns, and an indented rendering."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..records import Document, Section

_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
# a line that cannot be a setext title: it starts a list, quote, table, heading, html block or indented code
_NOT_TITLE = re.compile(r"^(?: {4}|\t| {0,3}(?:[-+*>|#<]|\d{1,9}[.)])(?:\s|$))")
_CLOSING_HASHES = re.compile(r"(?:^|[ \t]+)#+[ \t]*$")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_WRAPPED = re.compile(r"(?<![\w*])([*_])(?=\S)(.+?)(?<=\S)\1(?![\w*])")
_ESCAPED = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|<>~])")
# footnote and affiliation marks set as superscripts (PDF converters write them as <sup>): "Title<sup>*</sup>"
_MARK_SUP = re.compile(r"<sup>[\s\d,;*\u2217\u2020\u2021\u00a7\u00b6\u22c6\u2605#\u2013-]*</sup>", re.IGNORECASE)
# inline HTML that converters use for styling (a heading's text keeps what they wrap)
_INLINE_TAG = re.compile(r"</?(?:sup|sub|u|mark|b|i|em|strong|s|small|span)(?:\s[^<>]*)?>", re.IGNORECASE)
_BREAK_TAG = re.compile(r"<br\s*/?>", re.IGNORECASE)


@dataclass(frozen=True)
class Heading:
    """One heading line found in a markdown text (character offsets into it)."""

    level: int
    title: str  # cleaned, see clean_heading
    start: int  # start of the heading's first line
    end: int  # end of its last line, including the newline


def clean_heading(raw: str) -> str:
    """A heading's text without markdown decoration.

    Drops an ATX closing sequence (``## Title ##``), emphasis markers, code backticks,
    link targets and backslash escapes, footnote marks set as superscripts (``<sup>*1</sup>``)
    and the tags of inline HTML styling (``<sup>``, ``<u>``, ``<mark>`` ..., keeping what they
    wrap), and collapses whitespace.
    """
    text = _CLOSING_HASHES.sub("", raw.strip())
    text = _MARK_SUP.sub("", text)
    text = _INLINE_TAG.sub("", _BREAK_TAG.sub(" ", text))
    text = _LINK.sub(r"\1", text)
    text = text.replace("**", "").replace("__", "").replace("`", "")
    text = _WRAPPED.sub(r"\2", text)
    text = _ESCAPED.sub(r"\1", text)
    return " ".join(text.split())


def fence_opening(line: str) -> str | None:
    """The fence (run of backticks or tildes) that ``line`` opens, or None.

    CommonMark: a backtick fence's info string holds no backticks (such a line is inline code).
    """
    m = _FENCE.match(line)
    if m is None or (m.group(1)[0] == "`" and "`" in m.group(2)):
        return None
    return m.group(1)


def closes_fence(line: str, fence: str) -> bool:
    """Whether ``line`` closes a code block opened by ``fence``: the same character, at least as many, nothing after."""
    m = _FENCE.match(line)
    return m is not None and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip()


def _lines(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end including the newline, line without the newline) for each line."""
    pos = 0
    n = len(text)
    while pos < n:
        nl = text.find("\n", pos)
        end = n if nl < 0 else nl + 1
        yield pos, end, text[pos:end].rstrip("\n")
        pos = end


def iter_headings(text: str, setext: bool = True) -> Iterator[Heading]:
    """The ATX (``#`` ... ``######``) and setext (``===``/``---`` underlined) headings of ``text``, in order.

    Lines inside fenced code blocks are never headings; neither are ``#hashtag`` lines
    (CommonMark wants a space after the hashes) nor headings whose text is empty.
    A setext title must be a single line after a blank line (or a heading, or the start),
    so a ``---`` rule under a paragraph of several lines stays a rule.
    """
    fence: str | None = None
    prev: tuple[int, int, str] | None = None  # the previous line, when it may be a setext title
    after_break = True  # the previous line was blank, a heading, a fence or the start
    for start, end, line in _lines(text):
        if fence is not None:
            if closes_fence(line, fence):
                fence = None
                after_break = True
            prev = None
            continue
        opening = fence_opening(line)
        if opening:
            fence = opening
            prev = None
            continue
        atx = _ATX.match(line)
        if atx:
            title = clean_heading(atx.group(2) or "")
            if title:
                yield Heading(len(atx.group(1)), title, start, end)
            prev, after_break = None, True
            continue
        if setext and prev is not None:
            underline = _SETEXT.match(line)
            if underline and (underline.group(1)[0] == "=" or len(underline.group(1)) >= 2):
                title = clean_heading(prev[2])
                if title:
                    yield Heading(1 if underline.group(1)[0] == "=" else 2, title, prev[0], end)
                    prev, after_break = None, True
                    continue
        if not line.strip():
            prev, after_break = None, True
            continue
        prev = (start, end, line) if after_break and not _NOT_TITLE.match(line) else None
        after_break = False


def first_heading(text: str) -> str:
    """The cleaned title of the first heading in a markdown text, or ``""``."""
    for heading in iter_headings(text):
        return heading.title
    return ""


def _trim_blank_lines(text: str, start: int, end: int) -> tuple[int, int]:
    """Narrow [start, end) past whole blank lines at both ends (indentation of the first line stays)."""
    pos = start
    while pos < end:
        nl = text.find("\n", pos, end)
        if nl < 0 or text[pos:nl].strip():
            break
        pos = nl + 1
    if not text[pos:end].strip():
        return start, start
    stop = end
    while stop > pos and text[stop - 1].isspace():
        stop -= 1
    return pos, stop


def parse_sections(doc: Document) -> list[Section]:
    """The section tree of a document, flattened in document order; index 0 is the root.

    The root (level 0) spans the whole text and owns the text before the first heading.
    Every heading opens a section that runs to the next heading of the same or a shallower
    level; a skipped level (``#`` then ``###``) nests under the nearest shallower heading.
    ``body_start``/``body_end`` span a section's own text with blank lines trimmed at both ends
    (equal when it has none). Plain-text documents (``format == "text"``) have no headings,
    so they get the root alone; setext headings count in markdown documents only.

    Args:
        doc: the loaded document; offsets refer to ``doc.text``.

    Returns:
        The sections, each with its parent's index and its children's indexes.
    """
    text = doc.text
    # setext underlines only mean headings in real markdown; converters (PDF, HTML) write ATX headings
    headings = [] if doc.format == "text" else list(iter_headings(text, setext=doc.format == "markdown"))
    n = len(headings)
    # section i + 1 is heading i; a section ends where the next heading of level <= its own starts
    ends = [len(text)] * n
    stack: list[int] = []
    for i, heading in enumerate(headings):
        while stack and headings[stack[-1]].level >= heading.level:
            ends[stack.pop()] = heading.start
        stack.append(i)
    parents: list[int] = []
    children: list[list[int]] = [[] for _ in range(n + 1)]
    open_sections: list[int] = []  # indexes of headings whose sections are still open
    for i, heading in enumerate(headings):
        while open_sections and headings[open_sections[-1]].level >= heading.level:
            open_sections.pop()
        parent = open_sections[-1] + 1 if open_sections else 0
        parents.append(parent)
        children[parent].append(i + 1)
        open_sections.append(i)

    root_body = _trim_blank_lines(text, 0, headings[0].start if headings else len(text))
    sections = [Section(
        doc_id=doc.doc_id, index=0, level=0, title=doc.title, path=(), start=0, end=len(text),
        body_start=root_body[0], body_end=root_body[1], parent=None, children=tuple(children[0]),
    )]
    paths: list[tuple[str, ...]] = [()]
    for i, heading in enumerate(headings):
        path = (*paths[parents[i]], heading.title)
        paths.append(path)
        own_end = headings[i + 1].start if i + 1 < n else len(text)
        body_start, body_end = _trim_blank_lines(text, heading.end, own_end)
        sections.append(Section(
            doc_id=doc.doc_id, index=i + 1, level=heading.level, title=heading.title, path=path,
            start=heading.start, end=ends[i], body_start=body_start, body_end=body_end,
            parent=parents[i], children=tuple(children[i + 1]),
        ))
    return sections


def format_tree(sections: list[Section], doc: Document | None = None) -> str:
    """An indented outline of a section tree, one section a line (the root's line is the document title).

    Indentation follows the tree (two spaces per ancestor), so a skipped heading level does not
    indent twice.

    Args:
        sections: the result of :func:`parse_sections`.
        doc: the document, to append each section's first page (``p. 3``) when its pages are known.

    Returns:
        The outline, ending in a newline (empty for no sections).
    """
    depth: dict[int, int] = {}
    lines = []
    for section in sections:
        d = 0 if section.parent is None else depth[section.parent] + 1
        depth[section.index] = d
        title = section.title or ("(document)" if section.level == 0 else "(untitled)")
        page = doc.page_at(section.start) if doc is not None and section.level > 0 else None
        lines.append("  " * d + title + (f"  (p. {page})" if page is not None else ""))
    return "\n".join(lines) + ("\n" if lines else "")


def section_at(sections: Sequence[Section], offset: int) -> Section | None:
    """The deepest section holding character ``offset`` (the root only where no heading's section does)."""
    best: Section | None = None
    for section in sections:
        if section.start <= offset < section.end and (best is None or section.level > best.level):
            best = section
    return best
