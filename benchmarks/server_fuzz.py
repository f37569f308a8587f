"""The long fuzz of the HTTP service and the loaders: how many generated inputs were sent, what came back,
and that no request got a 5xx and no input raised anything but the project's own errors.

(1) Schemathesis: requests generated from the app's own OpenAPI schema (``/openapi.json``) for every
operation, valid by the schema and not, sent with the server's key through the ASGI app; half of them name
what exists (the collection, its document, a session, a job) so they get past a 404. ``--requests`` at least.
(2) Hypothesis: ``--documents`` documents (random bytes, UTF-8 cut anywhere, markdown and HTML nested
thousands of levels deep, empty ones, ...) each through the loader marginalia picks and through another
loader, on into sections and chunks; ``--asks`` bodies for ``POST /v1/ask``; ``--uploads`` files with
hostile names and contents, each upload's job followed to its end.
(3) ``--pdfs`` copies of the sample PDF with random bytes changed and cut short, through the PDF loader;
one line of ``--line-mb`` MB through every text loader and the chunker.

All on the scripted model and the hashing embedder (tests/fuzz_support.py holds the strategies and the
checks, shared with the tests).

    python benchmarks/server_fuzz.py [--requests 1000] [--documents 6500] [--asks 2500] [--uploads 1000]
                                     [--pdfs 30] [--line-mb 10] [--no-write]

Stores benchmarks/measurements/server_fuzz.json (unless ``--no-write``; see benchmarks/report.py) and prints its
section.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from _common import load_note, measurement, show  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fuzz_support as fz  # noqa: E402
from marginalia.ingest.loaders import _registry  # noqa: E402


@dataclass
class Part:
    """One part of the run: inputs made, their outcomes, and what went wrong."""

    name: str
    inputs: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    unhandled: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def failed(self, what: str, exc: BaseException) -> None:
        self.unhandled += 1
        if len(self.problems) < 10:
            self.problems.append(f"{what}: {''.join(traceback.format_exception(exc))[-600:]}")


def quick(n: int) -> settings:
    """Hypothesis settings for ``n`` generated examples, no shrinking (failures are counted, not raised)."""
    return settings(max_examples=n, phases=[Phase.generate], database=None, deadline=None,
                    suppress_health_check=list(HealthCheck))


def run_schemathesis(service: fz.FuzzedService, target: int) -> Part:
    operations = service.operations()
    part = Part(f"schemathesis requests ({len(operations)} operations)")
    per_operation = math.ceil(target / len(operations))
    t0 = time.perf_counter()

    def run(cases: st.SearchStrategy[Any], n: int) -> None:
        @quick(n)
        @given(case=cases, aim=st.booleans())
        def send(case: Any, aim: bool) -> None:
            service.send_case(case, aim)

        send()

    for operation in operations:
        run(service.cases(operation), per_operation)
    while service.tally.requests < target:  # an operation with few distinct requests gives fewer
        run(service.cases(), target - service.tally.requests)
    part.seconds = time.perf_counter() - t0
    tally = service.tally
    part.inputs, part.unhandled, part.problems = tally.requests, tally.unhandled, tally.problems[:10]
    part.outcomes.update(tally.classes())
    return part


def run_documents(n: int) -> Part:
    part = Part("documents through the loaders")
    t0 = time.perf_counter()

    @quick(n)
    @given(data=fz.documents, name=fz.names, loader=st.sampled_from(fz.loaders()))
    def load(data: bytes, name: str, loader: Any) -> None:
        part.inputs += 1
        for how, call in (("chosen", lambda: fz.load_by_name(data, name)),
                          (type(loader).__name__, lambda: fz.load_and_chunk(loader, data, name))):
            try:
                part.outcomes[call()] += 1
            except Exception as exc:  # noqa: BLE001 - counted: anything but the project's errors
                part.failed(f"{how} {name} {data[:60]!r}", exc)

    load()
    part.seconds = time.perf_counter() - t0
    return part


def run_bodies(service: fz.FuzzedService, n: int) -> Part:
    part = Part("POST /v1/ask bodies")
    before = service.tally.statuses.copy()
    t0 = time.perf_counter()

    @quick(n)
    @given(body=fz.ask_bodies)
    def ask(body: Any) -> None:
        part.inputs += 1
        try:
            service.post_json("/v1/ask", body)  # what is wrong with the reply goes to service.tally
        except Exception as exc:  # noqa: BLE001
            part.failed(f"ask {str(body)[:200]}", exc)

    ask()
    part.seconds = time.perf_counter() - t0
    part.outcomes.update(classes(service.tally.statuses - before))
    return part


def run_uploads(service: fz.FuzzedService, n: int) -> Part:
    part = Part("uploads (job followed to its end)")
    before = service.tally.statuses.copy()
    t0 = time.perf_counter()

    @quick(n)
    @given(name=fz.upload_names, data=fz.upload_contents)
    def upload(name: str, data: bytes) -> None:
        part.inputs += 1
        try:
            service.upload(name, data)  # what is wrong with the reply or the job goes to service.tally
        except Exception as exc:  # noqa: BLE001
            part.failed(f"upload {name!r}", exc)

    upload()
    part.seconds = time.perf_counter() - t0
    part.outcomes.update(classes(service.tally.statuses - before))
    return part


def run_pdfs(n: int) -> Part:
    part = Part("mutated PDFs")
    pdf = _registry()[".pdf"]
    t0 = time.perf_counter()

    @quick(n)
    @given(data=fz.pdfs)
    def load(data: bytes) -> None:
        part.inputs += 1
        try:
            part.outcomes[fz.load_and_chunk(pdf, data, "paper.pdf")] += 1
        except Exception as exc:  # noqa: BLE001
            part.failed("pdf", exc)

    load()
    part.seconds = time.perf_counter() - t0
    return part


def run_long_line(mb: int) -> Part:
    part = Part(f"one {mb} MB line")
    data = b"word " * (mb * 1_000_000 // 5)
    t0 = time.perf_counter()
    for suffix in (".md", ".txt", ".html"):
        part.inputs += 1
        try:
            part.outcomes[fz.load_and_chunk(_registry()[suffix], data, "long" + suffix)] += 1
        except Exception as exc:  # noqa: BLE001
            part.failed(suffix, exc)
    part.seconds = time.perf_counter() - t0
    return part


def classes(statuses: Counter[int]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for status, count in statuses.items():
        out[f"{status // 100}xx"] += count
    return dict(out)


def numbers(parts: list[Part], service: fz.FuzzedService, args: argparse.Namespace, total: float,
            load: tuple[float, float]) -> dict[str, Any]:
    """The run as the measurement file holds it: HTTP requests by status class, server errors and replies with a
    problem, each part's inputs, outcomes and unhandled exceptions, and the first problems met."""
    http = service.tally
    return {
        "requests_target": args.requests,
        "http": {"requests": http.requests, "classes": http.classes(), "server_errors": http.server_errors,
                 "unhandled": http.unhandled, "bad": http.bad},
        "hypothesis_inputs": sum(p.inputs for p in parts[1:4]),
        "unhandled": sum(p.unhandled for p in parts),
        "parts": [{"name": p.name, "inputs": p.inputs, "outcomes": dict(sorted(p.outcomes.items())),
                   "unhandled": p.unhandled, "seconds": p.seconds} for p in parts],
        "problems": [q[:300] for q in (http.problems + [q for p in parts for q in p.problems])[:10]],
        "load": load_note(load[0], load[1], "wall times are noisy"),
        "total_min": total / 60,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="schemathesis requests, at least (default 1000)")
    parser.add_argument("--documents", type=int, default=6500, help="documents through the loaders (default 6500)")
    parser.add_argument("--asks", type=int, default=2500, help="POST /v1/ask bodies (default 2500)")
    parser.add_argument("--uploads", type=int, default=1000, help="uploads, each job followed (default 1000)")
    parser.add_argument("--pdfs", type=int, default=30, help="mutated copies of the sample PDF (default 30)")
    parser.add_argument("--line-mb", type=int, default=10, help="MB of the one long line (default 10)")
    parser.add_argument("--no-write", action="store_true", help="print the section, store nothing")
    args = parser.parse_args()
    logging.getLogger("marginalia.server").setLevel(logging.CRITICAL)  # 500s are counted, not logged
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="marginalia-fuzz-") as home:
        service = fz.FuzzedService(home)
        parts = [run_schemathesis(service, args.requests)]
        print(f"schemathesis: {parts[-1]}", file=sys.stderr)
        parts.append(run_documents(args.documents))
        print(f"documents: {parts[-1].inputs} in {parts[-1].seconds:.0f} s", file=sys.stderr)
        parts.append(run_bodies(service, args.asks))
        print(f"asks: {parts[-1].inputs} in {parts[-1].seconds:.0f} s", file=sys.stderr)
        parts.append(run_uploads(service, args.uploads))
        print(f"uploads: {parts[-1].inputs} in {parts[-1].seconds:.0f} s", file=sys.stderr)
        parts.append(run_pdfs(args.pdfs))
        parts.append(run_long_line(args.line_mb))
        result = numbers(parts, service, args, time.perf_counter() - t0, (load_before, os.getloadavg()[0]))
    show(measurement("server_fuzz", result), write=not args.no_write)
    failed = service.tally.server_errors + service.tally.unhandled + sum(p.unhandled for p in parts)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
