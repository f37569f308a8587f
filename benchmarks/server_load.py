"""Load on the HTTP service: many streaming clients at once, fairness of the queue on the real model, and
what HTTP adds to a WiM reading. The server runs in its own process (uvicorn on 127.0.0.1, real sockets),
as `marginalia serve` runs it; the clients are threads of this one.

(a) ``--clients`` clients stream ``POST /v1/ask`` (``stream: true``, wim) at once, ``--requests`` times each,
on a scripted model whose every reply echoes a token found only in that request's question and text (and
sleeps ``--model-ms`` per call). Checked: every margin, answer and reference each client receives carries
its own token and no other's; counted: errors, 429s (a refused client waits its Retry-After and asks again),
time to the first event and to ``done``. Twice: a queue that admits every client, and the default queue.

(b) ``--fair-clients`` clients ask the embedded SmolLM2 (llama.cpp in the server's process) one short
question each over their own short text, sent ``--stagger`` seconds apart, while the first is being read:
each client's wait (sent to ``started``), the order served against the order asked, and that each gets its
own answer.

(c) A WiM reading of the bundled report (``marginalia demo``) with SmolLM2, in process (``app.reader``) and
streamed over ``POST /v1/ask``, in ``--rounds`` interleaved rounds: time to the first margin and to the
answer, medians and their ratio. The server keeps no stored readings here (``--no-cache``), so both ways
read the whole document each time.

    python benchmarks/server_load.py [--clients 32] [--requests 3] [--model-ms 5] [--fair-clients 6] [--rounds 3]

Stores benchmarks/measurements/server_load.json (see benchmarks/report.py) and prints its section.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from _common import BENCHMARKS, Benchmark, load_note, measurement, run_together, show, wait_up
from _markdown import Record, made_by, num, table

from marginalia.models.fake import Request

#: a request's own token: every question and text of part (a) holds one, and only its own
TOKEN = re.compile(r"\bK[0-9a-f]{12}\b")
MODEL_SPEC = "smollm2"

# -- the server, in its own process -------------------------------------------------------------------------


class Echo:
    """Scripted replies that carry the request's token: a margin quotes the sentence that holds the token's
    pier once the cache holds it (so it is judged relevant and becomes a reference), else says nothing is
    there; the answer names the token and its pier. A prompt holding two tokens gets a reply naming both."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, req: Request) -> str:
        from wim_requests import is_margin

        if self.seconds:
            time.sleep(self.seconds)
        tokens = sorted(set(TOKEN.findall(req.prompt)))
        token = " ".join(tokens) or "none"
        if is_margin(req):
            fact = fact_sentence(tokens[0]) if len(tokens) == 1 else None
            return fact if fact is not None and fact in req.prefix else f"Nothing about ferry {token} here."
        return f"Ferry {token} leaves from pier {pier(tokens[0]) if len(tokens) == 1 else 0}."


def pier(token: str) -> int:
    return 10 + int(token[1:], 16) % 90


def fact_sentence(token: str) -> str:
    return f"The night ferry {token} leaves from pier {pier(token)}."


def load_model(threads: int | None) -> Any:
    """SmolLM2 on llama.cpp, on ``threads`` CPU threads (None: its default, all cores, as served)."""
    from marginalia import app
    from marginalia.models.llamacpp.backend import LlamaCppGenerator
    from marginalia.models.weights import embedded_gguf

    if threads is None:
        return app.load_model(MODEL_SPEC, backend="llamacpp")
    return LlamaCppGenerator(embedded_gguf(), name=MODEL_SPEC, n_threads=threads)


def _serve(conn: Any, model: str, settings: dict[str, Any], model_seconds: float, threads: int | None) -> None:
    """The server's process: load the model, bind 127.0.0.1 on a free port, say which, serve until killed."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import uvicorn

    from marginalia.index.embedders import HashingEmbedder
    from marginalia.models.fake import ScriptedGenerator
    from marginalia.server import Settings, create_app
    from marginalia.server.net import listening_socket

    generator = ScriptedGenerator(respond=Echo(model_seconds)) if model == "echo" else load_model(threads)
    application = create_app(Settings(**settings), generator=generator, embedder=HashingEmbedder())
    sock = listening_socket("127.0.0.1", 0)
    conn.send(sock.getsockname()[1])
    uvicorn.Server(uvicorn.Config(application, log_level="warning")).run(sockets=[sock])


@contextmanager
def served(model: str, model_seconds: float = 0.0, threads: int | None = None, **settings: Any) -> Iterator[str]:
    """A server in a child process (its home a fresh temporary folder); yields its base URL."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    with tempfile.TemporaryDirectory(prefix="server-load-") as home:
        proc = ctx.Process(target=_serve, args=(child, model, {"home": home, **settings}, model_seconds, threads),
                           daemon=True)
        proc.start()
        try:
            if not parent.poll(600):
                raise RuntimeError("the server did not start within 10 minutes")
            url = f"http://127.0.0.1:{parent.recv()}"
            wait_up(f"{url}/v1/health", 120)
            yield url
        finally:
            proc.terminate()
            proc.join(30)


# -- a streaming client ---------------------------------------------------------------------------------------


@dataclass
class Streamed:
    """One streamed request as its client saw it (times in seconds from the first attempt)."""

    status: int = 0
    refused: int = 0  # 429s before it was admitted
    first: float | None = None  # the first event
    started: float | None = None
    first_margin: float | None = None
    done: float | None = None
    events: list[tuple[str, str]] = field(default_factory=list)
    answer: dict[str, Any] | None = None
    error: str | None = None


def stream_ask(http: httpx.Client, body: dict[str, Any], clock: float | None = None) -> Streamed:
    """POST a streamed /v1/ask, honouring 429's Retry-After; every event with its data, and when each came."""
    t0 = time.perf_counter() if clock is None else clock
    out = Streamed()
    while True:
        with http.stream("POST", "/v1/ask", json={**body, "stream": True}) as reply:
            out.status = reply.status_code
            if reply.status_code == 429:
                out.refused += 1
                wait = float(reply.headers["retry-after"])
                reply.read()
            elif reply.status_code != 200:
                out.error = f"HTTP {reply.status_code}: {reply.read().decode()[:200]}"
                return out
            else:
                kind, data = "message", []
                for line in reply.iter_lines():
                    if line.startswith("event:"):
                        kind = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].lstrip(" "))
                    elif not line and data:
                        now = time.perf_counter() - t0
                        raw = "\n".join(data)
                        out.events.append((kind, raw))
                        out.first = now if out.first is None else out.first
                        if kind == "started" and out.started is None:
                            out.started = now
                        if kind == "margin_written" and out.first_margin is None:
                            out.first_margin = now
                        if kind == "done":
                            out.done, out.answer = now, json.loads(raw)
                        if kind == "error":
                            out.error = raw[:200]
                        kind, data = "message", []
                return out
        time.sleep(wait)


# -- (a) many clients at once, scripted model ------------------------------------------------------------------

REPORT = """# Harbour report

## Dredging

Silt builds up in the inner basin every year. The dredger hired for the work was the Orla Maye.

## Ferries

{fact} It sails at eleven.

## Lifeboat

The lifeboat launched 37 times this year. Its new coxswain is Ingrid Tasker.
"""


def check_own(token: str, got: Streamed) -> list[str]:
    """What, in one client's stream, is not its own: foreign tokens, a missing or wrong answer or reference."""
    wrong = []
    for kind, raw in got.events:
        foreign = set(TOKEN.findall(raw)) - {token}
        if foreign:
            wrong.append(f"{kind} carries {sorted(foreign)}")
    margins = [json.loads(raw) for kind, raw in got.events if kind == "margin_written"]
    if not margins or any(token not in m["text"] for m in margins):
        wrong.append("a margin without its own token")
    answer = got.answer
    if answer is None:
        return [*wrong, "no answer"]
    streamed = "".join(json.loads(raw)["text"] for kind, raw in got.events if kind == "answer_delta")
    if streamed != answer["text"]:
        wrong.append(f"streamed {streamed!r} but answered {answer['text']!r}")
    if answer["text"] != f"Ferry {token} leaves from pier {pier(token)}." or token not in answer["question"]:
        wrong.append(f"answer {answer['text']!r} to {answer['question']!r}")
    if not answer["references"] or any(r["text"] != fact_sentence(token) for r in answer["references"]):
        wrong.append(f"references {[r['text'] for r in answer['references']]}")
    return wrong


def many_clients(clients: int, requests: int, queue: int, model_seconds: float) -> dict[str, Any]:
    results: list[tuple[str, Streamed]] = []
    failures: list[str] = []
    lock = threading.Lock()
    with served("echo", model_seconds, queue_size=queue) as url:
        start = threading.Barrier(clients)

        def client() -> None:
            with httpx.Client(base_url=url, timeout=600) as http:
                start.wait()
                for _ in range(requests):
                    token = "K" + secrets.token_hex(6)
                    body = {"question": f"Which pier does the night ferry {token} leave from?",
                            "text": REPORT.format(fact=fact_sentence(token)),
                            "reading": {"pattern": "wim", "segment_tokens": 24}}
                    try:
                        got = stream_ask(http, body)
                    except Exception as exc:  # noqa: BLE001 - counted as an error, reported
                        got = Streamed(error=f"{type(exc).__name__}: {exc}")
                    with lock:
                        results.append((token, got))

        wall = run_together([client] * clients)
    errors = [got.error for _, got in results if got.error or got.done is None]
    for token, got in results:
        if not got.error:
            failures.extend(f"{token}: {w}" for w in check_own(token, got))
    return {"queue": queue, "results": results, "errors": errors, "wrong": failures, "wall": wall,
            "refused": sum(got.refused for _, got in results),
            "segments": next((json.loads(raw)["segments_total"] for _, got in results for kind, raw in got.events
                              if kind == "started"), 0),
            "requests_refused": sum(1 for _, got in results if got.refused),
            "first": [got.first for _, got in results if got.first is not None],
            "done": [got.done for _, got in results if got.done is not None]}


# -- (b) fairness on the real model -----------------------------------------------------------------------------

SHORT = [
    ("The lighthouse at Skerry Point was painted red in 1990.", "What colour was the lighthouse painted?"),
    ("The bakery on Mill Lane opens at six every morning.", "When does the bakery open?"),
    ("The harbour crane can lift twelve tonnes.", "How much can the harbour crane lift?"),
    ("The school's new head teacher is Mara Quill.", "Who is the school's new head teacher?"),
    ("The ferry to Holm takes forty minutes.", "How long does the ferry to Holm take?"),
    ("The town's oldest oak stands behind the chapel.", "Where does the oldest oak stand?"),
    ("The fish market closes at noon on Saturdays.", "When does the fish market close on Saturdays?"),
    ("The river Aln floods about once every decade.", "How often does the river Aln flood?"),
]
FILLER = ("The council met twice this season and approved the budget for road repairs. Volunteers cleaned the "
          "beach in spring. ")


def fairness(n: int, stagger: float, threads: int | None) -> dict[str, Any]:
    if n > len(SHORT):
        raise SystemExit(f"--fair-clients is at most {len(SHORT)}")
    with served(MODEL_SPEC, threads=threads, queue_size=n) as url:
        with httpx.Client(base_url=url, timeout=600) as http:  # warm: the first reading pays for nothing else
            stream_ask(http, {"question": "What is this?", "text": FILLER, "reading": {"pattern": "wim"}})
        out: list[dict[str, Any]] = [{} for _ in range(n)]
        t0 = time.perf_counter()

        def client(i: int) -> None:
            fact, question = SHORT[i]
            time.sleep(i * stagger)
            with httpx.Client(base_url=url, timeout=600) as http:
                asked = time.perf_counter() - t0
                got = stream_ask(http, {"question": question, "text": FILLER + fact + " " + FILLER,
                                        "reading": {"pattern": "wim"}}, clock=t0)
            out[i] = {"asked": asked, "got": got, "question": question}

        threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return {"clients": out, "stagger": stagger}


# -- (c) HTTP overhead on a WiM reading of the bundled report ------------------------------------------------


def overhead(rounds: int, chars: int | None, threads: int | None) -> dict[str, Any]:
    """Each way, each round: (seconds to the first margin, to the answer) as the caller saw them, and the
    same two as the reading measured itself (its stats), so that what lies between is what the way adds."""
    from marginalia import WimOptions, app
    from marginalia.records import Done, MarginWritten

    report, questions = app.demo()
    text = report if chars is None else report[:chars]
    question = questions[0]["question"]
    gen = load_model(threads)
    ways = ("in process", "http")
    seen: dict[str, dict[str, list[float]]] = {w: {"first": [], "total": [], "own_first": [], "own_total": []}
                                               for w in ways}
    answers: dict[str, set[str]] = {w: set() for w in ways}
    with served(MODEL_SPEC, threads=threads, cache_readings=False) as url, \
            httpx.Client(base_url=url, timeout=3600) as http:
        for r in range(rounds):
            for way in (ways if r % 2 == 0 else ways[::-1]):
                if way == "in process":
                    t0 = time.perf_counter()
                    first, result = None, None
                    for event in app.reader(text, WimOptions(), generator=gen, source="text").ask(question):
                        if isinstance(event, MarginWritten) and first is None:
                            first = time.perf_counter() - t0
                        if isinstance(event, Done):
                            total, result = time.perf_counter() - t0, event.answer
                    assert first is not None and result is not None
                    answer, stats = result.text, {"time_to_first_margin": result.stats.time_to_first_margin,
                                                  "total_seconds": result.stats.total_seconds}
                else:
                    got = stream_ask(http, {"question": question, "text": text, "reading": {"pattern": "wim"}})
                    if got.answer is None or got.first_margin is None or got.done is None:
                        raise RuntimeError(f"the server's reading failed: {got.error}")
                    first, total, answer, stats = got.first_margin, got.done, got.answer["text"], got.answer["stats"]
                row = seen[way]
                row["first"].append(first)
                row["total"].append(total)
                row["own_first"].append(stats["time_to_first_margin"])
                row["own_total"].append(stats["total_seconds"])
                answers[way].add(answer)
                print(f"  round {r + 1}, {way}: first margin {first:.2f} s, answer {total:.2f} s "
                      f"(the reading's own: {stats['time_to_first_margin']:.2f}, {stats['total_seconds']:.2f})",
                      flush=True)
    segments = len(app.reader(text, WimOptions(), generator=gen, source="text").segments)
    return {"times": seen, "answers": answers, "question": question, "tokens": gen.tokenizer.count(text),
            "segments": segments, "whole": chars is None or chars >= len(report), "chars": len(text),
            "report_tokens": gen.tokenizer.count(report)}


# -- the report ----------------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=32, help="(a) clients streaming at once")
    ap.add_argument("--requests", type=int, default=3, help="(a) questions each client asks, one after another")
    ap.add_argument("--model-ms", type=float, default=5.0, help="(a) milliseconds the scripted model takes per call")
    ap.add_argument("--small-queue", type=int, default=8, help="(a) the second run's queue (the server's default)")
    ap.add_argument("--fair-clients", type=int, default=6, help="(b) clients asking the real model")
    ap.add_argument("--stagger", type=float, default=0.3, help="(b) seconds between their requests")
    ap.add_argument("--rounds", type=int, default=3, help="(c) interleaved rounds of in-process vs HTTP")
    ap.add_argument("--chars", type=int, default=None,
                    help="(c) read only the report's first CHARS characters (default: all of it)")
    ap.add_argument("--threads", type=int, default=None,
                    help="(b), (c) llama.cpp threads, the server's and the in-process model's (default: all cores)")
    ap.add_argument("--no-write", action="store_true", help="print the section, store nothing")
    args = ap.parse_args()

    t_start = time.perf_counter()
    load_before = os.getloadavg()
    print("(a) many clients, scripted model", flush=True)
    runs = [many_clients(args.clients, args.requests, q, args.model_ms / 1000)
            for q in (args.clients - 1, args.small_queue)]
    for run in runs:
        print(f"  queue {run['queue']}: {len(run['done'])} answers, {len(run['errors'])} errors, "
              f"{len(run['wrong'])} wrong, {run['refused']} 429s", flush=True)
    print("(b) fairness, SmolLM2", flush=True)
    fair = fairness(args.fair_clients, args.stagger, args.threads)
    print("(c) overhead, SmolLM2", flush=True)
    over = overhead(args.rounds, args.chars, args.threads)
    load_after = os.getloadavg()

    threads = f"llama.cpp on {args.threads} thread(s)" if args.threads else "llama.cpp on all cores"
    clients = fair["clients"]
    served_order = sorted(range(len(clients)), key=lambda i: clients[i]["got"].started or float("inf"))
    fifo = served_order == list(range(len(clients)))
    everyone = all(c["got"].answer is not None and c["got"].answer["question"] == c["question"]
                   and c["got"].answer["text"].strip() for c in clients)
    t = over["times"]
    med = {w: {k: statistics.median(v) for k, v in t[w].items()} for w in t}
    ratio_first = med["http"]["first"] / med["in process"]["first"]
    ratio_total = med["http"]["total"] / med["in process"]["total"]
    # what each way adds to the reading's own time, reading by reading: free of how fast the model ran
    added = {w: {k: statistics.median(a - b for a, b in zip(t[w][k], t[w]["own_" + k], strict=True))
                 for k in ("first", "total")} for w in t}
    steady = {k: (med["in process"][k] + added["http"][k] - added["in process"][k]) / med["in process"][k]
              for k in ("first", "total")}
    same = over["answers"]["http"] == over["answers"]["in process"] and len(over["answers"]["http"]) == 1
    goals = [
        ("(a) no errors, nothing delivered to the wrong client",
         all(not r["errors"] and not r["wrong"] and len(r["done"]) == args.clients * args.requests for r in runs)),
        ("(a) no 429 when the queue admits every client", runs[0]["refused"] == 0),
        ("(b) FIFO, and every client answered", fifo and everyone),
        ("(c) HTTP ≤ 1.05x in process, first margin and answer (medians as measured)",
         ratio_first <= 1.05 and ratio_total <= 1.05),
        ("(c) the same, from what HTTP adds per reading", steady["first"] <= 1.05 and steady["total"] <= 1.05),
    ]

    def answer_of(got: Streamed) -> str:
        return str((got.answer or {}).get("answer", got.error or "none"))

    numbers = {
        "clients": args.clients, "requests": args.requests, "model_ms": args.model_ms,
        "segments": runs[0]["segments"],
        "many": [{"queue": r["queue"], "answers": len(r["done"]), "asked": args.clients * args.requests,
                  "errors": len(r["errors"]), "wrong": len(r["wrong"]), "refused": r["refused"],
                  "requests_refused": r["requests_refused"],
                  "first_p50_ms": 1000 * pct(r["first"], 50), "first_p99_ms": 1000 * pct(r["first"], 99),
                  "done_p50_ms": 1000 * pct(r["done"], 50), "done_p99_ms": 1000 * pct(r["done"], 99),
                  "answers_per_s": len(r["done"]) / r["wall"], "problems": (r["errors"][:3] + r["wrong"][:3])}
                 for r in runs],
        "fair": {"threads": threads, "stagger": fair["stagger"], "fifo": fifo, "everyone": everyone,
                 "clients": [{"asked_s": c["asked"], "served": served_order.index(i) + 1,
                              "wait_s": None if c["got"].started is None else c["got"].started - c["asked"],
                              "reading_s": None if c["got"].done is None or c["got"].started is None
                              else c["got"].done - c["got"].started,
                              "question": c["question"], "answer": answer_of(c["got"])}
                             for i, c in enumerate(clients)]},
        "overhead": {"tokens": over["tokens"], "segments": over["segments"], "question": over["question"],
                     "rounds": args.rounds, "whole": over["whole"], "chars": over["chars"],
                     "report_tokens": over["report_tokens"], "threads": threads,
                     "ways": {w: {"first": med[w]["first"], "total": med[w]["total"],
                                  "added_first": added[w]["first"], "added_total": added[w]["total"],
                                  "first_each": t[w]["first"], "total_each": t[w]["total"]} for w in t},
                     "ratio_first": ratio_first, "ratio_total": ratio_total,
                     "steady_first": steady["first"], "steady_total": steady["total"], "same_answer": same,
                     "answers": sorted(over["answers"]["http"] | over["answers"]["in process"])},
        "goals": [{"goal": name, "met": ok} for name, ok in goals],
        "load": load_note(load_before[0], load_after[0], "rounds are few and wall-clock times are noisy"),
        "total_min": (time.perf_counter() - t_start) / 60,
    }
    show(measurement("server_load", numbers), write=not args.no_write)


def summary(m: Record) -> list[list[str]]:
    n = m["numbers"]
    many = n["many"][0]
    o = n["overhead"]
    return [[f"HTTP service: {n['clients']} streaming clients at once",
             f"{many['answers']} of {many['asked']} answered, {many['errors']} errors, {many['wrong']} delivered to "
             f"the wrong client; queue FIFO on the real model: {'yes' if n['fair']['fifo'] else 'no'}", made_by(m)],
            ["HTTP against in process, a WiM reading",
             f"{o['ratio_first']:.3f}x the in-process time to the first margin, {o['ratio_total']:.3f}x to the "
             "answer", made_by(m)]]


def section(m: Record) -> list[str]:
    n = m["numbers"]
    o, fair = n["overhead"], n["fair"]
    waits = [c["wait_s"] for c in fair["clients"] if c.get("wait_s") is not None]
    lines = ["The server in its own process, as `marginalia serve` runs it; clients stream `POST /v1/ask`; one reading "
             "at a time, the rest queue, and beyond the queue get 429 with `Retry-After`.", "",
             f"**(a) {n['clients']} clients at once**, {n['requests']} questions each, a scripted model "
             f"({n['model_ms']:g} ms per call) echoing each request's own token, checked in every event:", "",
             *table(["queue", "answers", "errors", "to the wrong client", "429s", "first event p50 / p99 ms",
                     "`done` p50 / p99 ms", "answers/s"],
                    [[str(r["queue"]), f"{r['answers']} of {r['asked']}", str(r["errors"]), str(r["wrong"]),
                      str(r["refused"]), f"{num(r['first_p50_ms'], 0)} / {num(r['first_p99_ms'], 0)}",
                      f"{num(r['done_p50_ms'], 0)} / {num(r['done_p99_ms'], 0)}", num(r["answers_per_s"])]
                     for r in n["many"]], "rrrrrrrr"), "",
             f"**(b) {len(fair['clients'])} clients on SmolLM2** ({fair['threads']}), each a short question sent "
             f"{fair['stagger']:g} s after the one before: served in the order asked: "
             f"{'yes' if fair['fifo'] else 'no'}; every client answered its own question: "
             f"{'yes' if fair['everyone'] else 'no'}" + (f"; waits {min(waits):.2f}-{max(waits):.2f} s" if waits else "")
             + ".", "",
             "**(c) HTTP against in process**: a WiM reading of the demo report"
             + ("" if o.get("whole", True) else f"'s first {num(o.get('chars'), 0)} characters")
             + f" ({num(o['tokens'], 0)} tokens), "
             f"{o['rounds']} rounds each way, interleaved, the server keeping no readings (`serve --no-cache`).", "",
             *table(["s, median", "first margin", "answer"],
                    [[way, num(w["first"], 2), num(w["total"], 2)] for way, w in o["ways"].items()]
                    + [["http / in process", f"{o['ratio_first']:.3f}x", f"{o['ratio_total']:.3f}x"]]), "",
             (f"All {len(n['goals'])} goals met (no errors or misdelivery, FIFO, HTTP at most 1.05x in process)."
              if all(g["met"] for g in n["goals"]) else
              "Goals not met: " + "; ".join(g["goal"] for g in n["goals"] if not g["met"]) + ".")]
    return lines


BENCHMARKS["server_load"] = Benchmark("The HTTP service under load", section, summary)


if __name__ == "__main__":
    main()
