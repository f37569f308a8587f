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

Every input's seconds are kept (an upload's until its job ended; a slow client's until the server answered or
closed): each part reports its slowest and its 99th percentile, and how many went over the time bound. While a
part against the live server runs, ``/v1/health`` is asked every 0.1 s on a connection of its own; its seconds
count against the bound too (a request that stalls the server stalls everyone). Memory is the peak resident
size of the process that serves, with the processes it starts (a PDF's conversion) added: the live server's
for (4), this process's own, fuzzer included, for (1)-(3).

All on the scripted model and the hashing embedder (tests/fuzz_support.py holds the strategies, the checks and
the live server, shared with the tests).

    python benchmarks/server_fuzz.py [--requests 1000] [--documents 6500] [--asks 2500] [--uploads 1000]
                                     [--pdfs 30] [--line-mb 10] [--bombs 4] [--slow 25] [--wide 8]
                                     [--origins 500] [--unpunctuated 3] [--unpunctuated-kb 100] [--cross 20]
                                     [--time-bound 30] [--memory-bound-mb 3072] [--no-write]

A count of 0 leaves its part out. Stores benchmarks/measurements/server_fuzz.json (unless ``--no-write``; see
benchmarks/report.py) and prints its section; exits 1 on a server error, an unhandled exception or a broken bound.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
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
#: connection, short enough that each slow client ends well within the time bound, and fewer connections, so
#: that holding all of them is quick
LIVE: dict[str, Any] = {"header_timeout": 5.0, "body_timeout": 5.0, "body_total_timeout": 15.0, "max_connections": 64}
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

    def failed(self, what: str, exc: BaseException) -> None:
        self.unhandled += 1
        if len(self.problems) < 10:
            self.problems.append(f"{what}: {''.join(traceback.format_exception(exc))[-600:]}")

    def took(self, outcome: str, seconds: float) -> None:
        """One input made: its outcome and its seconds."""
        self.inputs += 1
        self.outcomes[outcome] += 1
        self.times.append(seconds)

    def summary(self, time_bound: float) -> dict[str, Any]:
        """The part as the measurement holds it."""
        out = {"name": self.name, "where": self.where, "inputs": self.inputs,
               "outcomes": dict(sorted(self.outcomes.items())), "unhandled": self.unhandled,
               "server_errors": self.server_errors, "seconds": self.seconds,
               "slowest_s": max(self.times, default=None), "p99_s": percentile(self.times, 99),
               "over_time_bound": sum(t > time_bound for t in self.times + self.probes),
               "peak_rss_mb": self.peak_rss_mb, **self.notes}
        if self.by_kind:
            out["by_kind"] = True
        if self.probes:
            out["health_slowest_s"] = max(self.probes)
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
    start = time.perf_counter()
    reply, _ = live.request("POST", f"/v1/collections/{collection}/documents", f"upload {name}",
                            files={"file": (name, data)})
    if reply is None:
        return "no reply", time.perf_counter() - start
    if reply.status_code != 202:
        return str(reply.status_code), time.perf_counter() - start
    while True:
        job = live.http.get(reply.headers["location"]).json()
        if job["status"] in ("done", "failed"):
            break
        if time.perf_counter() - start > GIVE_UP:
            return "not finished", time.perf_counter() - start
        time.sleep(0.05)  # polling the job, as a client would
    seconds = time.perf_counter() - start
    if job["status"] == "done":
        return "indexed", seconds  # added, or a duplicate of what an earlier upload added
    if job["error"]["code"] == "internal_error":
        live.tally.note(f"upload {name}", [f"its job failed unexpectedly: {job['error']}"])
    return job["error"]["code"], seconds


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


def exchange(live: fz.LiveService, sent: bytes, trickle: bytes = b"", every: float = 0.5,
             opened: socket.socket | None = None, start: float | None = None) -> tuple[str, float]:
    """On a connection of its own (or ``opened``), send ``sent``, then a byte of ``trickle`` every ``every``
    seconds while any is left, until the server answers and closes: (the status, or "closed" when it closed
    without a word, or "no reply"; seconds from the connection to the close). The reply is checked."""
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
    if not data.startswith(b"HTTP/"):
        return ("closed" if not data else "garbled"), seconds
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    content_type = next((line.split(b":", 1)[1].strip().decode("latin-1") for line in head.split(b"\r\n")[1:]
                         if line.lower().startswith(b"content-type:")), "")
    live.tally.reply(f"slow client {sent[:40]!r}", status, content_type, body, seconds)
    return str(status), seconds


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
        held = []
        for _ in range(limit):
            start = time.perf_counter()
            sock = socket.create_connection(("127.0.0.1", live.port), timeout=30)
            sock.sendall(half)
            held.append(pool.submit(exchange, live, b"", opened=sock, start=start))
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
    summaries = [p.summary(args.time_bound) for p in parts]
    peak = max((p.peak_rss_mb for p in parts), default=0.0)
    return {
        "requests_target": args.requests,
        "bounds": {"time_s": args.time_bound, "memory_mb": args.memory_bound_mb},
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
        "peak_rss_mb": peak,
        "memory_ok": peak <= args.memory_bound_mb,
        "parts": summaries,
        "problems": [q[:300] for q in ([q for t in tallies for q in t.problems]
                                       + [q for p in parts for q in p.problems])[:10]],
        "load": load_note(load[0], load[1], "wall times are noisy"),
        "total_min": total / 60,
    }


def in_process(args: argparse.Namespace, home: str) -> tuple[list[Part], fz.Tally]:
    """Parts (1)-(3)."""
    made: list[fz.FuzzedService] = []

    def service() -> fz.FuzzedService:  # made for the first part that sends requests (it indexes a document)
        if not made:
            made.append(fz.FuzzedService(home))
        return made[0]

    watch = fz.MemoryWatch(os.getpid())
    parts = []
    try:
        for count, run in ((args.requests, lambda: run_schemathesis(service(), watch, args.requests)),
                           (args.documents, lambda: run_documents(watch, args.documents)),
                           (args.asks, lambda: run_bodies(service(), watch, args.asks)),
                           (args.uploads, lambda: run_uploads(service(), watch, args.uploads)),
                           (args.pdfs, lambda: run_pdfs(watch, args.pdfs)),
                           (args.line_mb, lambda: run_long_line(watch, args.line_mb)),
                           (args.cross, lambda: run_cross(watch, os.path.join(home, "cross"), args.cross))):
            if count:
                parts.append(run())
                report(parts[-1])
    finally:
        watch.close()
    return parts, made[0].tally if made else fz.Tally()


def live(args: argparse.Namespace, home: str) -> tuple[list[Part], fz.Tally]:
    """Parts (4), against the service in a process of its own."""
    parts: list[Part] = []
    if not (args.bombs or args.slow or args.wide or args.origins or args.unpunctuated):
        return parts, fz.Tally()
    with fz.LiveService(home, **LIVE) as service:
        watch = fz.MemoryWatch(service.pid)
        try:
            for count, run in ((args.bombs, lambda: run_bombs(service, watch, args.bombs)),
                               (args.slow, lambda: run_slow(service, watch, args.slow)),
                               (args.wide, lambda: run_wide(service, watch, args.wide)),
                               (args.origins, lambda: run_origins(service, watch, args.origins)),
                               (args.unpunctuated, lambda: run_unpunctuated(service, watch, args.unpunctuated,
                                                                            args.unpunctuated_kb))):
                if count:
                    parts.append(run())
                    report(parts[-1])
        finally:
            watch.close()
    return parts, service.tally


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
    parser.add_argument("--no-write", action="store_true", help="print the section, store nothing")
    args = parser.parse_args()
    logging.getLogger("marginalia.server").setLevel(logging.CRITICAL)  # 500s are counted, not logged
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="marginalia-fuzz-") as home:
        parts, tally = in_process(args, os.path.join(home, "in-process"))
        live_parts, live_tally = live(args, os.path.join(home, "live"))
        parts += live_parts
        result = numbers(parts, (tally, live_tally), args, time.perf_counter() - t0,
                         (load_before, os.getloadavg()[0]))
    show(measurement("server_fuzz", result), write=not args.no_write)
    cross = sum(p.get("cells_wrong", 0) for p in result["parts"])
    failed = (result["server_errors"] + result["unhandled"] + result["http"]["unhandled"]
              + result["over_time_bound"] + (not result["memory_ok"]) + cross)
    print(f"{result['inputs']} inputs: {result['server_errors']} server errors, {result['unhandled']} unhandled, "
          f"{result['bad']} bad replies; {result['over_time_bound']} over {args.time_bound:g} s; peak "
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
