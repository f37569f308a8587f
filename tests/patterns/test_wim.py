"""Writing in the Margins on the scripted fake: event order, the cached prefix, judges, early stop."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest

from marginalia.errors import UserError
from marginalia.models.base import GenerationParams, Generator
from marginalia.models.fake import Request, ScriptedGenerator, WordTokenizer
from marginalia.patterns import make_pattern
from marginalia.patterns.wim import WiM
from marginalia.records import (
    AnswerDelta,
    Done,
    MarginJudged,
    MarginWritten,
    SegmentRead,
    Started,
)
from wim_requests import is_margin

FACT = "The night ferry to Brackwater leaves from pier 47."
HALLUCINATION = "The night ferry to Brackwater leaves from pier 99."
QUESTION = "Which pier does the night ferry to Brackwater leave from?"
CLASSIFY_MARK = "Does the note answer the question?"
ANSWER_MARK = "Notes taken while reading the document:"
SEGMENT_TOKENS = 100


class Reader:
    """A responder that reads like a perfect small model.

    Margin requests: the fact's sentence when the newest text in the cache (what was
    prefilled since the previous margin) holds it; a hallucinated pier number for the segment
    just before that one (when ``hallucinate``); else NONE.
    Classification requests: YES when the note has the right number. Answer requests: the
    pier when the notes mention it.
    """

    def __init__(self, context: str, hallucinate: bool = True) -> None:
        segs = WiM(ScriptedGenerator(), segment_tokens=SEGMENT_TOKENS).segments(context)
        fact_at = next(s.index for s in segs if FACT in s.text)
        self.decoy = segs[fact_at - 1].text if hallucinate else None
        self.seen = 0

    def __call__(self, req: Request) -> str:
        if is_margin(req):
            latest = req.prefix[self.seen:]
            self.seen = len(req.prefix)
            if FACT in latest:
                return FACT
            if self.decoy is not None and latest.endswith(self.decoy):
                return HALLUCINATION
            return "NONE"
        if CLASSIFY_MARK in req.suffix:
            return "YES" if "pier 47" in req.suffix else "NO"
        if ANSWER_MARK in req.suffix:
            notes = req.suffix.split(ANSWER_MARK, 1)[1]
            return "The ferry leaves from pier 47." if "pier 47" in notes else "I do not know."
        return "The ferry leaves from pier 47." if FACT in req.prompt else "I do not know."


@pytest.fixture
def doc(make_haystack: Callable[..., str]) -> str:
    return make_haystack(40, FACT, 0.6)


def reader_for(context: str, **kw: Any) -> Reader:
    return Reader(context, **kw)


def run_events(gen: ScriptedGenerator, context: str, question: str = QUESTION, **opts: Any) -> list[Any]:
    opts.setdefault("segment_tokens", SEGMENT_TOKENS)
    return list(make_pattern("wim", gen, **opts).run(context, question))


def margin_requests(gen: ScriptedGenerator) -> list[Request]:
    return [r for r in gen.requests if is_margin(r)]


def answer_request(gen: ScriptedGenerator) -> Request:
    (req,) = [r for r in gen.requests if ANSWER_MARK in r.suffix]
    return req


def test_document_shape(doc: str) -> None:
    segs = WiM(ScriptedGenerator(), segment_tokens=SEGMENT_TOKENS).segments(doc)
    assert 6 <= len(segs) <= 20
    holders = [s.index for s in segs if FACT in s.text]
    assert len(holders) == 1 and 0 < holders[0] < len(segs) - 1


def test_event_order(doc: str) -> None:
    gen = ScriptedGenerator(reader_for(doc))
    events = run_events(gen, doc)
    n = len(WiM(gen, segment_tokens=SEGMENT_TOKENS).segments(doc))
    kinds = [e.kind for e in events]
    assert kinds[0] == "started"
    per_segment = kinds[1:1 + 3 * n]
    assert per_segment == ["segment_read", "margin_written", "margin_judged"] * n
    rest = kinds[1 + 3 * n:]
    assert rest[-1] == "done" and kinds.count("done") == 1
    assert set(rest[:-1]) == {"answer_delta"}
    started, done = events[0], events[-1]
    assert isinstance(started, Started) and isinstance(done, Done)
    assert started.segments_total == n == done.answer.segments_total == done.answer.segments_read
    reads = [e for e in events if isinstance(e, SegmentRead)]
    assert [e.segment.index for e in reads] == list(range(n))
    written = [e for e in events if isinstance(e, MarginWritten)]
    judged = [e for e in events if isinstance(e, MarginJudged)]
    assert [e.segment_index for e in written] == [e.margin.segment_index for e in judged] == list(range(n))
    assert "".join(e.text for e in events if isinstance(e, AnswerDelta)).strip() == done.answer.text
    assert done.answer.text == "The ferry leaves from pier 47."
    assert not done.answer.stopped_early


def test_only_relevant_margins_reach_the_answer(doc: str) -> None:
    gen = ScriptedGenerator(reader_for(doc))
    answer = run_events(gen, doc)[-1].answer
    written = [m.text for m in answer.margins]
    assert HALLUCINATION in written and FACT in written  # both notes were written
    kept = [m for m in answer.margins if m.relevant]
    assert [m.text for m in kept] == [FACT]
    suffix = answer_request(gen).suffix
    assert f"- {FACT}\n" in suffix
    assert "pier 99" not in suffix and "NONE" not in suffix
    (ref,) = answer.references
    assert ref.text == FACT and doc[ref.start:ref.end].strip() == FACT
    fact_segment = next(m.segment_index for m in kept)
    assert ref.segment_index == fact_segment


def test_no_relevant_margin_says_so(doc: str) -> None:
    gen = ScriptedGenerator(lambda r: "NONE" if ANSWER_MARK not in r.suffix else "I do not know.")
    answer = run_events(gen, doc)[-1].answer
    assert answer.references == () and not any(m.relevant for m in answer.margins)
    assert "- (no notes)\n" in answer_request(gen).suffix


def test_every_request_extends_the_cached_prefix(doc: str) -> None:
    gen = ScriptedGenerator(reader_for(doc))
    pattern = WiM(gen, segment_tokens=SEGMENT_TOKENS)
    answer = pattern.answer(doc, QUESTION)
    segs = pattern.segments(doc)
    framing = pattern.framing()
    margin_suffix = framing.suffix(gen, "margin", question=QUESTION)
    reqs = margin_requests(gen)
    assert len(reqs) == len(segs)
    expected_prefix = list(framing.head)
    previous: tuple[int, ...] = ()
    for seg, req in zip(segs, reqs, strict=True):
        expected_prefix += seg.token_ids
        assert req.prefix_ids == tuple(expected_prefix)
        assert req.prefix_ids[:len(previous)] == previous and len(req.prefix_ids) > len(previous)
        assert req.suffix_ids == tuple(margin_suffix)
        previous = req.prefix_ids
    final = answer_request(gen)
    assert final.prefix_ids == tuple(expected_prefix)
    assert all(seg.text in final.prefix for seg in segs)
    assert gen.requests[-1] is final and len(gen.requests) == len(segs) + 1

    # each context token was prefilled exactly once; everything else is instructions
    answer_suffix = final.suffix_ids
    stats = answer.stats
    n_context = len(gen.tokenizer.encode(doc))
    assert stats.context_tokens == stats.prefilled_context_tokens == n_context
    other = len(framing.head) + len(segs) * len(margin_suffix) + len(answer_suffix)
    assert stats.prefilled_other_tokens == other
    assert gen.usage.prefilled_tokens == n_context + other
    assert gen.length == 0  # the pattern worked on a fork: the caller's cache is untouched


def test_generated_tokens_are_accounted(doc: str) -> None:
    gen = ScriptedGenerator(reader_for(doc))
    answer = WiM(gen, segment_tokens=SEGMENT_TOKENS).answer(doc, QUESTION)
    tok = gen.tokenizer
    margin_tokens = sum(len(tok.encode(m.text)) for m in answer.margins)
    assert answer.stats.generated_margin_tokens == margin_tokens
    assert answer.stats.generated_answer_tokens == len(tok.encode(answer.text))
    assert answer.stats.generated_other_tokens == 0


def test_early_stop_after_the_first_relevant_margin(doc: str) -> None:
    gen = ScriptedGenerator(reader_for(doc))
    pattern = WiM(gen, segment_tokens=SEGMENT_TOKENS)
    segs = pattern.segments(doc)
    run = pattern.run(doc, QUESTION)
    events = []
    for event in run:
        events.append(event)
        if isinstance(event, MarginJudged) and event.margin.relevant:
            run.stop()
    answer = events[-1].answer
    fact_index = next(s.index for s in segs if FACT in s.text)
    reads = [e for e in events if isinstance(e, SegmentRead)]
    assert len(reads) == fact_index + 1 < len(segs)
    assert answer.stopped_early
    assert answer.segments_read == fact_index + 1 < answer.segments_total == len(segs)
    assert answer.text == "The ferry leaves from pier 47."
    prompt = answer_request(gen).prefix
    assert all(s.text in prompt for s in segs[:fact_index + 1])
    assert all(s.text not in prompt for s in segs[fact_index + 1:])
    assert answer.stats.prefilled_context_tokens == sum(s.n_tokens for s in segs[:fact_index + 1])
    assert answer.stats.prefilled_context_tokens < answer.stats.context_tokens
    assert isinstance(events[-1], Done) and sum(isinstance(e, Done) for e in events) == 1


def test_stop_before_reading_answers_from_nothing(doc: str) -> None:
    gen = ScriptedGenerator(reader_for(doc))
    run = WiM(gen, segment_tokens=SEGMENT_TOKENS).run(doc, QUESTION)
    run.stop()
    answer = run.answer()
    assert answer.segments_read == 0 and answer.stopped_early and answer.margins == ()
    assert answer.text == "I do not know."


# -- judges ---------------------------------------------------------------------------


def test_separate_judge_asks_once_per_nonempty_margin(doc: str) -> None:
    gen = ScriptedGenerator(reader_for(doc))
    pattern = WiM(gen, segment_tokens=SEGMENT_TOKENS, judge="separate")
    answer = pattern.answer(doc, QUESTION)
    nonempty = [m for m in answer.margins if m.text != "NONE"]
    assert {m.text for m in nonempty} == {FACT, HALLUCINATION}
    classify = [r for r in gen.requests if CLASSIFY_MARK in r.suffix]
    assert len(classify) == len(nonempty) == 2
    assert all(r.prefix_ids == () for r in classify)  # stateless: never the context's cache
    assert all(r.params.max_new_tokens == 3 for r in classify)
    assert [m.text for m in answer.margins if m.relevant] == [FACT]
    # the margin requests still extend one another, around the classification requests
    reqs = margin_requests(gen)
    assert len(reqs) == len(pattern.segments(doc))
    for before, after in pairwise(reqs):
        assert after.prefix_ids[:len(before.prefix_ids)] == before.prefix_ids
    assert answer_request(gen).prefix_ids[:len(reqs[-1].prefix_ids)] == reqs[-1].prefix_ids
    assert "pier 99" not in answer_request(gen).suffix


def test_grounded_rejects_an_unread_number_and_keeps_a_quote(doc: str) -> None:
    def respond(req: Request) -> str:
        if is_margin(req):
            if FACT not in req.prefix:
                return "NONE"
            return "Pier 99." if "pier 99" not in req.prefix else "NONE"
        return "x"

    gen = ScriptedGenerator(respond)
    answer = WiM(gen, segment_tokens=SEGMENT_TOKENS).answer(doc, QUESTION)
    assert {m.text for m in answer.margins} == {"NONE", "Pier 99."}
    assert not any(m.relevant for m in answer.margins)

    gen = ScriptedGenerator(reader_for(doc, hallucinate=False))
    answer = WiM(gen, segment_tokens=SEGMENT_TOKENS).answer(doc, QUESTION)
    (kept,) = [m for m in answer.margins if m.relevant]
    assert kept.text == FACT and kept.mode == "grounded" and kept.score == 1.0
    assert kept.evidence is not None and doc[slice(*kept.evidence)].strip() == FACT


def test_repeated_note_is_kept_once(doc: str) -> None:
    def respond(req: Request) -> str:
        if is_margin(req):
            return FACT if FACT in req.prefix else "NONE"
        return "x"

    gen = ScriptedGenerator(respond)
    answer = WiM(gen, segment_tokens=SEGMENT_TOKENS).answer(doc, QUESTION)
    facts = [m for m in answer.margins if m.text == FACT]
    assert len(facts) >= 2
    assert [m.relevant for m in facts] == [True] + [False] * (len(facts) - 1)
    assert all(m.reason == "repeats an earlier note" for m in facts[1:])
    assert len(answer.references) == 1


def test_a_short_margin_goes_to_the_answer_as_written(doc: str) -> None:
    seen = [0]

    def respond(req: Request) -> str:  # a bare "pier 47" for the part that holds the fact
        if is_margin(req):
            latest, seen[0] = req.prefix[seen[0]:], len(req.prefix)
            return "pier 47" if FACT in latest else "NONE"
        return "x"

    gen = ScriptedGenerator(respond)
    answer = WiM(gen, segment_tokens=SEGMENT_TOKENS).answer(doc, QUESTION)
    (kept,) = [m for m in answer.margins if m.relevant]
    assert kept.text == "pier 47" and kept.evidence is not None
    notes = answer_request(gen).suffix.split(ANSWER_MARK, 1)[1]
    assert "- pier 47\n" in notes + "\n" and "- " + FACT not in notes


# -- prompts, inputs, errors ----------------------------------------------------------

ODD_QUESTION = 'What is {x} and $y "z"\n\u2014 \u00fc?'


@pytest.mark.parametrize("judge", ["grounded", "separate"])
def test_odd_question_renders_verbatim(doc: str, judge: str) -> None:
    gen = ScriptedGenerator(lambda r: "YES it is {x} and $y" if CLASSIFY_MARK not in r.suffix
                            else "NO")
    WiM(gen, segment_tokens=SEGMENT_TOKENS, judge=judge).answer(doc, ODD_QUESTION)
    asked = [r for r in gen.requests if CLASSIFY_MARK not in r.suffix]
    assert len(asked) > 2
    assert all(f"Question: {ODD_QUESTION}\n" in r.suffix for r in asked)
    if judge == "separate":
        classify = [r for r in gen.requests if CLASSIFY_MARK in r.suffix]
        assert classify and all(f"Question: {ODD_QUESTION}\n" in r.suffix for r in classify)


def test_segment_size_must_fit_the_window() -> None:
    gen = ScriptedGenerator(context_window=200)
    for size in (200, 201, 10_000):
        with pytest.raises(UserError) as info:
            WiM(gen, segment_tokens=size)
        assert str(size) in str(info.value) and "200" in str(info.value)
    for size in (0, -5):
        with pytest.raises(UserError):
            WiM(gen, segment_tokens=size)
    WiM(gen, segment_tokens=199)


@pytest.mark.parametrize("question", ["", "   ", "\n\t "])
def test_empty_question(doc: str, question: str) -> None:
    gen = ScriptedGenerator()
    with pytest.raises(UserError):
        WiM(gen, segment_tokens=SEGMENT_TOKENS).run(doc, question)
    assert gen.requests == []


def test_empty_context() -> None:
    with pytest.raises(UserError):
        WiM(ScriptedGenerator(), segment_tokens=50).answer(" \n\n ", QUESTION)


@pytest.mark.parametrize("opts", [{"judge": "vibes"}, {"margin_tokens": 0}, {"max_new_tokens": 0}])
def test_bad_options(opts: dict[str, Any]) -> None:
    with pytest.raises(UserError):
        WiM(ScriptedGenerator(), segment_tokens=50, **opts)


class PlainGenerator(Generator):
    """A generator with no KV cache: WiM must refuse it."""

    name = "plain"

    @property
    def tokenizer(self) -> WordTokenizer:
        return WordTokenizer()

    def render_chat(self, messages: Any, add_generation_prompt: bool = True) -> str:
        return "".join(m["content"] for m in messages)

    def stream_prompt(self, prompt_ids: Any, params: GenerationParams) -> Any:
        yield "x"


def test_wim_needs_a_caching_generator() -> None:
    with pytest.raises(UserError) as info:
        WiM(PlainGenerator())
    assert "plain" in str(info.value) and "lc or rag" in str(info.value)
    assert make_pattern("lc", PlainGenerator()).answer("some text", "q?").text == "x"


def test_document_too_long_for_wim_notes() -> None:
    gen = ScriptedGenerator(context_window=300)
    text = " ".join(["word"] * 400)
    from marginalia.errors import ContextOverflow

    with pytest.raises(ContextOverflow) as info:
        WiM(gen, segment_tokens=100).answer(text, QUESTION)
    assert info.value.window == 300 and info.value.needed > 300
    assert gen.requests == []



def test_wim_overflow_does_not_advise_wim() -> None:
    """Found as a bug: ContextOverflow advised '--pattern wim' to a WiM run that overflowed."""
    from marginalia.errors import ContextOverflow

    with pytest.raises(ContextOverflow) as info:
        WiM(ScriptedGenerator(context_window=300), segment_tokens=100).answer(
            " ".join(["word"] * 400), QUESTION)
    assert "--pattern wim" not in str(info.value)


def test_answer_after_partial_iteration(doc: str) -> None:
    gen = ScriptedGenerator(reader_for(doc))
    run = WiM(gen, segment_tokens=SEGMENT_TOKENS).run(doc, QUESTION)
    first = [e for _, e in zip(range(4), run, strict=False)]
    assert [e.kind for e in first] == ["started", "segment_read", "margin_written", "margin_judged"]
    answer = run.answer()
    assert answer.text == "The ferry leaves from pier 47." and not answer.stopped_early
    assert run.answer() is answer


def test_notes_that_do_not_fit_keep_the_latest() -> None:
    from marginalia.patterns.wim import fit_notes

    count = WordTokenizer().count
    notes = ["first note here", "second note", "third"]
    assert fit_notes(notes, 1000, count) == "- first note here\n- second note\n- third"
    assert fit_notes(notes, count("- second note\n- third"), count) == "- second note\n- third"
    assert fit_notes(notes, 0, count) == "- (no notes)"
    assert fit_notes([], 1000, count) == "- (no notes)"


def test_list_notes_are_tallied_most_named_first() -> None:
    """Partial aggregates summed: each item of the list notes with the number of notes naming it (case aside),
    ties in order of first mention; the tally stands for the list notes; a sentence note is not a list and
    stays; nothing is tallied when fewer than two notes are lists."""
    from marginalia.patterns.wim import fit_notes, tally_notes

    count = WordTokenizer().count
    notes = ["apple, river, stone, cloud", "The river rose in May.", "river, cloud, Apple, lamp", "lamp, river, desk"]
    line = tally_notes(notes)
    assert line == ("- Named in the 3 list notes (how many), most named first: river (3), apple (2), cloud (2), "
                    "lamp (2), stone (1), desk (1)")
    assert tally_notes(["apple, river, stone", "The river rose in May."]) == ""
    assert tally_notes(["apple, river, stone"]) == ""
    only = fit_notes(notes, 1000, count).splitlines()
    assert only == ["- The river rose in May.", line]
    one_list = ["apple, river, stone", "The river rose in May."]
    assert fit_notes(one_list, 1000, count) == "\n".join(f"- {n}" for n in one_list)  # no tally: the list stays
    short = fit_notes(notes, count(line) - 2, count)  # the tally alone is too long: cut at a comma
    assert short == line.rsplit(", ", 1)[0], short


def test_lists_decoding_writes_again_by_copy_only_a_list_the_part_does_not_hold(doc: str) -> None:
    def respond(req: Request) -> str:
        if not is_margin(req):
            return "I do not know."
        if req.params.copy_from is not None:  # copy decoding: the part's own words
            return ", ".join(req.params.copy_from.split()[:3]).strip(".,")
        return "apple, banana, cherry, plum"  # free: a list no part holds

    gen = ScriptedGenerator(respond)
    events = run_events(gen, doc)
    segments = WiM(gen, segment_tokens=SEGMENT_TOKENS).segments(doc)
    reqs = margin_requests(gen)
    # each margin written freely, then again by copy from its own part
    assert [r.params.copy_from for r in reqs] == [t for s in segments for t in (None, s.text)]
    written = [e.text for e in events if isinstance(e, MarginWritten)]
    assert written == [", ".join(s.text.split()[:3]).strip(".,") for s in segments]
    assert all(r.params.copy_also == ("NONE",) for r in reqs if r.params.copy_from is not None)
    sentences = ScriptedGenerator(reader_for(doc))  # a margin that is no list stays as written
    WiM(sentences, segment_tokens=SEGMENT_TOKENS).answer(doc, QUESTION)
    assert all(r.params.copy_from is None for r in margin_requests(sentences))

    wim = WiM(ScriptedGenerator(), segment_tokens=SEGMENT_TOKENS)
    part = segments[0]
    words = [w.strip(".,") for w in part.text.split()[:3]]
    assert wim.needs_copy("apple, banana, cherry", part)
    assert not wim.needs_copy(", ".join(words), part)  # a list the part holds stays as written
    assert not wim.needs_copy("NONE", part) and not wim.needs_copy(part.text.split(".")[0] + ".", part)

    class Loose(ScriptedGenerator):
        supports_copy = False

    loose = Loose(respond, name="loose")  # a model that cannot copy keeps its margins as written
    run_events(loose, doc)
    assert all(r.params.copy_from is None for r in margin_requests(loose))
    assert len(margin_requests(loose)) == len(segments)


def test_copy_decoding_needs_a_backend_that_enforces_it() -> None:
    class Loose(ScriptedGenerator):
        supports_copy = False

    with pytest.raises(UserError, match="loose cannot restrict what it generates .to copies from a text"):
        Loose(name="loose").generate("Is it?", GenerationParams(copy_from="some text"))


def test_a_margin_the_token_budget_ends_loses_its_cut_last_word(doc: str) -> None:
    # a real tokenizer can end the budget inside a word ("pier 4" of "pier 47"), which a judge would take for
    # a number of the model's own: a budget-ended margin is judged, and shown, without its last word
    going_on = FACT[:-1] + " and returns at dawn"
    gen = ScriptedGenerator(lambda req: going_on if is_margin(req) else "I do not know.")
    budget = len(gen.tokenizer.encode(FACT[:-1] + " and"))
    cut = {e.text for e in run_events(gen, doc, margin_tokens=budget) if isinstance(e, MarginWritten)}
    assert cut == {FACT[:-1]}
    whole = {e.text for e in run_events(gen, doc, margin_tokens=budget + 20) if isinstance(e, MarginWritten)}
    assert whole == {going_on}


@pytest.mark.parametrize(("margin", "expected"), [
    ("landing the first humans on the Moon from 196", "landing the first humans on the Moon from"),
    ("apple, banana, cher", "apple, banana"),
    ("It was \"Denv", "It was"),
    ("The answer is 1961.", "The answer is 1961."),
    ("Cam", "Cam"),
])
def test_without_cut_word(margin: str, expected: str) -> None:
    from marginalia.patterns.wim import without_cut_word

    assert without_cut_word(margin) == expected
