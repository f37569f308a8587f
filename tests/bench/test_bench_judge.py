"""The model judge (JSON replies, retries, unjudged), medoid voting and judge-vs-lexical disagreements."""

from __future__ import annotations

import pytest

from marginalia.bench.config import JudgeConfig
from marginalia.bench.judge import (
    JudgeReply,
    ModelJudge,
    disagreement,
    judge_messages,
    medoid,
    parse_reply,
    token_f1,
)
from marginalia.errors import BackendError
from marginalia.models.fake import Request, ScriptedGenerator


@pytest.mark.parametrize(("text", "expected"), [
    ('{"correct": true, "reason": "same city"}', (True, "same city")),
    ('```json\n{"correct": false, "reason": "wrong year"}\n```', (False, "wrong year")),
    ('Here is my verdict: {"correct": true} -- hope it helps', (True, "")),
    ('{"correct": "yes", "reason": "ok", "confidence": 0.9}', (True, "ok")),  # lax bool, extra keys ignored
    ('{"verdict": "yes"} then {"correct": false, "reason": "has {braces}"}', (False, "has {braces}")),
    ('{"reason": "no verdict"}', None),
    ('[{"correct": true}]', (True, "")),  # the object inside the list is found
    ("The answer is correct.", None),
    ('{"correct": true, "reason": ', None),
    ('{"correct": "perhaps"}', None),
])
def test_parse_reply(text: str, expected: tuple[bool, str] | None) -> None:
    reply = parse_reply(text)
    if expected is None:
        assert reply is None
    else:
        assert isinstance(reply, JudgeReply)
        assert (reply.correct, reply.reason) == expected


def test_judge_prompt_holds_question_answers_and_prediction() -> None:
    system, user = judge_messages("Where is the $ferry {x}?", ("pier 47", 'dock "B"'), "  At pier 47. ")
    assert system["role"] == "system" and "JSON" in system["content"]
    text = user["content"]
    assert "Question: Where is the $ferry {x}?" in text
    assert 'Reference answers: "pier 47" | "dock \\"B\\""' in text
    assert "Predicted answer: At pier 47.\n" in text and '{"correct": <true or false>' in text
    _, unanswerable = judge_messages("Who?", (), "")
    assert "does not answer this question" in unanswerable["content"]
    assert "Predicted answer: (empty)" in unanswerable["content"]


def test_judge_reads_a_verdict_first_time() -> None:
    gen = ScriptedGenerator(replies=['Verdict:\n```json\n{"correct": true, "reason": "same pier"}\n```'])
    verdict = ModelJudge(gen).judge("Which pier?", ("pier 47",), "Pier 47.")
    assert (verdict.status, verdict.reason, verdict.attempts, verdict.correct) == ("correct", "same pier", 1, True)
    (req,) = gen.requests
    assert req.params.temperature == 0.0 and "Pier 47." in req.prompt
    assert verdict.to_dict() == {"verdict": "correct", "reason": "same pier", "attempts": 1}


def test_judge_retries_garbage_with_new_seeds() -> None:
    gen = ScriptedGenerator(replies=["I think so.", "{correct: yes}", '{"correct": false, "reason": "no"}'])
    verdict = ModelJudge(gen, retries=2, seed=10).judge("Q?", ("a",), "b")
    assert (verdict.status, verdict.attempts, verdict.correct) == ("wrong", 3, False)
    params = [r.params for r in gen.requests]
    assert params[0].temperature == 0.0
    assert [p.seed for p in params[1:]] == [11, 12] and all(p.temperature > 0 for p in params[1:])


def test_judge_gives_up_as_unjudged() -> None:
    gen = ScriptedGenerator(default="Yes, it is right.")
    verdict = ModelJudge(gen, retries=1).judge("Q?", ("a",), "a")
    assert (verdict.status, verdict.attempts, verdict.correct) == ("unjudged", 2, None)
    assert verdict.to_dict()["raw"] == "Yes, it is right." and len(gen.requests) == 2


def test_a_failing_judge_model_is_unjudged_not_a_crash() -> None:
    def broken(req: Request) -> str:
        raise BackendError("connection refused")

    verdict = ModelJudge(ScriptedGenerator(broken)).judge("Q?", ("a",), "a")
    assert verdict.status == "unjudged" and "connection refused" in verdict.reason


def test_token_f1() -> None:
    assert token_f1("The pier 47.", "pier 47") == 1.0
    assert token_f1("It is pier 47", "pier 47") == pytest.approx(2 / 3)
    assert token_f1("harbour", "pier") == 0.0
    assert token_f1("", "") == 1.0 and token_f1("the", "pier") == 0.0


def test_medoid_picks_the_consensus_answer() -> None:
    texts = ["Paris", "It is Paris.", "Lyon", "paris", "Paris, France"]
    best, means = medoid(texts)
    assert best == 0 and texts[best] == "Paris"
    # Paris: vs "It is Paris." 0.5, Lyon 0, paris 1, "Paris, France" 2/3
    assert means[0] == pytest.approx((0.5 + 0 + 1 + 2 / 3) / 4)
    assert means[2] == 0.0
    assert medoid(["only"]) == (0, [1.0])
    assert medoid(["a b", "c d"])[0] == 0  # a tie goes to the first
    with pytest.raises(ValueError):
        medoid([])


@pytest.mark.parametrize(("correct", "scores", "expected"), [
    (True, {"em": 0.0, "f1": 0.1, "contains": 0.0}, "judge_correct_lexical_wrong"),
    (True, {"em": 0.0, "f1": 0.1, "contains": 1.0}, None),     # contains the gold: plausible
    (True, {"em": 0.0, "f1": 0.25, "contains": 0.0}, None),    # some overlap
    (False, {"em": 1.0, "f1": 1.0, "contains": 1.0}, "judge_wrong_exact_match"),
    (False, {"em": 0.0, "f1": 0.9, "contains": 1.0}, None),
    (None, {"em": 1.0, "f1": 1.0, "contains": 1.0}, None),     # unjudged
    (True, {}, None),
])
def test_disagreement(correct: bool | None, scores: dict[str, float], expected: str | None) -> None:
    assert disagreement(correct, scores) == expected


def test_probability_judge_reads_p_yes_against_its_threshold() -> None:
    from marginalia.bench.judge import ProbabilityJudge, make_model_judge

    def model(req: Request) -> str:  # P(YES) 0.8 when the reply names the reference, else 0.3
        reply = (req.prefix + req.suffix).split("Reply to check:")[1]
        return "0.8" if "Orla Maye" in reply else "0.3"

    gen = ScriptedGenerator(model)
    judge = make_model_judge(gen, JudgeConfig(model="scripted", method="probability", threshold=0.5, yes_no="model"))
    assert isinstance(judge, ProbabilityJudge) and judge.name == "scripted P(YES)>=0.5"
    right = judge.judge("Which dredger was hired?", ["Orla Maye"], "They hired the Orla Maye.")
    wrong = judge.judge("Which dredger was hired?", ["Orla Maye"], "The Maverick's Revenge.")
    assert right.status == "correct" and right.p_yes == pytest.approx(0.8)
    assert wrong.status == "wrong" and wrong.p_yes == pytest.approx(0.3)
    assert right.to_dict()["p_yes"] == 0.8 and "P(YES) 0.80" in right.reason
    asked = gen.requests[0].prefix
    assert "Which dredger was hired?" in asked and '"Orla Maye"' in asked and "YES or NO" in asked
    # a lower threshold turns the 0.3 into a right answer; no reference: the unanswerable question
    assert ProbabilityJudge(gen, threshold=0.25).judge("Q?", ["Orla Maye"], "No idea.").status == "correct"
    ProbabilityJudge(gen).judge("Who won?", [], "The text does not say.")
    assert "does not answer this question" in gen.requests[-1].prefix


def test_probability_judge_refuses_what_it_cannot_do() -> None:
    from marginalia.bench.judge import ProbabilityJudge, make_model_judge
    from marginalia.errors import UserError

    gen = ScriptedGenerator(lambda req: "0.5")
    with pytest.raises(UserError, match="between 0 and 1"):
        ProbabilityJudge(gen, threshold=1.0)
    with pytest.raises(UserError, match="unknown judge method 'vote'"):
        make_model_judge(gen, JudgeConfig.model_construct(method="vote"))
    gen.supports_choice_probabilities = False
    with pytest.raises(UserError, match="does not give next-token probabilities"):
        ProbabilityJudge(gen)
    failing = ScriptedGenerator(lambda req: (_ for _ in ()).throw(BackendError("model died")))
    assert ProbabilityJudge(failing).judge("Q?", ["a"], "a").status == "unjudged"


@pytest.mark.parametrize(("answers", "prediction", "expected"), [
    (["yes"], "Yes", "correct"),
    (["No"], "no.", "correct"),
    (["no"], "Yes", "wrong"),                                          # the opposite word
    (["yes"], "No, the two were not born in the same country.", "wrong"),
    (["yes"], "No, no one disputes it, yes.", "wrong"),                # the first word decides
    (["yes"], "Both were American, so yes.", "correct"),               # the one of the two it names
    (["yes"], "They were both American.", None),                       # neither: the model decides
    (["yes"], "Perhaps yes, perhaps no.", None),                       # both, neither first
    (["Paris"], "Yes", None),                                          # not a yes/no question
    ([], "No", None),                                                  # unanswerable
])
def test_yes_no_verdict(answers: list[str], prediction: str, expected: str | None) -> None:
    from marginalia.bench.judge import yes_no_verdict

    verdict = yes_no_verdict(answers, prediction)
    assert (verdict.status if verdict else None) == expected
    if verdict:
        assert verdict.attempts == 0 and "settled by rule" in verdict.reason


def test_a_rule_first_judge_asks_the_model_only_what_the_rule_leaves() -> None:
    from marginalia.bench.judge import ProbabilityJudge, RuleFirstJudge, make_model_judge

    gen = ScriptedGenerator(lambda req: "0.9")  # a judge that accepts everything, as small ones accept "Yes"
    judge = make_model_judge(gen, JudgeConfig(model="scripted", method="probability", threshold=0.5))
    assert isinstance(judge, RuleFirstJudge) and isinstance(judge.inner, ProbabilityJudge)
    assert judge.name == "scripted P(YES)>=0.5, yes/no by rule" and judge.generator is gen
    assert judge.judge("Were both born in Ohio?", ["no"], "Yes").status == "wrong"
    assert not gen.requests
    verdict = judge.judge("Were both born in Ohio?", ["no"], "Only one of them was.")
    assert verdict.status == "correct" and verdict.p_yes == pytest.approx(0.9) and len(gen.requests) == 1
    assert judge.judge("Which city?", ["Paris"], "Yes").status == "correct"  # no yes/no gold: the model's
    model_only = make_model_judge(gen, JudgeConfig(model="scripted", method="probability", yes_no="model"))
    assert model_only.judge("Were both born in Ohio?", ["no"], "Yes").status == "correct"
