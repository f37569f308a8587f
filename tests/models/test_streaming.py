"""StopScanner and streaming: stream and generate agree; stop strings end the text and are cut off."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marginalia.models.base import GenerationParams, StopScanner
from marginalia.models.fake import ScriptedGenerator


def expected_stop(text: str, stops: list[str], cuts: list[int]) -> str:
    """Oracle: feed ``text`` growing to each cut; at the first prefix that holds a stop string,
    the output is that prefix up to the earliest stop string in it."""
    stops = [s for s in stops if s]
    for cut in cuts:
        prefix = text[:cut]
        found = [prefix.find(s) for s in stops if s in prefix]
        if found:
            return prefix[:min(found)]
    return text


def scan(text: str, stops: list[str], cuts: list[int]) -> tuple[list[str], bool]:
    scanner = StopScanner(stops)
    deltas = []
    for cut in cuts:
        delta = scanner.feed(text[:cut])
        if delta:
            deltas.append(delta)
        if scanner.stopped:
            break
    tail = scanner.flush()
    if tail:
        deltas.append(tail)
    return deltas, scanner.stopped


@st.composite
def stream_case(draw: Any) -> tuple[str, list[str], list[int]]:
    alphabet = st.sampled_from(list("ab \n.\u00fc\U0001f600"))
    text = draw(st.text(alphabet, max_size=40))
    stops = draw(st.lists(st.text(alphabet, min_size=0, max_size=4), max_size=3))
    inner = draw(st.lists(st.integers(0, len(text)), max_size=len(text) + 1))
    cuts = sorted(set(inner)) + [len(text)]
    return text, stops, cuts


@settings(max_examples=400, deadline=None)
@given(stream_case())
def test_stop_scanner_matches_oracle(case: tuple[str, list[str], list[int]]) -> None:
    text, stops, cuts = case
    deltas, stopped = scan(text, stops, cuts)
    assert "".join(deltas) == expected_stop(text, stops, cuts)
    assert stopped == any(s and s in text[:c] for c in cuts for s in stops)


def test_stop_scanner_holds_back_a_possible_stop() -> None:
    scanner = StopScanner(["\n\n"])
    assert scanner.feed("Hello") == "Hello"
    assert scanner.feed("Hello\n") == ""          # might be the start of "\n\n"
    assert scanner.feed("Hello\nworld") == "\nworld"
    assert scanner.feed("Hello\nworld\n\nmore") == ""
    assert scanner.stopped and scanner.flush() == ""


def test_stop_scanner_flushes_an_unfinished_stop() -> None:
    scanner = StopScanner(["END"])
    assert scanner.feed("the EN") == "the "
    assert scanner.flush() == "EN"


def test_stop_scanner_waits_for_incomplete_utf8() -> None:
    scanner = StopScanner([])
    assert scanner.feed("caf\ufffd") == "caf"     # a split multi-byte character decodes to U+FFFD
    assert scanner.feed("caf\u00e9") == "\u00e9"
    assert scanner.feed("caf\u00e9\ufffd") == ""
    assert scanner.flush() == "\ufffd"          # a real replacement character still comes out


# -- the fake ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply, stop, expected",
    [
        ("Pier 47.\n\nSecond paragraph.", ("\n\n",), "Pier 47."),
        ("Pier 47. STOP here", ("STOP",), "Pier 47. "),
        ("no stop at all", ("\n\n",), "no stop at all"),
        ("a b c d e f", (), "a b c d e f"),
    ],
)
def test_fake_generate_equals_stream(reply: str, stop: tuple[str, ...], expected: str) -> None:
    params = GenerationParams(stop=stop)
    gen = ScriptedGenerator(default=reply)
    streamed = list(gen.stream("question?", params))
    assert "".join(streamed) == expected
    assert gen.generate("question?", params) == expected
    assert len(streamed) > 1 or len(expected.split()) <= 1  # it really streams, delta by delta


def test_fake_respects_max_new_tokens() -> None:
    gen = ScriptedGenerator(default="one two three four five")
    assert gen.generate("q", GenerationParams(max_new_tokens=3)) == "one two"  # 'one',' ','two'
    assert gen.usage.generated_tokens == 3


# -- the tiny Llama -------------------------------------------------------------------


def greedy_oracle(model: Any, tok: Any, prompt_ids: list[int], n: int) -> list[int]:
    """Greedy decoding with a full forward pass per step (no cache at all)."""
    import torch

    ids = list(prompt_ids)
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            token = int(torch.argmax(logits))
            if token == tok.eos_token_id:
                break
            out.append(token)
            ids.append(token)
    return out


def test_tiny_llama_stream_equals_generate_and_oracle(
    make_tiny: Callable[..., Any], tiny_parts: tuple[Any, Any]
) -> None:
    model, tok = tiny_parts
    prompt = "The harbour opens at dawn."
    gen = make_tiny()
    params = GenerationParams(max_new_tokens=24)
    streamed = list(gen.stream(prompt, params))
    text = "".join(streamed)
    assert text == make_tiny().generate(prompt, params)
    oracle = greedy_oracle(model, tok, gen.tokenizer.encode(prompt), 24)
    assert text == gen.tokenizer.decode(oracle)
    assert len(text) > 0 and gen.length == 0  # stateless: the main cache was not touched


def test_tiny_llama_stop_string_is_excluded(make_tiny: Callable[..., Any]) -> None:
    prompt = "Rain fell on the market square."
    full = make_tiny().generate(prompt, GenerationParams(max_new_tokens=40))
    # a plain ASCII stop string taken from the middle of the unconstrained output
    at = next(i for i in range(3, len(full) - 2) if full[i:i + 2].isascii()
              and full[i:i + 2].isprintable() and full.find(full[i:i + 2]) == i)
    stop = full[at:at + 2]
    params = GenerationParams(max_new_tokens=40, stop=(stop,))
    gen = make_tiny()
    streamed = "".join(gen.stream(prompt, params))
    assert streamed == full[:at]
    assert stop not in streamed
    assert make_tiny().generate(prompt, params) == streamed
