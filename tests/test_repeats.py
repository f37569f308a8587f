"""The loop guard: which next tokens would repeat a run of n generated tokens."""

from __future__ import annotations

import pytest

from marginalia.models.repeats import NoRepeat, repeating


def test_a_run_written_once_may_not_close_again() -> None:
    #        a  b  c  a  b  -> writing c would make "a b c" twice
    assert repeating([1, 2, 3, 1, 2], 3) == {3}
    assert repeating([1, 2, 3, 1, 4], 3) == set()  # "1 4" was never followed by anything
    assert repeating([1, 2, 3, 1, 2, 4, 1, 2], 3) == {3, 4}  # every token that followed "1 2"


def test_short_histories_and_run_lengths() -> None:
    assert repeating([], 3) == set()
    assert repeating([1, 2], 3) == set()  # no whole run yet
    assert repeating([5, 6, 5], 1) == {5, 6}  # n = 1: no token twice
    assert repeating([7, 7], 2) == {7}  # "7 7" written, so a third 7 would repeat it
    assert repeating([1, 2, 3], 0) == set()


def test_the_guard_follows_what_is_fed() -> None:
    guard = NoRepeat(2)
    for token in (4, 5, 4):
        guard.feed(token)
    assert guard.banned() == [5]
    with pytest.raises(ValueError, match="at least 1 token"):
        NoRepeat(0)
