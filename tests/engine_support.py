"""A fake serving engine for the tests: an OpenAI-compatible server on 127.0.0.1 that answers requests side by
side with one prefix cache shared by all of them, as vLLM does, and can hold requests back until requests for
several readings have arrived (to show that readings run at once, with a deadline so that a test of code that
runs them one at a time fails instead of hanging)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from marginalia.models.fake import WordTokenizer

_PIECE = re.compile(r"\s*\S+\s*|\s+")


class Engine:
    """The fake engine (a context manager that stops it).

    Args:
        tok: the tokenizer the client's generator borrows (prompts come as its token ids).
        respond: the whole reply to a prompt's text.
        owned_by: what ``GET /models`` says owns the model (``vllm``: a prefix cache shared across requests;
            ``llamacpp``: llama.cpp's llama-server, a prompt per slot).
        reading_of: which reading a prompt's text belongs to (e.g. its document), for `hold`.
    """

    def __init__(self, tok: WordTokenizer, respond: Callable[[str], str], owned_by: str = "vllm",
                 reading_of: Callable[[str], str] = lambda text: "") -> None:
        self.tok = tok
        self.respond = respond
        self.owned_by = owned_by
        self.reading_of = reading_of
        self.prompts: list[list[int]] = []  # every prompt answered, in order: the prefix cache
        self.requests: Counter[str] = Counter()  # requests answered, by reading
        self._cond = threading.Condition()
        self._in_flight: Counter[str] = Counter()  # requests being answered, by reading
        self._arrived: set[str] = set()
        self._need = 1
        self._deadline = 0.0
        self.most_at_once = 0  # the most readings that had a request in flight (or held) at one moment
        self.gave_up = False  # a held request waited past the deadline
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.endswith("/models"):
                    self._send("application/json", json.dumps(
                        {"object": "list", "data": [{"id": "tiny", "owned_by": engine.owned_by}]}).encode())
                else:
                    self.send_error(404)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                events = engine.answer(body["prompt"], body)
                self._send("text/event-stream", "".join(f"data: {e}\n\n" for e in events).encode())

            def _send(self, kind: str, data: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def hold(self, readings: int, deadline: float = 10.0) -> None:
        """From now on, answer no request until requests of ``readings`` different readings have arrived, or
        until ``deadline`` seconds after it came (then `gave_up`, and nothing is held any more)."""
        with self._cond:
            self._need, self._deadline, self._arrived = readings, deadline, set()

    def answer(self, ids: list[int], body: dict[str, Any]) -> list[str]:
        """The events of the reply to the prompt ``ids``, once it may be answered."""
        text = self.tok.decode(ids)
        reading = self.reading_of(text)
        with self._cond:
            self._arrived.add(reading)
            self._in_flight[reading] += 1
            self.most_at_once = max(self.most_at_once, len(+self._in_flight))
            self._cond.notify_all()
            until = time.monotonic() + self._deadline
            while len(self._arrived) < self._need and not self.gave_up:
                if not self._cond.wait(max(0.0, until - time.monotonic())):
                    self.gave_up = True
                    self._cond.notify_all()
            cached = max((_common(ids, p) for p in self.prompts), default=0)
            self.prompts.append(list(ids))
        try:
            reply = self.respond(text)
            for stop in body.get("stop", []):
                reply = reply.split(stop)[0]
            pieces = _PIECE.findall(reply)[:body["max_tokens"]]
        finally:
            with self._cond:
                self._in_flight[reading] -= 1
                self.requests[reading] += 1
        events = [json.dumps({"choices": [{"index": 0, "text": p, "finish_reason": None}]}) for p in pieces]
        events.append(json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}))
        events.append(json.dumps({"choices": [], "usage": {"prompt_tokens": len(ids), "completion_tokens": len(pieces),
                                                            "prompt_tokens_details": {"cached_tokens": cached}}}))
        return [*events, "[DONE]"]

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


def _common(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of two prompts."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
