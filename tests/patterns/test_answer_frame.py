"""The prompt's "Question: ... Answer:" frame never opens an answer, and a run-on frame ends it, on every
pattern (streamed and whole)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from marginalia.index.embedders import HashingEmbedder
from marginalia.models.fake import Request, ScriptedGenerator
from marginalia.patterns import make_pattern
from marginalia.patterns.auto import AutoOptions
from marginalia.patterns.base import AnswerFrame
from marginalia.records import AnswerDelta, Done
from wim_requests import is_margin

FACT = "The night ferry to Brackwater leaves from pier 47."
QUESTION = "Which pier does the night ferry to Brackwater leave from?"


def trimmed(text: str, step: int) -> tuple[str, bool]:
    frame = AnswerFrame()
    shown = ""
    for k in range(0, len(text), step):
        shown += frame.feed(text[k:k + step])
        if frame.ended:
            break
    shown += frame.finish()
    assert shown == frame.text
    return shown, frame.ended


@pytest.mark.parametrize("step", [1, 3, 1000])
@pytest.mark.parametrize(("reply", "answer", "ended"), [
    ("Question: Which pier? Answer: Pier 47.", "Pier 47.", False),
    ("  question : Which pier?\nanswer: Pier 47.", "Pier 47.", False),
    ("Question: Which pier?\nPier 47.", "Pier 47.", False),
    ("Answer: Pier 47.", "Pier 47.", False),
    ("Pier 47.\nQuestion: Which day?\nAnswer: Monday.", "Pier 47.", True),
    ("Question: Which pier? Answer: Pier 47.\n\nQuestion: Who?\nAnswer: Ingrid.", "Pier 47.\n", True),
    ("Pier 47. Question: Who sails it?", "Pier 47.", True),
    ("Questions about the pier remain.", "Questions about the pier remain.", False),
    ("A", "A", False),
    ("An answer: pier 47.", "An answer: pier 47.", False),
    ("Question: Which pier?", "", False),
])
def test_the_frame_is_taken_off_as_the_answer_streams(reply, answer, ended, step):
    assert trimmed(reply, step) == (answer, ended)


def framed(req: Request) -> str:
    """A small model that repeats its prompt's frame, then runs on into invented pairs."""
    if is_margin(req):
        return FACT if FACT in req.prefix[-400:] else "NONE"
    return (f"Question: {QUESTION}\nAnswer: Pier 47.\nQuestion: Who runs the ferry?\nAnswer: Nobody."
            if FACT in req.prompt else "Question: What?\nAnswer: I do not know.")


BUILD: dict[str, Callable[[ScriptedGenerator], Any]] = {
    "lc": lambda gen: make_pattern("lc", gen),
    "rag": lambda gen: make_pattern("rag", gen, embedder=HashingEmbedder(), chunk_tokens=60),
    "wim": lambda gen: make_pattern("wim", gen, segment_tokens=100),
    "auto": lambda gen: make_pattern(AutoOptions(segment_tokens=100, chunk_tokens=60), gen,
                                     embedder=HashingEmbedder()),
}


@pytest.mark.parametrize("name", list(BUILD))
def test_no_pattern_answers_with_the_frame(make_haystack, name):
    doc = make_haystack(40, FACT, 0.6)
    events = list(BUILD[name](ScriptedGenerator(framed)).run(doc, QUESTION))
    answer = events[-1].answer if isinstance(events[-1], Done) else None
    assert answer is not None and answer.text == "Pier 47."
    streamed = "".join(e.text for e in events if isinstance(e, AnswerDelta))
    assert "Question:" not in streamed and streamed.strip().endswith("Pier 47.")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lc", "rag", "wim", "auto"])
def test_the_embedded_model_never_opens_an_answer_with_the_frame(smollm2_llamacpp, name):
    from marginalia.app import demo

    text, questions = demo()
    gen = smollm2_llamacpp.fork(keep_cache=False)
    build = {"lc": lambda: make_pattern("lc", gen), "rag": lambda: make_pattern("rag", gen),
             "wim": lambda: make_pattern("wim", gen), "auto": lambda: make_pattern(AutoOptions(), gen)}[name]
    pattern = build()
    for item in questions[:2]:
        answer = pattern.answer(text, item["question"])
        assert answer.text.strip()
        assert not answer.text.lstrip().lower().startswith(("question", "answer:")), answer.text
        assert "\nQuestion:" not in answer.text
