"""Extraction markup taken out of a converter's markdown: HTML tags and comments, ``<br>``, and emphasis inside words.

A PDF converter (pymupdf4llm) writes what it saw of the fonts as markup: superscripts as ``<sup>…</sup>``,
underlines and highlights as tags, the text it found inside a figure between HTML comments with a ``<br>`` after
each line, line breaks inside a table cell as ``<br>``, and each run of bold or italic type as its own word
(``**Pa** per`` for a "Paper" whose first two letters are bold). None of that is meant for people, and all of it
would reach the document view, the quoted references and a model's answers. The stored text is cleaned here,
before anything is cut from it, so that every character span stays exact. Markdown that carries structure
(headings, list markers, paragraph breaks, table pipes, emphasis on whole words) is kept.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# figure text: pymupdf4llm's markers around it, then its lines, each ending in <br>
_PICTURE = re.compile(r"<!--\s*Start of picture text\s*-->\s*(.*?)\s*<!--\s*End of picture text\s*-->", re.DOTALL)
_COMMENT = re.compile(r"[ \t]*<!--.*?-->[ \t]*", re.DOTALL)
_BREAK = re.compile(r"[ \t]*<br\s*/?>[ \t]*", re.IGNORECASE)
# code, where tags are what the document shows: fenced blocks and inline code spans
_CODE = re.compile(r"^ {0,3}(```|~~~).*?(?:^ {0,3}\1[ \t]*$|\Z)|`[^`\n]+`", re.DOTALL | re.MULTILINE)
_SCRIPT = re.compile(r"<(sup|sub)>(.*?)</\1>", re.IGNORECASE | re.DOTALL)
# the tags converters style text with; what they wrap stays
_STYLE_TAG = re.compile(r"</?(?:sup|sub|u|mark|b|i|em|strong|s|small|span|font)(?:\s[^<>]*)?>", re.IGNORECASE)
# emphasis delimiters a converter writes around a run of styled type (a lone "*" is text: it never writes one)
_DELIMITERS = re.compile(r"\*\*|__|~~|`|(?<![^\W_])_|_(?![^\W_])")
# what a word is compared by: its characters without tags and emphasis delimiters
_MARKUP = re.compile(r"<[^<>]*>|[*_`~]")
# a token that is markdown structure, never part of a word: list markers, heading marks, quotes, table pipes
_STRUCTURE = re.compile(r"^(?:[-+*>|]|#{1,6}|\d{1,9}[.)])$")
#: the most tokens one word is found cut into
_MOST_PIECES = 8

_SUPERSCRIPT = str.maketrans("0123456789+-=()abcdefghijklmnoprstuvwxyz*\u2212",
                             "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ᵃᵇᶜᵈᵉᶠᵍʰⁱʲᵏˡᵐⁿᵒᵖʳˢᵗᵘᵛʷˣʸᶻ∗⁻")
_SUBSCRIPT = str.maketrans("0123456789+-=()aehijklmnoprstuvx\u2212", "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₕᵢⱼₖₗₘₙₒₚᵣₛₜᵤᵥₓ₋")


def letters(token: str) -> str:
    """What a token of converted markdown says, without its tags and emphasis delimiters."""
    return _MARKUP.sub("", token)


def join_split_words(markdown: str, words: Iterable[str]) -> str:
    """Words a converter cut where their type changed (``**Pa** per`` for a "Paper" with two bold letters) joined
    again, with the emphasis inside them dropped.

    ``words`` are the page's own words (as the PDF spells them, split at its real spaces). A run of tokens is
    joined when together they spell one of those words and one of them alone spells none: so two words that
    each stand on the page stay apart. Tokens of markdown structure (list markers, ``#``, ``|``) are never joined.
    """
    known = {w for w in (letters(word) for word in words) if w}
    if not known:
        return markdown
    return "\n".join(_join_line(line, known) for line in markdown.split("\n"))


def _join_line(line: str, known: set[str]) -> str:
    parts = re.split(r"( +)", line)  # tokens at even indices, the spaces between them at odd ones
    tokens, gaps = parts[0::2], parts[1::2]
    if len(tokens) < 2:
        return line
    spelling = [letters(t) for t in tokens]
    pieces: list[str] = []
    i = 0
    while i < len(tokens):
        joined = 1
        if tokens[i] and not _STRUCTURE.match(tokens[i]):
            for n in range(min(_MOST_PIECES, len(tokens) - i), 1, -1):
                run = tokens[i:i + n]
                if any(not t or _STRUCTURE.match(t) for t in run) or any(g != " " for g in gaps[i:i + n - 1]):
                    continue
                spelled = spelling[i:i + n]
                if all(spelled) and "".join(spelled) in known and any(s not in known for s in spelled):
                    joined = n
                    break
        if joined > 1:
            pieces.append("".join(_DELIMITERS.sub("", t) for t in tokens[i:i + joined]))
        else:
            pieces.append(tokens[i])
        if i + joined - 1 < len(gaps):
            pieces.append(gaps[i + joined - 1])
        i += joined
    return "".join(pieces)


def _script(match: re.Match[str]) -> str:
    """A superscript or subscript in Unicode's raised or lowered characters where it has them, as is otherwise;
    an asterisk mark becomes ∗, which never reads as emphasis."""
    inner = _DELIMITERS.sub("", _STYLE_TAG.sub("", match.group(2))).strip()
    table = _SUPERSCRIPT if match.group(1).lower() == "sup" else _SUBSCRIPT
    return inner.translate(table)


def _picture(match: re.Match[str]) -> str:
    """A figure's text as one paragraph of its lines."""
    lines = (" ".join(line.split()) for line in _BREAK.split(match.group(1)))
    return " ".join(line for line in lines if line)


def clean_markup(markdown: str) -> str:
    """A converter's markdown without HTML comments and tags: figure text stays as a paragraph of its lines, a
    ``<br>`` becomes a space, super- and subscripts become Unicode's raised and lowered characters (``x²``,
    ``Lovelace∗¹``), and the tags of other styling (``<u>``, ``<mark>`` …) go, keeping what they wrap."""
    if "<" not in markdown:
        return markdown
    out, at = [], 0
    for code in _CODE.finditer(markdown):
        out += [_clean_prose(markdown[at:code.start()]), code.group()]
        at = code.end()
    out.append(_clean_prose(markdown[at:]))
    return "".join(out)


def _gone(match: re.Match[str]) -> str:
    """What stands for a removed comment or line break: a space between two words, nothing at a line's end."""
    text, start, end = match.string, match.start(), match.end()
    between = 0 < start and end < len(text) and not text[start - 1].isspace() and not text[end].isspace()
    return " " if between else ""


def _clean_prose(text: str) -> str:
    text = _PICTURE.sub(_picture, text)
    text = _COMMENT.sub(_gone, text)
    text = _BREAK.sub(_gone, text)
    text = _SCRIPT.sub(_script, text)
    return _STYLE_TAG.sub("", text)
