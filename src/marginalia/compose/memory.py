"""The memory generator: retrieves what the collection holds about the new text, and compresses it into a
few short memory items with a (larger) model.

Two ways to compress:

- ``takeaways``: for each retrieved chunk, the model writes the one fact that would help the writer go on
  (abstractive; the item spans the chunk it came from).
- ``margins``: WiM reads the retrieved chunks with the new text as its question; each margin judged
  relevant becomes an item whose text is the supporting sentence, exactly as the source has it, with its
  character span in the source document.

The document being written is never its own source: chunks of excluded documents (by id or source) and
chunks that the text being written already holds word for word are left out of what is retrieved.
"""

from __future__ import annotations

import copy
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from ..index.policy import Searchable
from ..index.schema import Hit
from ..ingest.loaders import names_for
from ..models.base import CachingGenerator, GenerationParams, Generator, close_stream
from ..patterns.judges import is_empty_margin
from ..patterns.wim import WiM, WimOptions
from ..prompts import render
from .events import MemoryItem, MemoryRequest

#: characters of the text's end a query falls back on when nothing new was typed (the writer deleted)
FALLBACK_QUERY_CHARS = 300
#: the most characters of new text a query holds (its end)
MAX_QUERY_CHARS = 2000
#: words of the new text WiM's question quotes (its end)
QUESTION_WORDS = 40
#: a chunk this long or longer that the text being written holds word for word is the text itself
SELF_MATCH_CHARS = 40
#: searches, each four times deeper than the one before, while the hits are mostly the text being written (a
#: long draft in the collection can fill the first two pages of hits on its own)
SEARCH_ROUNDS = 3
_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)]|note:|fact:)\s*", re.IGNORECASE)
#: a takeaway saying that its passage holds nothing to help, which small models write instead of NONE ("The
#: passage does not mention anything that helps."); "The passage of the bill did not ..." is a fact, kept
_SAYS_NOTHING = re.compile(
    r"^\W*(?:the|this)\s+(?:given\s+)?(?:passage|text|excerpt|article|document|section|chunk)\s+"
    r"(?:(?:does|did|do|has|had|is)n[’']t\b"
    r"|(?:does|did|do|has|had|contains?|provides?|mentions?|says|gives|is|offers?|includes?)\b[^.]*?"
    r"(?:\bnot\b|\bno\b|\bnothing\b))"
    r"|^\W*(?:there\s+is\s+)?nothing\s+(?:in|from|here|that|which|to)\b"
    r"|^\W*no\s+(?:fact|information|details?|relevant)\b", re.IGNORECASE)


def empty_takeaway(note: str) -> bool:
    """Whether a takeaway holds no fact: blank, NONE, one word, or a sentence saying the passage has nothing
    that helps (memory keeps none of these)."""
    return is_empty_margin(note) or len(note.split()) < 2 or bool(_SAYS_NOTHING.search(note))


def items_from_records(records: Iterable[dict[str, Any]]) -> tuple[MemoryItem, ...]:
    """Memory items from their JSON records (``asdict``), less the takeaways memory no longer keeps
    (`empty_takeaway`), which records written by an earlier version may hold.

    Raises:
        KeyError, TypeError: a record that is not a memory item.
    """
    items = (MemoryItem(**{**r, "section_path": tuple(r["section_path"])}) for r in records)
    return tuple(m for m in items if m.kind != "takeaway" or not empty_takeaway(m.text))


class MemoryGenerator(ABC):
    """Retrieve chunks for a memory request, then compress them into items (`__call__`).

    Args:
        collection: what to search (a `Collection`, or anything with its ``search``).
        generator: the memory model.
        hits: how many retrieved chunks a request compresses.
        search: ``hybrid``, ``dense`` or ``bm25``.
        min_similarity: chunks less similar than this to the query (cosine) are left out.
        exclude: document ids and sources never to retrieve from (the document being written); a path
            excludes the documents named by any of its trailing parts (`_names`).
        item_tokens: the most tokens the model writes per item.
    """

    kind: ClassVar[str]

    def __init__(self, collection: Searchable, generator: Generator, *, hits: int = 3, search: str = "hybrid",
                 min_similarity: float = 0.0, exclude: Iterable[str] = (), item_tokens: int = 48) -> None:
        self.collection = collection
        self.generator = generator
        self.hits = hits
        self.search = search
        self.min_similarity = min_similarity
        self.exclude = _names(exclude)
        self.item_tokens = item_tokens

    def __call__(self, request: MemoryRequest) -> list[MemoryItem]:
        hits = self.retrieve(request)
        return self.compress(request, hits) if hits else []

    def excluding(self, names: Iterable[str]) -> MemoryGenerator:
        """A copy that also never retrieves from these documents (ids or sources); it shares the collection
        and the model, so use one at a time."""
        other = copy.copy(self)
        other.exclude = self.exclude | _names(names)
        return other

    @staticmethod
    def query_of(request: MemoryRequest) -> str:
        """What to search with: the new text, or the text's end when nothing new was typed."""
        query = request.query.strip() or request.context[-FALLBACK_QUERY_CHARS:].strip()
        return query[-MAX_QUERY_CHARS:]

    def excluded(self, hit: Hit, context: str) -> bool:
        """Whether a hit comes from the text being written (by document, or word for word)."""
        if hit.doc_id in self.exclude or hit.source in self.exclude:
            return True
        text = hit.text.strip()
        return len(text) >= SELF_MATCH_CHARS and text in context

    def retrieve(self, request: MemoryRequest) -> list[Hit]:
        """The best ``hits`` chunks for the request that are not the text being written."""
        query = self.query_of(request)
        if not query:
            return []
        k = 2 * self.hits + 4
        for _ in range(SEARCH_ROUNDS):
            found = list(self.collection.search(query, k=k, mode=self.search, kinds=("chunk",)))
            kept = [h for h in found if not self.excluded(h, request.context)
                    and (math.isnan(h.similarity) or h.similarity >= self.min_similarity)]
            if len(kept) >= self.hits or len(found) < k:
                break
            k *= 4  # many hits were the text itself: look deeper
        return kept[: self.hits]

    @abstractmethod
    def compress(self, request: MemoryRequest, hits: Sequence[Hit]) -> list[MemoryItem]:
        """Memory items from the retrieved chunks (best first)."""


def _score(hit: Hit) -> float | None:
    return None if math.isnan(hit.similarity) else round(hit.similarity, 4)


class TakeawayMemory(MemoryGenerator):
    """One key takeaway per retrieved chunk, written by the memory model (our ``compose_takeaway`` prompt)."""

    kind = "takeaways"

    def compress(self, request: MemoryRequest, hits: Sequence[Hit]) -> list[MemoryItem]:
        params = GenerationParams(max_new_tokens=self.item_tokens, stop=("\n",))
        system = render("compose_takeaway_system").strip()
        text = self.query_of(request)
        items: list[MemoryItem] = []
        for hit in hits:
            where = " > ".join((hit.source, *hit.section_path))
            reply = self.generator.generate([
                {"role": "system", "content": system},
                {"role": "user", "content": render("compose_takeaway", text=text, where=where, passage=hit.text)},
            ], params)
            note = _BULLET.sub("", reply.strip().splitlines()[0] if reply.strip() else "").strip().strip('"')
            if empty_takeaway(note):
                continue
            item = MemoryItem(note, hit.source, hit.doc_id, hit.section_path, hit.start, hit.end, "takeaway",
                              _score(hit))
            # two chunks of a document can yield the same takeaway: the memory would hold it once
            # (`MemoryItem.key`), so the items do too, the first (best ranked) kept
            if all(other.key != item.key for other in items):
                items.append(item)
        return items


class MarginMemory(MemoryGenerator):
    """WiM margins over the retrieved chunks, the question asking what helps continue the new text's end;
    each relevant margin's supporting sentence, exactly as the source has it, is an item. The grounded judge
    asks no share of the passage's words of that sentence (retrieval chose the topic).

    Args:
        segment_tokens: WiM's segment size over the retrieved chunks.
        judge: WiM's margin judge (``grounded`` needs no extra request, and finds the supporting sentence).
        (the others as for `MemoryGenerator`)

    Raises:
        UserError: the memory model keeps no KV cache (WiM needs one).
    """

    kind = "margins"

    def __init__(self, collection: Searchable, generator: Generator, *, hits: int = 3, search: str = "hybrid",
                 min_similarity: float = 0.0, exclude: Iterable[str] = (), item_tokens: int = 48,
                 segment_tokens: int = 256, judge: str = "grounded") -> None:
        super().__init__(collection, generator, hits=hits, search=search, min_similarity=min_similarity,
                         exclude=exclude, item_tokens=item_tokens)
        # the answer is never read: one token bounds it should the run get that far. The retrieval chose
        # the topic: a sentence read need not repeat the passage's words to help continue it (a margin that
        # only repeats the passage is still dropped: it adds nothing)
        options = WimOptions.build(segment_tokens=segment_tokens, judge=judge, margin_tokens=item_tokens,
                                   max_new_tokens=1, topic_threshold=0.0)
        self.wim = WiM(generator, options)
        self.cache_gen: CachingGenerator = self.wim.cache_gen

    def compress(self, request: MemoryRequest, hits: Sequence[Hit]) -> list[MemoryItem]:
        pieces, starts, at = [], [], 0
        for hit in hits:
            starts.append(at)
            pieces.append(hit.text)
            at += len(hit.text) + 2
        context = "\n\n".join(pieces)
        words = self.query_of(request).split()
        question = render("compose_margin_question", passage=" ".join(words[-QUESTION_WORDS:])).strip()
        items: list[MemoryItem] = []
        seen: set[tuple[str, int, int]] = set()
        events = iter(self.wim.run(context, question, source="memory"))
        total, judged = None, 0
        try:
            for event in events:
                if event.kind == "started":
                    total = event.segments_total
                elif event.kind == "margin_judged":
                    judged += 1
                    margin = event.margin
                    if margin.relevant and margin.evidence is not None:
                        item = _span_item(margin.evidence, context, hits, starts, margin.score)
                        if item is not None and (item.doc_id, item.start, item.end) not in seen:
                            seen.add((item.doc_id, item.start, item.end))
                            items.append(item)
                    if total is not None and judged >= total:
                        break  # every margin is in: the answer is not needed
        finally:
            close_stream(events)
        return items


def _span_item(evidence: tuple[int, int], context: str, hits: Sequence[Hit], starts: Sequence[int],
               score: float | None) -> MemoryItem | None:
    """The item for a supporting sentence at ``evidence`` (a span of the joined chunks), as a span of its
    source document; None when it is not inside one chunk."""
    start, end = evidence
    while start < end and context[start].isspace():
        start += 1
    while end > start and context[end - 1].isspace():
        end -= 1
    if start >= end:
        return None
    for hit, offset in zip(hits, starts, strict=True):
        if offset <= start and end <= offset + len(hit.text):
            a, b = hit.start + start - offset, hit.start + end - offset
            return MemoryItem(context[start:end], hit.source, hit.doc_id, hit.section_path, a, b, "margin",
                              score)
    return None


MEMORY_MODES: dict[str, type[MemoryGenerator]] = {"takeaways": TakeawayMemory, "margins": MarginMemory}


def _names(names: Iterable[str]) -> frozenset[str]:
    """``names`` (document ids, sources, paths) with every name a path may have been indexed under
    (`names_for`: a document indexed from a folder is named from that folder down, one indexed alone by its
    file name)."""
    return frozenset(known for name in names for known in names_for(name))
