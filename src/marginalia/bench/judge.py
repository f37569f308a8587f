"""The model judges (is this prediction right?), medoid voting over sampled answers, and judge-vs-lexical checks.

Two judges, chosen by ``[judge] method``:

- ``verdict`` (`ModelJudge`): asks any generator for a small JSON object, ``{"correct": true, "reason":
  "..."}``; the reply is validated with pydantic, tolerating code fences and prose around it. A garbled reply
  is retried with a fresh sampling seed, and after the last try the item is recorded ``unjudged``: judging
  never stops a run.
- ``probability`` (`ProbabilityJudge`): asks a YES/NO question and reads the model's probability of YES from
  its first token (nothing is decoded, so nothing can be garbled); right when it reaches a threshold. Needs an
  in-process model. Small models answer such questions with a YES probability that ranks answers well but
  sits far from 0.5, so the threshold is fitted, not assumed: on answers whose rightness is known.

Either judge is asked only what a rule cannot settle: a yes/no question answered yes or no is right when the
word is the gold one (`yes_no_verdict`; ``[judge] yes_no = "rule"``, the default): small judges decide those
poorly, and often accept the opposite word.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from ..app import CachingGenerator, GenerationParams, Generator, Message
from ..errors import MarginaliaError, UserError
from ..prompts import template
from .metrics import YES_NO, is_yes_no_gold, normalize_answer
from .metrics import token_f1 as metric_f1

if TYPE_CHECKING:
    from .config import JudgeConfig

RETRY_TEMPERATURE = 0.7


class JudgeReply(BaseModel):
    """What the judge model must return (extra keys are ignored: a model's output, not our config)."""

    model_config = ConfigDict(extra="ignore")

    correct: bool
    reason: str = ""


@dataclass(frozen=True)
class Verdict:
    """The judge's decision on one prediction."""

    status: Literal["correct", "wrong", "unjudged"]
    reason: str = ""
    attempts: int = 0
    raw: str = ""  # the last reply, kept when it could not be read
    p_yes: float | None = None  # the model's probability of YES (the probability judge)

    @property
    def correct(self) -> bool | None:
        return None if self.status == "unjudged" else self.status == "correct"

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = {"verdict": self.status, "reason": self.reason, "attempts": self.attempts}
        if self.status == "unjudged":
            data["raw"] = self.raw
        if self.p_yes is not None:
            data["p_yes"] = round(self.p_yes, 4)
        return data


def judge_messages(question: str, answers: Sequence[str], prediction: str, prompt: str = "judge") -> list[Message]:
    """A judge's chat: our system line and the question, references and prediction, from the templates
    ``<prompt>_system``, ``<prompt>`` and (no reference: the question has no answer) ``<prompt>_unanswerable``."""
    values = {"question": question.strip(), "prediction": prediction.strip() or "(empty)"}
    if answers:
        name = prompt
        values["answers"] = " | ".join(json.dumps(a, ensure_ascii=False) for a in answers)
    else:
        name = f"{prompt}_unanswerable"
    return [{"role": "system", "content": template(f"{prompt}_system").template.strip()},
            {"role": "user", "content": template(name).substitute(values).strip()}]


_FENCE = re.compile(r"```(?:json)?", re.IGNORECASE)


def parse_reply(text: str) -> JudgeReply | None:
    """The first JSON object in ``text`` that is a valid reply, or None.

    Code fences and prose before or after the object are ignored.
    """
    text = _FENCE.sub(" ", text)
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        try:
            return JudgeReply.model_validate(obj)
        except ValidationError:
            continue
    return None


class ModelJudge:
    """Asks a generator whether a prediction answers a question, with retries on unreadable replies.

    Args:
        generator: any Generator (a stronger served model is a good choice).
        retries: extra attempts after an unreadable reply (each samples with a new seed).
        max_new_tokens: the most tokens of a reply.
        seed: the first retry's seed; later retries add one each.
    """

    def __init__(self, generator: Generator, retries: int = 2, max_new_tokens: int = 96, seed: int = 0) -> None:
        self.generator = generator
        self.retries = retries
        self.max_new_tokens = max_new_tokens
        self.seed = seed

    @property
    def name(self) -> str:
        return self.generator.name

    def judge(self, question: str, answers: Sequence[str], prediction: str) -> Verdict:
        """Judge one prediction; never raises for a bad reply or a failing model (then ``unjudged``)."""
        messages = judge_messages(question, answers, prediction)
        raw = ""
        attempts = 0
        for attempt in range(self.retries + 1):
            attempts += 1
            params = GenerationParams(max_new_tokens=self.max_new_tokens) if attempt == 0 else GenerationParams(
                max_new_tokens=self.max_new_tokens, temperature=RETRY_TEMPERATURE, seed=self.seed + attempt)
            try:
                raw = self.generator.generate(messages, params)
            except MarginaliaError as exc:
                return Verdict("unjudged", f"the judge model failed: {exc}", attempts, raw)
            reply = parse_reply(raw)
            if reply is not None:
                return Verdict("correct" if reply.correct else "wrong", reply.reason.strip(), attempts)
        return Verdict("unjudged", f"no readable JSON verdict in {attempts} replies", attempts, raw)


class Judge(Protocol):
    """What the runner needs of a judge."""

    @property
    def generator(self) -> Generator: ...

    @property
    def name(self) -> str: ...

    def judge(self, question: str, answers: Sequence[str], prediction: str) -> Verdict: ...


class ProbabilityJudge:
    """Right when the model's probability of YES, for "does the reply give the reference answer?", reaches
    ``threshold``; the probability is read from the first token after the question, never decoded.

    Args:
        generator: an in-process model (one that gives next-token probabilities).
        threshold: P(YES) from which an answer is right (fit it on answers whose rightness is known).

    Raises:
        UserError: the model gives no probabilities, or the threshold is not between 0 and 1.
    """

    choices = ("YES", "NO")

    def __init__(self, generator: Generator, threshold: float = 0.5) -> None:
        if not (isinstance(generator, CachingGenerator) and generator.supports_choice_probabilities):
            raise UserError(f"the probability judge reads the model's probability of YES, and {generator.name} "
                            "does not give next-token probabilities; use method = \"verdict\", or an "
                            "in-process judge model (smollm2, gguf:, hf:)")
        if not 0.0 < threshold < 1.0:
            raise UserError(f"the judge's threshold must be between 0 and 1 (exclusive), got {threshold}")
        self.generator: CachingGenerator = generator
        self.threshold = threshold

    @property
    def name(self) -> str:
        return f"{self.generator.name} P(YES)>={self.threshold:g}"

    def p_yes(self, question: str, answers: Sequence[str], prediction: str) -> float:
        """The model's probability of YES (against NO) that ``prediction`` gives a reference answer."""
        worker = self.generator.fork(keep_cache=False)
        worker.prefill(self.generator.encode_chat(judge_messages(question, answers, prediction, "judge_yesno")))
        return worker.choice_probabilities([], self.choices)[self.choices[0]]

    def judge(self, question: str, answers: Sequence[str], prediction: str) -> Verdict:
        """Judge one prediction; a failing model gives ``unjudged``, never an exception."""
        try:
            p = self.p_yes(question, answers, prediction)
        except MarginaliaError as exc:
            return Verdict("unjudged", f"the judge model failed: {exc}", 1)
        status: Literal["correct", "wrong"] = "correct" if p >= self.threshold else "wrong"
        return Verdict(status, f"P(YES) {p:.2f} against the threshold {self.threshold:g}", 1, p_yes=p)


def yes_no_verdict(answers: Sequence[str], prediction: str) -> Verdict | None:
    """A yes/no question (`is_yes_no_gold`) answered yes or no, settled without a model; None for the rest.

    The answer's word is its first word when that is yes or no ("No, the two were born in different
    countries"), else the one of the two it names; naming both or neither leaves the answer to the model.
    """
    if not is_yes_no_gold(answers):
        return None
    words = normalize_answer(prediction).split()
    named = {words[0]} if words and words[0] in YES_NO else set(words) & set(YES_NO)
    if len(named) != 1:
        return None
    said = named.pop()
    gold = {normalize_answer(str(a)) for a in answers}
    return Verdict("correct" if said in gold else "wrong", f"a yes/no question answered {said!r}: settled by rule", 0)


class RuleFirstJudge:
    """A judge that settles what `yes_no_verdict` can and asks ``inner`` the rest; its name says so, so its
    verdicts are told apart from the model's alone (a run judged by one is judged again by the other)."""

    def __init__(self, inner: Judge) -> None:
        self.inner = inner

    @property
    def generator(self) -> Generator:
        return self.inner.generator

    @property
    def name(self) -> str:
        return f"{self.inner.name}, yes/no by rule"

    def judge(self, question: str, answers: Sequence[str], prediction: str) -> Verdict:
        return yes_no_verdict(answers, prediction) or self.inner.judge(question, answers, prediction)


def make_model_judge(generator: Generator, settings: JudgeConfig, *, seed: int = 0) -> Judge:
    """The judge a ``[judge]`` table (`JudgeConfig`) describes, on ``generator``."""
    judge: Judge
    if settings.method == "verdict":
        judge = ModelJudge(generator, retries=settings.retries, max_new_tokens=settings.max_new_tokens, seed=seed)
    elif settings.method == "probability":
        judge = ProbabilityJudge(generator, settings.threshold)
    else:
        raise UserError(f"unknown judge method {settings.method!r}; choose verdict or probability")
    return RuleFirstJudge(judge) if settings.yes_no == "rule" else judge


# -- medoid voting -------------------------------------------------------------------------------

def token_f1(a: str, b: str) -> float:
    """SQuAD-style token F1 between two answers; two answers that normalise alike (even to nothing) score 1."""
    return 1.0 if normalize_answer(a) == normalize_answer(b) else metric_f1(a, b)


def medoid(texts: Sequence[str]) -> tuple[int, list[float]]:
    """The index of the text closest on average to the others (token F1), and every text's mean.

    Ties go to the earliest text, so the choice is deterministic.
    """
    if not texts:
        raise ValueError("medoid of no texts")
    if len(texts) == 1:
        return 0, [1.0]
    means = []
    for i, a in enumerate(texts):
        means.append(sum(token_f1(a, b) for j, b in enumerate(texts) if j != i) / (len(texts) - 1))
    best = max(range(len(texts)), key=lambda i: (means[i], -i))
    return best, means


# -- judge vs lexical scores -----------------------------------------------------------------------

EM_KEYS = ("em", "exact_match", "exact")
F1_KEYS = ("f1", "set_f1")
CONTAINS_KEYS = ("contains",)


def first_score(scores: Mapping[str, float], keys: Sequence[str]) -> float | None:
    for key in keys:
        value = scores.get(key)
        if value is not None:
            return float(value)
    return None


def disagreement(correct: bool | None, scores: Mapping[str, float]) -> str | None:
    """Why the judge's verdict contradicts the lexical scores, or None when it does not.

    The judge says correct, but the prediction does not contain a gold answer and its F1 is below 0.2;
    or the judge says wrong, but the prediction matches a gold answer exactly.
    """
    if correct is None:
        return None
    contains = first_score(scores, CONTAINS_KEYS)
    f1 = first_score(scores, F1_KEYS)
    em = first_score(scores, EM_KEYS)
    if correct and (contains is None or contains == 0) and f1 is not None and f1 < 0.2:
        return "judge_correct_lexical_wrong"
    if not correct and em == 1:
        return "judge_wrong_exact_match"
    return None


_VERDICTS: dict[Any, bool] = {"correct": True, "wrong": False}


def judges(scoring: str | None) -> bool:
    """Whether a model judge grades answers of this scoring: QA answers, yes; a word list (``set``) is scored
    as a set, never judged (a small judge calls nearly any list right)."""
    return scoring != "set"


def disagreement_line(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The disagreements.jsonl line of a judged result whose verdict contradicts its lexical scores."""
    verdict = (record.get("judge") or {}).get("verdict")
    why = disagreement(_VERDICTS.get(verdict), record.get("scores") or {})
    if why is None:
        return None
    return {"kind": why, "task": record["task"], "item_id": record["item_id"], "pattern": record["pattern"],
            "question": record.get("question"), "answers": record.get("answers"),
            "prediction": record.get("prediction"),  # none of them in a text-free result (bench export)
            "scores": record["scores"], "judge": record["judge"]}
