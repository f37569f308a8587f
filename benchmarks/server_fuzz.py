"""The long fuzz of the HTTP service and the loaders: how many generated inputs were sent, what came back, how
long each took and how much memory the service held; no request may get a 5xx, no input may raise anything but
the project's own errors, none may take longer than ``--time-bound`` seconds and the service's memory must stay
under ``--memory-bound-mb``.

(1) Schemathesis: requests generated from the app's own OpenAPI schema (``/openapi.json``) for every
operation, valid by the schema and not, sent with the server's key through the ASGI app; half of them name
what exists (the collection, its document, a session, a job) so they get past a 404. ``--requests`` at least.
(2) Hypothesis: ``--documents`` documents (random bytes, UTF-8 cut anywhere, markdown and HTML nested
thousands of levels deep, empty ones, ...) each through the loader marginalia picks and through another
loader, on into sections and chunks; ``--asks`` bodies for ``POST /v1/ask``; ``--uploads`` files with
hostile names and contents, each upload's job followed to its end.
(3) ``--pdfs`` copies of the sample PDF with random bytes changed and cut short, through the PDF loader;
one line of ``--line-mb`` MB through every text loader and the chunker.
(4) Against the service served by uvicorn in a process of its own, over real sockets, with no key (as a
loopback ``marginalia serve`` runs), and timeouts shorter than its defaults (`LIVE`) so that slow clients
end within the time bound: ``--bombs`` PDFs of each kind that inflate far beyond their size or have too many
pages, uploaded and each job followed to its end; ``--slow`` clients of each kind that declare more body than
they send, trickle their headers or their body, or hold connections open past the server's limit;
``--wide`` JSON bodies of each kind with 100k-2M unknown keys, nesting up to a million levels deep or strings
of up to 40 MB; ``--origins`` requests from a foreign ``Origin`` or to a foreign ``Host`` (and some from the
page's own, to compare), counted by status; ``--unpunctuated`` questions over a pasted text of
``--unpunctuated-kb`` KB without a full stop, read with WiM's default (grounded) relevance check.
(5) Across keys, in process: two collections, A and B, each with its own documents, sessions and jobs, and
for each a reader's and a writer's key; ``--cross`` rounds in which every key sends every request that names
something at the other collection's ids (its name, its documents, its jobs, its sessions and compose
sessions, its OpenAI model, the docqa chat, a question) and lists what it may see: each cell must get the
status a missing thing gets (404; 403 where only an admin may), and no reply to A's keys may hold a byte of
B's text, nor the reverse.
(6) The second round of hostile input. On the live server too: pages of ``--html-kb`` KB of unterminated
tags, indexed or refused within 10 s; ``--in-flight`` bodies past the bytes in flight, refused (503) at once;
a name of ``--echo-mb`` MB in each field that takes one, never echoed; a body with an unknown key holding
``--frozen-m`` million values, or a twelfth as many unknown keys, while the health check answers; ``--trickle``
bodies of a byte every 2 s, cut by the minimum rate; ``--together`` PDFs of ``--together-pages`` pages, each
with a note uploaded behind it and indexed first; and a folder indexed from outside the home before the server
started (``--naming``), its documents named without the file system in every reply. On servers of their own:
``--kills`` servers stopped mid-conversion by kill -9 and SIGTERM, with no converter left 5 s later, each
followed by a server on its home that sweeps its staged uploads (and a folder process 1 would have left);
a keyed server serving an ``openai:`` model whose URL holds credentials, which a caller without the key, the
health check and a model's error never show, with the page's headers (``--strangers``); ``--keyless`` bodies
of ``--keyless-mb`` MB at once without the key, refused before they are read (the server's growth kept); and
``--oom`` PDFs converted out of ``--oom-memory-mb``, refused as ``document_too_large`` naming that bound.

Every input's seconds are kept (an upload's until its job ended; a slow client's until the server answered or
closed): each part reports its slowest and its 99th percentile, and how many went over the time bound. While a
part against the live server runs, ``/v1/health`` is asked every 0.1 s on a connection of its own; its seconds
count against the bound too (a request that stalls the server stalls everyone), and against ``--health-bound``
on their own. Memory is the peak resident
size of the process that serves, with the processes it starts (a PDF's conversion) added: the live server's
for (4), this process's own, fuzzer included, for (1)-(3).

All on the scripted model and the hashing embedder (tests/fuzz_support.py holds the strategies, the checks and
the live server, shared with the tests).

    python benchmarks/server_fuzz.py [--requests 1000] [--documents 6500] [--asks 2500] [--uploads 1000]
                                     [--pdfs 30] [--line-mb 10] [--bombs 4] [--slow 25] [--wide 8]
                                     [--origins 500] [--unpunctuated 3] [--unpunctuated-kb 100] [--cross 20]
                                     [--html-kb 300] [--kills 1] [--strangers 1] [--keyless 32]
                                     [--keyless-mb 50] [--in-flight 4] [--echo-mb 16] [--frozen 1]
                                     [--frozen-m 24] [--trickle 4] [--together 1] [--together-pages 12]
                                     [--oom 1] [--oom-memory-mb 700] [--naming 1] [--only NAMES]
                                     [--time-bound 30] [--memory-bound-mb 3072] [--health-bound 1] [--no-write]

A count of 0 leaves its part out; ``--only html-kb,kills`` runs the parts named by their options alone. Stores
benchmarks/measurements/server_fuzz.json (a run of ``--only`` some parts: ``server_fuzz-some-parts.json``; unless
``--no-write``; see benchmarks/report.py) and prints its section; exits 1 on a server error, an unhandled
exception, a broken bound or a check of a part's own that did not hold.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import select
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from _common import BENCHMARKS, Benchmark, load_note, measurement, show  # noqa: E402
from _markdown import Record, made_by, num, table  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fuzz_support as fz  # noqa: E402
from marginalia.ingest.loaders import _registry  # noqa: E402
from marginalia.options import IngestOptions  # noqa: E402

#: the live server's bounds (`Settings` fields): its defaults but for the time a slow client may hold a
#: connection, short enough that each slow client ends well within the time bound, and fewer connections and
#: bytes of bodies in flight, so that holding all of them is quick
LIVE: dict[str, Any] = {"header_timeout": 5.0, "body_timeout": 5.0, "body_total_timeout": 15.0, "max_connections": 64,
                        "body_bytes_in_flight": 128 * fz.MIB, "body_rate_grace": 3.0}
#: seconds a request to the live server, or an upload's job, is waited for before it counts as never answered
GIVE_UP = 600.0
#: seconds between two health checks while a live part runs
PROBE_EVERY = 0.1


@dataclass
class Part:
    """One part of the run: inputs made, their outcomes, their seconds, and what went wrong."""

    name: str
    where: str = "in process"  # where the service ran: "in process" or "own process"
    by_kind: bool = False  # its outcomes are shown by kind ("kind: status"), not by status alone
    inputs: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    unhandled: int = 0
    server_errors: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    times: list[float] = field(default_factory=list)  # each input's seconds
    probes: list[float] = field(default_factory=list)  # the health checks' seconds while the part ran
    peak_rss_mb: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)  # numbers of this part alone (the largest reply, ...)
    bound: float | None = None  # seconds an input of this part may take, when tighter than the run's bound
    broken: int = 0  # checks of this part's own that did not hold (a secret shown, a header missing, ...)

    def broke(self, what: str) -> None:
        """One of the part's own checks did not hold."""
        self.broken += 1
        if len(self.problems) < 10:
            self.problems.append(what)

    def failed(self, what: str, exc: BaseException) -> None:
        self.unhandled += 1
        if len(self.problems) < 10:
            self.problems.append(f"{what}: {''.join(traceback.format_exception(exc))[-600:]}")

    def took(self, outcome: str, seconds: float) -> None:
        """One input made: its outcome and its seconds."""
        self.inputs += 1
        self.outcomes[outcome] += 1
        self.times.append(seconds)

    def summary(self, time_bound: float, health_bound: float = math.inf) -> dict[str, Any]:
        """The part as the measurement holds it: inputs over the tighter of ``time_bound`` and the part's own
        bound, health checks over ``time_bound`` (both in ``over_time_bound``) and over ``health_bound``."""
        bound = min(time_bound, self.bound or math.inf)
        out = {"name": self.name, "where": self.where, "inputs": self.inputs,
               "outcomes": dict(sorted(self.outcomes.items())), "unhandled": self.unhandled,
               "server_errors": self.server_errors, "seconds": self.seconds,
               "slowest_s": max(self.times, default=None), "p99_s": percentile(self.times, 99),
               "over_time_bound": sum(t > bound for t in self.times) + sum(t > time_bound for t in self.probes),
               "peak_rss_mb": self.peak_rss_mb, **self.notes}
        if self.bound is not None:
            out["bound_s"] = self.bound
        if self.broken:
            out["broken"] = self.broken
        if self.by_kind:
            out["by_kind"] = True
        if self.probes:
            out["health_slowest_s"] = max(self.probes)
            out["health_over_bound"] = sum(t > health_bound for t in self.probes)
        return out


def percentile(times: list[float], q: float) -> float | None:
    """The ``q``-th percentile of ``times`` by nearest rank (None for none)."""
    if not times:
        return None
    ordered = sorted(times)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@contextmanager
def measured(part: Part, watch: fz.MemoryWatch, http: fz.Tally | None = None,
             probe: str | None = None) -> Iterator[Part]:
    """Run one part: its wall time, the peak memory ``watch`` saw meanwhile, the 5xx ``http`` counted meanwhile,
    and the health checks of the server at ``probe`` (a base URL) while it ran."""
    errors = http.server_errors if http is not None else 0
    watch.reset()
    prober = Prober(probe) if probe else None
    t0 = time.perf_counter()
    try:
        yield part
    finally:
        part.seconds = time.perf_counter() - t0
        if prober is not None:
            part.probes = prober.stop()
        part.peak_rss_mb = watch.peak_mb()
        if http is not None:
            part.server_errors = http.server_errors - errors


class Prober:
    """``GET /v1/health`` every `PROBE_EVERY` seconds, on a connection of its own, until `stop`: what another
    client waits while the part runs."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="health-probe")
        self._thread.start()

    def _run(self) -> None:
        import httpx

        with httpx.Client(base_url=self.url, timeout=GIVE_UP) as http:
            while not self._stop.wait(PROBE_EVERY):
                start = time.perf_counter()
                try:
                    http.get("/v1/health")
                except httpx.HTTPError:
                    pass  # a refused or closed connection is answered at once; its seconds still count
                self.times.append(time.perf_counter() - start)

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join(GIVE_UP)
        return self.times


def quick(n: int) -> settings:
    """Hypothesis settings for ``n`` generated examples, no shrinking (failures are counted, not raised)."""
    return settings(max_examples=n, phases=[Phase.generate], database=None, deadline=None,
                    suppress_health_check=list(HealthCheck))


# -- (1)-(3): through the ASGI app and the loaders, in this process ------------------------------------------


def run_schemathesis(service: fz.FuzzedService, watch: fz.MemoryWatch, target: int) -> Part:
    operations = service.operations()
    part = Part("schemathesis", notes={"operations": len(operations)})
    per_operation = math.ceil(target / len(operations))
    first = len(service.tally.times)

    def run(cases: st.SearchStrategy[Any], n: int) -> None:
        @quick(n)
        @given(case=cases, aim=st.booleans())
        def send(case: Any, aim: bool) -> None:
            service.send_case(case, aim)

        send()

    with measured(part, watch, service.tally):
        for operation in operations:
            run(service.cases(operation), per_operation)
        while service.tally.requests < target:  # an operation with few distinct requests gives fewer
            run(service.cases(), target - service.tally.requests)
    tally = service.tally
    part.inputs, part.unhandled, part.problems = tally.requests, tally.unhandled, tally.problems[:10]
    part.times = tally.times[first:]
    part.outcomes.update(tally.classes())
    return part


def run_documents(watch: fz.MemoryWatch, n: int) -> Part:
    part = Part("documents")

    @quick(n)
    @given(data=fz.documents, name=fz.names, loader=st.sampled_from(fz.loaders()))
    def load(data: bytes, name: str, loader: Any) -> None:
        part.inputs += 1
        start = time.perf_counter()
        for how, call in (("chosen", lambda: fz.load_by_name(data, name)),
                          (type(loader).__name__, lambda: fz.load_and_chunk(loader, data, name))):
            try:
                part.outcomes[call()] += 1
            except Exception as exc:  # noqa: BLE001 - counted: anything but the project's errors
                part.failed(f"{how} {name} {data[:60]!r}", exc)
        part.times.append(time.perf_counter() - start)

    with measured(part, watch):
        load()
    return part


def run_bodies(service: fz.FuzzedService, watch: fz.MemoryWatch, n: int) -> Part:
    part = Part("ask bodies")
    before = service.tally.statuses.copy()

    @quick(n)
    @given(body=fz.ask_bodies)
    def ask(body: Any) -> None:
        part.inputs += 1
        start = time.perf_counter()
        try:
            service.post_json("/v1/ask", body)  # what is wrong with the reply goes to service.tally
        except Exception as exc:  # noqa: BLE001
            part.failed(f"ask {str(body)[:200]}", exc)
        part.times.append(time.perf_counter() - start)

    with measured(part, watch, service.tally):
        ask()
    part.outcomes.update(classes(service.tally.statuses - before))
    return part


def run_uploads(service: fz.FuzzedService, watch: fz.MemoryWatch, n: int) -> Part:
    part = Part("uploads")
    before = service.tally.statuses.copy()

    @quick(n)
    @given(name=fz.upload_names, data=fz.upload_contents)
    def upload(name: str, data: bytes) -> None:
        part.inputs += 1
        start = time.perf_counter()
        try:
            service.upload(name, data)  # what is wrong with the reply or the job goes to service.tally
        except Exception as exc:  # noqa: BLE001
            part.failed(f"upload {name!r}", exc)
        part.times.append(time.perf_counter() - start)

    with measured(part, watch, service.tally):
        upload()
    part.outcomes.update(classes(service.tally.statuses - before))
    return part


def run_pdfs(watch: fz.MemoryWatch, n: int) -> Part:
    part = Part("mutated PDFs")
    pdf = _registry()[".pdf"]

    @quick(n)
    @given(data=fz.pdfs)
    def load(data: bytes) -> None:
        start = time.perf_counter()
        try:
            outcome = fz.load_and_chunk(pdf, data, "paper.pdf")
        except Exception as exc:  # noqa: BLE001
            part.failed("pdf", exc)
            outcome = "unhandled"
        part.took(outcome, time.perf_counter() - start)

    with measured(part, watch):
        load()
    part.outcomes.pop("unhandled", None)
    return part


def run_long_line(watch: fz.MemoryWatch, mb: int) -> Part:
    part = Part(f"{mb} MB line")
    data = b"word " * (mb * 1_000_000 // 5)
    with measured(part, watch):
        for suffix in (".md", ".txt", ".html"):
            start = time.perf_counter()
            try:
                outcome = fz.load_and_chunk(_registry()[suffix], data, "long" + suffix)
            except Exception as exc:  # noqa: BLE001
                part.failed(suffix, exc)
                outcome = "unhandled"
            part.took(outcome, time.perf_counter() - start)
    part.outcomes.pop("unhandled", None)
    return part


def classes(statuses: Counter[int]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for status, count in statuses.items():
        out[f"{status // 100}xx"] += count
    return dict(out)


# -- (4): against the service in its own process, over real sockets ------------------------------------------


#: each kind of bomb: a name, and the PDF made for the ``i``-th of that kind (each a little different, so that
#: none is a duplicate of one stored before and every one is converted)
BOMBS: tuple[tuple[str, Callable[[int], bytes]], ...] = (
    ("200 MB of text operators", lambda i: fz.pdf_bomb((200 + i) * fz.MB)),
    ("100 MB of text operators", lambda i: fz.pdf_bomb((100 + i) * fz.MB)),  # under the inflated-size bound
    ("400 MB of spaces, hex of zlib", lambda i: fz.pdf_bomb((400 + i) * fz.MB, unit=b" " * 64,
                                                             filters="[/ASCIIHexDecode /FlateDecode]", level=1)),
    ("20 MB of text operators", lambda i: fz.pdf_bomb((20 + i) * fz.MB)),  # small enough to be indexed
    ("one page past max_pages", lambda i: fz.pdf_of_pages(IngestOptions().max_pages + 1 + i)),
)


def upload_and_follow(live: fz.LiveService, collection: str, name: str, data: bytes) -> tuple[str, float]:
    """Upload ``data`` as ``name`` and follow its job to its end: (its outcome, seconds from the upload to the
    end). A job that fails with ``internal_error`` is a problem of the reply."""
    outcome, seconds, _ = follow(live, upload(live, collection, name, data), name)
    return outcome, seconds


def upload(live: fz.LiveService, collection: str, name: str, data: bytes) -> tuple[Any, float]:
    """Upload ``data`` as ``name``: (the reply or None, when it was sent by `time.perf_counter`)."""
    start = time.perf_counter()
    reply, _ = live.request("POST", f"/v1/collections/{collection}/documents", f"upload {name}",
                            files={"file": (name, data)})
    return reply, start


def follow(live: fz.LiveService, sent: tuple[Any, float], name: str) -> tuple[str, float, dict[str, Any] | None]:
    """Follow an upload's job (``sent``: what `upload` returned) to its end: (its outcome, seconds from the
    upload to the end, the job as last seen)."""
    reply, start = sent
    if reply is None:
        return "no reply", time.perf_counter() - start, None
    if reply.status_code != 202:
        return str(reply.status_code), time.perf_counter() - start, None
    while True:
        job = live.http.get(reply.headers["location"]).json()
        if job["status"] in ("done", "failed"):
            break
        if time.perf_counter() - start > GIVE_UP:
            return "not finished", time.perf_counter() - start, job
        time.sleep(0.05)  # polling the job, as a client would
    seconds = time.perf_counter() - start
    if job["status"] == "done":
        return "indexed", seconds, job  # added, or a duplicate of what an earlier upload added
    if job["error"]["code"] == "internal_error":
        live.tally.note(f"upload {name}", [f"its job failed unexpectedly: {job['error']}"])
    return job["error"]["code"], seconds, job


def run_bombs(live: fz.LiveService, watch: fz.MemoryWatch, n: int,
              kinds: tuple[tuple[str, Callable[[int], bytes]], ...] = BOMBS) -> Part:
    """``n`` PDFs of each kind, uploaded one after the other, each job followed to its end."""
    part = Part("PDF bombs", "own process")
    live.request("POST", "/v1/collections", json={"name": "bombs", "embedder": "hashing"})
    slowest: dict[str, float] = {}
    with measured(part, watch, live.tally, live.url):
        for i in range(n):
            for k, (kind, make) in enumerate(kinds):
                data = make(i)  # made before the clock starts
                outcome, seconds = upload_and_follow(live, "bombs", f"bomb-{k}-{i}.pdf", data)
                part.took(outcome, seconds)
                slowest[kind] = max(slowest.get(kind, 0.0), seconds)
                part.notes["largest_upload_mb"] = max(part.notes.get("largest_upload_mb", 0), len(data) / fz.MIB)
    part.notes["slowest_s_by_kind"] = slowest
    return part


def raw_request(live: fz.LiveService, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{live.port}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def hold_open(live: fz.LiveService, pool: ThreadPoolExecutor, sent: bytes, count: int) -> list[Future[Any]]:
    """``count`` connections, each opened one after the other and sent ``sent`` before the next: their
    exchanges (`exchange`), waiting in ``pool`` for what the server answers, timed from each one's opening."""
    held = []
    for _ in range(count):
        start = time.perf_counter()
        sock = socket.create_connection(("127.0.0.1", live.port), timeout=30)
        sock.sendall(sent)
        held.append(pool.submit(exchange, live, b"", opened=sock, start=start))
    return held


def exchange(live: fz.LiveService, sent: bytes, trickle: bytes = b"", every: float = 0.5,
             opened: socket.socket | None = None, start: float | None = None) -> tuple[str, float]:
    """On a connection of its own (or ``opened``), send ``sent``, then a byte of ``trickle`` every ``every``
    seconds while any is left, until the server answers and closes: (the status, or "closed" when it closed
    without a word, or "no reply"; seconds from the connection to the close). The reply is checked."""
    status, seconds, _ = converse(live, sent, trickle, every, opened, start)
    return status, seconds


def converse(live: fz.LiveService, sent: bytes, trickle: bytes = b"", every: float = 0.5,
             opened: socket.socket | None = None, start: float | None = None) -> tuple[str, float, bytes]:
    """`exchange`, with the reply's body."""
    start = time.perf_counter() if start is None else start
    data = b""
    try:
        sock = opened or socket.create_connection(("127.0.0.1", live.port), timeout=30)
        with sock:
            if sent:
                sock.sendall(sent)
            while time.perf_counter() - start < GIVE_UP:
                sock.settimeout(every if trickle else GIVE_UP)
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    try:
                        sock.sendall(trickle[:1])
                    except OSError:  # the server has closed its side: read what it said
                        trickle = b""
                    trickle = trickle[1:]
                    continue
                if not chunk:
                    break
                data += chunk
    except OSError:
        pass  # reset by the server: what came before the reset is its answer
    seconds = time.perf_counter() - start
    return answered(live, f"slow client {sent[:40]!r}", data, seconds)


def answered(live: fz.LiveService, what: str, data: bytes, seconds: float) -> tuple[str, float, bytes]:
    """What came back on a raw connection (``data``), checked and counted: (its status, or "closed" when
    nothing came, or "garbled"; ``seconds``; its body)."""
    if not data.startswith(b"HTTP/"):
        return ("closed" if not data else "garbled"), seconds, b""
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    content_type = next((line.split(b":", 1)[1].strip().decode("latin-1") for line in head.split(b"\r\n")[1:]
                         if line.lower().startswith(b"content-type:")), "")
    live.tally.reply(what, status, content_type, body, seconds)
    return str(status), seconds, body


#: a request body declared 1 MB long, of which a few bytes come
HALF_SENT = {"Content-Type": "application/json", "Content-Length": "1000000"}


def run_slow(live: fz.LiveService, watch: fz.MemoryWatch, n: int) -> Part:
    """``n`` clients of each kind at once: a body declared longer than sent, headers or a body trickled a byte
    every half second; then the server's every connection held open by half-sent bodies, and ``n`` requests
    more."""
    part = Part("slow clients", "own process")
    half = raw_request(live, "POST", "/v1/ask", HALF_SENT, b'{"question": ')
    kinds = {"body shorter than declared": (half, b""),
             "headers trickled": (b"GET /v1/collections HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ", b"a" * 100_000),
             "body trickled": (half, b" " * 100_000)}
    limit = live.settings.get("max_connections", LIVE["max_connections"])
    with measured(part, watch, live.tally, live.url), ThreadPoolExecutor(limit + n) as pool:  # none waits for a thread
        for kind, (sent, trickle) in kinds.items():
            for outcome, seconds in pool.map(lambda _, s=sent, t=trickle: exchange(live, s, t), range(n)):
                part.took(f"{kind}: {outcome}", seconds)
        held = hold_open(live, pool, half, limit)
        request = raw_request(live, "GET", "/v1/collections", {})
        for outcome, seconds in pool.map(lambda _: exchange(live, request), range(n)):
            part.took(f"past the connection limit: {outcome}", seconds)
        for future in held:
            outcome, seconds = future.result()
            part.took(f"held open: {outcome}", seconds)
    return part


#: each route a wide body goes to: its valid body, and the fields a huge string may go in
WIDE_ROUTES: tuple[tuple[str, dict[str, Any], tuple[str, ...]], ...] = (
    ("/v1/ask", {"question": fz.QUESTION, "text": "x"}, ("question", "collection", "document", "zzz")),
    ("/v1/sessions", {"text": "x"}, ("text", "collection", "document", "zzz")),
    ("/v1/collections", {"name": "wide", "embedder": "hashing"}, ("name", "embedder", "zzz")),
    ("/v1/chat/completions", {"model": "marginalia:docs", "messages": [{"role": "user", "content": "x"}]},
     ("model", "zzz")),
)


def wide_body(kind: str, j: int, scale: float = 1.0) -> tuple[str, bytes]:
    """The ``j``-th wide body of ``kind`` (the first of each kind the largest): (its route, its bytes)."""
    rng = random.Random(f"{kind} {j}")
    route, base, fields = WIDE_ROUTES[j % len(WIDE_ROUTES)]
    start = json.dumps(base)[:-1]

    def size(low: int, high: int) -> int:
        return max(1, int((high if j == 0 else rng.randint(low, high)) * scale))

    if kind == "unknown keys":
        keys = ", ".join(f'"k{i}": {i}' for i in range(size(100_000, 2_000_000)))
        return route, f"{start}, {keys}}}".encode()
    if kind == "deep arrays":
        depth = size(1_000, 1_000_000)
        return route, (start + ', "zzz": ' + "[" * depth + "]" * depth + "}").encode()
    if kind == "deep objects":
        depth = size(1_000, 1_000_000)
        return route, (start + ', "zzz": ' + '{"a": ' * depth + "1" + "}" * depth + "}").encode()
    text = "why " * (size(1, 40) * 1_000_000 // 4)
    return route, json.dumps({**base, rng.choice(fields): text}).encode()


WIDE_KINDS = ("unknown keys", "deep arrays", "deep objects", "huge strings")


def run_wide(live: fz.LiveService, watch: fz.MemoryWatch, n: int, scale: float = 1.0) -> Part:
    """``n`` bodies of each kind (`wide_body`; ``scale`` shrinks them, for the tests), one after the other."""
    part = Part("wide bodies", "own process")
    largest = 0
    with measured(part, watch, live.tally, live.url):
        for j in range(n):
            for kind in WIDE_KINDS:
                route, body = wide_body(kind, j, scale)  # made before the clock starts
                reply, seconds = live.request("POST", route, f"{kind} to {route}", content=body,
                                              headers={"content-type": "application/json"})
                part.took(f"{kind}: {reply.status_code if reply is not None else 'no reply'}", seconds)
                largest = max(largest, len(reply.content) if reply is not None else 0)
    part.notes["largest_reply_mb"] = largest / fz.MIB
    return part


FOREIGN_ORIGINS = ("http://attacker.example", "null", "http://127.0.0.1.attacker.example",
                   "https://attacker.example:{port}", "http://localhost.attacker.example:{port}")
FOREIGN_HOSTS = ("attacker.example", "attacker.example:{port}", "127.0.0.1.nip.io:{port}",
                 "localhost.attacker.example", "192.168.1.10:{port}")
NOTE = b"# Note\n\nThe ferry to Brackwater leaves from pier 47.\n"


def run_origins(live: fz.LiveService, watch: fz.MemoryWatch, n: int) -> Part:
    """``n`` requests in turn from a foreign ``Origin`` (state-changing ones), to a foreign ``Host`` (any), and
    from the page's own origin and host, to compare; counted by status, whatever it is."""
    part = Part("foreign Origin, Host", "own process", by_kind=True)
    rng = random.Random(64)
    port = live.port

    def changing(i: int) -> tuple[str, str, dict[str, Any]]:
        requests: list[tuple[str, str, dict[str, Any]]] = [
            ("POST", "/v1/collections", {"json": {"name": f"origin{i}", "embedder": "hashing"}}),
            ("POST", "/v1/collections/docs/documents", {"files": {"file": (f"origin-{i}.md", NOTE)}}),
            ("DELETE", f"/v1/collections/victim{i}", {}),
            ("POST", "/v1/ask", {"json": {"question": fz.QUESTION, "text": fz.REPORT, "reading": {"pattern": "lc"}}}),
            ("POST", "/v1/sessions", {"json": {"text": fz.REPORT}}),
        ]
        return rng.choice(requests)

    live.request("POST", "/v1/collections", json={"name": "docs", "embedder": "hashing"})
    with measured(part, watch, live.tally, live.url):
        for i in range(n):
            kind = ("Origin", "Host", "own")[i % 3]
            method, path, kw = changing(i)
            if kind == "Host" and rng.random() < 0.4:
                method, path, kw = rng.choice([("GET", "/v1/collections", {}), ("GET", "/", {}),
                                               ("GET", "/openapi.json", {})])
            if path.startswith("/v1/collections/victim"):  # something to delete (not counted)
                live.request("POST", "/v1/collections", json={"name": f"victim{i}", "embedder": "hashing"})
            own = rng.choice(["127.0.0.1", "localhost"])
            headers = {"Host": f"{own}:{port}"}
            if kind == "Host":
                headers["Host"] = rng.choice(FOREIGN_HOSTS).format(port=port)
            elif method != "GET":
                headers["Origin"] = (rng.choice(FOREIGN_ORIGINS).format(port=port) if kind == "Origin"
                                     else f"http://{own}:{port}")
            reply, seconds = live.request(method, path, f"{kind} {method} {path}", headers=headers, **kw)
            part.took(f"{kind}: {reply.status_code if reply is not None else 'no reply'}", seconds)
    return part


FERRY = "the night ferry to Brackwater leaves from pier 47"
WORDS = ("harbour", "tide", "silt", "basin", "dredger", "lifeboat", "crew", "morning", "coxswain", "quay", "rope",
         "cargo", "weather", "north", "wind", "storm", "gull", "lamp", "bell", "channel", "buoy", "mooring", "deck",
         "the", "a", "of", "and", "to", "in", "was", "with", "from", "after", "before", "every", "year")


def unpunctuated(chars: int, seed: int) -> str:
    """``chars`` characters of words and commas, no full stop (nor ! or ?) and no line break, with the
    fact about the ferry halfway."""
    rng = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(WORDS) + ("," if rng.random() < 0.08 else "")
        words.append(word)
        size += len(word) + 1
    words.insert(len(words) // 2, FERRY)
    return " ".join(words)[:chars]


def run_unpunctuated(live: fz.LiveService, watch: fz.MemoryWatch, n: int, kb: int = 100) -> Part:
    """``n`` questions, one after the other, each over its own ``kb`` KB of text without a full stop, read with
    the default reading (WiM, grounded relevance check)."""
    part = Part("unpunctuated", "own process", notes={"kb": kb})
    with measured(part, watch, live.tally, live.url):
        for i in range(n):
            body = json.dumps({"question": fz.QUESTION, "text": unpunctuated(kb * 1000, i)}).encode()
            reply, seconds = live.request("POST", "/v1/ask", "unpunctuated text", content=body,
                                          headers={"content-type": "application/json"})
            part.took(str(reply.status_code) if reply is not None else "no reply", seconds)
    return part


# -- (5): the second round of hostile input, against the live server and servers of their own ------------------

#: seconds a page of unterminated tags may take to be indexed or refused
HTML_BOUND = 10.0
#: what each hostile page repeats: constructs a parser that rescans to the end of the input meets at every step
HOSTILE_UNITS = ("<a", "<?", "</", "<!--", '<a x="')
#: seconds a refusal that needs no body (the key, the bytes in flight) may take
AT_ONCE = 1.0
#: seconds after a server's death by which none of its converters may be left
KILL_GRACE = 5.0
#: an openai: model spec with credentials and a key in its query, which no reply nor page may show
SECRET_MODEL = "openai:http://fuzz-user:fuzz-pass@model.invalid:8000/v1?api_key=sk-fuzz-secret"
SECRETS = (b"fuzz-pass", b"sk-fuzz-secret")
#: the headers the page must be served with, and a part of each value
PAGE_HEADERS = {"x-frame-options": "DENY", "x-content-type-options": "nosniff",
                "content-security-policy": "frame-ancestors 'none'"}


def run_hostile_html(live: fz.LiveService, watch: fz.MemoryWatch, kb: int) -> Part:
    """A page of ``kb`` KB of each of `HOSTILE_UNITS` repeated, uploaded and its job followed: indexed or
    refused within `HTML_BOUND` seconds."""
    part = Part("unterminated tags", "own process", notes={"kb": kb}, bound=HTML_BOUND)
    live.request("POST", "/v1/collections", json={"name": "hostile", "embedder": "hashing"})
    with measured(part, watch, live.tally, live.url):
        for i, unit in enumerate(HOSTILE_UNITS):
            page = (unit * (kb * 1000 // len(unit)) + f"<p>page {i}</p>").encode()
            outcome, seconds = upload_and_follow(live, "hostile", f"hostile-{i}.html", page)
            part.took(f"{unit}: {outcome}", seconds)
    return part


def push(live: fz.LiveService, path: str, size: int, headers: dict[str, str] | None = None) -> tuple[str, float, int]:
    """A request declaring a JSON body of ``size`` bytes, its body sent as fast as the server takes it until the
    server answers: (its status, seconds to the answer, bytes of the body sent by then). Checked and counted."""
    block = b" " * min(size, 1 << 20)
    start = time.perf_counter()
    sent, data = 0, b""
    try:
        with socket.create_connection(("127.0.0.1", live.port), timeout=30) as sock:
            sock.sendall(raw_request(live, "POST", path, {"Content-Type": "application/json",
                                                          "Content-Length": str(size), **(headers or {})}))
            sock.setblocking(False)
            while sent < size and time.perf_counter() - start < GIVE_UP:
                readable, writable, _ = select.select([sock], [sock], [], 30)
                if readable:
                    break  # the server answers before the whole body came
                if writable:
                    try:
                        sent += sock.send(block[:size - sent])
                    except BlockingIOError:
                        continue
            sock.setblocking(True)
            sock.settimeout(30)
            while chunk := sock.recv(65536):
                data += chunk
    except OSError:
        pass  # reset by the server once it answered: what came before is its answer
    status, seconds, _ = answered(live, f"push {size} bytes to {path}", data, time.perf_counter() - start)
    return status, seconds, sent


def run_keyless_bodies(live: fz.LiveService, watch: fz.MemoryWatch, n: int, mb: int) -> Part:
    """``n`` bodies of ``mb`` MB at once, without the key, to a keyed server: each refused (401) before it is
    read, the server's memory flat."""
    part = Part("keyless bodies", "own process", notes={"mb": mb}, bound=AT_ONCE)
    with measured(part, watch, live.tally, live.url), ThreadPoolExecutor(n) as pool:
        before = watch.rss() / fz.MIB
        outcomes = list(pool.map(lambda _: push(live, "/v1/ask", mb * fz.MB), range(n)))
    for status, seconds, _ in outcomes:
        part.took(status, seconds)
    part.notes["most_sent_mb"] = max(sent for _, _, sent in outcomes) / fz.MIB
    part.notes["growth_mb"] = part.peak_rss_mb - before
    if part.notes["growth_mb"] > mb:
        part.broke(f"the server grew by {part.notes['growth_mb']:.0f} MiB for keyless bodies it refused")
    return part


def run_in_flight(live: fz.LiveService, watch: fz.MemoryWatch, n: int) -> Part:
    """As many bodies of 40 MB as the server's bytes in flight hold, announced and left unsent, then ``n``
    more: each of those refused (503) at once; the held ones end at the body's time bound (408)."""
    part = Part("bytes in flight", "own process", by_kind=True)
    size = 40 * fz.MB
    held = live.settings.get("body_bytes_in_flight", LIVE["body_bytes_in_flight"]) // size
    half = raw_request(live, "POST", "/v1/ask", {"Content-Type": "application/json", "Content-Length": str(size)},
                       b"{")
    with measured(part, watch, live.tally, live.url), ThreadPoolExecutor(held + n) as pool:
        holding = hold_open(live, pool, half, held)
        time.sleep(0.2)  # the server has read their headers: their declared bytes are held
        for status, seconds, _ in pool.map(lambda _: push(live, "/v1/ask", size), range(n)):
            part.took(f"past the bound: {status}", seconds)
            if status != "503" or seconds > AT_ONCE:
                part.broke(f"a body past the bytes in flight got {status} after {seconds:.2f} s")
        for future in holding:
            status, seconds = future.result()
            part.took(f"held: {status}", seconds)
    return part


#: each field a huge value goes in: its route, and the body around it (``HUGE`` is replaced by the value)
ECHOED: tuple[tuple[str, dict[str, Any]], ...] = (
    ("/v1/ask", {"question": fz.QUESTION, "collection": "HUGE"}),
    ("/v1/ask", {"question": fz.QUESTION, "collection": "docs", "document": "HUGE"}),
    ("/v1/sessions", {"collection": "HUGE"}),
    ("/v1/compose/sessions", {"collection": "HUGE"}),
    ("/chat", {"message": fz.QUESTION, "collection": "HUGE"}),
    ("/v1/chat/completions", {"model": "marginalia:HUGE", "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/collections", {"name": "HUGE"}),
    ("/v1/collections", {"name": "echo", "embedder": "HUGE"}),
)
#: the most bytes a reply to a body with a huge name may hold
SMALL_REPLY = 64 * 1024


def run_echoes(live: fz.LiveService, watch: fz.MemoryWatch, mb: int) -> Part:
    """A name of ``mb`` MB in each field of `ECHOED`: refused with a small reply, the value not echoed."""
    part = Part("echoed values", "own process", notes={"mb": mb})
    largest = 0
    with measured(part, watch, live.tally, live.url):
        for route, base in ECHOED:
            body = json.dumps(base).replace("HUGE", "c" * (mb * fz.MB)).encode()  # made before its clock starts
            field = next(k for k, v in base.items() if isinstance(v, str) and "HUGE" in v)
            reply, seconds = live.request("POST", route, f"huge {field} to {route}", content=body,
                                          headers={"content-type": "application/json"})
            size = len(reply.content) if reply is not None else 0
            largest = max(largest, size)
            part.took(f"{route} {field}: {reply.status_code if reply is not None else 'no reply'}", seconds)
            if size > SMALL_REPLY:
                part.broke(f"a huge {field} to {route} got a reply of {size:,} bytes")
    part.notes["largest_reply_bytes"] = largest
    return part


def frozen_body(kind: str, millions: float) -> bytes:
    """A body for ``POST /v1/ask`` with, beside a valid question, an unknown key holding an array of
    ``millions`` million elements, or ``millions / 12`` million unknown keys."""
    start = json.dumps({"question": fz.QUESTION, "text": "x"})[:-1]
    if kind == "array under an unknown key":
        return f'{start}, "zzz": [{",".join(["0"] * int(millions * 1_000_000))}]}}'.encode()
    keys = ", ".join(f'"k{i}": 0' for i in range(int(millions * 1_000_000 / 12)))
    return f"{start}, {keys}}}".encode()


FROZEN_KINDS = ("array under an unknown key", "many unknown keys")


def run_frozen(live: fz.LiveService, watch: fz.MemoryWatch, n: int, millions: float) -> Part:
    """``n`` bodies of each of `FROZEN_KINDS`, one after the other: refused, while the health check answers
    (its seconds count against the health bound)."""
    part = Part("loop not frozen", "own process", notes={"millions": millions})
    bodies = {kind: frozen_body(kind, millions) for kind in FROZEN_KINDS}
    part.notes["largest_body_mb"] = max(len(b) for b in bodies.values()) / fz.MIB
    with measured(part, watch, live.tally, live.url):
        for _ in range(n):
            for kind, body in bodies.items():
                reply, seconds = live.request("POST", "/v1/ask", kind, content=body,
                                              headers={"content-type": "application/json"})
                part.took(f"{kind}: {reply.status_code if reply is not None else 'no reply'}", seconds)
    return part


#: seconds between two bytes of a trickled body (at most half the server's pause bound), far under its rate
TRICKLE_EVERY = 2.0


def run_trickle(live: fz.LiveService, watch: fz.MemoryWatch, n: int) -> Part:
    """``n`` bodies at once, a byte every `TRICKLE_EVERY` seconds or so: each cut by the minimum rate (408 naming
    ``--min-body-rate``) once its grace has passed, long before the whole body's bound."""
    part = Part("trickled bodies", "own process")
    half = raw_request(live, "POST", "/v1/ask", HALF_SENT, b'{"question": ')
    total = live.settings.get("body_total_timeout", LIVE["body_total_timeout"])
    every = min(TRICKLE_EVERY, live.settings.get("body_timeout", LIVE["body_timeout"]) / 2)
    with measured(part, watch, live.tally, live.url), ThreadPoolExecutor(n) as pool:
        replies = list(pool.map(lambda _: converse(live, half, b" " * 10_000, every=every), range(n)))
    for status, seconds, body in replies:
        why = next((w for flag, w in ((b"--min-body-rate", "rate"), (b"--body-total-timeout", "total"),
                                      (b"--body-timeout", "pause")) if flag in body), "other")
        part.took(f"{status} ({why})", seconds)
        if (status, why) != ("408", "rate") or seconds >= total:
            part.broke(f"a trickled body got {status} ({why}) after {seconds:.1f} s")
    return part


def run_together(live: fz.LiveService, watch: fz.MemoryWatch, n: int, pages: int) -> Part:
    """``n`` times: a PDF of ``pages`` pages (a conversion of some seconds), then at once a short note; the
    note is indexed while the PDF is still converted (two conversions at once)."""
    part = Part("two conversions at once", "own process", by_kind=True, notes={"pages": pages})
    live.request("POST", "/v1/collections", json={"name": "together", "embedder": "hashing"})
    for i in range(n):
        slow = fz.pdf_of_pages(pages + i)  # made before the clock starts
        with measured(part, watch, live.tally, live.url):
            pdf = upload(live, "together", f"long-{i}.pdf", slow)
            note, note_s, _ = follow(live, upload(live, "together", f"note-{i}.md", NOTE + f"{i}\n".encode()),
                                     "note")
            first = live.http.get(pdf[0].headers["location"]).json()["status"] if pdf[0] is not None else "?"
            outcome, seconds, _ = follow(live, pdf, "long pdf")
        part.took(f"note: {note}", note_s)
        part.took(f"pdf: {outcome}", seconds)
        part.took(f"pdf when the note ended: {first}", 0.0)
        if first not in ("queued", "running") or note != "indexed":
            part.broke(f"the note ended {note} after {note_s:.1f} s with the PDF {first} ({seconds:.1f} s)")
    return part


def run_naming(live: fz.LiveService, watch: fz.MemoryWatch, folder: Path) -> Part:
    """What the service says about collection ``papers``, indexed from ``folder`` (outside the home) before it
    started: every document named without the file system around it, in every reply."""
    part = Part("documents named", "own process")
    where = str(folder.parent).encode()
    with measured(part, watch, live.tally, live.url):
        reply, seconds = live.request("GET", "/v1/collections/papers")
        names = [d["source"] for d in reply.json()["documents"]] if reply is not None else []
        part.took(f"collection: {reply.status_code if reply is not None else 'no reply'}", seconds)
        checked = [reply]
        for name in names:
            checked.append(live.request("GET", f"/v1/collections/papers/documents/{name}")[0])
            part.took("document", 0.0)
        for body in ({"question": fz.QUESTION, "collection": "papers", "reading": {"pattern": "rag"}},
                     {"question": fz.QUESTION, "collection": "papers", "document": names[0] if names else "x",
                      "reading": {"pattern": "lc"}}):
            answer, seconds = live.request("POST", "/v1/ask", "ask papers", json=body)
            checked.append(answer)
            part.took(f"ask: {answer.status_code if answer is not None else 'no reply'}", seconds)
    part.notes["names"] = names
    for reply in checked:
        if reply is not None and where in reply.content:
            part.broke(f"{reply.request.url.path} shows the folder indexed: {reply.text[:200]}")
    if not names:
        part.broke("the collection indexed before the server started has no documents")
    return part


def index_papers(home: str, folder: Path) -> None:
    """Index a folder ``papers`` of two notes into collection ``papers`` under ``home``, as `marginalia index`
    does (from outside the home)."""
    from marginalia import app as marginalia_app
    from marginalia.models.fake import WordTokenizer

    (folder / "2024").mkdir(parents=True, exist_ok=True)
    (folder / "2024" / "ferry.md").write_text(fz.REPORT, encoding="utf-8")
    (folder / "harbour.md").write_text("# Harbour\n\nThe harbour master keeps the tide tables.\n", encoding="utf-8")
    marginalia_app.index_paths([folder], "papers", count_tokens=WordTokenizer().count, home=home, embedder="hashing")


def converters(pid: int) -> list[Any]:
    """The processes under process ``pid`` that convert a document."""
    import psutil

    found = []
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return found
    for child in children:
        try:
            if "marginalia.ingest.isolated" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            pass
    return found


def running(process: Any) -> bool:
    import psutil

    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


#: how a server is stopped mid-conversion: by the kernel (nothing of it runs again), or asked to
STOPS = (("kill -9", signal.SIGKILL), ("SIGTERM", signal.SIGTERM))


def run_kills(home: str, n: int, pages: int) -> tuple[Part, Part]:
    """``n`` times for each of `STOPS`: a server of its own converting a PDF of ``pages`` pages is stopped so;
    `KILL_GRACE` seconds later none of its converters may run. Then a server that starts on its home must
    sweep what the stopped one staged, and a folder named as a server of process 1 would have named it (the
    process id alive, as in a container), and keep the folder of a server that lives."""
    killed = Part("killed mid-conversion", "own process", by_kind=True)
    swept = Part("staging swept", "own process", by_kind=True)
    t0 = time.perf_counter()
    for i in range(n):
        for kind, sig in STOPS:
            server_home = Path(home) / f"stopped-{i}-{sig.name}"
            with fz.LiveService(server_home, **LIVE) as live:
                live.request("POST", "/v1/collections", json={"name": "slow", "embedder": "hashing"})
                upload(live, "slow", "long.pdf", fz.pdf_of_pages(pages + i))
                deadline = time.perf_counter() + 60
                while not (found := converters(live.pid)) and time.perf_counter() < deadline:
                    time.sleep(0.05)
                if not found:
                    killed.broke(f"{kind}: no converter was seen running")
                    continue
                start = time.perf_counter()
                os.kill(live.pid, sig)
                live.process.wait(60)
                time.sleep(KILL_GRACE)
                left = [p for p in found if running(p)]
                killed.took(f"{kind}: {len(left)} left", time.perf_counter() - start)
                for process in left:
                    killed.broke(f"{kind}: converter {process.pid} still runs {KILL_GRACE:g} s after the server")
                    process.kill()
            swept_part(swept, server_home, kind)
    killed.seconds = swept.seconds = time.perf_counter() - t0
    return killed, swept


def swept_part(part: Part, home: Path, kind: str) -> None:
    """Start two servers, one after the other, on ``home``, whose last server was stopped (`run_kills`): the
    first sweeps what the stopped one left there and a folder of process 1's, the second keeps the first's
    (whose lock it holds)."""
    staging = home / "staging"
    left = {p.name for p in staging.iterdir()} if staging.is_dir() else set()
    (staging / "1-upload").mkdir(parents=True, exist_ok=True)  # process 1's, by the old naming: 1 is alive
    (staging / "1-upload" / "document.md").write_text("left over", encoding="utf-8")
    start = time.perf_counter()
    with fz.LiveService(home, **LIVE), fz.LiveService(home, **LIVE):
        seconds = time.perf_counter() - start
        now = {p.name for p in staging.iterdir()}
        stale = now & (left | {"1-upload"})
        part.took(f"after {kind}: {'swept' if not stale else 'left ' + ', '.join(sorted(stale))}", seconds)
        if stale:
            part.broke(f"after {kind}, the next server left {sorted(stale)} in staging")
        if len(now) != 2:
            part.broke(f"two live servers on one home hold {sorted(now)} in staging, not a folder each")


def run_strangers(live: fz.LiveService, watch: fz.MemoryWatch) -> Part:
    """What a keyed server serving `SECRET_MODEL` shows: the health check without the key says only "ok"; with
    it, the model without credentials; the model's failure (502) quotes it without them; the page and its
    script come with the anti-framing, nosniff and CSP headers."""
    import httpx

    part = Part("strangers and the page", "own process", by_kind=True)
    with measured(part, watch, live.tally, live.url), httpx.Client(base_url=live.url, timeout=60) as stranger:
        start = time.perf_counter()
        health = stranger.get("/v1/health")
        part.took(f"health without key: {health.status_code}", time.perf_counter() - start)
        if health.json() != {"status": "ok"}:
            part.broke(f"the health check tells a caller without the key {health.text[:300]}")
        keyed, seconds = live.request("GET", "/v1/health")
        part.took(f"health with key: {keyed.status_code if keyed is not None else 'no reply'}", seconds)
        # the model's failure is a 502 by design: checked here, not counted with the server's own errors
        start = time.perf_counter()
        failed = live.http.post("/v1/ask", json={"question": fz.QUESTION, "text": fz.REPORT,
                                                 "reading": {"pattern": "lc"}})
        part.took(f"model fails: {failed.status_code}", time.perf_counter() - start)
        if failed.status_code != 502 or fz.check_reply(502, failed.headers.get("content-type", ""),
                                                       failed.content) != ["status 502"]:
            part.broke(f"the model's failure was answered {failed.status_code}: {failed.text[:300]}")
        for reply in (health, keyed, failed):
            if reply is not None and any(secret in reply.content for secret in SECRETS):
                part.broke(f"{reply.request.url.path} shows the model's credentials: {reply.text[:300]}")
        for path in ("/", "/static/app.js"):
            start = time.perf_counter()
            page = stranger.get(path)
            part.took(f"page {path}: {page.status_code}", time.perf_counter() - start)
            for header, value in PAGE_HEADERS.items():
                if value not in page.headers.get(header, ""):
                    part.broke(f"{path} is served without {header}: {value}")
    return part


def run_out_of_memory(live: fz.LiveService, watch: fz.MemoryWatch, n: int, memory_mb: int) -> Part:
    """``n`` PDFs whose stream must be decoded whole (400 MB of spaces, hex of zlib) to a server whose
    conversions have ``memory_mb`` MiB: each job fails as ``document_too_large`` naming the memory bound."""
    part = Part("out of memory", "own process", notes={"convert_memory_mb": memory_mb})
    live.request("POST", "/v1/collections", json={"name": "bombs", "embedder": "hashing"})
    for i in range(n):
        data = BOMBS[2][1](i)
        with measured(part, watch, live.tally, live.url):
            outcome, seconds, job = follow(live, upload(live, "bombs", f"oom-{i}.pdf", data), "oom")
        part.took(outcome, seconds)
        message = (job or {}).get("error", {}).get("message", "")
        if outcome != "document_too_large" or "convert_memory_mb" not in message:
            part.broke(f"a conversion out of memory ended {outcome}: {message[:300]}")
    return part


# -- the run -------------------------------------------------------------------------------------------------

#: the parts whose inputs hypothesis generated
# -- (5): each key at the other collection's ids ---------------------------------------------------------------

#: each collection's own text: a line no other collection holds, so that a reply carrying it is a leak
CROSS_TEXTS = {
    "A": "# Harbour\n\n## Ferries\n\nThe night ferry to Brackwater leaves from pier 47 at eleven.\n",
    "B": "# Lighthouse\n\n## Vault\n\nThe vault under the lighthouse opens with the word Calloway.\n",
}
#: the words of each collection's text only it holds (a reply to the other's keys may hold none of them)
CROSS_MARKERS = {"A": ("Brackwater", "pier 47"), "B": ("Calloway", "lighthouse opens")}


def cross_world(home: str) -> tuple[Any, dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """The app with collections A and B, and for each its reader's and writer's tokens and its ids (document,
    job, chat session, compose session, each opened by that collection's writer)."""
    from marginalia.server import Settings, create_app
    from marginalia.server.keys import Grants, KeyStore
    from server_support import COMPOSE_SETTINGS, ComposeModels

    app = create_app(Settings(home=home, api_key=fz.KEY, **COMPOSE_SETTINGS), generator=fz.scripted(),
                     embedder=fz.HashingEmbedder(), loader=ComposeModels())
    client = fz.TestClient(app, base_url="http://localhost", raise_server_exceptions=False)
    store = KeyStore.of_home(home)
    tokens: dict[str, dict[str, str]] = {}
    ids: dict[str, dict[str, str]] = {}
    for name, text in CROSS_TEXTS.items():
        client.headers["Authorization"] = f"Bearer {fz.KEY}"
        job = fz.index_text(client, name, f"{name.lower()}.md", text)
        tokens[name] = {"reader": store.create(f"reader-{name}", Grants(read=frozenset({name})))[1],
                        "writer": store.create(f"writer-{name}", Grants(write=frozenset({name})))[1]}
        client.headers["Authorization"] = f"Bearer {tokens[name]['writer']}"
        session = client.post("/v1/sessions", json={"collection": name}).json()["id"]
        compose = client.post("/v1/compose/sessions", json={"collection": name, "options": {"debounce": 0.0}})
        ids[name] = {"document": f"{name.lower()}.md", "job": job["id"], "session": session,
                     "compose": compose.json()["id"]}
    client.headers.pop("Authorization")
    return client, tokens, ids


def cross_requests(other: str, ids: dict[str, str], question: str) -> list[tuple[str, str, dict[str, Any], int]]:
    """(method, url, request kwargs, the status it must get) for every request naming ``other``'s ids."""
    ask = {"question": question, "collection": other}
    return [
        ("GET", f"/v1/collections/{other}", {}, 404),
        ("DELETE", f"/v1/collections/{other}", {}, 403),
        ("POST", f"/v1/collections/{other}/documents", {"files": {"file": ("x.md", b"# X\n\nx\n")}}, 404),
        ("GET", f"/v1/collections/{other}/documents/{ids['document']}", {}, 404),
        ("DELETE", f"/v1/collections/{other}/documents/{ids['document']}", {}, 404),
        ("GET", f"/v1/jobs/{ids['job']}", {}, 404),
        ("GET", f"/v1/jobs/{ids['job']}/events", {}, 404),
        ("POST", "/v1/ask", {"json": ask}, 404),
        ("POST", "/v1/ask", {"json": {**ask, "document": ids["document"]}}, 404),
        ("POST", "/v1/sessions", {"json": {"collection": other}}, 404),
        ("GET", f"/v1/sessions/{ids['session']}", {}, 404),
        ("POST", f"/v1/sessions/{ids['session']}/messages", {"json": {"message": question}}, 404),
        ("DELETE", f"/v1/sessions/{ids['session']}", {}, 404),
        ("POST", "/v1/compose/sessions", {"json": {"collection": other}}, 404),
        ("GET", f"/v1/compose/sessions/{ids['compose']}", {}, 404),
        ("GET", f"/v1/compose/sessions/{ids['compose']}/memory", {}, 404),
        ("POST", f"/v1/compose/sessions/{ids['compose']}/suggestions", {"json": {"text": "The vault"}}, 404),
        ("DELETE", f"/v1/compose/sessions/{ids['compose']}", {}, 404),
        ("POST", "/v1/chat/completions", {"json": {"model": f"marginalia:{other}",
                                                   "messages": [{"role": "user", "content": question}]}}, 404),
        ("POST", "/chat", {"json": {"message": question, "collection": other}}, 404),
    ]


def run_cross(watch: fz.MemoryWatch, home: str, rounds: int) -> Part:
    """Part (5): every key of each collection at the other's ids, ``rounds`` times, in a shuffled order."""
    part = Part("across keys", by_kind=True)
    wrong, leaked = 0, 0
    with measured(part, watch):
        client, tokens, ids = cross_world(home)
        rng = random.Random(73)
        questions = ["What opens the vault?", "Which pier does the night ferry leave from?", "What is here?"]
        for _ in range(rounds):
            cells = [(own, role, request) for own, other in (("A", "B"), ("B", "A"))
                     for role in ("reader", "writer")
                     for request in cross_requests(other, ids[other], rng.choice(questions))]
            cells += [(own, role, ("GET", path, {}, 200)) for own in ("A", "B") for role in ("reader", "writer")
                      for path in ("/v1/collections", "/v1/models", "/v1/jobs", "/v1/me")]
            rng.shuffle(cells)
            for own, role, (method, url, kw, want) in cells:
                t0 = time.perf_counter()
                reply = client.request(method, url, headers={"Authorization": f"Bearer {tokens[own][role]}"}, **kw)
                seconds = time.perf_counter() - t0
                foreign = "B" if own == "A" else "A"
                text = reply.text
                leak = sum(text.count(m) * len(m.encode()) for m in CROSS_MARKERS[foreign]) + text.count(
                    f"marginalia:{foreign}") + text.count(f'"{foreign}"')
                kind = url.split("/")[2] if url.startswith("/v1/") else url.strip("/")
                ok = reply.status_code == want and leak == 0
                part.took(f"{kind}: {reply.status_code}{'' if ok else ' WRONG'}", seconds)
                if reply.status_code >= 500:
                    part.server_errors += 1
                if not ok:
                    wrong += 1
                    leaked += leak
                    if len(part.problems) < 10:
                        part.problems.append(f"{own} {role} {method} {url}: {reply.status_code} (expected {want}), "
                                             f"{leak} foreign bytes")
    part.notes.update(cells_wrong=wrong, foreign_bytes=leaked, statuses=True)
    return part


HYPOTHESIS_PARTS = ("documents", "ask bodies", "uploads")


def numbers(parts: list[Part], tallies: tuple[fz.Tally, fz.Tally], args: argparse.Namespace, total: float,
            load: tuple[float, float]) -> dict[str, Any]:
    """The run as the measurement file holds it (``tallies``: the requests in process, and to the live
    server): its bounds and the live server's, HTTP requests by status class, server errors and replies with a problem, each part's inputs, outcomes,
    unhandled exceptions, seconds and peak memory, and the first problems met."""
    http, served = tallies
    summaries = [p.summary(args.time_bound, args.health_bound) for p in parts]
    peak = max((p.peak_rss_mb for p in parts), default=0.0)
    return {
        "requests_target": args.requests,
        "bounds": {"time_s": args.time_bound, "memory_mb": args.memory_bound_mb, "health_s": args.health_bound},
        "live_server": LIVE,
        "http": {"requests": http.requests, "classes": http.classes(), "server_errors": http.server_errors,
                 "unhandled": http.unhandled, "bad": http.bad},
        "live_http": {"requests": served.requests, "classes": served.classes(), "server_errors": served.server_errors,
                      "busy": served.busy, "bad": served.bad},
        "requests": sum(t.requests for t in tallies),
        "server_errors": sum(t.server_errors for t in tallies),
        "bad": sum(t.bad for t in tallies),
        "hypothesis_inputs": sum(p.inputs for p in parts if p.name in HYPOTHESIS_PARTS),
        "inputs": sum(p.inputs for p in parts),
        "unhandled": sum(p.unhandled for p in parts),
        "over_time_bound": sum(s["over_time_bound"] for s in summaries),
        "health_over_bound": sum(s.get("health_over_bound", 0) for s in summaries),
        "broken": sum(p.broken for p in parts),
        "peak_rss_mb": peak,
        "memory_ok": peak <= args.memory_bound_mb,
        "parts": summaries,
        "problems": [q[:300] for q in ([q for t in tallies for q in t.problems]
                                       + [q for p in parts for q in p.problems])[:10]],
        "load": load_note(load[0], load[1], "wall times are noisy"),
        "total_min": total / 60,
    }


def run_planned(watch: fz.MemoryWatch, plan: Iterable[tuple[float, Callable[[], Part]]]) -> list[Part]:
    """The parts of ``plan`` (a count, then the part's run) whose count is not 0, each reported as it ends;
    ``watch`` is closed after the last, or at the first that fails."""
    parts = []
    try:
        for count, run in plan:
            if count:
                parts.append(run())
                report(parts[-1])
    finally:
        watch.close()
    return parts


def in_process(args: argparse.Namespace, home: str) -> tuple[list[Part], fz.Tally]:
    """Parts (1)-(3)."""
    made: list[fz.FuzzedService] = []

    def service() -> fz.FuzzedService:  # made for the first part that sends requests (it indexes a document)
        if not made:
            made.append(fz.FuzzedService(home))
        return made[0]

    watch = fz.MemoryWatch(os.getpid())
    parts = run_planned(watch, (
        (args.requests, lambda: run_schemathesis(service(), watch, args.requests)),
        (args.documents, lambda: run_documents(watch, args.documents)),
        (args.asks, lambda: run_bodies(service(), watch, args.asks)),
        (args.uploads, lambda: run_uploads(service(), watch, args.uploads)),
        (args.pdfs, lambda: run_pdfs(watch, args.pdfs)),
        (args.line_mb, lambda: run_long_line(watch, args.line_mb)),
        (args.cross, lambda: run_cross(watch, os.path.join(home, "cross"), args.cross))))
    return parts, made[0].tally if made else fz.Tally()


def live(args: argparse.Namespace, home: str) -> tuple[list[Part], fz.Tally]:
    """Parts (4) and those of (5) that share the live server, against the service in a process of its own."""
    parts: list[Part] = []
    if not (args.bombs or args.slow or args.wide or args.origins or args.unpunctuated or args.html_kb
            or args.in_flight or args.echo_mb or args.frozen or args.trickle or args.together or args.naming):
        return parts, fz.Tally()
    papers = Path(home).parent / "outside" / "papers"  # indexed before the server starts, from outside its home
    if args.naming:
        index_papers(home, papers)
    with fz.LiveService(home, **LIVE) as service:
        watch = fz.MemoryWatch(service.pid)
        parts = run_planned(watch, (
            (args.bombs, lambda: run_bombs(service, watch, args.bombs)),
            (args.slow, lambda: run_slow(service, watch, args.slow)),
            (args.wide, lambda: run_wide(service, watch, args.wide)),
            (args.origins, lambda: run_origins(service, watch, args.origins)),
            (args.unpunctuated, lambda: run_unpunctuated(service, watch, args.unpunctuated,
                                                         args.unpunctuated_kb)),
            (args.html_kb, lambda: run_hostile_html(service, watch, args.html_kb)),
            (args.in_flight, lambda: run_in_flight(service, watch, args.in_flight)),
            (args.echo_mb, lambda: run_echoes(service, watch, args.echo_mb)),
            (args.frozen, lambda: run_frozen(service, watch, args.frozen, args.frozen_m)),
            (args.trickle, lambda: run_trickle(service, watch, args.trickle)),
            (args.together, lambda: run_together(service, watch, args.together,
                                                 args.together_pages)),
            (args.naming, lambda: run_naming(service, watch, papers))))
    return parts, service.tally


def own_servers(args: argparse.Namespace, home: str) -> tuple[list[Part], fz.Tally]:
    """The parts of (5) that need servers of their own: stopped mid-conversion and the next one on its home;
    one with a key, the model `SECRET_MODEL` and conversions bounded to ``--oom-memory-mb``."""
    parts: list[Part] = []
    tally = fz.Tally()
    if args.kills:
        parts += run_kills(os.path.join(home, "stopped"), args.kills, args.together_pages)
        for part in parts:
            report(part)
    if not (args.strangers or args.keyless or args.oom):
        return parts, tally
    ingest = {"convert_memory_mb": args.oom_memory_mb, "max_inflated_mb": 1024}
    with fz.LiveService(os.path.join(home, "keyed"), model=SECRET_MODEL, api_key=fz.KEY, ingest=ingest,
                        **LIVE) as service:
        watch = fz.MemoryWatch(service.pid)
        parts += run_planned(watch, (
            (args.strangers, lambda: run_strangers(service, watch)),
            (args.keyless, lambda: run_keyless_bodies(service, watch, args.keyless,
                                                      args.keyless_mb)),
            (args.oom, lambda: run_out_of_memory(service, watch, args.oom, args.oom_memory_mb))))
    return parts, service.tally


def merged(a: fz.Tally, b: fz.Tally) -> fz.Tally:
    """Two tallies as one (the requests to the live server and to the servers of their own)."""
    return fz.Tally(statuses=a.statuses + b.statuses, times=a.times + b.times, unhandled=a.unhandled + b.unhandled,
                    bad=a.bad + b.bad, busy=a.busy + b.busy, problems=(a.problems + b.problems)[:50])


#: the options that count a part's inputs (0 leaves it out), by which ``--only`` names parts
PART_OPTIONS = ("requests", "documents", "asks", "uploads", "pdfs", "line-mb", "cross", "bombs", "slow", "wide", "origins",
                "unpunctuated", "html-kb", "kills", "strangers", "keyless", "in-flight", "echo-mb", "frozen",
                "trickle", "together", "oom", "naming")


def only(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Leave out the parts ``--only`` does not name; refuse a name that is no part's."""
    unknown = sorted(set(args.only) - set(PART_OPTIONS))
    if unknown:
        parser.error(f"--only names no part {', '.join(unknown)}; name some of {', '.join(PART_OPTIONS)}")
    for name in PART_OPTIONS:
        if name not in args.only:
            setattr(args, name.replace("-", "_"), 0)


def report(part: Part) -> None:
    print(f"{part.name}: {part.inputs} in {part.seconds:.0f} s, slowest {max(part.times, default=0):.2f} s, "
          f"peak {part.peak_rss_mb:.0f} MiB; {dict(part.outcomes)}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    count = parser.add_argument_group("inputs (0 leaves a part out)")
    count.add_argument("--requests", type=int, default=1000, help="schemathesis requests, at least (default 1000)")
    count.add_argument("--documents", type=int, default=6500, help="documents through the loaders (default 6500)")
    count.add_argument("--asks", type=int, default=2500, help="POST /v1/ask bodies (default 2500)")
    count.add_argument("--uploads", type=int, default=1000, help="uploads, each job followed (default 1000)")
    count.add_argument("--pdfs", type=int, default=30, help="mutated copies of the sample PDF (default 30)")
    count.add_argument("--line-mb", type=int, default=10, help="MB of the one long line (default 10)")
    count.add_argument("--bombs", type=int, default=4,
                       help=f"PDF bombs of each of the {len(BOMBS)} kinds, uploaded to the live server (default 4)")
    count.add_argument("--slow", type=int, default=25, help="slow clients of each kind at once (default 25)")
    count.add_argument("--wide", type=int, default=8,
                       help=f"wide JSON bodies of each of the {len(WIDE_KINDS)} kinds (default 8)")
    count.add_argument("--origins", type=int, default=500,
                       help="requests from a foreign Origin, to a foreign Host and from the page's own (default 500)")
    count.add_argument("--unpunctuated", type=int, default=3,
                       help="questions over a text without full stops (default 3)")
    count.add_argument("--cross", type=int, default=20,
                       help="rounds of every key's requests at the other collection's ids (default 20)")
    count.add_argument("--unpunctuated-kb", type=int, default=100,
                       help="KB of each text without full stops (default 100)")
    bounds = parser.add_argument_group("bounds")
    bounds.add_argument("--time-bound", type=float, default=30.0,
                        help="seconds one input may take, a health check while a part runs included (default 30)")
    bounds.add_argument("--memory-bound-mb", type=float, default=3072.0,
                        help="MiB the serving process and the conversions it starts may hold at their peak "
                             "(default 3072: a PDF's conversion alone may take --convert-memory-mb, 2048)")
    hostile = parser.add_argument_group("the second round of hostile input (0 leaves a part out)")
    hostile.add_argument("--html-kb", type=int, default=300,
                         help=f"KB of each page of unterminated tags ({len(HOSTILE_UNITS)} pages; default 300)")
    hostile.add_argument("--kills", type=int, default=1,
                         help=f"servers stopped mid-conversion by each of {len(STOPS)} signals, each followed by "
                              "one that sweeps its staging (default 1)")
    hostile.add_argument("--strangers", type=int, default=1,
                         help="check what a keyed server shows without its key, and the page's headers (default 1)")
    hostile.add_argument("--keyless", type=int, default=32, help="keyless bodies sent at once (default 32)")
    hostile.add_argument("--keyless-mb", type=int, default=50, help="MB of each keyless body (default 50)")
    hostile.add_argument("--in-flight", type=int, default=4,
                         help="bodies past the bytes in flight, each refused at once (default 4)")
    hostile.add_argument("--echo-mb", type=int, default=16,
                         help=f"MB of a name sent in each of {len(ECHOED)} fields (default 16)")
    hostile.add_argument("--frozen", type=int, default=1,
                         help=f"bodies of each of {len(FROZEN_KINDS)} kinds that could freeze the loop (default 1)")
    hostile.add_argument("--frozen-m", type=float, default=24.0,
                         help="millions of elements in the unknown key's array (a twelfth as many keys; default 24)")
    hostile.add_argument("--trickle", type=int, default=4, help="bodies trickled at once (default 4)")
    hostile.add_argument("--together", type=int, default=1,
                         help="long PDFs, each with a short note uploaded behind it (default 1)")
    hostile.add_argument("--together-pages", type=int, default=12,
                         help="pages of each long PDF, here and in --kills (default 12)")
    hostile.add_argument("--oom", type=int, default=1, help="PDFs whose conversion runs out of memory (default 1)")
    hostile.add_argument("--oom-memory-mb", type=int, default=700,
                         help="MiB a conversion may take on the server of --oom (default 700)")
    hostile.add_argument("--naming", type=int, default=1,
                         help="check the names of documents indexed from a folder outside the home (default 1)")
    bounds.add_argument("--health-bound", type=float, default=1.0,
                        help="seconds a health check may take while a live part runs (default 1)")
    parser.add_argument("--only", type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
                        default=None, metavar="NAMES",
                        help="run only these parts, by their options' names, comma-separated (e.g. "
                             "'html-kb,kills,trickle'); the others are left out")
    parser.add_argument("--no-write", action="store_true", help="print the section, store nothing")
    args = parser.parse_args()
    if args.only is not None:
        only(parser, args)
    logging.getLogger("marginalia.server").setLevel(logging.CRITICAL)  # 500s are counted, not logged
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="marginalia-fuzz-") as home:
        parts, tally = in_process(args, os.path.join(home, "in-process"))
        live_parts, live_tally = live(args, os.path.join(home, "live"))
        own_parts, own_tally = own_servers(args, os.path.join(home, "own"))
        parts += live_parts + own_parts
        result = numbers(parts, (tally, merged(live_tally, own_tally)), args, time.perf_counter() - t0,
                         (load_before, os.getloadavg()[0]))
    # a run of some parts only is stored beside the whole run's, not over it
    name = "server_fuzz" if args.only is None else "server_fuzz-some-parts"
    show(measurement("server_fuzz", result, name=name), write=not args.no_write)
    cross = sum(p.get("cells_wrong", 0) for p in result["parts"])
    failed = (result["server_errors"] + result["unhandled"] + result["http"]["unhandled"]
              + result["over_time_bound"] + result["health_over_bound"] + result["broken"]
              + (not result["memory_ok"]) + cross)
    print(f"{result['inputs']} inputs: {result['server_errors']} server errors, {result['unhandled']} unhandled, "
          f"{result['bad']} bad replies, {result['broken']} checks broken; {result['over_time_bound']} over "
          f"{args.time_bound:g} s, {result['health_over_bound']} health checks over {args.health_bound:g} s; peak "
          f"{result['peak_rss_mb']:.0f} MiB, {'under' if result['memory_ok'] else 'over'} the bound of "
          f"{args.memory_bound_mb:g}", file=sys.stderr)
    sys.exit(1 if failed else 0)


def summary(m: Record) -> list[list[str]]:
    n = m["numbers"]
    b = n["bounds"]
    return [["Fuzzing the HTTP service",
             f"{num(n['inputs'], 0)} inputs: {n['server_errors']} server errors, {n['unhandled']} unhandled, "
             f"{n['over_time_bound']} over {b['time_s']:g} s; {num(n['peak_rss_mb'], 0)} MiB "
             f"{'≤' if n['memory_ok'] else '>'} {num(b['memory_mb'], 0)}", made_by(m)]]


def outcomes(part: Record) -> str:
    """A fuzz part's outcomes: by status, summed over kinds ("kind: status"), unless the part shows its kinds
    ("Host: 421 3; own: 2xx 2", the page's own by status class); a loader's errors together ("ok 5, refused 2");
    then its server errors and unhandled exceptions, if any."""
    kinds: dict[str, dict[str, int]] = {}
    for outcome, count in part["outcomes"].items():
        kind, _, what = outcome.rpartition(": ")
        if kind == "own":
            what = f"{what[0]}xx"
        elif part["where"] == "in process" and what != "ok" and not what.endswith("xx") and not part.get("statuses"):
            what = "refused"
        mine = kinds.setdefault(kind if part.get("by_kind") else "", {})
        mine[what] = mine.get(what, 0) + count
    text = "; ".join(f"{kind}: " * bool(kind) + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                     for kind, counts in kinds.items())
    errors = [f"{what} {part.get(key)}" for what, key in (("5xx", "server_errors"), ("unhandled", "unhandled"))
              if part.get(key)]
    return "; ".join([text, *errors])


def section(m: Record) -> list[str]:
    n = m["numbers"]
    t = n["live_server"]
    health = max((p["health_slowest_s"] for p in n["parts"] if p.get("health_slowest_s") is not None), default=None)
    first = next((p["name"] for p in n["parts"] if p["where"] != "in process"), None)
    live = (f" From {first} on: `serve` in its own process, no key, timeouts {t['header_timeout']:g} s (headers, "
            f"body pause), {t['body_total_timeout']:g} s (body), {t['max_connections']} connections; `/v1/health` "
            f"every 0.1 s ≤ {num(health, 2)} s." if first else "")
    lines = ["Scripted model." + live, "",
             *table(["part", "inputs", "outcomes", "max s", "MiB (+ conversions)"],
                    [[p["name"], num(p["inputs"], 0), outcomes(p), num(p["slowest_s"]), num(p["peak_rss_mb"], 0)]
                     for p in n["parts"]], "lrlrr")]
    for p in n["parts"]:
        if "cells_wrong" in p:
            lines += ["", f"Across keys: **{p['cells_wrong']} cells wrong, {p['foreign_bytes']} bytes of the other "
                          "collection's text** in replies to each collection's keys."]
    if n.get("problems"):
        lines += ["", "Problems (first ones):", "", *(f"- `{q[:300]}`" for q in n["problems"][:10])]
    return lines


BENCHMARKS["server_fuzz"] = Benchmark("Fuzzing the service", section, summary)


if __name__ == "__main__":
    main()
