"""Context tokens prefilled, as the backends count them (`PrefillLedger`), and a re-prefill caught."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from benchmark_scripts import load
from marginalia.models.fake import ScriptedGenerator
from marginalia.models.ledger import PrefillLedger, common_prefix
from marginalia.patterns.long_context import LongContext
from marginalia.patterns.wim import WiM

QUESTION = "Which pier does the night ferry to Brackwater leave from?"
FACT = "The night ferry to Brackwater leaves from pier 47."


def reader(request: Any) -> str:
    return "Pier 47." if "=====" in request.suffix else ("NONE" if FACT not in request.prefix else FACT)


def overhead_problems() -> Callable[[dict[str, Any], dict[str, Any]], list[str]]:
    return load("wim_overhead").problems  # type: ignore[no-any-return]


def row(answer: Any) -> dict[str, Any]:
    s = answer.stats
    return {"context_tokens": s.context_tokens, "prefilled_context": s.prefilled_context_tokens,
            "reprefilled_context": s.reprefilled_context_tokens}


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3, 4], (1, 2, 9), 10) == 2
    assert common_prefix([1, 2, 3], [1, 2, 3, 4], 10) == 3
    assert common_prefix([1, 2, 3], [1, 2, 3], 2) == 2
    assert common_prefix([5], [1], 3) == 0


def test_ledger_counts_positions_of_the_reference_only() -> None:
    ledger = PrefillLedger([9, 9, 1, 2, 3, 4], context=[(2, 6)], blocks=[2, 4, 6])
    ledger.record([9, 9], 0, 2)  # the instructions: not context
    ledger.record([9, 9, 1, 2], 2, 4)
    assert (ledger.evaluated, ledger.repeated) == (2, 0)
    # a prompt after the first block whose first token happens to be the next block's: not a re-read
    ledger.record([9, 9, 1, 2, 3, 7, 7], 4, 7)
    assert (ledger.evaluated, ledger.repeated) == (2, 0)
    ledger.record([9, 9, 1, 2, 3, 4], 4, 6)
    ledger.record([9, 9, 1, 2, 3, 4], 2, 6)  # everything again
    assert (ledger.evaluated, ledger.repeated) == (8, 4)
    ledger.shift(2, 4)  # the first block dropped: its counts stay in the totals
    assert ledger.reference == [9, 9, 3, 4] and (ledger.evaluated, ledger.repeated) == (8, 4)
    ledger.record([9, 9, 3, 4], 2, 4)  # the tail prefilled again at its new positions
    assert (ledger.evaluated, ledger.repeated) == (10, 6)


def test_wim_and_lc_prefill_each_context_token_once_by_the_backends_count(
        make_haystack: Callable[..., str]) -> None:
    doc = make_haystack(40, FACT, 0.5)
    wim = WiM(ScriptedGenerator(reader), segment_tokens=100).answer(doc, QUESTION)
    lc = LongContext(ScriptedGenerator(reader)).answer(doc, QUESTION)
    assert wim.segments_total > 3
    assert wim.stats.prefilled_context_tokens == wim.stats.context_tokens == lc.stats.prefilled_context_tokens
    assert wim.stats.reprefilled_context_tokens == lc.stats.reprefilled_context_tokens == 0
    assert overhead_problems()(row(lc), row(wim)) == []


class Forgetful(ScriptedGenerator):
    """A backend that loses its cache before each prefill and evaluates everything again (as a fork that
    evicts another's tokens from a shared context would)."""

    def prefill(self, ids: Sequence[int]) -> None:
        held = list(self.ids)
        self.ids.clear()
        super().prefill(held + list(ids))

    def fork(self, keep_cache: bool = True) -> ScriptedGenerator:
        other = Forgetful(self.respond, default=self.default, context_window=self.context_window,
                          name=self.name, _shared=self)
        if keep_cache:
            other.ids = list(self.ids)
        return other


def test_a_forced_re_prefill_is_caught(make_haystack: Callable[..., str]) -> None:
    doc = make_haystack(40, FACT, 0.5)
    wim = WiM(Forgetful(reader), segment_tokens=100).answer(doc, QUESTION)
    lc = LongContext(ScriptedGenerator(reader)).answer(doc, QUESTION)
    s = wim.stats
    assert s.prefilled_context_tokens > s.context_tokens
    assert s.reprefilled_context_tokens == s.prefilled_context_tokens - s.context_tokens > 0
    found = overhead_problems()(row(lc), row(wim))
    assert any("WiM prefilled" in p and "more than once" in p for p in found)


def test_a_second_question_prefills_no_context(make_haystack: Callable[..., str]) -> None:
    doc = make_haystack(40, FACT, 0.5)
    read = WiM(ScriptedGenerator(reader), segment_tokens=100).reader(doc)
    first, second = read.answer(QUESTION), read.answer("Where does the ferry go?")
    assert first.stats.prefilled_context_tokens == first.stats.context_tokens
    assert second.stats.prefilled_context_tokens == second.stats.reprefilled_context_tokens == 0
    assert second.stats.cached_context_tokens == second.stats.context_tokens


@pytest.mark.slow
def test_llamacpp_counts_what_a_shared_context_evaluates_again(smollm2_llamacpp: Any) -> None:
    gen = smollm2_llamacpp.fork(keep_cache=False)
    ids = gen.tokenizer.encode("The harbour opens at dawn. Rain fell all week.")
    ledger = PrefillLedger(ids, [(0, len(ids))])
    attached, gen.usage.ledger = gen.usage.ledger, ledger
    try:
        gen.prefill(ids)
        assert (ledger.evaluated, ledger.repeated) == (len(ids), 0)
        gen.fork(keep_cache=False).prefill(gen.tokenizer.encode("Something else entirely."))  # evicts ours
        gen.prefill(gen.tokenizer.encode(" More."))  # our tokens are evaluated again first
        assert (ledger.evaluated, ledger.repeated) == (2 * len(ids), len(ids))
    finally:
        gen.usage.ledger = attached
