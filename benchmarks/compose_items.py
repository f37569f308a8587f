"""The composition benchmarks' test items: prefixes of real documents cut inside a paragraph, from WikiText
articles (in domain) and Enron e-mail bodies (out of domain), and which e-mails quote or copy one another.
compose_utility.py measures completions of them; loop_guard.py draws its prefixes and windows from the same
texts.

The texts are read at run time from ../shared/data; nothing of them is kept in the repository.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compose_latency import clean

#: characters of earlier text a prefix keeps before its paragraph (cut at a paragraph start)
PREFIX_CHARS = 700


@dataclass(frozen=True)
class Item:
    dataset: str  # "wikitext" or "enron"
    key: str  # the document's id and the cut
    source: str  # the document's file in the collection ("" for an e-mail: not in it)
    prefix: str


def _cut(paragraph: str, rng: random.Random) -> str | None:
    """The paragraph up to a word end 40-70% into it (None when it is too short to leave 20 words after)."""
    ws = paragraph.split(" ")
    if len(ws) < 60:
        return None
    k = rng.randint(int(0.4 * len(ws)), int(0.7 * len(ws)))
    return " ".join(ws[:k])


def wikitext_items(articles: list[dict[str, Any]], files: list[Path], chosen: range, n: int,
                   seed: int) -> list[Item]:
    """``n`` prefixes from the articles ``chosen`` (indices), a paragraph per article in turn (each article's
    paragraphs in a random order), so that no article gives more than the count needs; an article whose
    paragraphs run out leaves its turn to the others."""
    rng = random.Random(seed)
    picks: dict[int, tuple[list[str], list[int]]] = {}  # article -> its paragraphs, the order they are cut in
    for i in chosen:
        paragraphs = clean(articles[i]["text"]).split("\n\n")
        body = [j for j, p in enumerate(paragraphs) if not p.startswith("#") and len(p.split()) >= 60]
        picks[i] = (paragraphs, rng.sample(body, len(body)))
    items: list[Item] = []
    for round_ in range(max((len(order) for _, order in picks.values()), default=0)):
        for i in chosen:
            if len(items) >= n:
                return items
            paragraphs, cut_at = picks[i]
            if len(cut_at) <= round_:
                continue
            j = cut_at[round_]
            cut = _cut(paragraphs[j], rng)
            if cut is None:
                continue
            before = "\n\n".join(paragraphs[:j])
            if len(before) > PREFIX_CHARS:
                at = before.find("\n\n", len(before) - PREFIX_CHARS)
                before = before[at + 2:] if at >= 0 else before[-PREFIX_CHARS:]
            prefix = f"# {articles[i]['title']}\n\n" + (before + "\n\n" if before else "") + cut
            items.append(Item("wikitext", f"wiki{i}:p{j}", str(files[i]), prefix))
    return items


def detokenize_email(text: str) -> str:
    """The Enron release's spaced tokens closed up a little (``we ' ll`` -> ``we'll``, ``a , b`` -> ``a, b``)."""
    text = re.sub(r" ' (s|t|ll|re|ve|d|m)\b", r"'\1", text)
    text = re.sub(r" ([,.;:!?)])", r"\1", text)
    return text.replace("( ", "(")


#: a header line of an e-mail quoted or forwarded inside another
_HEADER = re.compile(r"^\s*(from|to|cc|bcc|subject|date|sent|message - id|importance)\s*:", re.IGNORECASE)
#: forwarding marks, separator rules, and "name 10 / 31 / 2000 07 : 21 am" stamps above a quoted reply
_MARK = re.compile(r"forwarded|original message|- - - -|\d+ / \d+ / \d+\s+\d+\s?:\s?\d+", re.IGNORECASE)


def email_body(text: str) -> str:
    """The e-mail's own writing: its longest run of lines (by characters) holding no header line of a
    forwarded or quoted message, no forwarding mark and no reply stamp."""
    runs: list[list[str]] = [[]]
    for line in text.split("\n"):
        if not line.strip():
            continue
        if _HEADER.match(line) or _MARK.search(line):
            runs.append([])
        else:
            runs[-1].append(line.strip())
    return max((" ".join(run) for run in runs), key=len)


def enron_items(rows: list[dict[str, Any]], n: int, seed: int, files: dict[str, Path] | None = None) -> list[Item]:
    """``n`` prefixes of e-mail bodies; ``files``: each e-mail's file in a collection (by id), which becomes the
    item's source (left out of its memory)."""
    rng = random.Random(seed)
    items = []
    for row in rows:
        text = detokenize_email(row["text"])
        cut = _cut(" ".join(email_body(text).split()), rng)
        if cut is None:
            continue
        source = str(files[str(row["id"])]) if files else ""
        items.append(Item("enron", f"enron{row['id']}", source, cut[-PREFIX_CHARS:].lstrip()))
        if len(items) >= n:
            break
    return items


#: words in a run two e-mails share when one quotes or copies the other
SHARED_RUN = 10


def shared_runs(texts: dict[str, str], words: int = SHARED_RUN) -> dict[str, set[str]]:
    """For each text (by key), the other texts that share a run of ``words`` words with it (lower-cased)."""
    seen: dict[tuple[str, ...], set[str]] = {}
    for key, text in texts.items():
        ws = text.lower().split()
        for i in range(len(ws) - words + 1):
            seen.setdefault(tuple(ws[i:i + words]), set()).add(key)
    near: dict[str, set[str]] = {key: set() for key in texts}
    for keys in seen.values():
        if len(keys) > 1:
            for key in keys:
                near[key] |= keys - {key}
    return near
