"""The router's signals: support from one or two sentences, and whether those sentences are on the question."""

from __future__ import annotations

from marginalia.index.embedders import HashingEmbedder
from marginalia.models.fake import ScriptedGenerator
from marginalia.patterns import make_pattern
from marginalia.patterns.auto import Auto, AutoOptions, answer_signals
from marginalia.patterns.signals import measure
from marginalia.records import Answer, Reference, Started

SPEEDWAY = "The 1911 race was won by Ray Harroun at the Indianapolis speedway, a brick oval in Speedway."
TRACK = "The circuit is a motor speedway built in 1909 for automobile testing."
OTHER = "The Brickyard hosts a golf course inside the oval as well."
QUESTION = "At which motor speedway was the 1911 race that Ray Harroun won held?"


def test_a_multi_hop_answer_stands_on_two_sentences_together():
    passages = [SPEEDWAY + " " + OTHER, TRACK]
    measured = measure(QUESTION, "Indianapolis Motor Speedway, built for automobile testing", passages)
    assert measured.single < 0.8  # no one sentence holds "Indianapolis" and "automobile testing"
    assert measured.support == 1.0 and measured.sentences == 2
    assert measured.support > measured.single


def test_a_copied_sentence_stands_alone_and_needs_no_second():
    measured = measure(QUESTION, SPEEDWAY, [SPEEDWAY, TRACK])
    assert measured.support == measured.single == 1.0 and measured.sentences == 1


def test_a_copied_sentence_about_something_else_is_not_on_the_question():
    off = "The ferry to Brackwater leaves from pier 47 every night at nine."
    on = measure(QUESTION, SPEEDWAY, [SPEEDWAY, off])
    elsewhere = measure(QUESTION, off, [SPEEDWAY, off])
    assert elsewhere.support == 1.0  # copied: fully supported
    assert elsewhere.topic < 0.2 < on.topic  # but it holds none of the question's words
    assert elsewhere.names == 0.0 and on.names == 1.0  # nor its names (Ray Harroun)


def test_an_answer_that_adds_nothing_to_the_question_stands():
    measured = measure("Was Ray Harroun the winner?", "Yes.", [SPEEDWAY])
    assert (measured.support, measured.topic) == (1.0, 1.0)


def test_nothing_read_supports_nothing():
    assert measure(QUESTION, "Indianapolis", []).support == 0.0


CONTEXT = "\n\n".join(f"The harbour master in {1900 + i} was Person{i} of Dunmore.\n\n"
                      f"Ferry {i} leaves from pier {40 + i} at night." for i in range(40))
HARBOUR = "Who was the harbour master in 1907?"


def auto(reply: str, **values: object) -> Auto:
    pattern = make_pattern(AutoOptions(segment_tokens=64, **values), ScriptedGenerator(replies=(), default=reply),
                           embedder=HashingEmbedder())
    assert isinstance(pattern, Auto)
    return pattern


def rag_answer(text: str, *passages: str) -> Answer:
    refs = tuple(Reference("doc", 0, len(p), p, score=0.5) for p in passages)
    return Answer(question=HARBOUR, text=text, pattern="rag", model="m", references=refs)


def test_the_question_threshold_escalates_a_copied_sentence_about_something_else():
    harbour, ferry = "The harbour master in 1907 was Person7 of Dunmore.", "Ferry 7 leaves from pier 47 at night."
    copied = rag_answer(ferry, harbour, ferry)
    assert auto("x").decide(HARBOUR, copied).taken == "rag"  # copied: it stands on support alone
    route = auto("x", question_threshold=0.5).decide(HARBOUR, copied)
    assert route.taken == "wim" and "not on the question" in route.reason
    assert route.signals["topic"] < 0.5 <= route.signals["support"]
    assert auto("x", question_threshold=0.5).decide(HARBOUR, rag_answer("Person7 of Dunmore.", harbour,
                                                                        ferry)).taken == "rag"


def test_escalating_to_long_context_reads_the_whole_text_in_one_prompt():
    events = list(auto("Captain Wolfgang Ahab was.", escalate="lc").run(CONTEXT, HARBOUR))
    answer = events[-1].answer
    assert [e.pattern for e in events if isinstance(e, Started)] == ["rag", "lc"]
    assert answer.route.taken == "lc" and answer.margins == ()


def test_escalating_to_nothing_gives_rags_answer_and_says_so():
    events = list(auto("Captain Wolfgang Ahab was.", escalate="rag").run(CONTEXT, HARBOUR))
    answer = events[-1].answer
    assert [e.pattern for e in events if isinstance(e, Started)] == ["rag"]
    assert answer.text == "Captain Wolfgang Ahab was." and answer.route.taken == "rag"
    assert answer.route.reason.endswith("it is given all the same (escalate rag)")


def test_answer_signals_say_whether_it_abstains_and_the_question_gathers():
    ref = Reference("doc", 0, len(SPEEDWAY), SPEEDWAY, score=0.5)
    answer = Answer(question=QUESTION, text="It is not mentioned.", pattern="rag", model="m", references=(ref,))
    signals = answer_signals("List all the races held there.", answer)
    assert signals["abstains"] == 1.0 and signals["gathers"] == 1.0 and signals["retrieval"] == 0.5


def test_a_multi_hop_answer_stands_only_where_two_sentences_may_hold_it():
    joined = Answer(question=QUESTION, text="Indianapolis Motor Speedway, built for automobile testing",
                    pattern="rag", model="m",
                    references=(Reference("doc", 0, 10, SPEEDWAY + " " + OTHER, score=0.5),
                                Reference("doc", 20, 30, TRACK, score=0.5)))
    one = auto("x").decide(QUESTION, joined)  # the default: one sentence
    assert one.taken == "wim" and f"support {one.signals['single_support']:.2f} below 0.5" in one.reason
    two = auto("x", support_sentences=2).decide(QUESTION, joined)
    assert two.taken == "rag" and "support 1.00" in two.reason
