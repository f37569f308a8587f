"""Readings side by side: over a serving engine that batches requests and shares its prefix cache (vLLM), the
service runs as many readings at once as the model's ``concurrency``, each counting its own requests only; an
in-process model still reads one request at a time."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from engine_support import Engine
from marginalia.index.embedders import HashingEmbedder
from marginalia.models.fake import ScriptedGenerator
from marginalia.models.openai.backend import OpenAIGenerator
from marginalia.server import Settings, create_app
from marginalia.server.errors import Busy
from marginalia.server.worker import ModelWorker
from server_support import live_server, wait_for

READINGS = 4
QUESTIONS = ("Which pier does the ferry leave from?", "Where does the ferry leave from?")
WIM = {"pattern": "wim", "segment_tokens": 100}
#: what a reading's answer says of its requests, which must not depend on what else ran beside it
OWN = ("context_tokens", "prompt_tokens_sent", "generated_margin_tokens", "generated_answer_tokens",
       "prompt_cache_unreported")


def document(k: int) -> str:
    """Harbour ``k``'s log: a ferry leaving from pier 41 + k, among lines that say nothing of it."""
    lines = [f"Harbour log {k}, entry {i}: the tide was calm and the gulls were loud." for i in range(12)]
    lines.insert(7, f"The ferry of harbour {k} leaves from pier {41 + k}.")
    return f"# Harbour log {k}\n\n" + " ".join(lines) + "\n"


def reading_of(prompt: str) -> str:
    """Which document a prompt reads (its first segment names it)."""
    found = re.search(r"Harbour log (\d+)", prompt)
    return found.group(1) if found else ""


def respond(prompt: str) -> str:
    """A perfect small model: a margin copies the ferry's pier once the text read holds it; the answer names it."""
    pier = re.search(r"leaves from pier (\d+)", prompt)
    if "Answer the question" in prompt.rsplit("Question:", 1)[-1]:
        return f"Pier {pier.group(1)}." if pier else "I do not know."
    return f"The ferry leaves from pier {pier.group(1)}." if pier else "NONE"


@contextmanager
def served(owned_by: str = "vllm", concurrency: int = READINGS) -> Iterator[tuple[Engine, httpx.Client]]:
    """`marginalia serve` over the fake engine (``concurrency=<n>`` in its spec), live on a free port."""
    borrowed = ScriptedGenerator()  # its word tokenizer, shared with the engine
    with Engine(borrowed.tokenizer, respond, owned_by, reading_of) as engine:
        model = OpenAIGenerator(engine.url, "tiny", borrowed, context_window=100_000, concurrency=concurrency)
        app = create_app(Settings(queue_size=READINGS), generator=model, embedder=HashingEmbedder())
        with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as http:
            yield engine, http


def at_once(calls: list[Any]) -> list[Any]:
    """Call each of ``calls`` on a thread of its own, all at once; their results in order."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            results[k] = calls[k]()
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]
    return results


def test_readings_over_a_batching_server_run_side_by_side_each_counting_its_own_requests() -> None:
    with served() as (engine, http):
        assert http.get("/v1/health").json()["queue"]["parallel"] == READINGS
        sessions = [http.post("/v1/sessions", json={"text": document(k), "reading": WIM}).json()["id"]
                    for k in range(READINGS)]
        answers: list[list[dict[str, Any]]] = []
        for question in QUESTIONS:  # each client asks two questions in its chat session, all clients at once
            engine.hold(READINGS)  # no request is answered before every reading has sent one

            def ask(session: str, question: str = question) -> dict[str, Any]:
                reply = http.post(f"/v1/sessions/{session}/messages", json={"message": question})
                assert reply.status_code == 200, reply.text
                return reply.json()  # type: ignore[no-any-return]

            answers.append(at_once([lambda s=s: ask(s) for s in sessions]))
            assert not engine.gave_up and engine.most_at_once == READINGS
        # each client got the answer about its own document
        for replies in answers:
            assert [r["text"] for r in replies] == [f"Pier {41 + k}." for k in range(READINGS)]
            assert all(r["margins"] and all(m["text"] != "NONE" for m in r["margins"] if m["relevant"])
                       for r in replies)
        # each answer counts its own requests: what the same reading reports when it runs alone
        engine.hold(1)
        for question, replies in zip(QUESTIONS, answers, strict=True):
            for k, reply in enumerate(replies):
                alone = http.post("/v1/ask", json={"question": question, "text": document(k), "reading": WIM})
                assert alone.status_code == 200, alone.text
                assert {f: reply["stats"][f] for f in OWN} == {f: alone.json()["stats"][f] for f in OWN}
                assert [m["text"] for m in reply["margins"]] == [m["text"] for m in alone.json()["margins"]]
                assert reply["stats"]["prompt_tokens_sent"] > 0 and reply["stats"]["prompt_cache_unreported"] == 0
        assert http.get("/v1/health").json()["queue"] == {"running": 0, "waiting": 0, "queue_size": READINGS,
                                                         "parallel": READINGS}


@pytest.mark.parametrize(("owned_by", "concurrency"), [("llamacpp", READINGS), ("vllm", 1)])
def test_a_server_with_a_prompt_per_slot_or_one_request_at_a_time_reads_one_at_a_time(
        owned_by: str, concurrency: int) -> None:
    with served(owned_by, concurrency) as (engine, http):
        assert http.get("/v1/health").json()["queue"]["parallel"] == 1
        engine.hold(2, deadline=1.0)  # never met: one reading's requests at a time
        replies = at_once([lambda k=k: http.post("/v1/ask", json={"question": QUESTIONS[0], "text": document(k),
                                                                  "reading": WIM}) for k in range(2)])
        assert [r.json()["text"] for r in replies] == ["Pier 41.", "Pier 42."]
        assert engine.gave_up and engine.most_at_once == 1


class Gate:
    """A scripted model's replies that wait until the test lets them go, counting how many wait at once."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.lock = threading.Lock()
        self.inside = 0
        self.most = 0

    def __call__(self, req: Any) -> str:
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        try:
            self.open.wait(30)
            return respond(req.prompt)
        finally:
            with self.lock:
                self.inside -= 1


def test_an_in_process_model_still_reads_one_request_at_a_time() -> None:
    gate = Gate()
    app = create_app(Settings(queue_size=READINGS), generator=ScriptedGenerator(respond=gate),
                     embedder=HashingEmbedder())
    lc = {"pattern": "lc"}
    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        assert http.get("/v1/health").json()["queue"]["parallel"] == 1
        replies: list[Any] = []
        asking = threading.Thread(target=lambda: replies.extend(at_once([
            lambda k=k: http.post("/v1/ask", json={"question": QUESTIONS[0], "text": document(k), "reading": lc})
            for k in range(3)])), daemon=True)
        asking.start()
        wait_for(lambda: http.get("/v1/health").json()["queue"] == {"running": 1, "waiting": 2,
                                                                    "queue_size": READINGS, "parallel": 1})
        gate.open.set()
        asking.join(60)
        assert sorted(r.json()["text"] for r in replies) == ["Pier 41.", "Pier 42.", "Pier 43."]
        assert gate.most == 1


def test_the_worker_runs_as_many_jobs_as_it_is_allowed_and_queues_the_rest_in_order() -> None:
    worker = ModelWorker(queue_size=1)
    started = [threading.Event() for _ in range(5)]
    release = threading.Event()

    def job(k: int) -> Callable[[], None]:
        def run() -> None:
            started[k].set()
            release.wait(30)
        return run

    try:
        worker.submit(job(0))
        worker.submit(job(1))
        assert started[0].wait(10)
        assert worker.status() == {"running": 1, "waiting": 1, "queue_size": 1, "parallel": 1}
        with pytest.raises(Busy):  # one runs, one waits: the queue is full
            worker.submit(job(2))
        worker.allow(3)  # the model is known, and reads three at once: the waiting job starts now
        assert started[1].wait(10)
        worker.submit(job(2))
        assert started[2].wait(10)
        fourth = worker.submit(job(3))
        assert worker.status() == {"running": 3, "waiting": 1, "queue_size": 1, "parallel": 3}
        with pytest.raises(Busy):
            worker.submit(job(4))
        assert worker.withdraw(fourth)  # its client left: its place is free at once, and it never runs
        assert worker.status()["waiting"] == 0 and fourth.cancelled()
        fifth = worker.submit(job(4))
        release.set()
        assert started[4].wait(10)
        assert not worker.withdraw(fifth)  # it started
        wait_for(lambda: worker.status()["running"] == 0)
        assert not started[3].is_set()
    finally:
        release.set()
        worker.shutdown()
