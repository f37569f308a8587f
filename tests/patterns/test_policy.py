"""The retrieval policy (every branch) and patterns reading a collection through it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from marginalia.errors import UserError
from marginalia.index.policy import Piece, RetrievalPolicy, retrieve
from marginalia.models.fake import ScriptedGenerator
from marginalia.patterns import make_pattern
from marginalia.patterns.collection import NO_REFERENCES, CollectionReader, assemble, map_reference
from marginalia.records import Document, Reference, Section
from wim_requests import is_margin

TEXT = (
    "# Harbour\n\nThe harbour keeps 214 moorings.\n\n"
    "## Dredging\n\nThe dredger Orla Maye cleared the basin.\n\n"
    "# Lifeboat\n\nThe lifeboat launched 37 times.\n"
)
H1 = TEXT.index("# Harbour")
H2 = TEXT.index("## Dredging")
H3 = TEXT.index("# Lifeboat")
SECTIONS = [
    Section("d1", 0, 0, "", (), 0, len(TEXT), 0, 0, None, (1, 3)),
    Section("d1", 1, 1, "Harbour", ("Harbour",), H1, H3, H1 + 10, H2, 0, (2,)),
    Section("d1", 2, 2, "Dredging", ("Harbour", "Dredging"), H2, H3, H2 + 12, H3, 1),
    Section("d1", 3, 1, "Lifeboat", ("Lifeboat",), H3, len(TEXT), H3 + 11, len(TEXT), 0),
]


@dataclass(frozen=True)
class FakeHit:
    kind: str
    doc_id: str
    source: str
    text: str
    section_path: tuple[str, ...]
    section_index: int | None
    start: int
    end: int
    page: int | None
    score: float
    similarity: float
    answer: str = ""


def chunk_hit(phrase: str, similarity: float) -> FakeHit:
    start = TEXT.index(phrase)
    section = max((s for s in SECTIONS if s.start <= start < s.end), key=lambda s: s.level)
    return FakeHit("chunk", "d1", "report.md", phrase, section.path, section.index, start, start + len(phrase),
                   None, similarity, similarity)


class FakeCollection:
    def __init__(self, hits: list[FakeHit]) -> None:
        self.hits = hits
        self.calls: list[tuple[str, int, str, tuple[str, ...]]] = []

    def search(self, query: str, k: int = 5, mode: str = "hybrid",
               kinds: Sequence[str] = ("chunk",)) -> list[FakeHit]:
        self.calls.append((query, k, mode, tuple(kinds)))
        return [h for h in self.hits if h.kind in kinds][:k]

    def document(self, doc_id: str) -> Document:
        return Document("report.md", TEXT, "d1", format="markdown")

    def sections(self, doc_id: str) -> list[Section]:
        return SECTIONS


QUESTION_HIT = FakeHit("question", "d1", "report.md", "Which dredger cleared the basin?", ("Harbour", "Dredging"),
                       2, TEXT.index("The dredger"), TEXT.index(" cleared") + len(" cleared the basin."), None,
                       0.95, 0.95, answer="The Orla Maye")


def test_direct_answer_from_a_certain_question_bank_hit():
    coll = FakeCollection([QUESTION_HIT, chunk_hit("The dredger Orla Maye cleared the basin.", 0.8)])
    got = retrieve(coll, "What dredger cleared the basin?", RetrievalPolicy(certain=0.9))
    assert got.outcome == "direct"
    assert got.direct is QUESTION_HIT
    assert got.pieces[0].text == "The dredger Orla Maye cleared the basin."
    assert coll.calls[0][3] == ("chunk", "question")


def test_an_uncertain_question_bank_hit_does_not_answer_directly():
    weak = FakeHit(**{**QUESTION_HIT.__dict__, "similarity": 0.7})
    coll = FakeCollection([weak, chunk_hit("The dredger Orla Maye cleared the basin.", 0.6)])
    got = retrieve(coll, "q?", RetrievalPolicy(certain=0.9, uncertain=0.3))
    assert got.outcome == "references"


def test_nothing_relevant_below_the_uncertainty_threshold():
    coll = FakeCollection([chunk_hit("The lifeboat launched 37 times.", 0.1)])
    got = retrieve(coll, "Who painted the lighthouse?", RetrievalPolicy(uncertain=0.3))
    assert got.outcome == "none"
    assert got.pieces == ()
    assert got.best_similarity == pytest.approx(0.1)


def test_references_are_whole_sections_in_document_order_without_duplicates():
    coll = FakeCollection([
        chunk_hit("The lifeboat launched 37 times.", 0.7),
        chunk_hit("The dredger Orla Maye cleared the basin.", 0.6),
        chunk_hit("The harbour keeps 214 moorings.", 0.5),
        chunk_hit("The harbour keeps", 0.2),  # below the uncertainty threshold: not a reference
    ])
    got = retrieve(coll, "q?", RetrievalPolicy(scope="sections", uncertain=0.3))
    assert got.outcome == "references"
    # Harbour (which holds Dredging) swallows its subsection; pieces come in document order
    assert [p.section_path for p in got.pieces] == [("Harbour",), ("Lifeboat",)]
    assert got.pieces[0].text == TEXT[H1:H3]


def test_chunk_scope_and_document_scope():
    hits = [chunk_hit("The lifeboat launched 37 times.", 0.7), chunk_hit("The harbour keeps 214 moorings.", 0.5)]
    chunks = retrieve(FakeCollection(hits), "q?", RetrievalPolicy(scope="chunks"))
    assert [p.text for p in chunks.pieces] == ["The harbour keeps 214 moorings.", "The lifeboat launched 37 times."]
    docs = retrieve(FakeCollection(hits), "q?", RetrievalPolicy(scope="documents"))
    assert [(p.start, p.end) for p in docs.pieces] == [(0, len(TEXT))]


def test_token_budget_drops_lower_ranked_pieces_first():
    hits = [chunk_hit("The lifeboat launched 37 times.", 0.7), chunk_hit("The harbour keeps 214 moorings.", 0.5)]
    got = retrieve(FakeCollection(hits), "q?", RetrievalPolicy(scope="chunks", max_context_tokens=6),
                   count_tokens=lambda t: len(t.split()))
    assert [p.text for p in got.pieces] == ["The lifeboat launched 37 times."]


def test_policy_rejects_bad_thresholds_and_scopes():
    with pytest.raises(UserError, match="uncertain"):
        RetrievalPolicy(certain=0.2, uncertain=0.5)
    with pytest.raises(UserError, match="scope"):
        RetrievalPolicy(scope="paragraphs")


def test_assemble_and_map_references_back_to_documents():
    pieces = [Piece("d1", "report.md", ("Harbour",), H1, H3, TEXT[H1:H3]),
              Piece("d1", "report.md", ("Lifeboat",), H3, len(TEXT), TEXT[H3:])]
    ctx = assemble(pieces)
    for (s, e), piece in zip(ctx.spans, ctx.pieces, strict=True):
        assert ctx.text[s:e] == piece.text
    assert ctx.text.startswith("[report.md > Harbour]\n")
    # a span inside the second piece maps to the same text in the document
    s = ctx.text.index("launched 37")
    mapped = map_reference(Reference("collection", s, s + len("launched 37"), "launched 37"), ctx)
    assert len(mapped) == 1
    assert TEXT[mapped[0].start:mapped[0].end] == "launched 37"
    assert mapped[0].section_path == ("Lifeboat",)
    # the whole context becomes one reference per piece
    whole = map_reference(Reference("collection", 0, len(ctx.text), "(the whole document)"), ctx)
    assert [(r.start, r.end) for r in whole] == [(H1, H3), (H3, len(TEXT))]


def _reader(pattern: str, hits: list[FakeHit], policy: RetrievalPolicy, gen: ScriptedGenerator) -> CollectionReader:
    coll = FakeCollection(hits)
    inner = make_pattern("lc", gen, intro="passages_intro") if pattern == "rag" else make_pattern(pattern, gen)
    return CollectionReader(inner, lambda q: retrieve(coll, q, policy), name=pattern)


def test_reader_answers_directly_without_calling_the_model():
    gen = ScriptedGenerator(default="should not be asked")
    answer = _reader("lc", [QUESTION_HIT], RetrievalPolicy(), gen).ask("Which dredger?").answer()
    assert answer.text == "The Orla Maye"
    assert answer.retrieval == "direct"
    assert answer.references[0].section_path == ("Harbour", "Dredging")
    assert gen.requests == []


def test_reader_says_no_references_instead_of_making_one_up():
    gen = ScriptedGenerator(default="should not be asked")
    run = _reader("wim", [chunk_hit("The lifeboat launched 37 times.", 0.05)], RetrievalPolicy(), gen).ask("q?")
    events = list(run)
    assert events[0].kind == "retrieved" and events[0].outcome == "none"
    answer = run.answer()
    assert answer.text == NO_REFERENCES
    assert [e.text for e in events if e.kind == "answer_delta"] == [NO_REFERENCES]  # streamed like any answer
    assert answer.references == ()
    assert gen.requests == []


@pytest.mark.parametrize("pattern", ["lc", "wim", "rag"])
def test_patterns_read_the_gathered_references_and_cite_documents(pattern: str):
    hits = [chunk_hit("The dredger Orla Maye cleared the basin.", 0.8), chunk_hit("The lifeboat launched 37 times.",
                                                                                0.6)]
    scope = "chunks" if pattern == "rag" else "sections"

    def respond(request) -> str:
        if is_margin(request):
            return "The dredger Orla Maye cleared the basin." if "Orla" in request.prefix[-200:] else "NONE"
        return "The Orla Maye."

    gen = ScriptedGenerator(respond)
    answer = _reader(pattern, hits, RetrievalPolicy(scope=scope), gen).ask("Which dredger cleared the basin?").answer()
    assert answer.text == "The Orla Maye."
    assert answer.retrieval == "references"
    assert answer.pattern == pattern
    # the model saw the retrieved text, and the references point into the document
    assert "Orla Maye" in gen.requests[-1].prompt
    assert answer.references
    for ref in answer.references:
        assert ref.source == "report.md"
        assert TEXT[ref.start:ref.end] == ref.text
    assert any("Orla Maye" in ref.text for ref in answer.references)
