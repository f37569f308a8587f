"""Long context and RAG on the fakes, and streaming parity of all three patterns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from marginalia.errors import ContextOverflow, UserError
from marginalia.index.embedders import HashingEmbedder, load_embedder
from marginalia.models.fake import Request, ScriptedGenerator
from marginalia.options import RunSettings
from marginalia.patterns import make_pattern
from marginalia.patterns.long_context import LongContext
from marginalia.patterns.rag import RAG
from marginalia.records import AnswerDelta, Done, SegmentRead, Started, event_to_dict
from wim_requests import is_margin

FACT = "The night ferry to Brackwater leaves from pier 47."
QUESTION = "Which pier does the night ferry to Brackwater leave from?"
ODD_QUESTION = 'What is {x} and $y "z"\n\u2014 \u00fc?'


def answering(req: Request) -> str:
    """Answers from whatever prompt it sees; margins copy the fact when it was just read."""
    if is_margin(req):
        return FACT if FACT in req.prefix[-400:] else "NONE"
    return "Pier 47." if FACT in req.prompt else "I do not know."


@pytest.fixture
def doc(make_haystack: Callable[..., str]) -> str:
    return make_haystack(40, FACT, 0.6)


# -- long context --------------------------------------------------------------------


def test_lc_reads_everything_in_one_prompt(doc: str) -> None:
    gen = ScriptedGenerator(answering)
    events = list(LongContext(gen).run(doc, QUESTION, source="doc.md"))
    answer = events[-1].answer
    assert answer.text == "Pier 47."
    (req,) = gen.requests
    assert req.prefix_ids == () and doc in req.suffix
    assert req.suffix.endswith("<|assistant|>\n")
    assert f"Question: {QUESTION}\n" in req.suffix
    n = len(gen.tokenizer.encode(doc))
    assert answer.stats.context_tokens == answer.stats.prefilled_context_tokens == n
    assert gen.usage.prefilled_tokens == len(req.suffix_ids)
    (ref,) = answer.references
    assert (ref.source, ref.start, ref.end) == ("doc.md", 0, len(doc))
    assert isinstance(events[0], Started) and events[0].context_tokens == n


def test_lc_overflow_carries_both_numbers(doc: str) -> None:
    gen = ScriptedGenerator(context_window=200)
    with pytest.raises(ContextOverflow) as info:
        LongContext(gen).answer(doc, QUESTION)
    assert info.value.window == 200
    assert info.value.needed > info.value.window
    assert info.value.needed >= len(gen.tokenizer.encode(doc))
    assert gen.requests == []


# -- RAG -------------------------------------------------------------------------------


def test_rag_retrieves_the_planted_fact(doc: str) -> None:
    gen = ScriptedGenerator(answering)
    pattern = RAG(gen, embedder=HashingEmbedder(), chunk_tokens=60, top_k=3)
    events = list(pattern.run(doc, QUESTION))
    answer = events[-1].answer
    assert answer.segments_total > 10 and answer.segments_read == 3
    holders = [r for r in answer.references if FACT in r.text]
    assert len(holders) == 1
    for ref in answer.references:
        assert doc[ref.start:ref.end] == ref.text
    starts = [r.start for r in answer.references]
    assert starts == sorted(starts)  # document order
    scores = [r.score for r in answer.references]
    assert holders[0].score == max(scores)
    (req,) = gen.requests
    assert FACT in req.suffix and all(r.text in req.suffix for r in answer.references)
    assert answer.text == "Pier 47."
    reads = [e for e in events if isinstance(e, SegmentRead)]
    assert [e.segment.start for e in reads] == starts


def test_rag_without_the_fact_chunk_cannot_answer(doc: str) -> None:
    """The same fake answers wrongly when retrieval misses: the RAG test above can fail."""
    gen = ScriptedGenerator(answering)
    answer = RAG(gen, embedder=HashingEmbedder(), chunk_tokens=60, top_k=2).answer(
        doc, "Which town sold candles and honey at the market?")
    assert all(FACT not in r.text for r in answer.references)
    assert answer.text == "I do not know."


@pytest.mark.parametrize("opts", [{"chunk_tokens": 0}, {"top_k": 0}, {"max_new_tokens": -1}])
def test_rag_bad_options(opts: dict[str, Any]) -> None:
    with pytest.raises(UserError):
        RAG(ScriptedGenerator(), embedder=HashingEmbedder(), **opts)


def test_hashing_embedder_tracks_word_overlap() -> None:
    emb = HashingEmbedder()
    docs = emb.embed_documents(["the ferry leaves from pier 47", "apples and wool at the market",
                                "the ferry"])
    assert docs.shape == (3, 512) and docs.dtype == np.float32
    assert np.allclose(np.linalg.norm(docs, axis=1), 1.0)
    q = emb.embed_query("which pier does the ferry leave from")
    sims = docs @ q
    assert sims[0] > sims[2] > sims[1]
    assert emb.embed([]).shape[0] == 0
    assert np.allclose(emb.embed_query("Pier 47"), emb.embed_query("pier 47!"))


def test_unknown_embedder() -> None:
    with pytest.raises(UserError):
        load_embedder("word2vec")
    assert isinstance(load_embedder("hashing"), HashingEmbedder)


# -- all patterns ----------------------------------------------------------------------


def build(name: str, gen: ScriptedGenerator) -> Any:
    opts: dict[str, Any] = {"wim": {"segment_tokens": 100}, "lc": {},
                            "rag": {"embedder": HashingEmbedder(), "chunk_tokens": 60}}[name]
    return make_pattern(name, gen, **opts)


@pytest.mark.parametrize("name", ["wim", "lc", "rag"])
def test_streaming_equals_non_streaming(doc: str, name: str) -> None:
    events = list(build(name, ScriptedGenerator(answering)).run(doc, QUESTION))
    assert isinstance(events[-1], Done) and sum(isinstance(e, Done) for e in events) == 1
    streamed = events[-1].answer
    direct = build(name, ScriptedGenerator(answering)).answer(doc, QUESTION)
    assert streamed.text == direct.text == "Pier 47."
    assert streamed.margins == direct.margins
    assert streamed.references == direct.references and len(direct.references) >= 1
    assert (streamed.segments_read, streamed.segments_total) == (direct.segments_read,
                                                                direct.segments_total)
    assert streamed.pattern == direct.pattern == name
    assert "".join(e.text for e in events if isinstance(e, AnswerDelta)).strip() == streamed.text
    # and the events serialise for JSON consumers (segments without their token ids)
    import json

    for event in events:
        data = event_to_dict(event)
        json.dumps(data)
        if isinstance(event, SegmentRead):
            assert "token_ids" not in data["segment"] and data["kind"] == "segment_read"


@pytest.mark.parametrize("name", ["wim", "lc", "rag"])
def test_odd_question_renders_verbatim(doc: str, name: str) -> None:
    gen = ScriptedGenerator(answering)
    build(name, gen).answer(doc, ODD_QUESTION)
    assert gen.requests
    assert all(f"Question: {ODD_QUESTION}\n" in r.suffix for r in gen.requests)


@pytest.mark.parametrize("name", ["wim", "lc", "rag"])
@pytest.mark.parametrize("question", ["", "  \n "])
def test_empty_question_is_a_user_error(doc: str, name: str, question: str) -> None:
    gen = ScriptedGenerator(answering)
    with pytest.raises(UserError) as info:
        build(name, gen).run(doc, question)
    assert "question" in str(info.value)
    assert gen.requests == []


def test_unknown_pattern() -> None:
    with pytest.raises(UserError) as info:
        make_pattern("skim", ScriptedGenerator())
    assert "wim" in str(info.value)


def test_answer_is_stripped_and_question_trimmed(doc: str) -> None:
    gen = ScriptedGenerator(default="  Pier 47.  \n")
    answer = LongContext(gen).answer(doc, f"  {QUESTION}\n")
    assert answer.text == "Pier 47." and answer.question == QUESTION


OPTS: dict[str, Callable[[], dict[str, Any]]] = {
    "wim": lambda: {"segment_tokens": 100}, "lc": dict,
    "rag": lambda: {"embedder": HashingEmbedder(), "chunk_tokens": 60}}


@pytest.mark.parametrize("name", ["wim", "lc", "rag"])
def test_the_answer_is_asked_for_as_one_short_sentence(doc: str, name: str) -> None:
    """One short sentence, which opens with yes or no for a question that asks for one; margins are asked
    for without it."""
    gen = ScriptedGenerator(answering)
    answer = make_pattern(name, gen, **OPTS[name]()).answer(doc, QUESTION)
    assert answer.text == "Pier 47."
    final = [r for r in gen.requests if not is_margin(r)][-1]
    assert "in one short sentence, using the" in final.suffix and "Yes or No" not in final.suffix
    assert not any("short sentence" in r.suffix for r in gen.requests if is_margin(r))
    make_pattern(name, gen, **OPTS[name]()).answer(doc, "Does the night ferry to Brackwater leave from pier 47?")
    final = [r for r in gen.requests if not is_margin(r)][-1]
    assert "one short sentence that opens with Yes or No" in final.suffix


@pytest.mark.parametrize("name", ["wim", "lc", "rag"])
def test_run_settings_reach_only_their_own_run(doc: str, name: str) -> None:
    """A run's temperature and seed decode its answer; the next run without them decodes as the pattern
    was built, and the built pattern is as it was."""
    gen = ScriptedGenerator(answering)
    pattern = make_pattern(name, gen, **OPTS[name]())
    built = dict(vars(pattern))
    params = pattern.answer_params
    pattern.answer(doc, QUESTION, settings=RunSettings(temperature=0.7, seed=3))
    sampled = [r for r in gen.requests if not is_margin(r)][-1].params
    assert (sampled.temperature, sampled.seed) == (0.7, 3)
    assert sampled.max_new_tokens == params.max_new_tokens and sampled.stop == params.stop
    assert not any(r.params.temperature for r in gen.requests if is_margin(r))  # margins stay greedy
    pattern.answer(doc, QUESTION)
    greedy = [r for r in gen.requests if not is_margin(r)][-1].params
    assert greedy == params and greedy.temperature == 0.0 and greedy.seed is None
    run = pattern.run(doc, QUESTION, settings=RunSettings(seed=5))
    assert run.params(params) == replace(params, seed=5)
    assert vars(pattern) == built and pattern.answer_params is params


@pytest.mark.parametrize(("question", "yes_no"), [
    ("Were Scott Derrickson and Ed Wood of the same nationality?", True), ("is it open?", True),
    ('"Did she win?"', True), ("Who is older, Annie Morton or Terry Richardson?", False),
    ("Which pier is it?", False), ("Island or mainland?", False), ("", False),
    # a phrase that sets the scene, then the yes/no clause (MultiHop-RAG)
    ("After the report by The Age on October 22, 2023, did TechCrunch stay consistent?", True),
    ("Between the report from 'The Verge' and the one from 'Wired', is there consistency?", True),
    ("Considering the two articles, which network did she partner with?", False),
    ("Who is older, is it Annie Morton?", False)])
def test_yes_no_questions_are_told_by_their_first_word(question: str, yes_no: bool) -> None:
    from marginalia.patterns.base import is_yes_no_question

    assert is_yes_no_question(question) is yes_no


def test_lc_on_a_wim_reading_answers_with_its_own_settings(doc: str) -> None:
    from marginalia.patterns.wim import WimReader

    gen = ScriptedGenerator(answering)
    wim = make_pattern("wim", gen, segment_tokens=100)
    reader = WimReader(wim, doc)
    lc = LongContext(gen, max_new_tokens=9)
    whole = reader.ask_whole(QUESTION, lc, settings=RunSettings(temperature=0.5)).answer()
    assert whole.text == "Pier 47." and whole.pattern == "lc"
    last = gen.requests[-1]
    assert "Notes taken" not in last.suffix and (last.params.max_new_tokens, last.params.temperature) == (9, 0.5)
    assert lc.answer_params.temperature == 0.0


def test_only_patterns_subclass_a_pattern_and_nothing_sets_a_built_ones_settings() -> None:
    """Ways of reading live in marginalia.patterns; elsewhere a pattern or a judge is built and run, never
    subclassed nor changed: no attribute of one is assigned outside its own methods."""
    import ast
    from pathlib import Path

    import marginalia
    from marginalia.patterns.judges import GroundedJudge
    from marginalia.patterns.wim import WiM

    package = Path(marginalia.__file__).parent
    patterns = package / "patterns"
    pattern_classes = {"Pattern", "WiM", "LongContext", "RAG", "CollectionReader"}
    settings = {"answer_params", "margin_params", "options", "judge", "threshold", "topic_threshold",
                "cover_threshold", "link_sentences", "clause_share", "segment_tokens", "stop_at_score",
                "batch_margins", "copy_lists"}  # a pattern's and a judge's settings
    judge_settings = set(vars(GroundedJudge()))
    assert judge_settings | set(vars(WiM(ScriptedGenerator()))) >= settings  # the names are real ones
    problems = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        where = path.relative_to(package)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and patterns not in path.parents:
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if bases & pattern_classes:
                    problems.append(f"{where}: class {node.name} subclasses {sorted(bases & pattern_classes)}")
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in settings and not (
                        isinstance(target.value, ast.Name) and target.value.id == "self"):
                    problems.append(f"{where}:{node.lineno}: sets {ast.unparse(target)}")
    assert problems == []
