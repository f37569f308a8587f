"""Load on the HTTP service: what the HTTP layer adds to a reading, and how the bounded queue behaves
when more clients ask at once than the one model can serve.

(1) Overhead: the same lc reading of a short text, called directly (``app.ask_text``) and through
``POST /v1/ask`` on a live uvicorn server (JSON, and streamed to the ``done`` event), interleaved,
on the scripted model (its replies cost nothing, so what is left is the service's own cost).

(2) Concurrency: ``--clients`` threads each send ``--requests`` questions at once to a server whose
model takes ``--model-seconds`` per request and whose queue holds ``--queue``; counted: answers, 429s
(each waits its Retry-After and retries, as a client should), latency percentiles and throughput.
One model reads one request at a time, so throughput is bounded by 1 / model time whatever the clients.

    python benchmarks/server_load.py [--rounds 200] [--clients 8] [--requests 5] [--queue 4]
                                      [--model-seconds 0.2]

Prints a markdown report with the command, git commit and machine; BENCHMARKS.md is not written.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from typing import Any

import httpx

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from _common import command_line, git_commit  # noqa: E402

from marginalia import app  # noqa: E402
from marginalia.index.embedders import HashingEmbedder  # noqa: E402
from marginalia.models.fake import ScriptedGenerator  # noqa: E402
from marginalia.options import LcOptions  # noqa: E402
from marginalia.server import Settings, create_app  # noqa: E402
from server_support import REPORT, live_server  # noqa: E402

QUESTION = "Which pier does the night ferry leave from?"
BODY = {"question": QUESTION, "text": REPORT, "reading": {"pattern": "lc"}}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def overhead(rounds: int) -> dict[str, list[float]]:
    gen = ScriptedGenerator(default="Pier 47.")
    times: dict[str, list[float]] = {"direct": [], "json": [], "stream": []}
    with live_server(create_app(Settings(), generator=gen, embedder=HashingEmbedder())) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        for _ in range(rounds):
            t0 = time.perf_counter()
            app.ask_text(REPORT, QUESTION, LcOptions(), generator=gen).answer()
            times["direct"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert http.post("/v1/ask", json=BODY).status_code == 200
            times["json"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            with http.stream("POST", "/v1/ask", json={**BODY, "stream": True}) as reply:
                assert any(line == "event: done" for line in reply.iter_lines())
            times["stream"].append(time.perf_counter() - t0)
    return times


def concurrency(clients: int, requests: int, queue: int, model_seconds: float) -> dict[str, Any]:
    def slow(req: Any) -> str:
        time.sleep(model_seconds)
        return "Pier 47."

    latencies: list[float] = []
    refused = 0
    lock = threading.Lock()
    application = create_app(Settings(queue_size=queue), generator=ScriptedGenerator(respond=slow))
    with live_server(application) as url:
        def client() -> None:
            nonlocal refused
            with httpx.Client(base_url=url, timeout=600) as http:
                for _ in range(requests):
                    t0 = time.perf_counter()
                    while (reply := http.post("/v1/ask", json=BODY)).status_code == 429:
                        with lock:
                            refused += 1
                        time.sleep(float(reply.headers["retry-after"]))
                    assert reply.status_code == 200, reply.text
                    with lock:
                        latencies.append(time.perf_counter() - t0)

        threads = [threading.Thread(target=client) for _ in range(clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    return {"answers": len(latencies), "refused": refused, "wall": wall, "latencies": latencies}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--queue", type=int, default=4)
    parser.add_argument("--model-seconds", type=float, default=0.2)
    args = parser.parse_args()

    times = overhead(args.rounds)
    direct = statistics.median(times["direct"])
    print(f"## Server load\n\n`{command_line()}` at {git_commit()}; {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; scripted model, lc over a {len(REPORT)}-character text.\n")
    print("| path | median ms | p95 ms | added by HTTP, median ms |\n|---|---|---|---|")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"| {name} | {med * 1e3:.2f} | {pct(values, 0.95) * 1e3:.2f} | "
              f"{'' if name == 'direct' else f'{(med - direct) * 1e3:.2f}'} |")
    load = concurrency(args.clients, args.requests, args.queue, args.model_seconds)
    lat = load["latencies"]
    print(f"\n{args.clients} clients x {args.requests} questions, queue {args.queue}, "
          f"{args.model_seconds} s of model per request (model calls per lc reading: 1):\n")
    print("| answers | 429s (retried) | wall s | answers/s | bound 1/model s | p50 s | p95 s | max s |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {load['answers']} | {load['refused']} | {load['wall']:.2f} | {load['answers'] / load['wall']:.2f} | "
          f"{1 / args.model_seconds:.2f} | {pct(lat, 0.5):.2f} | {pct(lat, 0.95):.2f} | {max(lat):.2f} |")


if __name__ == "__main__":
    main()
