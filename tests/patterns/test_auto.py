"""Routing (pattern auto): RAG's answer stands where its passages support it; else WiM reads, and says why."""

from __future__ import annotations

import pytest

from marginalia import AutoOptions, RagOptions, WimOptions
from marginalia.index.embedders import HashingEmbedder
from marginalia.models.fake import ScriptedGenerator
from marginalia.patterns import make_pattern
from marginalia.patterns.auto import Auto, abstains, answer_support, combined, gathers_whole
from marginalia.records import AnswerDelta, Routed, SegmentRead, Started, Stats

CONTEXT = "\n\n".join(f"Paragraph {i}. The harbour master in {1900 + i} was Person{i} of Dunmore."
                      for i in range(40))
QUESTION = "Who was the harbour master in 1907?"


def auto(reply: str, **values: object) -> Auto:
    pattern = make_pattern(AutoOptions(segment_tokens=64, **values), ScriptedGenerator(replies=(), default=reply),
                           embedder=HashingEmbedder())
    assert isinstance(pattern, Auto)
    return pattern


def test_a_supported_answer_stands_at_rags_cost():
    events = list(auto("Person7 of Dunmore was the harbour master.").run(CONTEXT, QUESTION))
    kinds = [type(e) for e in events]
    routed = next(e for e in events if isinstance(e, Routed))
    answer = events[-1].answer
    assert routed.route.taken == "rag" and "stands" in routed.route.reason
    # the answer is sent only once the route is known, and no segment of WiM is read
    assert kinds.index(Routed) < kinds.index(AnswerDelta)
    assert [e.pattern for e in events if isinstance(e, Started)] == ["rag"]
    assert answer.pattern == "auto" and answer.route == routed.route
    assert answer.text == "Person7 of Dunmore was the harbour master."
    assert answer.margins == () and answer.segments_total > answer.segments_read


def test_an_answer_not_in_the_passages_escalates_and_says_why():
    events = list(auto("Captain Wolfgang Ahab was.").run(CONTEXT, QUESTION))
    routed = next(e for e in events if isinstance(e, Routed))
    started = [e.pattern for e in events if isinstance(e, Started)]
    answer = events[-1].answer
    assert routed.route.taken == "wim" and "not in the retrieved passages" in routed.route.reason
    assert routed.route.signals["support"] < 0.5
    assert started == ["rag", "wim"]
    # RAG's answer was never shown: the only answer text is WiM's
    assert "".join(e.text for e in events if isinstance(e, AnswerDelta)) == answer.text
    assert answer.route.taken == "wim" and answer.margins
    wim_reads = sum(isinstance(e, SegmentRead) for e in events[events.index(routed):])
    assert wim_reads == answer.segments_total


def test_an_abstaining_answer_escalates():
    answer = auto("The passages do not mention who it was.").answer(CONTEXT, QUESTION)
    assert answer.route.taken == "wim" and "do not answer" in answer.route.reason


def test_a_question_over_the_whole_document_goes_to_wim_at_once():
    events = list(auto("Person1").run(CONTEXT, "What are the 10 most common words in the list?"))
    assert [e.pattern for e in events if isinstance(e, Started)] == ["wim"]
    assert events[-1].answer.route.reason == "the question gathers over the whole document"


def test_threshold_zero_keeps_any_answer_that_does_not_abstain():
    assert auto("Captain Wolfgang Ahab was.", support_threshold=0.0).answer(CONTEXT, QUESTION).route.taken == "rag"


def test_stats_count_both_readings():
    pattern = auto("Captain Wolfgang Ahab was.")
    answer = pattern.answer(CONTEXT, QUESTION)
    rag = make_pattern(RagOptions(), pattern.generator, embedder=HashingEmbedder()).answer(CONTEXT, QUESTION)
    assert answer.stats.generated_answer_tokens > rag.stats.generated_answer_tokens
    assert answer.stats.total_seconds >= rag.stats.total_seconds
    assert answer.stats.context_tokens == rag.stats.context_tokens


def test_combined_adds_counts_and_offsets_first_token_times():
    a = Stats(context_tokens=10, generated_answer_tokens=3, total_seconds=2.0, time_to_first_answer_token=1.5)
    b = Stats(context_tokens=10, generated_answer_tokens=5, total_seconds=4.0, time_to_first_answer_token=3.0,
              time_to_first_margin=1.0)
    c = combined(a, b)
    assert (c.context_tokens, c.generated_answer_tokens, c.total_seconds) == (10, 8, 6.0)
    assert (c.time_to_first_answer_token, c.time_to_first_margin) == (5.0, 3.0)


def test_a_model_without_a_rollback_cache_answers_with_rag_and_says_so():
    from marginalia.models.base import Generator

    class Plain(Generator):  # the least a generator is: no KV cache
        name = "plain"
        context_window = 100_000
        remote = False

        def __init__(self) -> None:
            super().__init__()
            self._inner = ScriptedGenerator(default="Captain Wolfgang Ahab was.")

        @property
        def tokenizer(self):
            return self._inner.tokenizer

        def render_chat(self, messages, add_generation_prompt=True):
            return self._inner.render_chat(messages, add_generation_prompt)

        def stream_prompt(self, prompt_ids, params):
            return self._inner.stream_prompt(prompt_ids, params)

    pattern = make_pattern(AutoOptions(), Plain(), embedder=HashingEmbedder())
    answer = pattern.answer(CONTEXT, QUESTION)
    assert answer.route.taken == "rag" and "cannot read with WiM" in answer.route.reason


@pytest.mark.parametrize("question", [
    "What are the 10 most common words in the list?", "List all the ships named in the report.",
    "Which word appears most often?", "How many different ports are mentioned?",
])
def test_questions_that_gather(question):
    assert gathers_whole(question)


@pytest.mark.parametrize("question", [
    "Who was the harbour master in 1907?", "How many people lived in Dunmore in 1901?",
    "Were Scott Derrickson and Ed Wood of the same nationality?", "Which ship came in first?",
])
def test_questions_that_do_not_gather(question):
    assert not gathers_whole(question)


@pytest.mark.parametrize(("answer", "expected"), [
    ("", True), ("The passages do not mention it.", True), ("It is not specified in the text.", True),
    ("I cannot determine that from the passages.", True), ("Person7 of Dunmore.", False),
    ("No, they were not.", False),
])
def test_abstains(answer, expected):
    assert abstains(answer) is expected


def test_answer_support():
    passages = ["The harbour master in 1907 was Person7 of Dunmore.", "Ships came in."]
    assert answer_support(QUESTION, "Person7 of Dunmore", passages)[0] == 1.0
    assert answer_support(QUESTION, "Captain Ahab", passages) == (0.0, 0.0)
    assert answer_support("Was it Person7?", "Yes.", passages) == (1.0, 1.0)


def test_options_split_into_the_two_readings():
    options = AutoOptions(top_k=3, segment_tokens=256, max_new_tokens=20)
    assert options.rag_options() == RagOptions(top_k=3, max_new_tokens=20)
    assert options.wim_options() == WimOptions(segment_tokens=256, max_new_tokens=20)
