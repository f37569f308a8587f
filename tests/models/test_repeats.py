"""The loop guard: which next tokens would repeat a run of n generated tokens."""

from __future__ import annotations

from typing import Any

import pytest

from marginalia.models.repeats import NoRepeat, digits_or_blanks, repeating


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


def test_tokens_of_digits_and_blanks_are_never_banned() -> None:
    pieces = {1: " from", 2: " ", 3: "2", 4: "0", 5: "5", 6: " to", 7: "6", 8: ",", 9: " the"}

    def decode(ids: Any) -> str:
        return "".join(pieces[i] for i in ids)

    year = [2, 3, 4, 4]
    written = [1, *year, 5, 6, *year]  # "from 2005 to 200": the run " ", "2", "0" and "2", "0", "0" closed twice
    assert repeating(written[:-1], 3) == {4}  # n-gram blocking alone would forbid the second year's "0"
    guard = NoRepeat(3, decode)
    for token in written:
        assert token not in guard.banned(), decode(guard.written)
        guard.feed(token)
    # a run closing on a word or a mark is still banned: "the, the, the" stops at its third "the"
    words = NoRepeat(2, decode)
    for token in (9, 8, 9):
        words.feed(token)
    assert words.banned() == [8]
    assert digits_or_blanks(" 2005 ") and digits_or_blanks("\n") and not digits_or_blanks("1,000")
