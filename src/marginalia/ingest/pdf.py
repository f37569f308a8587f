"""PDF to markdown with pymupdf4llm: text in reading order, headings with outline levels, page offsets, clear errors.

pymupdf4llm (with pymupdf-layout) classifies each block of a page (text, section header,
title, list item, table, page header/footer ...) and ranks header levels by font size alone.
This module takes its per-page boxes and adds four things:

* **Reading order on two-column pages.** pymupdf4llm sometimes puts a column's last short
  block after the other column (a block whose vertical extent touches nothing in the other
  column counts as full-width for it). When a page is cleanly two-column — every block lies
  left or right of the middle of the text area, except full-width blocks that sit beside no
  column block — blocks are read band by band (bands are cut at the full-width blocks): left
  column top to bottom, then right column. Other pages keep pymupdf4llm's order. A paragraph
  cut by a column or page break (it ends without a full stop and the next block starts in
  lower case) is joined again.
* **Heading levels from the outline, not only from font sizes** (:func:`heading_levels`).
* **A title's byline is not part of the title.** The layout model may put a paper's title and
  its author list (with affiliation marks) in one title box; the lines in the title's font
  stay the heading and the smaller lines after them become text (:func:`split_byline`).
* **Running heads, running feet and page numbers are dropped** (see :func:`_drop_running_heads`),
  and a damaged, encrypted, empty or image-only file is refused with a message that says what to do.
* **No extraction markup in the text** (see `markup`): words cut where their type changes are joined
  again (checked against the page's own words), and the HTML pymupdf4llm writes (superscript tags,
  the comments and ``<br>`` around a figure's text) is taken out.

The loader is isolated: it always converts in a child process (see `isolated`), which refuses a PDF with
more pages than ``max_pages`` or whose streams inflate past ``max_inflated_mb`` before converting it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import re
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import BadInput, IngestError, MissingDependency
from ..options import IngestOptions
from ..records import Document
from .base import Converted, Loader
from .isolated import MIB, exceeded
from .markup import clean_markup, join_split_words
from .sections import clean_heading

log = logging.getLogger(__name__)

PDF_INSTALL = "pip install 'marginalia[pdf]'"

_HEADING_BOX = re.compile(r"^\s*(#{1,6})\s+(.*\S)\s*$", re.DOTALL)
_HEADING_LINE = re.compile(r"^( {0,3})(#{1,6})(?=\s|$)")
_FENCE_LINE = re.compile(r"^ {0,3}(```|~~~)")
_APPENDIX = re.compile(r"^(?:appendix|annex)\s+[A-Z](?=$|[\s.:])", re.IGNORECASE)
_LETTERED = re.compile(r"^[A-Z]((?:\.\d{1,3}){1,5})\.?\s+\S")  # A.1, B.2.3
_ARABIC = re.compile(r"^(\d{1,2}(?:\.\d{1,3}){0,5})\.?\s+\S")  # 2, 2.1, 2.1.3, "3." too
_ROMAN = re.compile(r"^[IVX]{1,5}\.\s+\S")  # II. METHOD
_SENTENCE_END = re.compile(r"[.!?:;\"'\u201d)\]]$")
_TAG = re.compile(r"<[^<>]*>")
_NOT_WORD = re.compile(r"[\W_]+")
#: boxes whose words are not prose: a table's cells, a figure's labels, a formula
_NOT_PROSE = ("table", "picture", "formula")
#: font sizes (points) closer than this are one size: a title's lines are all in its largest font
SIZE_SLACK = 0.5


def _import_pdf_libraries() -> tuple[Any, Any]:
    try:
        import pymupdf
        import pymupdf4llm
    except ImportError as exc:
        what = "PDF support (pymupdf4llm)"
        if not isinstance(exc, ModuleNotFoundError):  # e.g. pymupdf4llm refusing a mismatched pymupdf
            what += f" in a working version ({exc})"
        raise MissingDependency(what, PDF_INSTALL) from exc
    return pymupdf, pymupdf4llm


# -- heading levels -------------------------------------------------------------


def numbering_depth(title: str) -> int | None:
    """The outline depth a heading's number says (``2`` → 1, ``2.1`` → 2, ``A.1`` → 2), or None.

    Recognised: arabic numbers with dots (at most two digits first, so "2019 in review" is no
    number), ``Appendix A``, lettered appendix sections (``A.1``) and roman numerals with a dot (``IV.``).
    """
    if _APPENDIX.match(title) or _ROMAN.match(title):
        return 1
    lettered = _LETTERED.match(title)
    if lettered:
        return 1 + lettered.group(1).count(".")
    arabic = _ARABIC.match(title)
    if arabic:
        return 1 + arabic.group(1).count(".")
    return None


@dataclass(frozen=True)
class RawHeading:
    """A heading as pymupdf4llm found it: its font-size rank (1 = largest), text and page (1-based)."""

    rank: int
    title: str
    page: int


def _ranks_per_depth(numbered: dict[int, int], ranks: Sequence[int]) -> dict[int, int]:
    """For each numbering depth, the font-size rank that most of its headings use.

    Chosen together so that a deeper depth never has a larger font than a shallower one
    (ranks non-decreasing with depth), maximising the headings explained; ties go to larger fonts.
    """
    depths = sorted(set(numbered.values()))
    values = sorted({ranks[i] for i in numbered})
    counts = {(d, v): 0 for d in depths for v in values}
    for i, d in numbered.items():
        counts[d, ranks[i]] += 1
    # best[v]: (headings explained, the choice so far) when the current depth uses rank v
    best: dict[int, tuple[int, tuple[int, ...]]] = {v: (counts[depths[0], v], (v,)) for v in values}
    for d in depths[1:]:
        new: dict[int, tuple[int, tuple[int, ...]]] = {}
        for v in values:
            score, choice = max(
                (best[u] for u in values if u <= v), key=lambda sc: (sc[0], [-x for x in sc[1]])
            )
            new[v] = (score + counts[d, v], (*choice, v))
        best = new
    _, choice = max(best.values(), key=lambda sc: (sc[0], [-x for x in sc[1]]))
    return dict(zip(depths, choice, strict=True))


def heading_levels(headings: Sequence[RawHeading]) -> tuple[list[int], int | None]:
    """Markdown levels (1–6) for a PDF's headings, and the index of the document title if there is one.

    pymupdf4llm ranks headings by font size only, so an 11-point "Abstract" lands between
    12-point sections and 10-point subsections, and a "2.1" may come out as deep as any
    small bold line. The levels here follow the outline instead:

    1. **Title**: the first heading, on page 1, unnumbered, in a font larger than every other
       heading's, is the document title: level 1, and every other heading moves one level down.
    2. **Numbered headings** take their depth from their number (``2`` → 1, ``2.1`` → 2). Each
       depth is tied to the font-size rank most of its headings use (deeper never larger); a
       numbered heading whose font contradicts that (a numbered list in small type inside a
       licence, say) is treated as unnumbered.
    3. **Unnumbered headings** (Abstract, References, run-in titles) take the depth whose font
       rank they share (the shallowest, if several); one between two depths' fonts takes the
       shallower depth; one smaller than every numbered depth goes below the deepest, one
       level per smaller size.
    4. **No numbered headings at all**: depth is the rank of the heading's font size among
       the sizes used by headings (largest first).

    Args:
        headings: in document order.

    Returns:
        (levels, title index or None).
    """
    n = len(headings)
    if n == 0:
        return [], None
    ranks = [h.rank for h in headings]
    first = headings[0]
    title = 0 if (first.page == 1 and numbering_depth(first.title) is None
                  and all(r > first.rank for r in ranks[1:])) else None
    offset = 1 if title is not None else 0
    others = [i for i in range(n) if i != title]

    numbered = {i: d for i in others if (d := numbering_depth(headings[i].title)) is not None}
    per_depth = _ranks_per_depth(numbered, ranks) if numbered else {}
    depth: dict[int, int] = {}
    for i, d in numbered.items():
        r = ranks[i]
        if all(per_depth[e] <= r for e in per_depth if e < d) and all(per_depth[e] >= r for e in per_depth if e > d):
            depth[i] = d
    rest = [i for i in others if i not in depth]
    if per_depth:
        deepest = max(per_depth)
        smaller = sorted({ranks[i] for i in rest if ranks[i] > per_depth[deepest]})
        for i in rest:
            r = ranks[i]
            same = [d for d, v in per_depth.items() if v == r]
            above = [d for d, v in per_depth.items() if v < r]
            if same:
                depth[i] = min(same)
            elif r > per_depth[deepest]:
                depth[i] = deepest + 1 + smaller.index(r)
            else:
                depth[i] = max(above) if above else 1
    else:
        used = sorted({ranks[i] for i in rest})
        for i in rest:
            depth[i] = used.index(ranks[i]) + 1
    levels = [1 if i == title else min(6, offset + depth[i]) for i in range(n)]
    return levels, title


# -- pages and boxes ---------------------------------------------------------------


@dataclass
class _Box:
    kind: str  # pymupdf4llm's class: text, section-header, title, list-item, table, picture, ...
    bbox: tuple[float, float, float, float]
    text: str
    heading: RawHeading | None = None


def _two_column_order(boxes: list[_Box]) -> list[_Box]:
    """Boxes in column order when the page is cleanly two-column, else as they are (see the module doc)."""
    if len(boxes) < 3:
        return boxes
    x0 = min(b.bbox[0] for b in boxes)
    x1 = max(b.bbox[2] for b in boxes)
    middle = (x0 + x1) / 2
    left = [b for b in boxes if b.bbox[2] <= middle]
    right = [b for b in boxes if b.bbox[0] >= middle]
    if not left or not right:
        return boxes
    columns = {id(b) for b in left + right}
    spanning = sorted((b for b in boxes if id(b) not in columns), key=lambda b: b.bbox[1])

    def beside(a: _Box, b: _Box) -> bool:  # vertical overlap of more than a hair (1 pt)
        return min(a.bbox[3], b.bbox[3]) - max(a.bbox[1], b.bbox[1]) > 1.0

    if any(beside(s, c) for s in spanning for c in left + right):
        return boxes
    ordered: list[_Box] = []
    cuts = [s.bbox[1] for s in spanning] + [float("inf")]
    for k, cut in enumerate(cuts):
        low = cuts[k - 1] if k else float("-inf")
        band = [b for b in left + right if low <= b.bbox[1] < cut]
        ordered += sorted((b for b in band if b.bbox[2] <= middle), key=lambda b: b.bbox[1])
        ordered += sorted((b for b in band if b.bbox[2] > middle), key=lambda b: b.bbox[1])
        if k < len(spanning):
            ordered.append(spanning[k])
    return ordered


@dataclass(frozen=True)
class _Line:
    """A line of a PDF page: its text, its font size (superscripts aside) and its box."""

    text: str
    size: float
    bbox: tuple[float, float, float, float]


def _lines_in(pdf_page: Any, bbox: tuple[float, float, float, float]) -> list[_Line]:
    """The text lines inside ``bbox`` on a pymupdf page, top to bottom."""
    lines = []
    for block in pdf_page.get_text("dict", clip=bbox).get("blocks", []):
        for line in block.get("lines", []):
            spans = [s for s in line.get("spans", []) if s.get("text", "").strip()]
            sizes = [s["size"] for s in spans if not s.get("flags", 0) & 1]  # flag 1: superscript
            if spans and sizes:
                lines.append(_Line("".join(s["text"] for s in spans), max(sizes), tuple(line["bbox"])))
    return sorted(lines, key=lambda ln: (ln.bbox[1], ln.bbox[0]))


def _union(lines: Sequence[_Line]) -> tuple[float, float, float, float]:
    return (min(ln.bbox[0] for ln in lines), min(ln.bbox[1] for ln in lines),
            max(ln.bbox[2] for ln in lines), max(ln.bbox[3] for ln in lines))


def split_byline(markdown: str, title: str) -> tuple[str, str] | None:
    """A heading's markdown cut where the words of ``title`` (its plain text, as the page has it) end:
    (the title's markdown, the rest), or None when the words do not line up (nothing is cut then).

    Emphasis, tags and punctuation are ignored in the comparison, so ``**PaSa:** An Agent Yichen
    He<sup>*</sup>`` cut after "PaSa: An Agent" gives ``**PaSa:** An Agent`` and ``Yichen He<sup>*</sup>``.
    """
    def letters(text: str) -> str:
        return _NOT_WORD.sub("", _TAG.sub("", text)).casefold()

    target = letters(title)
    tokens = markdown.split()
    seen = ""
    for i, token in enumerate(tokens[:-1]):
        seen += letters(token)
        if seen == target and target:
            return " ".join(tokens[:i + 1]), " ".join(tokens[i + 1:])
        if not target.startswith(seen):
            return None
    return None


def _heading_boxes(box: _Box, match: re.Match[str], page: int, pdf_page: Any) -> list[_Box]:
    """A title or section header box as a heading, and its byline as text when the box holds one: lines
    after the heading's own in a smaller font (an author list under a paper's title)."""
    markdown = " ".join(match.group(2).split())
    byline: _Box | None = None
    if pdf_page is not None:
        lines = _lines_in(pdf_page, box.bbox)
        largest = max((ln.size for ln in lines), default=0.0)
        head = 0
        while head < len(lines) and lines[head].size >= largest - SIZE_SLACK:
            head += 1
        if 0 < head < len(lines):
            cut = split_byline(markdown, " ".join(ln.text for ln in lines[:head]))
            if cut is not None:
                markdown = cut[0]
                byline = _Box("text", _union(lines[head:]), cut[1])
                box.bbox = _union(lines[:head])
    title = clean_heading(markdown)
    if not title:
        box.kind = "text"
        return [box]
    box.heading = RawHeading(len(match.group(1)), title, page)
    return [box] if byline is None else [box, byline]


def _page_boxes(chunk: dict[str, Any], page: int, pdf_page: Any = None) -> list[_Box]:
    """A page's non-empty boxes with their markdown, in pymupdf4llm's order, headings parsed (with
    ``pdf_page``, the pymupdf page, a title's byline is split from it and words cut where their type
    changes are joined again)."""
    text = chunk["text"]
    words = [w[4] for w in pdf_page.get_text("words")] if pdf_page is not None else []
    boxes = []
    for info in chunk.get("page_boxes") or []:
        start, stop = info["pos"]
        piece = text[start:stop].strip("\n")
        if not piece.strip():
            continue
        if words and info["class"] not in _NOT_PROSE and not _FENCE_LINE.match(piece):
            piece = join_split_words(piece, words)
        box = _Box(info["class"], tuple(info["bbox"]), piece)
        if box.kind in ("title", "section-header"):
            match = _HEADING_BOX.match(piece)
            if match:
                boxes += _heading_boxes(box, match, page, pdf_page)
                continue
            box.kind = "text"
        boxes.append(box)
    if not boxes and text.strip():  # no box information: keep the page's text as one block
        boxes.append(_Box("text", (0.0, 0.0, 0.0, 0.0), text.strip("\n")))
    return boxes


_MARGIN = ("page-header", "page-footer")
_PAGE_NUMBER = re.compile(r"^[\W_]*(?:\d+|[ivxlc]+)(?:[\W_]+(?:of[\W_]+)?\d+)?[\W_]*$", re.IGNORECASE)


def _margin_key(text: str) -> str:
    return re.sub(r"\d+", "0", " ".join(text.split())).lower()


def _drop_running_heads(pages: list[list[_Box]]) -> list[list[_Box]]:
    """Each page's boxes in reading order, without running heads, running feet and page numbers.

    The layout model marks page headers and footers, but it also calls a lone line at the top of
    a page a header. So such a box is dropped only when it is noise: a page number ("3", "- iv -",
    "3 / 12"), or text that recurs (digits aside) on two or more pages. The rest is kept as text:
    headers before the page's body, footers after it.
    """
    pages_with: dict[str, set[int]] = {}
    for number, boxes in enumerate(pages):
        for box in boxes:
            if box.kind in _MARGIN:
                pages_with.setdefault(_margin_key(box.text), set()).add(number)
    ordered = []
    for boxes in pages:
        kept: dict[str, list[_Box]] = {"page-header": [], "page-footer": []}
        for box in boxes:
            if box.kind in _MARGIN and not (_PAGE_NUMBER.match(box.text.strip())
                                            or len(pages_with[_margin_key(box.text)]) > 1):
                kept[box.kind].append(_Box("margin", box.bbox, box.text))  # text, but no paragraph joins it
        body = _two_column_order([b for b in boxes if b.kind not in _MARGIN])
        ordered.append(kept["page-header"] + body + kept["page-footer"])
    return ordered


def _tidy(text: str) -> str:
    """A text block's markdown: no extraction markup (see `markup`), no trailing spaces, at most one blank line,
    no line that reads as a heading."""
    lines = []
    in_fence = False
    for line in clean_markup(text).split("\n"):
        line = line.rstrip()
        if _FENCE_LINE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            line = _HEADING_LINE.sub(r"\1\\\2", line)
        lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")


def _continues(previous: _Box, following: _Box) -> bool:
    """Whether ``following`` carries on the paragraph that ``previous`` left unfinished at a column or page end."""
    if previous.kind != "text" or following.kind != "text":
        return False
    end, start = previous.text.rstrip(), following.text.lstrip()
    if not end or not start or end.endswith(("```", "|", "**")):
        return False
    return not _SENTENCE_END.search(end) and start[0].islower()


def assemble(pages: list[list[_Box]], levels: list[int]) -> tuple[str, tuple[int, ...]]:
    """Join pages of boxes into one markdown text, with the offset where each page begins."""
    text = ""
    starts: list[int | None] = []
    level_iter = iter(levels)
    previous: _Box | None = None
    for boxes in pages:
        starts.append(None)
        for box in boxes:
            if box.heading is not None:
                piece = "#" * next(level_iter) + " " + box.heading.title
            else:
                piece = _tidy(box.text)
                if not piece:
                    continue
            if not text:
                separator = ""
            elif previous is not None and _continues(previous, box):
                separator = "" if text.endswith("-") else " "
            else:
                separator = "\n\n"
            if starts[-1] is None:
                starts[-1] = len(text) + len(separator)
            text += separator + piece
            previous = box
    filled: list[int] = []
    following = len(text)
    for start in reversed(starts):  # a page without text begins where the next one does
        following = start if start is not None else following
        filled.append(following)
    return (text + "\n" if text else ""), tuple(reversed(filled))


# -- MuPDF's messages --------------------------------------------------------------


@contextlib.contextmanager
def _quiet_mupdf(pymupdf: Any) -> Any:
    """MuPDF prints its errors and warnings to standard output, where answers go: keep them for notes instead."""
    tools = pymupdf.TOOLS
    errors, warnings = tools.mupdf_display_errors(), tools.mupdf_display_warnings()
    tools.mupdf_display_errors(False)
    tools.mupdf_display_warnings(False)
    tools.mupdf_warnings()  # flushes and forgets what earlier calls left behind
    try:
        yield tools
    finally:
        tools.mupdf_display_errors(errors)
        tools.mupdf_display_warnings(warnings)


def _pages_list(numbers: list[int]) -> str:
    shown = ", ".join(str(p) for p in numbers[:10])
    return shown + (f" and {len(numbers) - 10} more" if len(numbers) > 10 else "")


# -- bounds -------------------------------------------------------------------------


#: the names of the zlib filter, which the inflated size is counted through without holding the stream
_FLATE = ("/FlateDecode", "/Fl")
#: the most inflated bytes asked of zlib at once while counting
_PIECE = MIB
#: a PDF name in a filter's value (``/FlateDecode``, or each of ``[/ASCII85Decode/FlateDecode]``)
_NAME = re.compile(r"/[^\s/\[\]<>()]+")
#: an indirect object's header ("12 0 obj"): a PDF with a page has one at least (its page is one)
_OBJECT = re.compile(rb"(?<!\d)\d++\s++\d++\s++obj")


def _lacks_memory(pymupdf: Any, exc: BaseException) -> bool:
    """Whether a failure is the memory bound's: Python's MemoryError, or MuPDF's system error, which is a failed
    allocation here (the document is read from memory, never from a file)."""
    system = getattr(getattr(pymupdf, "mupdf", None), "FzErrorSystem", None)
    return isinstance(exc, MemoryError) or (system is not None and isinstance(exc, system))


def _filters(doc: Any, xref: int) -> list[str] | None:
    """A stream's filters in decoding order (``[]``: none), or None when not given plainly (an indirect object)."""
    kind, value = doc.xref_get_key(xref, "Filter")
    if kind == "null":
        return []
    if kind in ("name", "array"):
        return _NAME.findall(value)
    return None


def _inflate(pieces: Iterable[bytes], budget: int) -> Iterator[bytes]:
    """zlib-inflate a stream given in pieces, at most `_PIECE` bytes at a time, until it ends or makes more than
    ``budget`` bytes."""
    inflater = zlib.decompressobj()
    made = 0
    for piece in pieces:
        while piece and not inflater.eof:
            out = inflater.decompress(piece, _PIECE)
            piece = inflater.unconsumed_tail
            made += len(out)
            yield out
            if made > budget:
                return
        if inflater.eof:
            return


def _stream_size(doc: Any, xref: int, budget: int) -> int:
    """The bytes a stream inflates to, counted up to just past ``budget`` where it is zlib-compressed (once or
    more); MuPDF decodes the others whole, under the process's memory bound."""
    filters = _filters(doc, xref)
    if filters and all(f in _FLATE for f in filters):
        pieces: Iterable[bytes] = [doc.xref_stream_raw(xref)]
        for _ in filters:
            pieces = _inflate(pieces, budget)
        size = 0
        try:
            for out in pieces:
                size += len(out)
                if size > budget:
                    return size
            return size
        except zlib.error:  # damaged: MuPDF recovers what it can, below
            pass
    return len(doc.xref_stream(xref) or b"")


def inflated_size(doc: Any, budget: int, pymupdf: Any) -> int:
    """The bytes a PDF's streams take once decompressed, counted until past ``budget``.

    Images are left out: a document may hold many large ones (scans with a text layer), and the converter
    decodes them only to render a page, under the memory and time bounds. A stream that cannot be decoded
    counts for nothing (the conversion repairs it or says so).

    Raises:
        MemoryError: MuPDF could not decode a stream within the process's memory bound.
    """
    total = 0
    for xref in range(1, doc.xref_length()):
        if total > budget:
            break
        try:
            if not doc.xref_is_stream(xref) or doc.xref_get_key(xref, "Subtype")[1] == "/Image":
                continue
            total += _stream_size(doc, xref, budget - total)
        except Exception as exc:
            if _lacks_memory(pymupdf, exc):
                raise MemoryError(str(exc)) from exc
    return total


def _check_header(data: bytes, source: str) -> None:
    if b"%PDF-" not in data[:1024]:
        # MuPDF guesses the type of what is not a PDF and opens it as such: deeply nested HTML made it
        # crash the whole process (a segfault), so only a file with a PDF header reaches it
        raise BadInput(f"{source} is not a PDF (it has no %PDF- header); give the real PDF, or name the "
                       "file for what it is (.md, .txt, .html)", path=source)


def _refuse_early(data: bytes, source: str) -> None:
    """Refuse, before a process is started for it, a file that is no PDF, one that holds no PDF object (so no
    page either), or any PDF where the ``pdf`` extra is missing."""
    _check_header(data, source)
    if any(importlib.util.find_spec(name) is None for name in ("pymupdf", "pymupdf4llm")):
        raise MissingDependency("PDF support (pymupdf4llm)", PDF_INSTALL)
    if not _OBJECT.search(data):
        raise BadInput(f"{source} is not a readable PDF: it holds no PDF object at all; it is damaged or not a "
                       f"PDF: check that it opens in a PDF viewer, or get an intact copy", path=source)


# -- the loader --------------------------------------------------------------------


class PdfLoader(Loader):
    """PDFs through pymupdf4llm (the ``pdf`` extra), with headings, page offsets and clear errors; converted in
    a child process within ``limits`` (see `Loader`)."""

    format = "pdf"
    suffixes = (".pdf",)
    isolated = True

    def __init__(self, limits: IngestOptions | None = None) -> None:
        self.limits = limits or IngestOptions()

    def prepare(self) -> None:
        _import_pdf_libraries()

    def load(self, data: bytes, source: str, limits: IngestOptions | None = None) -> tuple[Document, tuple[str, ...]]:
        _refuse_early(data, source)
        return super().load(data, source, limits)

    def convert(self, data: bytes, source: str) -> Converted:
        _check_header(data, source)
        pymupdf, pymupdf4llm = _import_pdf_libraries()
        with _quiet_mupdf(pymupdf) as tools:
            try:
                doc = pymupdf.open(stream=data, filetype="pdf")
            except Exception as exc:  # pymupdf raises FileDataError, EmptyFileError, RuntimeError ...
                if _lacks_memory(pymupdf, exc):
                    raise MemoryError(str(exc)) from exc
                raise BadInput(
                    f"{source} is not a readable PDF ({exc}); it is damaged or not a PDF at all: "
                    f"check that it opens in a PDF viewer, or try to repair it, e.g. qpdf {source} repaired.pdf",
                    path=source,
                ) from exc
            try:
                return self._convert(doc, source, pymupdf, pymupdf4llm, tools)
            finally:
                doc.close()

    def _check_bounds(self, doc: Any, source: str, pymupdf: Any) -> None:
        """Refuse a document over ``max_pages`` or ``max_inflated_mb`` before anything reads its pages."""
        limits = self.limits
        if doc.page_count > limits.max_pages:
            raise exceeded(source, f"has {doc.page_count} pages, more than max_pages ({limits.max_pages})",
                           "max_pages", limits.max_pages)
        mb = limits.max_inflated_mb
        if inflated_size(doc, mb * MIB, pymupdf) > mb * MIB:
            raise exceeded(source, f"inflates to more than {mb} MiB when its streams are decompressed "
                                   f"(max_inflated_mb is {mb}): it may be a decompression bomb", "max_inflated_mb", mb,
                           "if you trust it,")

    def _convert(self, doc: Any, source: str, pymupdf: Any, pymupdf4llm: Any, tools: Any) -> Converted:
        if doc.needs_pass:
            raise BadInput(
                f"{source} is encrypted (password-protected); decrypt it first, "
                f"e.g. qpdf --decrypt --password=PASSWORD {source} decrypted.pdf",
                path=source,
            )
        self._check_bounds(doc, source, pymupdf)
        warnings = [line for line in tools.mupdf_warnings().splitlines()
                    if line.strip() and not line.startswith("...")]  # "... repeated 2 times..." says nothing
        damaged = any("repair" in line for line in warnings)
        if doc.page_count == 0:
            if damaged:
                raise BadInput(
                    f"{source} is not a readable PDF: it is damaged ({warnings[0]}) and no page could be "
                    f"recovered; get an intact copy, or try to repair it, e.g. qpdf {source} repaired.pdf",
                    path=source,
                )
            raise BadInput(f"{source} has no pages; give a PDF with some text", path=source)
        notes: list[str] = []
        if damaged:
            notes.append(f"{source} is damaged; it was repaired on reading and some of it may be missing "
                         f"({warnings[0]})")
        scanned, blank = [], []
        for page in doc:
            if page.get_text("text").strip():
                continue
            if page.get_images(full=False) or page.get_drawings():
                scanned.append(page.number + 1)
            else:
                blank.append(page.number + 1)
        if len(scanned) + len(blank) == doc.page_count:
            if scanned:
                raise BadInput(
                    f"{source} has no text layer: its pages are images (a scan?); "
                    f"run OCR on it first, e.g. ocrmypdf {source} ocr.pdf",
                    path=source, page=scanned[0],
                )
            raise BadInput(f"{source} contains no text (its pages are blank); give a PDF with some text",
                           path=source, page=1)
        if scanned:
            noun, have, their = ("pages", "have", "their") if len(scanned) > 1 else ("page", "has", "its")
            notes.append(
                f"{source}: {noun} {_pages_list(scanned)} {have} no text layer (only images or drawings), "
                f"so {their} content is missing; run OCR to include it, e.g. ocrmypdf {source} ocr.pdf"
            )

        captured = io.StringIO()  # pymupdf4llm prints progress and warnings to standard output
        try:
            with contextlib.redirect_stdout(captured):
                chunks = pymupdf4llm.to_markdown(
                    doc, page_chunks=True, use_ocr=False, header=True, footer=True, show_progress=False,
                )
        except Exception as exc:  # a converter failure on an odd file: say which file, keep the cause
            if _lacks_memory(pymupdf, exc):
                raise MemoryError(str(exc)) from exc
            raise IngestError(
                f"could not convert {source} to markdown ({type(exc).__name__}: {exc}); the file may be "
                f"damaged: try repairing it (qpdf {source} repaired.pdf) or converting it with another tool",
                path=source,
            ) from exc
        if captured.getvalue().strip():
            log.debug("pymupdf4llm on %s: %s", source, captured.getvalue().strip())

        pages = _drop_running_heads([_page_boxes(chunk, i + 1, doc[i]) for i, chunk in enumerate(chunks)])
        headings = [b.heading for boxes in pages for b in boxes if b.heading is not None]
        levels, title_index = heading_levels(headings)
        text, page_starts = assemble(pages, levels)
        if not text.strip():
            raise BadInput(f"{source} contains no text that could be extracted; "
                           f"if it is a scan, run OCR on it first, e.g. ocrmypdf {source} ocr.pdf", path=source)
        metadata_title = " ".join(str((doc.metadata or {}).get("title") or "").split())
        if title_index is not None:
            title = headings[title_index].title
        else:
            title = metadata_title or (headings[0].title if headings else "")
        return Converted(text, title=title, page_starts=page_starts, notes=tuple(notes))
