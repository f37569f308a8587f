"""Retrieval-augmented generation over one context: the top-k chunks, then the question; its options record
and its registration."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pydantic import Field

from ..index.embedders import Embedder, load_embedder
from ..ingest.segment import segments_from_tokens
from ..models.base import Clock, Generator
from ..options import MAX_ITEMS, MAX_TOKENS, CollectionOptions, PatternOptions
from ..records import Answer, Done, Event, Reference, Segment, SegmentRead, Started
from .base import Framing, Pattern, Run, ledger_for, make_stats, relay_answer, resolve_options
from .collection import CollectionReader
from .long_context import one_prompt_reader
from .registry import PatternSpec

if TYPE_CHECKING:
    from ..index.store import Collection


class RagOptions(PatternOptions):
    """Retrieval over one document: the ``top_k`` closest chunks, then the question."""

    pattern: ClassVar[str] = "rag"
    chunk_tokens: int = Field(default=128, gt=0, le=MAX_TOKENS, description="rag: model tokens per retrieved chunk")
    top_k: int = Field(default=4, gt=0, le=MAX_ITEMS, description="rag: how many chunks the answer sees")

_BLANK_LINES = re.compile(r"\n[ \t]*\n\s*")


def paragraph_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the paragraphs of ``text`` (cut at blank lines, outer whitespace left out)."""
    spans = []
    start = 0
    for m in [*_BLANK_LINES.finditer(text), None]:
        end = m.start() if m else len(text)
        piece = text[start:end]
        lead = len(piece) - len(piece.lstrip())
        trail = len(piece.rstrip())
        if trail > lead:
            spans.append((start + lead, start + trail))
        if m:
            start = m.end()
    return spans


class RAG(Pattern):
    """Cut the context's paragraphs into chunks, embed them, answer from the ``top_k`` closest (see `RagOptions`).

    Args:
        generator: any Generator.
        options: the options record (or give its fields as keyword arguments).
        embedder: an Embedder; when none is given, the embedded MiniLM is loaded on first use.

    Each paragraph is chunked on its own, so a passage yields the same chunks wherever it sits, and a cached
    embedder embeds it once across contexts.
    """

    name = "rag"

    def __init__(self, generator: Generator, options: RagOptions | None = None, *,
                 embedder: Embedder | None = None, **values: Any) -> None:
        opts = resolve_options(RagOptions, options, values)
        super().__init__(generator, opts)
        self.chunk_tokens = opts.chunk_tokens
        self.top_k = opts.top_k
        self._embedder = embedder

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = load_embedder()
        return self._embedder

    def _events(self, run: Run, context: str, question: str, source: str) -> Iterator[Event]:
        clock = Clock()
        gen = self.generator
        params = run.params(self.answer_params)
        n_context = gen.tokenizer.count(context)
        chunks = self._paragraph_chunks(context)
        yield Started(self.name, len(chunks), n_context)
        vectors = self.embedder.embed_documents([c.text for c in chunks])
        scores = vectors @ self.embedder.embed_query(question)
        best = sorted(np.argsort(-scores, kind="stable")[: self.top_k].tolist())
        retrieve_seconds = clock()
        picked = [chunks[i] for i in best]
        for chunk in picked:
            yield SegmentRead(chunk, len(chunks), clock())

        framing = Framing.build(gen, intro="passages_intro")
        body: list[int] = []
        sep = gen.tokenizer.encode("\n\n[...]\n\n")
        read: list[tuple[int, int]] = []  # where each chunk's tokens sit in the prompt
        for k, chunk in enumerate(picked):
            body += sep if k else []
            read.append((len(framing.head) + len(body), len(framing.head) + len(body) + chunk.n_tokens))
            body += list(chunk.token_ids)
        prompt = framing.head + body + framing.suffix(gen, self.answer_template(question), question=question)
        gen.check_fits(len(prompt) + params.max_new_tokens,
                       what="the retrieved passages, the question and the answer")
        before = gen.usage.snapshot()
        with ledger_for(gen, prompt[:len(framing.head) + len(body)], read) as ledger:
            text, first = yield from relay_answer(gen.stream_prompt(prompt, params), clock)
        used = gen.usage.since(before)
        stats = make_stats(
            clock, used, n_context, ledger.evaluated, reprefilled_context=ledger.repeated,
            answer_tokens=used.generated_tokens,
            answer_seconds=used.decode_seconds, time_to_first_answer_token=first,
            retrieval_seconds=retrieve_seconds,
        )
        yield Done(Answer(
            question=question, text=text.strip(), pattern=self.name, model=gen.name,
            references=tuple(
                Reference(source, c.start, c.end, c.text, c.index, float(scores[c.index]))
                for c in picked
            ),
            stats=stats, segments_read=len(picked), segments_total=len(chunks),
        ))

    def _paragraph_chunks(self, context: str) -> list[Segment]:
        """Chunks within paragraphs; each paragraph is tokenized on its own, so its chunks do not
        depend on the text around it."""
        tokenizer = self.generator.tokenizer
        chunks: list[Segment] = []
        for start, end in paragraph_spans(context):
            piece = context[start:end]
            ids, offsets = tokenizer.encode_with_offsets(piece)
            for seg in segments_from_tokens(piece, ids, offsets, self.chunk_tokens):
                chunks.append(Segment(len(chunks), start + seg.start, start + seg.end, seg.text, seg.token_ids))
        return chunks


def _read_collection(store: Collection, options: RagOptions, reading: CollectionOptions, generator: Generator,
                     scope: str) -> CollectionReader:
    """Its ``top_k`` hits of the collection (chunks, unless ``reading.scope`` says otherwise), in one prompt."""
    return one_prompt_reader(store, options, reading, generator, scope=scope, k=options.top_k,
                             intro="passages_intro", name="rag")


SPEC = PatternSpec(
    name="rag", options=RagOptions, pattern=RAG, title="retrieval", needs_embedder=True,
    description="retrieval: the chunks of the text closest to the question, then the question",
    reads="chunks", read_collection=_read_collection)
