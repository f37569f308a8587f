"""HTML to markdown: headings, paragraphs, lists, code, quotes and tables, read by a tokenizer that is linear in
the page's length whatever it holds (the standard library's parser rescans to the end of the input at every
unterminated tag, so a page of ``<a`` repeated costs time quadratic in its size)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

from ..options import IngestOptions
from .base import Converted, Loader
from .sections import first_heading
from .text import decode_text

# content that is not the document's text: code, styling, menus, embedded media
_DROP = frozenset({"script", "style", "nav", "noscript", "template", "svg", "iframe", "object", "canvas", "select"})
_BLOCK = frozenset({
    "p", "div", "section", "article", "main", "header", "footer", "aside", "address", "figure", "figcaption",
    "details", "summary", "dl", "dt", "dd", "form", "fieldset", "center", "body", "html", "hr", "caption",
})
_HEADINGS = {f"h{i}": i for i in range(1, 7)}
_BR = "\ue000"  # a private-use character marks <br> until whitespace is collapsed
_SPACES = re.compile(r"\s+")
_HEADING_LIKE = re.compile(r"^(#{1,6})(?=\s|$)", re.MULTILINE)
#: elements whose content is raw text up to their end tag (no tags inside)
_RAW_TEXT = frozenset({"script", "style"})
_RAW_END = {tag: re.compile(rf"</{tag}(?=[\t\n\f\r />]|\Z)", re.IGNORECASE) for tag in _RAW_TEXT}
# One token at a time, each alternative either ending where HTML ends it or running to the end of the input
# (what a browser does with an unterminated construct), so that every scan consumes what it read.
# A quote guards a '>' only in an attribute's value (after '='), as the HTML tokenizer has it.
_ATTRIBUTES = r"""(?:=[\t\n\f\r ]*(?:"[^"]*(?:"|\Z)|'[^']*(?:'|\Z))|[^>])*"""
_TOKEN = re.compile(
    r"(?P<comment><!--.*?(?:--!?>|\Z))"
    r"|(?P<cdata><!\[CDATA\[.*?(?:\]\]>|\Z))"
    r"|(?P<decl><[!?][^>]*(?:>|\Z))"
    r"|</(?P<end>[a-zA-Z][^\t\n\f\r />]*)" + _ATTRIBUTES + r"(?:>|\Z)"
    r"|(?P<bogus></[^>]*(?:>|\Z))"
    r"|<(?P<start>[a-zA-Z][^\t\n\f\r />]*)" + _ATTRIBUTES + r"(?:>|\Z)"
    r"|(?P<text>[^<]+|<)",
    re.DOTALL)


def _tokens(page: str) -> Iterator[tuple[str, str]]:
    """The page as ``(kind, value)``: ``("start", tag)``, ``("end", tag)`` (tag names in lower case) and
    ``("data", text)`` (character references resolved); comments, declarations and processing instructions
    are left out. The content of a script or style element is one ``data`` token, up to its end tag."""
    pos, size = 0, len(page)
    text: list[str] = []
    while pos < size:
        match = _TOKEN.match(page, pos)
        assert match is not None  # the last alternative takes any character
        pos = match.end()
        kind = match.lastgroup
        if kind == "text":
            text.append(match.group("text"))
            continue
        if text:
            yield "data", html.unescape("".join(text))
            text = []
        if kind == "end":
            yield "end", match.group("end").lower()
        elif kind == "start":
            tag = match.group("start").lower()
            yield "start", tag
            if match.group(0).endswith("/>"):
                yield "end", tag
            elif tag in _RAW_TEXT:
                close = _RAW_END[tag].search(page, pos)
                stop = size if close is None else close.start()
                if stop > pos:
                    yield "data", page[pos:stop]
                pos = stop
    if text:
        yield "data", html.unescape("".join(text))


def _collapse(text: str) -> str:
    """HTML whitespace rules: runs of whitespace are one space; <br> makes a line break."""
    return "\n".join(_SPACES.sub(" ", part).strip() for part in text.split(_BR)).strip()


class _Converter:
    """Collects markdown blocks while `_tokens` walks the tags."""

    def __init__(self) -> None:
        self.blocks: list[str] = []
        self.inline: list[str] = []
        self.title_parts: list[str] = []
        self.in_title = False
        self.skip = 0  # depth inside dropped elements
        self.heading: int | None = None
        self.lists: list[list[int]] = []  # per open list: [ordered (0/1), items so far, marker width]
        self.marker: str | None = None  # a list item's marker, waiting for the item's first block
        self.quote = 0
        self.pre = 0
        self.pre_parts: list[str] = []
        self.table: list[list[str]] | None = None
        self.table_depth = 0
        self.row: list[str] | None = None
        self.cell: list[str] | None = None

    # -- output ------------------------------------------------------------------

    def emit(self, text: str) -> None:
        """Add a block, decorated for the lists and quotes it sits in."""
        lines = text.split("\n")
        if self.lists:
            # nested content lines up with the text after its item's marker, as markdown wants
            indent = " " * sum(width for _, _, width in self.lists[:-1])
            rest = indent + " " * self.lists[-1][2]
            first = indent + self.marker if self.marker is not None else rest
            self.marker = None
            lines = [first + lines[0]] + [rest + line if line else line for line in lines[1:]]
        if self.quote:
            lines = [("> " * self.quote + line).rstrip() for line in lines]
        self.blocks.append("\n".join(lines))

    def flush(self) -> None:
        text = _collapse("".join(self.inline))
        self.inline = []
        if not text:
            return
        if self.heading is not None:
            self.emit("#" * self.heading + " " + text.replace("\n", " "))
        else:
            # a paragraph that begins with '#' would read as a heading in markdown
            self.emit(_HEADING_LIKE.sub(r"\\\1", text))

    def render_table(self, rows: list[list[str]]) -> None:
        rows = [row for row in rows if any(cell for cell in row)]
        if not rows:
            return
        width = max(len(row) for row in rows)
        rows = [row + [""] * (width - len(row)) for row in rows]
        lines = ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        lines.insert(1, "|" + " --- |" * width)
        self.emit("\n".join(lines))

    # -- parser callbacks --------------------------------------------------------

    def feed(self, page: str) -> None:
        for kind, value in _tokens(page):
            if kind == "start":
                self.handle_starttag(value)
            elif kind == "end":
                self.handle_endtag(value)
            else:
                self.handle_data(value)

    def handle_starttag(self, tag: str) -> None:
        if self.skip or tag in _DROP:
            if tag in _DROP:
                self.skip += 1
            return
        if tag == "title":
            self.in_title = True
        elif self.table is not None:
            self._table_start(tag)
        elif self.pre:
            return
        elif tag == "br":
            self.inline.append(_BR)
        elif tag == "code":
            self.inline.append("`")
        elif tag in _HEADINGS:
            self.flush()
            self.heading = _HEADINGS[tag]
        elif tag in ("ul", "ol"):
            self.flush()
            self.lists.append([int(tag == "ol"), 0, 2])
        elif tag == "li":
            self.flush()
            if not self.lists:  # a stray <li>: treat it as an item of an unordered list
                self.lists.append([0, 0, 2])
            self.lists[-1][1] += 1
            ordered, count, _ = self.lists[-1]
            self.marker = f"{count}. " if ordered else "- "
            self.lists[-1][2] = len(self.marker)
        elif tag == "pre":
            self.flush()
            self.pre = 1
            self.pre_parts = []
        elif tag == "blockquote":
            self.flush()
            self.quote += 1
        elif tag == "table":
            self.flush()
            self.table, self.table_depth = [], 1
        elif tag in _BLOCK:
            self.flush()

    def _table_start(self, tag: str) -> None:
        if tag == "table":  # nested tables are flattened into the outer cell's text
            self.table_depth += 1
        elif self.table_depth > 1:
            if self.cell is not None:
                self.cell.append(" ")
        elif tag == "tr":
            self.row = []
        elif tag in ("td", "th"):
            if self.row is None:
                self.row = []
            self.cell = []
        elif self.cell is not None:
            self.cell.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if self.skip:
            if tag in _DROP:
                self.skip -= 1
            return
        if tag == "title":
            self.in_title = False
        elif self.table is not None:
            self._table_end(tag)
        elif tag == "pre":
            if self.pre:
                self.pre = 0
                code = "".join(self.pre_parts).strip("\n")
                if code.strip():
                    fence = "~~~" if "```" in code else "```"
                    self.emit(f"{fence}\n{code}\n{fence}")
        elif self.pre:
            return
        elif tag == "code":
            self.inline.append("`")
        elif tag in _HEADINGS:
            self.flush()
            self.heading = None
        elif tag in ("ul", "ol"):
            self.flush()
            if self.lists:
                self.lists.pop()
            self.marker = None
        elif tag == "li":
            self.flush()
            self.marker = None
        elif tag == "blockquote":
            self.flush()
            self.quote = max(0, self.quote - 1)
        elif tag in _BLOCK:
            self.flush()

    def _table_end(self, tag: str) -> None:
        if tag == "table":
            self.table_depth -= 1
            if self.table_depth == 0:
                rows, self.table = self.table or [], None
                if self.row:
                    rows.append(self.row)
                self.row = self.cell = None
                self.render_table(rows)
        elif self.table_depth > 1:
            return
        elif tag in ("td", "th") and self.cell is not None:
            if self.row is None:
                self.row = []
            self.row.append(_collapse("".join(self.cell)).replace("\n", " "))
            self.cell = None
        elif tag == "tr" and self.row is not None and self.table is not None:
            self.table.append(self.row)
            self.row = None

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        if self.in_title:
            self.title_parts.append(data)
        elif self.table is not None:
            if self.cell is not None:
                self.cell.append(data)
        elif self.pre:
            self.pre_parts.append(data)
        else:
            self.inline.append(data)

    def result(self) -> tuple[str, str]:
        # a page cut short (a truncated download) keeps what its open elements hold
        if self.table is not None:  # an unclosed table still shows its rows, and its open cell
            self.table_depth = 1
            self._table_end("td")
            self._table_end("table")
        if self.pre:
            self.handle_endtag("pre")
        self.flush()
        text = "\n\n".join(self.blocks)
        return (text + "\n" if text else ""), _collapse("".join(self.title_parts))


def html_to_markdown(html: str) -> tuple[str, str]:
    """Convert an HTML page to markdown.

    Headings h1–h6 become ``#`` … ``######``; paragraphs and other blocks are separated by
    blank lines; lists keep their markers and nesting; ``<pre>`` becomes a fenced block;
    tables become pipe tables; scripts, styles, navigation and embedded media are dropped.
    Inline styling is dropped too (only ``<code>`` keeps its backticks): the text is what matters.

    Args:
        html: the page's source.

    Returns:
        (markdown, the ``<title>`` text or ``""``).
    """
    converter = _Converter()
    converter.feed(html)
    return converter.result()


class HtmlLoader(Loader):
    """HTML pages, converted to markdown; the title comes from ``<title>``, else the first heading."""

    format = "html"
    suffixes = (".html", ".htm", ".xhtml")
    isolated = True  # a page's nesting decides what its markdown costs: bounded in time and memory like a PDF

    def __init__(self, limits: IngestOptions | None = None) -> None:
        self.limits = limits or IngestOptions()  # built so in the child (see `isolated`)

    def convert(self, data: bytes, source: str) -> Converted:
        markdown, title = html_to_markdown(decode_text(data, source))
        return Converted(markdown, title=title or first_heading(markdown))
