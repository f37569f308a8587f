"""The OpenAI-compatible HTTP backend against a stdlib fake server: wire format, retries,
errors, usage, and the patterns (WiM's requests must extend one shared prefix)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from marginalia.errors import BackendError, ContextOverflow, UserError
from marginalia.index.embedders import HashingEmbedder
from marginalia.models import known_specs, load_generator
from marginalia.models.base import GenerationParams
from marginalia.models.fake import ScriptedGenerator, WordTokenizer
from marginalia.models.openai.backend import OpenAIGenerator, from_spec
from marginalia.patterns import make_pattern
from marginalia.patterns.base import Framing
from marginalia.patterns.long_context import LongContext
from marginalia.patterns.wim import WiM
from marginalia.prompts import render
from marginalia.records import MarginJudged
from wim_requests import MARGIN_INTRO

FACT = "The night ferry to Brackwater leaves from pier 47."
QUESTION = "Which pier does the night ferry to Brackwater leave from?"
ANSWER = "The ferry leaves from pier 47."
MARGIN_SPLIT = "\n\nQuestion:"
NOTES_MARK = "Notes taken while reading the document:"
SEGMENT_TOKENS = 100
_PIECE = re.compile(r"\s*\S+\s*|\s+")


# -- the fake server ---------------------------------------------------------------


@dataclass
class Reply:
    """One scripted reply to a POST; ``events`` are raw SSE payloads (None: a generated stream)."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    events: list[str] | None = None
    delay: float = 0.0
    claim_length: int | None = None  # a Content-Length larger than what is sent: a cut connection
    content_type: str = "text/event-stream"


@dataclass
class Seen:
    method: str
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


class FakeServer:
    """An OpenAI-compatible server on 127.0.0.1: it records every request and replies from
    ``script`` first, then streams ``respond(prompt text)`` word by word, with a one-slot
    prefix cache whose hits it reports as ``usage.prompt_tokens_details.cached_tokens``
    (or as llama.cpp's ``timings`` when ``usage_style == "llamacpp"``; token counts without
    cache details when "plain", as llama-cpp-python's server does; none when "none")."""

    def __init__(self) -> None:
        self.tok: WordTokenizer | None = None
        self.respond: Callable[[str], str] = lambda prompt: "Hello there, world."
        self.script: list[Reply] = []
        self.seen: list[Seen] = []
        self.models: list[dict[str, Any]] = [{"id": "tiny", "max_model_len": 1_000_000}, {"id": "other"}]
        self.usage_style = "openai"
        self.honour_stop = True
        self.reported: list[tuple[int, int]] = []  # (prompt_tokens, cached) per generated stream
        self.pace = 0.0  # seconds between the streamed events of a reply (0: all at once)
        self.spans: list[tuple[float, float]] = []  # (received, finished) per answered POST
        #: llama-server's slots: how many (/props; None: no /props), whether it keeps slot files (else a
        #: save is refused), what each slot's file holds; a request's ``id_slot`` picks the slot whose prompt
        #: it is compared with (one slot when it names none)
        self.total_slots: int | None = None
        self.slot_files = False
        self.files: dict[int, list[Any]] = {}
        self.slot_actions: list[tuple[int, str]] = []
        self._held: dict[int, list[Any]] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake.seen.append(Seen("GET", self.path, {}, dict(self.headers)))
                if self.path.endswith("/models"):
                    self._json(200, {"object": "list", "data": fake.models})
                elif self.path == "/props" and fake.total_slots:
                    self._json(200, {"total_slots": fake.total_slots})
                else:
                    self._json(404, {"error": {"message": "no such route"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.startswith("/slots/"):
                    slot, _, action = self.path[len("/slots/"):].partition("?action=")
                    fake.slot_actions.append((int(slot), action))
                    if not fake.slot_files:
                        self._json(501, error("This server does not support slots action. Start it with "
                                              "`--slot-save-path`", type="not_supported_error"))
                        return
                    if action == "save":
                        fake.files[int(slot)] = list(fake._held.get(int(slot), []))
                    elif int(slot) in fake.files:
                        fake._held[int(slot)] = list(fake.files[int(slot)])
                    self._json(200, {"id_slot": int(slot), "filename": body["filename"]})
                    return
                received = time.monotonic()
                fake.seen.append(Seen("POST", self.path, body, dict(self.headers)))
                reply = fake.script.pop(0) if fake.script else Reply()
                time.sleep(reply.delay)
                if reply.status != 200:
                    self._json(reply.status, reply.body, reply.headers)
                    return
                events = reply.events if reply.events is not None else fake.stream(self.path, body)
                payload = "".join(f"data: {e}\n\n" for e in events).encode()
                self.send_response(200)
                self.send_header("Content-Type", reply.content_type)
                if reply.claim_length:
                    self.send_header("Content-Length", str(reply.claim_length))
                self.end_headers()
                # a span ends as its last event is sent: the client may send its next request as soon as it
                # has read it, before this thread gets to run again
                finished = time.monotonic()
                if fake.pace:
                    for k, e in enumerate(events):
                        if k:
                            time.sleep(fake.pace)
                        if k == len(events) - 1:
                            finished = time.monotonic()
                        self.wfile.write(f"data: {e}\n\n".encode())
                        self.wfile.flush()
                else:
                    self.wfile.write(payload)
                fake.spans.append((received, finished))

            def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that gave up (timeout tests) is not a failure here

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.start()
        self.running = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def posts(self) -> list[Seen]:
        return [s for s in self.seen if s.method == "POST"]

    def stop(self) -> None:
        if self.running:
            self.running = False
            self.httpd.shutdown()
            self.httpd.server_close()
            self.thread.join()

    def prompt_text(self, body: dict[str, Any]) -> tuple[str, list[Any]]:
        """The prompt as text, and as the units the prefix cache compares."""
        if "messages" in body:
            text = "".join(m["content"] for m in body["messages"])
            return text, list(text)
        prompt = body["prompt"]
        if isinstance(prompt, list):
            assert self.tok is not None
            return self.tok.decode(prompt), prompt
        return prompt, list(prompt)

    def stream(self, path: str, body: dict[str, Any]) -> list[str]:
        text, units = self.prompt_text(body)
        reply = self.respond(text)
        if self.honour_stop:
            for stop in body.get("stop", []):
                reply = reply.split(stop)[0]
        pieces = _PIECE.findall(reply)[: body["max_tokens"]]
        last = self._held.get(body.get("id_slot", -1), [])
        cached = 0
        while cached < min(len(units), len(last)) and units[cached] == last[cached]:
            cached += 1
        self._held[body.get("id_slot", -1)] = units
        self.reported.append((len(units), cached))
        chat = path.endswith("/chat/completions")
        events = [json.dumps({"choices": [{"index": 0, "finish_reason": None,
                                           **({"delta": {"content": p}} if chat else {"text": p})}]})
                  for p in pieces]
        end: dict[str, Any] = {"choices": [{"index": 0, "finish_reason": "stop",
                                            **({"delta": {}} if chat else {"text": ""})}]}
        if self.usage_style == "llamacpp":
            end["timings"] = {"prompt_n": len(units) - cached, "cache_n": cached}
        events.append(json.dumps(end))
        if self.usage_style in ("openai", "plain") and body.get("stream_options", {}).get("include_usage"):
            usage: dict[str, Any] = {"prompt_tokens": len(units), "completion_tokens": len(pieces)}
            if self.usage_style == "openai":  # "plain": no cache details (llama-cpp-python's server)
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            events.append(json.dumps({"choices": [], "usage": usage}))
        return [*events, "[DONE]"]


@pytest.fixture(autouse=True)
def no_openai_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    yield fake
    fake.stop()


@pytest.fixture
def make_gen(server: FakeServer) -> Callable[..., OpenAIGenerator]:
    """A generator on the fake server, sharing the scripted fake's word tokenizer with it;
    its backoff sleeps are recorded in ``gen.sleeps`` instead of slept."""

    def make(**kw: Any) -> OpenAIGenerator:
        borrowed = ScriptedGenerator()
        server.tok = borrowed.tokenizer
        kw.setdefault("context_window", 1_000_000)
        gen = OpenAIGenerator(server.url, kw.pop("model", "tiny"), borrowed, **kw)
        sleeps: list[float] = []
        gen.sleep = sleeps.append
        gen.sleeps = sleeps  # type: ignore[attr-defined]
        return gen

    return make


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def error(message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"message": message, **extra}}


def chunk(text: str) -> str:
    return json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": None}]})


# -- the wire ----------------------------------------------------------------------


def test_streaming_deltas_concatenate_to_generate(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    gen = make_gen()
    params = GenerationParams(max_new_tokens=20, temperature=0.5, top_p=0.9, stop=("XYZ",), seed=7)
    deltas = list(gen.stream("Say hello", params))
    assert len(deltas) > 1
    assert "".join(deltas) == gen.generate("Say hello", params) == "Hello there, world."
    body = server.posts()[0].body
    assert server.posts()[0].path == "/v1/completions"
    assert body["prompt"] == gen.tokenizer.encode("Say hello")
    assert body["model"] == "tiny" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["stop"], body["seed"]) == (
        20, 0.5, 0.9, ["XYZ"], 7)
    assert "logit_bias" not in body and "Authorization" not in server.posts()[0].headers


def test_text_prompts_and_client_side_stop(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    server.respond = lambda prompt: "one two\n\nthree"
    server.honour_stop = False
    gen = make_gen(token_prompts=False)
    assert gen.generate("Count", GenerationParams(stop=("\n\n",))) == "one two"
    assert server.posts()[0].body["prompt"] == "Count"


def test_chat_mode_sends_the_messages_back(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    gen = make_gen(mode="chat")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi\nthere"}]
    assert gen.generate(messages) == "Hello there, world."
    seen = server.posts()[0]
    assert seen.path == "/v1/chat/completions" and seen.body["messages"] == messages
    assert gen.messages_of(gen.tokenizer.encode("no frame here")) == [
        {"role": "user", "content": "no frame here"}]
    lone = gen.encode_chat([{"role": "user", "content": "alone"}])
    assert gen.messages_of(lone) == [{"role": "user", "content": "alone"}]


def test_api_key_from_argument_or_environment(server: FakeServer, make_gen: Callable[..., Any],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "from-openai")
    make_gen().generate("a")
    monkeypatch.setenv("MARGINALIA_API_KEY", "from-marginalia")
    make_gen().generate("b")
    make_gen(api_key="explicit").generate("c")
    assert [s.headers.get("Authorization") for s in server.posts()] == [
        "Bearer from-openai", "Bearer from-marginalia", "Bearer explicit"]


def test_timeouts_are_configurable(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    gen = make_gen()
    assert (gen.client.timeout.connect, gen.client.timeout.read) == (10.0, 120.0)
    gen = make_gen(connect_timeout=1.5, read_timeout=0.2)
    assert (gen.client.timeout.connect, gen.client.timeout.read) == (1.5, 0.2)
    server.script = [Reply(delay=1.0)]
    with pytest.raises(BackendError, match=r"sent nothing for 0.2 s; give it more time with ';timeout=<seconds>'"):
        gen.generate("slow")
    assert gen.sleeps == []  # a slow server is not retried


# -- the cache over HTTP ----------------------------------------------------------


def test_prefill_sends_nothing_and_generation_sends_prefix_plus_suffix(
        server: FakeServer, make_gen: Callable[..., Any]) -> None:
    gen = make_gen()
    tok = gen.tokenizer
    prefix, suffix = tok.encode("A long shared prefix."), tok.encode(" Question one?")
    gen.prefill(prefix)
    assert server.posts() == [] and gen.length == len(prefix)
    assert "".join(gen.generate_from_cache(suffix)) == "Hello there, world."
    assert server.posts()[0].body["prompt"] == prefix + suffix
    assert gen.length == len(prefix)  # rolled back
    list(gen.generate_from_cache(suffix, commit=True))
    assert gen.length == len(prefix) + len(suffix) + len(tok.encode("Hello there, world."))
    other = gen.fork(keep_cache=False)
    assert other.length == 0 and other.usage is gen.usage and other.client is gen.client
    list(gen.stream_prompt(suffix, GenerationParams()))
    assert server.posts()[-1].body["prompt"] == suffix and gen.length > len(prefix)
    gen.rollback(3)
    assert gen.length == 3
    with pytest.raises(BackendError, match="cannot roll back to 4 tokens: the cache holds 3"):
        gen.rollback(4)


def test_usage_counts_what_the_server_reports(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    gen = make_gen()
    tok = gen.tokenizer
    gen.prefill(tok.encode("A shared prefix of several words."))
    for q in (" First question?", " Second question?", " Third?"):
        list(gen.generate_from_cache(tok.encode(q)))
    sent = [len(s.body["prompt"]) for s in server.posts()]
    assert [p for p, _ in server.reported] == sent
    cached = [c for _, c in server.reported]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])
    u = gen.usage
    assert u.requests == 3 and u.prompt_tokens_sent == sum(sent)
    assert u.prompt_tokens_cached == sum(cached) and u.cache_unreported == 0
    assert u.prefilled_tokens == sum(sent) - sum(cached)
    assert u.generated_tokens == 3 * len(tok.encode("Hello there, world."))


@pytest.mark.parametrize("style", ["llamacpp", "plain", "none"])
def test_usage_from_llamacpp_timings_or_unknown(
        server: FakeServer, make_gen: Callable[..., Any], style: str) -> None:
    server.usage_style = style
    gen = make_gen()
    gen.prefill(gen.tokenizer.encode("Shared words here."))
    for q in (" one", " two"):
        list(gen.generate_from_cache(gen.tokenizer.encode(q)))
    sent = sum(p for p, _ in server.reported)
    assert gen.usage.prompt_tokens_sent == sent
    if style == "llamacpp":
        cached = sum(c for _, c in server.reported)
        assert cached > 0 and gen.usage.prompt_tokens_cached == cached
        assert gen.usage.prefilled_tokens == sent - cached and gen.usage.cache_unreported == 0
    else:  # a bare prompt_tokens, or nothing: what the server computed is unknown, and counted nowhere
        assert gen.usage.cache_unreported == 2
        assert gen.usage.prompt_tokens_cached == 0 and gen.usage.prefilled_tokens == 0


def test_context_window_from_the_server(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    server.models = [{"id": "tiny", "max_model_len": 8192}]
    assert make_gen(context_window=None).context_window == 8192
    server.models = [{"id": "gguf-model", "meta": {"n_ctx_train": 2048}}]  # llama.cpp: one entry
    assert make_gen(context_window=None).context_window == 2048
    server.models = [{"id": "a"}, {"id": "b"}]
    assert make_gen(context_window=None).context_window == 4096
    assert make_gen(context_window=300).context_window == 300
    assert len([s for s in server.seen if s.method == "GET"]) == 3  # asked once per generator, never when given
    server.models = [{"id": "tiny", "max_model_len": "lots"}]
    gen = make_gen(context_window=None)
    with pytest.raises(BackendError, match=r"/models is malformed: field data\.0\.max_model_len"):
        _ = gen.context_window
    assert gen.list_models() == []  # where the listing is only a hint, a bad one is none


# -- retries -------------------------------------------------------------------------


def test_429_once_then_success_respects_retry_after(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    server.script = [Reply(429, error("slow down"), {"Retry-After": "0.25"})]
    gen = make_gen()
    assert gen.generate("hi") == "Hello there, world."
    assert len(server.posts()) == 2 and gen.sleeps == [0.25]


def test_500_twice_then_success_backs_off(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    server.script = [Reply(500, error("boom")), Reply(503, error("loading"))]
    gen = make_gen()
    assert gen.generate("hi") == "Hello there, world."
    assert len(server.posts()) == 3 and gen.sleeps == [0.5, 1.0]


def test_retries_give_up_after_three(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    server.script = [Reply(500, error("boom"))] * 5
    gen = make_gen()
    with pytest.raises(BackendError, match="HTTP 500 after 4 attempt.*boom"):
        gen.generate("hi")
    assert len(server.posts()) == 4 and gen.sleeps == [0.5, 1.0, 2.0]


def test_a_long_retry_after_is_an_error_not_a_hang(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    server.script = [Reply(429, error("quota"), {"Retry-After": "3600"}),
                     Reply(503, error("loading"), {"Retry-After": "Wed, 21 Oct 2099 07:28:00 GMT"})]
    gen = make_gen()
    with pytest.raises(BackendError, match="busy.*try again later"):
        gen.generate("hi")
    with pytest.raises(BackendError, match="HTTP 503 after 1 attempt.*loading"):
        gen.generate("hi")
    assert len(server.posts()) == 2 and gen.sleeps == []


def test_retry_after_as_a_date(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    server.script = [Reply(503, error("loading"), {"Retry-After": "Mon, 01 Jan 2001 00:00:00 GMT"}),
                     Reply(503, error("loading"), {"Retry-After": "soon"})]
    gen = make_gen()
    assert gen.generate("hi") == "Hello there, world."
    assert gen.sleeps == [0.0, 1.0]  # a date past is no wait; an unreadable header keeps the schedule


@pytest.mark.parametrize("events", [
    [chunk("Hello"), chunk(" world")],                      # ends without [DONE]
    [chunk("Hello"), chunk(" world"), "{not json"],          # a malformed chunk
    [chunk("Hello"), chunk(" world"), "[DONE]"],            # [DONE] but never a finish_reason
])
def test_no_retry_once_text_has_streamed(server: FakeServer, make_gen: Callable[..., Any],
                                         events: list[str]) -> None:
    server.script = [Reply(events=events)]
    gen = make_gen()
    got: list[str] = []
    with pytest.raises(BackendError) as info:
        for delta in gen.stream("hi"):
            got.append(delta)
    assert "".join(got) == "Hello world"  # what the consumer already has stays with it
    assert "after 11 characters" in str(info.value)
    assert ("malformed" if "{not json" in events else "cut off") in str(info.value)
    if events[-1] == "[DONE]":  # what llama-cpp-python's server sends when another request interrupts
        assert "--interrupt_requests false" in str(info.value)
    assert len(server.posts()) == 1 and gen.sleeps == []


def test_a_connection_cut_mid_body_and_an_error_event(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    server.script = [Reply(events=[chunk("Hel")], claim_length=10_000),
                     Reply(events=[chunk("Hi"), json.dumps(error("out of memory"))])]
    gen = make_gen()
    with pytest.raises(BackendError, match="cut off after 3 characters"):
        gen.generate("hi")
    with pytest.raises(BackendError, match="failed after 2 characters: out of memory"):
        gen.generate("hi")
    assert len(server.posts()) == 2


def test_replies_are_validated_naming_the_field(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    bad_text = json.dumps({"choices": [{"index": 0, "text": {"oops": 1}, "finish_reason": None}]})
    bad_usage = json.dumps({"choices": [], "usage": {"prompt_tokens": "many"}})
    server.script = [Reply(events=[chunk("Hi"), bad_text]), Reply(events=[chunk("Hi"), bad_usage]),
                     Reply(events=["[1, 2]"]), Reply(events=[json.dumps({"choices": [{"text": "x"}]})],
                                                     content_type="application/json")]
    gen = make_gen()
    with pytest.raises(BackendError, match=r"malformed after 2 characters: field choices\.0\.text: "
                                           r"Input should be a valid string, got \{'oops': 1\}"):
        gen.generate("hi")
    with pytest.raises(BackendError, match=r"malformed .* field usage\.prompt_tokens: .*got 'many'"):
        gen.generate("hi")
    with pytest.raises(BackendError, match=r"malformed after 0 characters: '\[1, 2\]' is not a JSON object"):
        gen.generate("hi")
    with pytest.raises(BackendError, match="malformed after 0 characters: .*text/event-stream.*application/json"):
        gen.generate("hi")
    assert len(server.posts()) == 4 and gen.sleeps == []


def test_replies_may_leave_out_what_servers_leave_out(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}], "usage": None}
    words = [{"id": "x", "choices": [{"delta": {"content": w}, "logprobs": None, "finish_reason": None}],
              "usage": None, "system_fingerprint": "fp"} for w in ("Hi", " there")]
    end = {"choices": [{"delta": {}, "finish_reason": "stop"}], "timings": {"prompt_n": 3, "predicted_n": 2}}
    server.script = [Reply(events=[json.dumps(e) for e in (role, *words, end)] + ["[DONE]"])]
    gen = make_gen(mode="chat")
    assert gen.generate("hi") == "Hi there"
    assert (gen.usage.prefilled_tokens, gen.usage.prompt_tokens_cached, gen.usage.cache_unreported) == (3, 0, 0)


@pytest.mark.parametrize("body, message", [
    ({"object": "error", "message": "bad top_k", "type": "BadRequestError", "code": 400}, "bad top_k"),  # vLLM
    ({"detail": [{"loc": ["body", "top_k"], "msg": "not an int"}]}, "not an int"),  # FastAPI
    ({"error": "plain words"}, "plain words"),
    ({"error": {"message": 42}}, '"message": 42'),  # an error body of no known shape: its text
])
def test_error_bodies_of_every_shape(server: FakeServer, make_gen: Callable[..., Any], body: Any,
                                     message: str) -> None:
    server.script = [Reply(422, body)]
    with pytest.raises(BackendError, match=f"HTTP 422 after 1 attempt.*{re.escape(message)}"):
        make_gen().generate("hi")


def test_connection_refused() -> None:
    url = closed_port_url()
    gen = OpenAIGenerator(url, "tiny", WordTokenizer(), context_window=1000)
    sleeps: list[float] = []
    gen.sleep = sleeps.append
    with pytest.raises(BackendError, match=f"cannot reach the model server at {re.escape(url)}: is it running"):
        gen.generate("hi")
    assert sleeps == [0.5, 1.0, 2.0]
    with pytest.raises(BackendError, match="llama-server"):
        _ = OpenAIGenerator(url, "tiny", WordTokenizer()).context_window


# -- errors ----------------------------------------------------------------------------


def test_401_is_about_the_api_key(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    server.script = [Reply(401, error("invalid api key"))]
    with pytest.raises(UserError) as info:
        make_gen().generate("hi")
    assert not isinstance(info.value, ContextOverflow)
    assert "MARGINALIA_API_KEY" in str(info.value) and "OPENAI_API_KEY" in str(info.value)
    assert len(server.posts()) == 1


@pytest.mark.parametrize("reply", [
    Reply(404, error("model 'nope' not found")),
    Reply(400, error("The model `nope` does not exist.")),
])
def test_unknown_model_lists_the_served_ones(server: FakeServer, make_gen: Callable[..., Any], reply: Reply) -> None:
    server.script = [reply]
    with pytest.raises(UserError, match=r"does not know the model 'nope'.*it serves: tiny, other"):
        make_gen(model="nope").generate("hi")


@pytest.mark.parametrize("body", [
    error("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
          "(4900 in the messages, 100 in the completion)."),
    error("the request exceeds the available context size, try increasing it",
          type="exceed_context_size_error", n_prompt_tokens=5000, n_ctx=4096),
])
def test_context_errors_carry_both_numbers(server: FakeServer, make_gen: Callable[..., Any], body: Any) -> None:
    server.script = [Reply(400, body)]
    with pytest.raises(ContextOverflow) as info:
        make_gen().generate("hi")
    assert (info.value.needed, info.value.window) == (5000, 4096)


def test_context_error_without_numbers_and_other_400s(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    server.script = [Reply(400, error("input is longer than the context")), Reply(400, error("bad top_p"))]
    gen = make_gen()
    with pytest.raises(BackendError, match="too long: input is longer than the context"):
        gen.generate("hi")
    with pytest.raises(BackendError, match="HTTP 400 after 1 attempt.*bad top_p"):
        gen.generate("hi")


# -- the spec ------------------------------------------------------------------------


def test_spec_string(server: FakeServer) -> None:
    gen = load_generator(f"openai:{server.url}#tiny;tokenizer=scripted:x;window=1000;mode=chat")
    assert isinstance(gen, OpenAIGenerator)
    assert (gen.base_url, gen.model, gen.mode, gen.context_window) == (server.url, "tiny", "chat", 1000)
    assert isinstance(gen.tokenizer, WordTokenizer) and gen.name.startswith("openai:http")
    server.tok = gen.tokenizer
    assert gen.generate("hi") == "Hello there, world."
    default = load_generator(f"openai:{server.url}#scripted:x")  # the model id doubles as the tokenizer spec
    assert isinstance(default, OpenAIGenerator) and default.mode == "completions"
    assert default.concurrency == 1
    assert load_generator(f"openai:{server.url}#scripted:x;concurrency=4").concurrency == 4
    assert default.read_timeout == 120
    assert load_generator(f"openai:{server.url}#scripted:x;timeout=600").read_timeout == 600
    assert any(form == "openai:<arg>" for form, _ in known_specs())


def test_spec_extra_body_fields_and_text_prompts(server: FakeServer) -> None:
    gen = load_generator(f"openai:{server.url}#tiny;tokenizer=scripted:x;prompt=text"
                         ";x-repeat_penalty=1;x-cache_prompt=true;x-slot=a1")
    server.tok = gen.tokenizer
    gen.generate("hi")
    body = [s.body for s in server.seen if s.method == "POST"][-1]
    assert body["repeat_penalty"] == 1 and body["cache_prompt"] is True and body["slot"] == "a1"
    assert body["prompt"] == "hi"  # text, not token ids


@pytest.mark.parametrize("rest, match", [
    ("http://h/v1", "needs a model id after '#'"),
    ("http://h/v1#m;tokenizer=scripted:x;prompt=bytes", "must be 'tokens' or 'text'"),
    ("http://h/v1#m;tokenizer=scripted:x;mode=fast", "unknown mode 'fast'"),
    ("http://h/v1#m;tokenizer=scripted:x;window=lots", "positive number of tokens"),
    ("http://h/v1#m;tokenizer=scripted:x;colour=red", "bad option 'colour=red'"),
    ("http://h/v1#m;tokenizer=scripted:x;concurrency=0", "positive number of requests"),
    ("http://h/v1#m;tokenizer=scripted:x;timeout=soon", "positive number of seconds"),
    ("http://h/v1#m;tokenizer=scripted:x;timeout=0", "positive number of seconds"),
    ("ftp://h/v1#m;tokenizer=scripted:x", "must start with http"),
    ("http://h/v1#gpt-4o", "cannot load the tokenizer 'gpt-4o'.*tokenizer=<spec>"),
])
def test_bad_specs(rest: str, match: str) -> None:
    with pytest.raises(UserError, match=match):
        load_generator(f"openai:{rest}")


def test_hf_tokenizer_folder_loads_no_weights(server: FakeServer, tiny_parts: Any, tmp_path: Path) -> None:
    _, tok = tiny_parts
    tok.save_pretrained(tmp_path / "tok")
    gen = from_spec(f"{server.url}#tiny;tokenizer=hf:{tmp_path / 'tok'};window=512", load=pytest.fail)
    assert gen.tokenizer.encode("The harbour opens") == tok("The harbour opens", add_special_tokens=False)["input_ids"]
    assert gen.chat_frame("S").tail == "<|im_end|>\n<|im_start|>assistant\n"


def test_import_marginalia_does_not_import_httpx() -> None:
    probe = ("import sys, marginalia, marginalia.models, marginalia.models.registry, marginalia.patterns; "
             "print('httpx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False"


# -- the patterns against the fake server ------------------------------------------------


def reader() -> Callable[[str], str]:
    """Replies like a perfect small model: a margin copies the fact when the text read since
    the previous margin holds it; the answer uses the notes (or, without notes, the prompt)."""
    seen = [0]

    def respond(prompt: str) -> str:
        if NOTES_MARK in prompt:
            return ANSWER if "pier 47" in prompt.split(NOTES_MARK)[1] else "I do not know."
        if MARGIN_INTRO in prompt:
            read = prompt.rsplit(MARGIN_SPLIT, 1)[0]
            latest, seen[0] = read[seen[0]:], len(read)
            return FACT if FACT in latest else "NONE"
        return ANSWER if FACT in prompt else "I do not know."

    return respond


@pytest.fixture
def doc(make_haystack: Callable[..., str]) -> str:
    return make_haystack(40, FACT, 0.6)


def test_wim_requests_extend_one_shared_prefix(server: FakeServer, make_gen: Callable[..., Any], doc: str) -> None:
    server.respond = reader()
    gen = make_gen()
    pattern = WiM(gen, segment_tokens=SEGMENT_TOKENS)
    answer = pattern.answer(doc, QUESTION)
    assert answer.text == ANSWER and [m.text for m in answer.margins if m.relevant] == [FACT]

    framing = pattern.framing()
    suffix = framing.suffix(gen, "margin", question=QUESTION)
    prompts = [s.body["prompt"] for s in server.posts()]
    margins, final = prompts[:-1], prompts[-1]
    assert len(margins) == len(pattern.segments(doc))
    assert margins[0][:len(framing.head)] == framing.head
    previous: list[int] = []
    for prompt in margins:
        assert prompt[-len(suffix):] == suffix
        base = prompt[:-len(suffix)]
        assert base[:len(previous)] == previous and len(base) > len(previous)
        previous = base
    assert final[:len(previous)] == previous and NOTES_MARK in gen.tokenizer.decode(final)

    # the server's prefix cache did the reuse: each request found the previous one's prefix
    cached = [c for _, c in server.reported]
    assert all(c >= len(p[:-len(suffix)]) for c, p in zip(cached[1:], margins, strict=True))
    assert gen.usage.prompt_tokens_cached == sum(cached)
    assert gen.usage.prefilled_tokens == gen.usage.prompt_tokens_sent - sum(cached)
    assert gen.usage.prefilled_tokens < gen.usage.prompt_tokens_sent / 3


def test_wim_in_chat_mode_extends_the_user_text(server: FakeServer, make_gen: Callable[..., Any], doc: str) -> None:
    server.respond = reader()
    gen = make_gen(mode="chat")
    answer = WiM(gen, segment_tokens=SEGMENT_TOKENS).answer(doc, QUESTION)
    assert answer.text == ANSWER
    bodies = [s.body["messages"] for s in server.posts()]
    assert all(m[0] == {"role": "system", "content": render("system").strip()} for m in bodies)
    margin_text = render("margin", question=QUESTION)
    previous = ""
    for messages in bodies[:-1]:
        user = messages[1]["content"]
        assert user.endswith(margin_text) and user.startswith(previous)
        previous = user[:-len(margin_text)]
    assert bodies[-1][1]["content"].startswith(previous)


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_server_that_dies_mid_run(server: FakeServer, make_gen: Callable[..., Any], doc: str,
                                    concurrency: int) -> None:
    server.respond = reader()
    server.pace = 0.01
    gen = make_gen(concurrency=concurrency)
    events: list[Any] = []
    with pytest.raises(BackendError, match="cannot reach the model server"):
        for event in WiM(gen, segment_tokens=SEGMENT_TOKENS).run(doc, QUESTION):
            events.append(event)
            if isinstance(event, MarginJudged) and event.margin.segment_index == 1:
                server.stop()
    judged = [e.margin.segment_index for e in events if isinstance(e, MarginJudged)]
    assert judged[:2] == [0, 1] and judged == list(range(len(judged)))  # kept, in reading order
    if concurrency == 1:  # nothing was in flight when the server stopped
        assert judged == [0, 1] and len(server.posts()) == 2 and gen.sleeps == [0.5, 1.0, 2.0]


def in_flight(spans: list[tuple[float, float]]) -> int:
    """The most requests a server was answering at one moment."""
    return max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)


def test_wim_pipelines_margin_requests_when_the_server_allows(
        server: FakeServer, make_gen: Callable[..., Any], doc: str) -> None:
    server.respond = reader()
    server.pace = 0.01
    one = make_gen()
    sequential = WiM(one, segment_tokens=SEGMENT_TOKENS).answer(doc, QUESTION)
    requests = [s.body["prompt"] for s in server.posts()]
    assert in_flight(server.spans) == 1
    server.seen.clear()
    server.spans.clear()
    server.respond = reader()
    gen = make_gen(concurrency=3)
    events = list(WiM(gen, segment_tokens=SEGMENT_TOKENS).run(doc, QUESTION))
    answer = events[-1].answer
    # the same requests in the same order, hence the same margins and answer
    assert [s.body["prompt"] for s in server.posts()] == requests
    assert answer.text == sequential.text == ANSWER
    assert [(m.text, m.relevant) for m in answer.margins] == [(m.text, m.relevant) for m in sequential.margins]
    # but margin requests overlapped, never more than three at once
    assert 2 <= in_flight(server.spans) <= 3
    # events still come in reading order, each margin after its segment
    judged = [e.margin.segment_index for e in events if isinstance(e, MarginJudged)]
    assert judged == list(range(len(judged))) == [m.segment_index for m in answer.margins]
    order = [(type(e).__name__, getattr(e, "segment", None) or getattr(e, "segment_index", None)) for e in events]
    for i in judged:
        read_at = next(k for k, (name, seg) in enumerate(order) if name == "SegmentRead" and seg.index == i)
        written_at = next(k for k, (name, seg) in enumerate(order) if name == "MarginWritten" and seg == i)
        assert read_at < written_at
    # every thread's requests are in the account
    assert gen.usage.requests == len(requests) == one.usage.requests
    assert gen.usage.generated_tokens == one.usage.generated_tokens
    assert answer.stats.generated_margin_tokens == sequential.stats.generated_margin_tokens > 0


def test_wim_sends_a_reading_one_request_at_a_time_to_a_server_with_a_prompt_per_slot(
        server: FakeServer, make_gen: Callable[..., Any], doc: str) -> None:
    server.respond = reader()
    server.pace = 0.01
    server.models = [{"id": "tiny", "object": "model", "owned_by": "llamacpp", "meta": {"n_ctx_train": 8192}}]
    gen = make_gen(concurrency=3)
    assert not gen.shares_prefixes
    answer = WiM(gen, segment_tokens=SEGMENT_TOKENS).answer(doc, QUESTION)
    assert answer.text == ANSWER
    assert in_flight(server.spans) == 1  # each request finds the one before it in the slot that read it
    assert [s.path for s in server.seen if s.method == "GET"] == ["/v1/models", "/props"]  # asked once
    assert all("id_slot" not in s.body for s in server.posts())  # a server that says no number of slots
    # a server that shares its prefix cache across requests, or one that says nothing of itself: side by side
    server.models = [{"id": "tiny", "owned_by": "vllm"}]
    assert make_gen(concurrency=3).shares_prefixes
    server.models = []
    assert make_gen(concurrency=3).shares_prefixes
    assert not make_gen(concurrency=3, shares_prefixes=False).shares_prefixes


@pytest.mark.parametrize("files", [True, False])
def test_a_reading_on_llama_server_keeps_its_slot_and_a_second_question_its_file(
        server: FakeServer, make_gen: Callable[..., Any], doc: str, files: bool) -> None:
    server.respond = reader()
    server.models = [{"id": "tiny", "object": "model", "owned_by": "llamacpp"}]
    server.total_slots, server.slot_files = 4, files
    gen = make_gen(concurrency=4)
    reading = WiM(gen, segment_tokens=SEGMENT_TOKENS).reader(doc)
    first = reading.answer(QUESTION)
    assert first.text == ANSWER
    assert first.stats.prefilled_context_tokens == first.stats.context_tokens  # read once, in one slot
    assert server.slot_actions == [(0, "save")]  # the full reading's slot, once it had read it all
    server.respond = reader()
    second = reading.answer(QUESTION)
    assert second.text == ANSWER
    assert {s.body.get("id_slot") for s in server.posts()} == {0}  # every request of the reading
    restores = [a for a in server.slot_actions if a[1] == "restore"]
    if files:  # each margin request and the answer found the reading in the slot put back from its file
        assert second.stats.prefilled_context_tokens == 0
        assert restores == [(0, "restore")] * (len(reading.segments) - 1)  # the first is still in the slot
    else:  # refused once: the slot keeps only the last prompt, and the document is read again
        assert restores == [] and server.slot_actions == [(0, "save")]
        assert second.stats.prefilled_context_tokens > 0.8 * second.stats.context_tokens


def test_lc_and_rag(server: FakeServer, make_gen: Callable[..., Any], doc: str) -> None:
    server.respond = reader()
    gen = make_gen()
    assert LongContext(gen).answer(doc, QUESTION).text == ANSWER
    framing = Framing.build(gen)
    expected = framing.head + gen.tokenizer.encode(doc) + framing.suffix(gen, "answer", question=QUESTION)
    assert server.posts()[0].body["prompt"] == expected
    rag = make_pattern("rag", gen, embedder=HashingEmbedder(), chunk_tokens=60, top_k=3)
    answer = rag.answer(doc, QUESTION)
    assert answer.text == ANSWER and any(FACT in r.text for r in answer.references)
    assert len(server.posts()) == 2 and FACT in gen.tokenizer.decode(server.posts()[1].body["prompt"])


def test_wim_over_http_counts_the_context_the_server_evaluated(server: FakeServer, make_gen: Callable[..., Any],
                                                               doc: str) -> None:
    server.respond = reader()
    answer = WiM(make_gen(), segment_tokens=SEGMENT_TOKENS).answer(doc, QUESTION)
    # the server reported its cache hits: each context token was evaluated once, by its account
    assert answer.stats.prefilled_context_tokens == answer.stats.context_tokens
    assert answer.stats.reprefilled_context_tokens == 0
    assert answer.stats.prompt_tokens_cached is not None and answer.stats.prompt_tokens_cached > 0
    # a server that says nothing of its cache: what it evaluated is unknown, not a count of re-reads
    server.usage_style = "plain"
    server.respond = reader()
    blind = WiM(make_gen(), segment_tokens=SEGMENT_TOKENS).answer(doc, QUESTION)
    assert blind.text == answer.text
    assert blind.stats.prompt_cache_unreported == len(server.posts()) // 2
    assert blind.stats.prompt_tokens_sent == answer.stats.prompt_tokens_sent
    s = blind.stats
    assert (s.prefilled_context_tokens, s.reprefilled_context_tokens, s.prefilled_other_tokens,
            s.prompt_tokens_cached) == (None, None, None, None)
    assert blind.to_dict()["stats"]["reprefilled_context_tokens"] is None


def test_a_loop_guard_is_refused_not_ignored(server: FakeServer, make_gen: Callable[..., Any]) -> None:
    gen = make_gen()
    with pytest.raises(UserError, match="no run of tokens twice"):
        gen.generate("The harbour", GenerationParams(max_new_tokens=4, no_repeat_ngram=3))
    assert server.posts() == []
