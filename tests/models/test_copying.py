"""Copy decoding's check: every piece of a generated text between joining marks occurs in the source."""

from __future__ import annotations

import numpy as np
import pytest

from marginalia.models.copying import CopyState

SOURCE = "12. mushy\n13. hydrogen\n14. tenant\nThe ferry rose 3.5 metres at Dr. Smith's pier."


class Chars:
    """Token i is the i-th entry of a fixed piece list: enough to spell what the tests write."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)

    def id(self, piece: str) -> int:
        return self.pieces.index(piece)


PIECES = ["mushy", ",", " hydrogen", " apple", "Hydrogen", " ten", "ant", "NO", "NE", "The ferry", " rose 3",
          ".", "5 metres", "\n", " New York", "<end>"]


def state(also: tuple[str, ...] = ("NONE",)) -> tuple[CopyState, Chars]:
    chars = Chars(PIECES)
    return CopyState(SOURCE, chars.decode, also=also), chars


def write(text: list[str]) -> tuple[CopyState, Chars, list[bool]]:
    copying, chars = state()
    fits = []
    for piece in text:
        fits.append(copying.allowed(chars.id(piece)))
        copying.feed(chars.id(piece))
    return copying, chars, fits


def test_pieces_copied_from_the_source_pass_case_and_spacing_aside() -> None:
    assert write(["mushy", ",", " hydrogen", ",", " ten", "ant"])[2] == [True] * 6
    assert write(["Hydrogen"])[2] == [True]  # no space before it, a capital: still the source's word
    assert write(["The ferry", " rose 3", ".", "5 metres"])[2] == [True] * 4  # a decimal: two pieces, both copied


def test_what_the_source_lacks_is_ruled_out() -> None:
    copying, chars, fits = write(["mushy", ","])
    assert not copying.allowed(chars.id(" apple"))
    assert not write(["The ferry"])[0].allowed(chars.id(" New York"))  # each word is there, the piece is not
    assert not write(["mushy"])[0].allowed(chars.id(" hydrogen"))  # "mushy hydrogen" is not in the source


def test_none_may_be_written_and_the_mask_keeps_the_end() -> None:
    assert write(["NO", "NE"])[2] == [True, True]
    copying, chars = state()
    logits = np.zeros(len(PIECES), dtype=np.float32)
    logits[chars.id(" apple")] = 9.0  # the likeliest token is not a copy
    allowed = set(copying.mask(logits, ends=[chars.id("<end>")]).tolist())
    assert chars.id(" apple") not in allowed and chars.id(" New York") not in allowed
    assert {chars.id("mushy"), chars.id("<end>"), chars.id("NO")} <= allowed


def test_a_model_set_on_a_word_the_source_lacks_is_led_to_one_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    import marginalia.models.copying as copying_module

    copying, chars = state()
    logits = np.full(len(PIECES), -100.0, dtype=np.float32)
    logits[chars.id(" apple")], logits[chars.id(" New York")] = 9.0, 8.0  # the likeliest are not copies
    logits[chars.id("<end>")] = -200.0
    monkeypatch.setattr(copying_module, "CANDIDATES", (2, len(PIECES)))  # the first look finds no copy
    allowed = set(copying.mask(logits, ends=[chars.id("<end>")]).tolist())
    assert chars.id("mushy") in allowed and chars.id("<end>") in allowed
    assert chars.id(" apple") not in allowed


def test_pieces_are_whole_words_of_the_source() -> None:
    chars = Chars(["m", ",", " h", "mush", "y", " tenant", "<end>", "ushy", " "])
    copying = CopyState(SOURCE, chars.decode)
    assert copying.allowed(0)  # "m" may still become "mushy"
    copying.feed(0)
    assert not copying.allowed(1)  # but "m," would finish a piece that is no word of the source
    assert not copying.allowed(8)  # and so would "m " (a space ends the word)
    assert not copying.finished
    logits = np.zeros(9, dtype=np.float32)
    assert copying.mask(logits, ends=[6]).tolist() == [7]  # nor may it end there: "ushy" goes on to a word
    copying = CopyState(SOURCE, chars.decode)
    for token in (3, 4, 1, 5):  # "mushy, tenant"
        assert copying.allowed(token)
        copying.feed(token)
    assert copying.finished and 6 in copying.mask(logits, ends=[6]).tolist()


def test_no_piece_is_written_twice() -> None:
    copying, chars, fits = write(["mushy", ",", " hydrogen", ","])
    assert fits == [True] * 4
    assert not copying.allowed(chars.id(" hydrogen"))  # a whole word already listed, refused as it starts
    assert copying.allowed(chars.id(" ten"))
    chars = Chars(["mush", "y", ",", " ", "<end>", "NONE"])
    copying = CopyState(SOURCE, chars.decode, also=("NONE",))
    for token in (0, 1, 2, 3, 0, 1):  # "mushy, mushy": the second is spelled in two tokens
        copying.feed(token)
    assert not copying.allowed(2)  # so it is refused where it would be finished
    assert not copying.finished  # nor may the text end on it
    logits = np.zeros(6, dtype=np.float32)
    assert 4 not in copying.mask(logits, ends=[4]).tolist()
    copying = CopyState(SOURCE, chars.decode, also=("NONE",))
    for token in (5, 2, 3):  # "NONE, "
        copying.feed(token)
    assert not copying.allowed(5)  # NONE once is enough
