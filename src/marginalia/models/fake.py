"""Scripted fakes for tests: a word-level tokenizer and a generator that records requests.

`ScriptedGenerator` is a real `CachingGenerator` (its "cache" is the list of token
ids), so patterns run on it unchanged; it answers from a responder callable and
records every request with the cached prefix it extended.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ..errors import BackendError
from .base import CacheSnapshot, CachingGenerator, GenerationParams, Message, Tokenizer, step_pause

_SPECIAL = re.compile(r"<\|[a-z_]+\|>")
_TOKEN = re.compile(r"\s+|\w+|[^\w\s]", re.UNICODE)


class WordTokenizer(Tokenizer):
    """Whitespace runs, words and single punctuation marks, each one token.

    The vocabulary grows as text is seen, so ids are stable within one instance (and unique across the
    threads that share it: readings side by side).
    """

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.inverse: list[str] = []
        self._growing = threading.Lock()

    def _id(self, piece: str, special: bool = False) -> int:
        key = ("\x00" if special else "") + piece
        found = self.vocab.get(key)
        if found is not None:
            return found
        with self._growing:
            if key not in self.vocab:
                self.inverse.append(piece)  # first: an id is never handed out before `decode` knows it
                self.vocab[key] = len(self.inverse) - 1
            return self.vocab[key]

    def encode_with_offsets(
        self, text: str, allow_special: bool = False
    ) -> tuple[list[int], list[tuple[int, int]]]:
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        pos = 0
        while pos < len(text):
            m = _SPECIAL.match(text, pos) if allow_special else None
            if m:
                ids.append(self._id(m.group(), special=True))
            else:
                m = _TOKEN.match(text, pos)
                if m is None:  # the pattern matches any character
                    raise BackendError(f"the word tokenizer cannot split {text[pos:pos + 20]!r}")
                ids.append(self._id(m.group()))
            offsets.append((pos, m.end()))
            pos = m.end()
        return ids, offsets

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.inverse[i] for i in ids)


@dataclass(frozen=True)
class Request:
    """One generation request as the fake saw it."""

    prefix_ids: tuple[int, ...]
    suffix_ids: tuple[int, ...]
    prefix: str
    suffix: str
    params: GenerationParams

    @property
    def prompt(self) -> str:
        return self.prefix + self.suffix


Responder = Callable[[Request], str]


FAKE_STATE = b"scripted-state:"


class ScriptedGenerator(CachingGenerator):
    """A fake CachingGenerator that answers from a script and records what it was asked.

    Args:
        respond: called with each `Request`; returns the full reply text.
        replies: alternatively, replies returned in order (then ``default``).
        default: the reply when neither gives one.
        context_window: the window it claims, to test overflow handling.
    """

    supports_copy = True  # copy decoding is recorded with each request, not enforced
    supports_choice_probabilities = True

    def __init__(
        self,
        respond: Responder | None = None,
        replies: Sequence[str] = (),
        default: str = "I do not know.",
        context_window: int = 1_000_000,
        name: str = "scripted",
        _shared: ScriptedGenerator | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self.context_window = context_window
        self.respond = respond
        self.replies = list(replies)
        self.default = default
        self.ids: list[int] = []
        self._request_start = 0
        self._tok: WordTokenizer = WordTokenizer() if _shared is None else _shared._tok
        self.requests: list[Request] = [] if _shared is None else _shared.requests
        if _shared is not None:  # a fork: one tokenizer, one request log, one usage
            self.usage = _shared.usage
            self.replies = _shared.replies

    @property
    def tokenizer(self) -> WordTokenizer:
        return self._tok

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        out = "".join(f"<|{m['role']}|>\n{m['content']}<|end|>\n" for m in messages)
        return out + ("<|assistant|>\n" if add_generation_prompt else "")

    @property
    def length(self) -> int:
        return len(self.ids)

    def prefill(self, ids: Sequence[int]) -> None:
        self.check_fits(self.length + len(ids), what="the prefilled context")
        if (pause := step_pause()) is not None:
            pause()
        self.ids.extend(ids)
        self.usage.prefilled_tokens += len(ids)
        self.usage.evaluated(self.ids, len(self.ids) - len(ids), len(self.ids))

    def rollback(self, length: int) -> None:
        self.check_rollback(length)
        del self.ids[length:]

    @property
    def cached_ids(self) -> tuple[int, ...]:
        return tuple(self.ids)

    def drop(self, start: int, end: int) -> None:
        self.check_drop(start, end)
        del self.ids[start:end]

    def snapshot(self) -> CacheSnapshot:
        return CacheSnapshot(tuple(self.ids))

    def restore(self, snapshot: CacheSnapshot) -> None:
        self.ids[:] = snapshot.ids

    def state_bytes(self, snapshot: CacheSnapshot) -> bytes:
        """The fake's "KV state" is its ids, so that storing and loading caches can be tested."""
        return FAKE_STATE + ",".join(map(str, snapshot.ids)).encode()

    def snapshot_from_bytes(self, ids: Sequence[int], data: bytes) -> CacheSnapshot:
        if not data.startswith(FAKE_STATE) or data[len(FAKE_STATE):] != ",".join(map(str, ids)).encode():
            raise BackendError("not a stored scripted cache, or not of these tokens")
        return CacheSnapshot(tuple(ids))

    def fork(self, keep_cache: bool = True) -> ScriptedGenerator:
        other = ScriptedGenerator(
            self.respond, default=self.default, context_window=self.context_window,
            name=self.name, _shared=self,
        )
        if keep_cache:
            other.ids = list(self.ids)
        return other

    def generate_from_cache(
        self, suffix_ids: Sequence[int], params: GenerationParams | None = None,
        commit: bool = False,
    ) -> Iterator[str]:
        self._request_start = self.length
        return super().generate_from_cache(suffix_ids, params, commit)

    def choice_probabilities(self, suffix_ids: Sequence[int], choices: Sequence[str]) -> dict[str, float]:
        self._request_start = self.length
        return super().choice_probabilities(suffix_ids, choices)

    def _next_logits(self, token_ids: Sequence[int]) -> list[float]:
        """The script's reply stands for the model's next token: a number in [0, 1] is the first choice's
        probability (of two); else the choice whose first token the reply starts with is certain."""
        start, decode = self._request_start, self._tok.decode
        request = Request(tuple(self.ids[:start]), tuple(self.ids[start:]), decode(self.ids[:start]),
                          decode(self.ids[start:]), GenerationParams(max_new_tokens=1))
        self.requests.append(request)
        reply = self._reply(request).strip()
        try:
            p = min(max(float(reply), 1e-9), 1 - 1e-9)
        except ValueError:
            first = self._tok.encode(reply)[:1]
            return [0.0 if first == [t] else -50.0 for t in token_ids]
        return [math.log(p), math.log(1 - p)] + [-50.0] * (len(token_ids) - 2)

    def _reply(self, request: Request) -> str:
        if self.respond is not None:
            return self.respond(request)
        if self.replies:
            return self.replies.pop(0)
        return self.default

    def _sample_tokens(self, params: GenerationParams) -> Iterator[int]:
        start = self._request_start
        decode = self._tok.decode
        request = Request(
            prefix_ids=tuple(self.ids[:start]), suffix_ids=tuple(self.ids[start:]),
            prefix=decode(self.ids[:start]), suffix=decode(self.ids[start:]), params=params,
        )
        self.requests.append(request)
        for token in self._tok.encode(self._reply(request)):
            if (pause := step_pause()) is not None:
                pause()
            yield token
            self.ids.append(token)
