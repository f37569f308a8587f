"""What the fuzz tests and ``benchmarks/server_fuzz.py`` share: documents made to break the loaders, hostile
uploads and request bodies, a schemathesis run over the service's own OpenAPI schema, and the one check of
a reply (a status below 500 and, for an error, ``{"error": {"code", "message"}}``).

The tests run a few hundred examples of each; the benchmark runs thousands with the same strategies.
"""

from __future__ import annotations

import json
import random
import re
import tempfile
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from server_support import QUESTION, REPORT, index_text, scripted, wait_for

pytest.importorskip("lancedb")

from fastapi.testclient import TestClient  # noqa: E402

from marginalia import app as marginalia_app  # noqa: E402
from marginalia.app import pattern_specs  # noqa: E402
from marginalia.cli.common import _field_type  # noqa: E402
from marginalia.errors import IngestError, UserError  # noqa: E402
from marginalia.index.embedders import HashingEmbedder  # noqa: E402
from marginalia.ingest.base import Loader  # noqa: E402
from marginalia.ingest.loaders import _registry, loader_for  # noqa: E402
from marginalia.models.fake import WordTokenizer  # noqa: E402
from marginalia.options import ChunkingOptions, CollectionOptions  # noqa: E402
from marginalia.server import Settings, create_app  # noqa: E402

KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SAMPLE_PDF = Path(__file__).parent / "data" / "pdf" / "paper.pdf"

# -- documents for the loaders --------------------------------------------------------------------------------

#: one level of markdown nesting (each wraps what follows it)
MD_LEVELS = ("> ", "- ", "1. ", "  - ", "* > ", "[", "**", "`", "#", "<div>")
#: one level of HTML nesting: an opening tag (closed in reverse order, or never)
HTML_LEVELS = ("<div>", "<ul><li>", "<ol><li>", "<blockquote>", "<table><tr><td>", "<pre>", "<h2>", "<p>",
               "<script>", "<code>", "<li>", "<td>", "<svg>", "<details><summary>")
#: bits of markup that markdown and HTML care about, so random text hits their corners
MARKUP = ["#", "##", "###### ", "> ", "- ", "* ", "1. ", "```", "~~~", "    ", "\t", "\n", "\n\n", "|", "---",
          "===", "[", "](", ")", "<", ">", "</", "&amp;", "&#0;", "&#x110000;", "&", ";", "<br>", "<p>", "</p>",
          "<h1>", "</h1>", "<table>", "<tr>", "<td>", "</td>", "<pre>", "</pre>", "<!--", "-->", "<!doctype html>",
          "<html>", "<script>", "</script>", "<title>", "\r", "\r\n", "\x0c", "\u2028", "\ufeff", "\x00", "word",
          " ", "é", "\U0001f600", "%PDF-1.7"]


def nested_markdown(depth: int, level: str, closed: bool) -> str:
    """Markdown nested ``depth`` levels deep: quotes in quotes, lists in lists, brackets in brackets, ...
    (a list at most 2000 levels: its indentation grows with depth, so that is already 4 MB)."""
    if level in ("- ", "1. ", "  - "):
        return "\n".join("  " * i + level + f"item {i}" for i in range(min(depth, 2000))) + "\n"
    closing = {"[": "]", "**": "**", "`": "`", "<div>": "</div>"}.get(level, "")
    return level * depth + "deep text" + (closing * depth if closed else "") + "\n"


def nested_html(depth: int, level: str, closed: bool) -> str:
    """HTML nested ``depth`` levels deep, its tags closed in order or left open (a page cut short)."""
    closing = "".join(f"</{tag}>" for tag in reversed(re.findall(r"<(\w+)", level)))
    return "<!doctype html><html><body>" + level * depth + "deep text" + (closing * depth if closed else "")


def cut_utf8(text: str, cut: int) -> bytes:
    """``text`` as UTF-8, cut after ``cut`` bytes (maybe inside a character)."""
    data = text.encode("utf-8")
    return data[:cut % (len(data) + 1)]


markup_text = st.lists(st.sampled_from(MARKUP) | st.text(max_size=8), max_size=120).map("".join)
documents: st.SearchStrategy[bytes] = st.one_of(
    st.binary(max_size=3000),  # random bytes
    st.builds(cut_utf8, st.text(max_size=400) | markup_text, st.integers(0, 2000)),  # UTF-8 cut anywhere
    markup_text.map(lambda t: t.encode("utf-8", "surrogatepass")),  # lone surrogates too (invalid UTF-8)
    st.builds(nested_markdown, st.integers(1, 4000), st.sampled_from(MD_LEVELS), st.booleans())
    .map(str.encode),
    st.builds(nested_html, st.integers(1, 4000), st.sampled_from(HTML_LEVELS), st.booleans()).map(str.encode),
    st.sampled_from([b"", b" ", b"\n\n\n", b"\xef\xbb\xbf", b"\xef\xbb\xbf \t\r\n", b"<html></html>",
                     b"<!doctype html><script>x</script>", b"%PDF-", b"%PDF-1.7\n%%EOF", b"\x00"]),
    st.binary(max_size=2000).map(lambda b: b"%PDF-1.4\n" + b),  # looks like a PDF, is not one
    st.binary(max_size=2000).map(lambda b: b"<!doctype html>" + b),
)
#: the names a document may come under: every suffix a loader reads, one none reads, and none
names = st.sampled_from(sorted({f"doc{s}" for s in _registry()} | {"doc", "doc.PDF", "doc.Md", "doc.exe"}))


def loaders() -> list[Loader]:
    """Every registered loader, once each."""
    return list({id(loader): loader for loader in _registry().values()}.values())


def mutated_pdf(seed: int, flips: int, cut: float) -> bytes:
    """The sample PDF with ``flips`` random bytes changed, cut to a fraction ``cut`` of its length."""
    data = bytearray(SAMPLE_PDF.read_bytes())
    rng = random.Random(seed)
    for _ in range(flips):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data[:max(1, int(len(data) * cut))])


pdfs = st.builds(mutated_pdf, st.integers(0, 2**32), st.integers(0, 60), st.just(1.0) | st.floats(0.02, 1.0))

#: page content that draws text: a bomb of it makes the converter work for every line, not only inflate it
DRAW_TEXT = b"BT /helv 1 Tf 10 10 Td (aa) Tj ET\n"
MB = 1_000_000


def pdf_bomb(inflated: int, unit: bytes = DRAW_TEXT, filters: str = "/FlateDecode", level: int = 6) -> bytes:
    """A one-page PDF whose content stream inflates to about ``inflated`` bytes (``unit`` repeated after a line
    of text), compressed piece by piece so that it is never held inflated here. With ``filters``
    ``[/ASCIIHexDecode /FlateDecode]`` the zlib data is hex-encoded too: MuPDF must decode such a stream whole.
    The issue's bomb is ``pdf_bomb(200 * MB)``: about 600 KB."""
    import pymupdf

    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((72, 72), "A page whose content is mostly filler.", fontsize=11)
    xref = page.get_contents()[0]
    block = unit * max(1, (1 << 20) // len(unit))
    zipper = zlib.compressobj(level)
    parts = [zipper.compress(doc.xref_stream(xref) + b"\n")]
    parts += [zipper.compress(block) for _ in range(max(1, inflated // len(block)))]
    data = b"".join(parts) + zipper.flush()
    if "/ASCIIHexDecode" in filters:
        data = data.hex().encode() + b">"
    doc.update_stream(xref, data, compress=False)
    doc.xref_set_key(xref, "Filter", filters)
    return doc.tobytes()


def pdf_of_pages(pages: int) -> bytes:
    """A PDF of ``pages`` short pages, each with a paragraph in the middle of the page."""
    import pymupdf

    doc = pymupdf.open()
    for number in range(1, pages + 1):
        text = f"Page {number} says a few words of its own. " * 3
        doc.new_page().insert_textbox(pymupdf.Rect(72, 300, 520, 400), text, fontsize=11)
    return doc.tobytes()

_TOKENS = WordTokenizer()


def load_and_chunk(loader: Loader, data: bytes, name: str) -> str:
    """Load ``data`` as ``name`` with ``loader`` and cut it into sections and chunks as an upload would;
    return ``"ok"`` or the name of the project's error it was refused with. Anything else propagates.

    A loaded document's chunks must lie inside its text, each the text at its span.
    """
    try:
        doc, _ = loader.load(data, name)
        sections, chunks = marginalia_app.chunk_document(doc, _TOKENS.count, ChunkingOptions())
    except (UserError, IngestError) as exc:
        message = str(exc)
        if not message or name not in message:
            raise AssertionError(f"{type(exc).__name__} does not say which file: {message!r}") from exc
        return type(exc).__name__
    assert doc.text.strip() and sections and sections[0].start == 0 and sections[0].end == len(doc.text)
    for chunk in chunks:
        assert 0 <= chunk.start < chunk.end <= len(doc.text) and doc.text[chunk.start:chunk.end] == chunk.text
    return "ok"


def load_by_name(data: bytes, name: str) -> str:
    """Like `load_and_chunk`, with the loader marginalia would choose for the file (by content, then name)."""
    try:
        loader = loader_for(name, data)
    except UserError:
        return "unsupported"
    return load_and_chunk(loader, data, name)


# -- request bodies (shared with test_server_fuzz) -------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 10_000),
                    st.floats(allow_nan=False, allow_infinity=False, width=32), st.text(max_size=30))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=10), inner, max_size=3), max_leaves=6)


def field_values(info: Any) -> st.SearchStrategy[Any]:
    """Values of an options field's type, within the usual bounds (the wild bodies try the rest)."""
    kind, choices = _field_type(info.annotation)
    if choices is not None:
        return st.sampled_from(choices)
    if kind is bool:
        return st.booleans()
    if kind is int:
        return st.integers(1, 600)
    return st.floats(0.0, 1.0)


def record_dicts(cls: Any) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={name: field_values(info) for name, info in cls.model_fields.items()})


PATTERN_OPTIONS = {spec.name: spec.options for spec in pattern_specs()}
readings = st.sampled_from(list(PATTERN_OPTIONS)).flatmap(
    lambda p: record_dicts(PATTERN_OPTIONS[p]).map(lambda d, p=p: {"pattern": p, **d}))
sources = st.sampled_from([{"text": REPORT}, {"collection": "docs"}, {"collection": "docs", "document": "report.md"},
                           {"text": REPORT}, {"collection": "docs"}, {"collection": "docs", "document": "other.md"},
                           {"collection": "nowhere"}])
near_valid = st.builds(
    lambda source, question, reading, more: {"question": question, **source, "reading": reading, **more},
    sources, st.sampled_from([QUESTION, "What dredger was hired?", "zebra?"]), readings,
    st.fixed_dictionaries({}, optional={"collection_options": record_dicts(CollectionOptions),
                                        "stream": st.booleans(), "temperature": st.floats(0, 2)}))
wild = st.fixed_dictionaries({}, optional={
    "question": st.sampled_from([QUESTION, "", "  ", "?", "\ud800?"]) | scalars,
    "text": st.sampled_from([REPORT, "", "x", "lone \udc00 surrogate"]) | scalars,
    "collection": st.sampled_from(["docs", "nowhere", "../x", "", "a" * 300]) | scalars,
    "document": st.sampled_from(["report.md", "other", "../../etc/passwd"]) | scalars, "reading": readings | values,
    "collection_options": values, "stream": st.booleans() | scalars, "temperature": st.floats(-1, 3) | scalars,
    "extra": values})
ask_bodies = st.one_of(near_valid, near_valid, near_valid, wild)  # three in four near valid

#: file names a client may send: paths up and out, absolute, NUL, backslashes, very long, odd characters
upload_names = st.one_of(
    st.sampled_from(["report.md", "../../etc/passwd", "/etc/passwd", "..\\..\\boot.ini", "C:\\Windows\\x.txt",
                     "a\x00b.md", "notes.md\x00.pdf", "x" * 3000 + ".md", "...", ".md", ".", "~/.ssh/id_rsa",
                     "émigré.md", "\u202etxt.exe", "con.txt", "a/b/c/../../d.html", "doc.PDF", "page.htm"]),
    st.text(max_size=40), st.builds(lambda a, b: a + b, st.text(max_size=20), st.sampled_from(list(_registry()))))
upload_contents = st.one_of(documents, st.just(REPORT.encode()), st.builds(cut_utf8, st.just(REPORT), st.integers()))


# -- the service --------------------------------------------------------------------------------------------


def post_json(client: TestClient, url: str, body: Any) -> Any:
    """POST ``body`` as JSON with non-ASCII escaped, so a lone surrogate travels as ``\\ud800`` (httpx's own
    encoding writes UTF-8, which cannot hold one)."""
    return client.post(url, content=json.dumps(body), headers={"content-type": "application/json"})



def check_reply(status: int, content_type: str, body: bytes) -> list[str]:
    """What is wrong with a reply: a status of 500 or more, or an error that is not the one JSON shape."""
    problems = []
    if status >= 500:
        problems.append(f"status {status}")
    if status >= 400 and status != 499:
        try:
            error = json.loads(body)["error"]
            assert isinstance(error["code"], str) and error["code"]
            assert isinstance(error["message"], str) and error["message"]
        except (ValueError, KeyError, TypeError, AssertionError):
            problems.append(f"status {status} without the error shape: {body[:200]!r}")
        if not content_type.startswith("application/json"):
            problems.append(f"status {status} as {content_type!r}, not JSON")
    return problems


def conformance(case: Any, reply: Any) -> list[str]:
    """What schemathesis finds wrong with a reply by the schema: an undocumented status or content type, a
    body that does not match the documented one (the error shape included)."""
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    try:
        case.validate_response(reply, checks=[status_code_conformance, content_type_conformance,
                                              response_schema_conformance])
    except Exception as exc:  # noqa: BLE001 - schemathesis raises its failures as one group
        return [f"not as the schema says: {exc}"[:600]]
    return []


#: the codes of the 503s that are refusals by a bound: a connection past the limit, a body past the bytes in flight
REFUSALS = ("busy", "overloaded")


@dataclass
class Tally:
    """What a fuzz run sent and got back."""

    statuses: Counter[int] = field(default_factory=Counter)
    times: list[float] = field(default_factory=list)  # each request's seconds, in the order sent
    unhandled: int = 0  # exceptions that escaped the app (a test client sees them; a real server answers 500)
    bad: int = 0  # replies (or uploads' jobs) with a problem
    busy: int = 0  # 503s past the server's connections or bytes in flight: a bound at work, not a server error
    problems: list[str] = field(default_factory=list)  # the first ones

    @property
    def requests(self) -> int:
        return sum(self.statuses.values()) + self.unhandled

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500) - self.busy

    def reply(self, what: str, status: int, content_type: str, body: bytes, seconds: float) -> list[str]:
        """Count one reply over a real socket and check it (`check_reply`); a 503 whose error is one of
        `REFUSALS` (a connection past the server's limit, a body past its bytes in flight) is a refusal, not a
        server error."""
        self.statuses[status] += 1
        self.times.append(seconds)
        problems = check_reply(status, content_type, body)
        if problems == [f"status {status}"] and status == 503 and json.loads(body)["error"]["code"] in REFUSALS:
            self.busy += 1
            problems = []
        self.note(what, problems)
        return problems

    def classes(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for status, n in self.statuses.items():
            out[f"{status // 100}xx"] += n
        return dict(sorted(out.items()))

    def note(self, what: str, problems: list[str]) -> None:
        if problems:
            self.bad += 1
            if len(self.problems) < 50:
                self.problems.append(f"{what}: {'; '.join(problems)}")


class FuzzedService:
    """The app on the scripted model and a hashing embedder, with a key, a collection ``docs`` holding
    ``report.md``, and a chat session: what generated requests may name to get past a 404."""

    def __init__(self, home: str | Path | None = None) -> None:
        self.home = str(home or tempfile.mkdtemp(prefix="marginalia-fuzz-"))
        # schemathesis addresses the app as 'testserver', a name it must be told to answer to
        self.app = create_app(Settings(home=self.home, api_key=KEY, embedder="hashing",
                                       allowed_hosts=("testserver",)), generator=scripted(),
                              embedder=HashingEmbedder())
        # a client may name minilm for a new collection; the fake stands in for it (loading it takes seconds)
        self.app.state.service._embedders["minilm"] = HashingEmbedder()
        self.client = TestClient(self.app, headers=AUTH, raise_server_exceptions=False)
        self.tally = Tally()
        self.known: dict[str, str] = {}
        self.restore()

    def restore(self) -> None:
        """Bring back what a generated DELETE took: the collection, its document, the session."""
        if self.client.get("/v1/collections/docs/documents/report.md").status_code == 404:
            job = index_text(self.client, "docs", "report.md", REPORT)
            assert job["status"] == "done", job
            self.known.update(name="docs", document="report.md", job_id=job["id"])
        if "session_id" not in self.known or self.client.get(
                f"/v1/sessions/{self.known['session_id']}").status_code == 404:
            reply = self.client.post("/v1/sessions", json={"collection": "docs", "document": "report.md"})
            assert reply.status_code == 201, reply.text
            self.known["session_id"] = reply.json()["id"]

    # -- schemathesis --

    @cached_property
    def schema(self) -> Any:
        """The app's OpenAPI schema, loaded by schemathesis from ``/openapi.json`` through the ASGI app."""
        import schemathesis

        return schemathesis.openapi.from_asgi("/openapi.json", self.app, headers=AUTH)

    def operations(self) -> list[Any]:
        """Every operation of the schema."""
        return [result.ok() for result in self.schema.get_all_operations()]

    def cases(self, operation: Any = None) -> st.SearchStrategy[Any]:
        """Requests for an operation (default: any), valid by the schema (positive) and not (negative)."""
        from schemathesis import GenerationMode

        source = operation if operation is not None else self.schema
        return st.one_of(source.as_strategy(), source.as_strategy(GenerationMode.NEGATIVE))

    def send_case(self, case: Any, aim: bool) -> list[str]:
        """Send one generated request with the key (``aim``: its path names what exists) and check the reply."""
        if aim and case.path_parameters:
            for name in case.path_parameters:
                if name in self.known:
                    case.path_parameters[name] = self.known[name]
        what = f"{case.method} {case.formatted_path}"
        start = time.perf_counter()
        try:
            reply = case.call(headers=AUTH, timeout=60)
        except Exception as exc:  # noqa: BLE001 - an exception out of the app is what is counted
            self.tally.times.append(time.perf_counter() - start)
            self.tally.unhandled += 1
            problems = [f"unhandled {type(exc).__name__}: {exc}"]
            self.tally.note(what, problems)
            return problems
        self.tally.times.append(time.perf_counter() - start)
        self.tally.statuses[reply.status_code] += 1
        content_type = reply.headers.get("content-type") or [""]  # schemathesis keeps each header's values
        problems = check_reply(reply.status_code, content_type[0], reply.content) + conformance(case, reply)
        self.tally.note(what, problems)
        if case.method.upper() == "DELETE" and reply.status_code < 300:
            self.restore()
        return problems

    # -- bodies and uploads through the test client --

    def send(self, method: str, url: str, **kw: Any) -> tuple[Any, list[str]]:
        start = time.perf_counter()
        reply = self.client.request(method, url, **kw)
        self.tally.times.append(time.perf_counter() - start)
        self.tally.statuses[reply.status_code] += 1
        problems = check_reply(reply.status_code, reply.headers.get("content-type", ""), reply.content)
        self.tally.note(f"{method} {url}", problems)
        return reply, problems

    def post_json(self, url: str, body: Any) -> list[str]:
        """POST a JSON body (see `post_json`) and check the reply."""
        return self.send("POST", url, content=json.dumps(body), headers={"content-type": "application/json"})[1]

    def upload(self, name: str, data: bytes, wait: bool = True) -> list[str]:
        """Upload ``data`` as ``name`` to ``docs``; an accepted one's job must end done, or failed with an
        error that is not ``internal_error``; its document's name is never a path."""
        reply, problems = self.send("POST", "/v1/collections/docs/documents", files={"file": (name, data)})
        if reply.status_code != 202 or problems:
            return problems
        document, more = reply.json()["document"], []
        if "/" in document or "\\" in document or document.startswith(".") or len(document) > 120:
            more.append(f"the document name {document!r} could be a path")
        if wait:
            job = wait_for(lambda: (j := self.client.get(reply.headers["location"]).json())["status"]
                           in ("done", "failed") and j, timeout=120)
            if job["status"] == "failed" and job["error"]["code"] == "internal_error":
                more.append(f"its job failed unexpectedly: {job['error']}")
        self.tally.note(f"upload {name!r}", more)
        return more


# -- the service in a process of its own, and what it takes ------------------------------------------------------

MIB = 1024 * 1024


def unreachable(name: str) -> Any:
    """A scripted model named ``name`` whose every request fails as a model server that cannot be reached
    does, the error quoting ``name`` (a reply must show it without credentials)."""
    from marginalia.errors import BackendError

    def respond(request: Any) -> str:
        raise BackendError(f"the model server of {name} could not be reached: connection refused")

    return scripted(respond, name=name)


def serve(home: str, settings: dict[str, Any], model: str | None = None) -> None:
    """Serve the app on the scripted model and a hashing embedder with uvicorn, as `marginalia serve` does (its
    bounds, on 127.0.0.1 and a free port, no key unless ``settings`` give one; ``ingest`` as a dict of
    `IngestOptions` fields); print the port on a line of its own, then serve until stopped. With ``model``, the
    model is `unreachable` under that name. What `LiveService` runs in its child process."""
    import logging
    import os
    import sys

    import uvicorn

    from marginalia.options import IngestOptions
    from marginalia.server.limits import server_config
    from marginalia.server.net import listening_socket

    logging.getLogger("marginalia.server").setLevel(logging.CRITICAL)  # 500s are counted, not logged
    if "ingest" in settings:
        settings = {**settings, "ingest": IngestOptions(**settings["ingest"])}
    app = create_app(Settings(home=home, embedder="hashing", **settings),
                     generator=unreachable(model) if model else scripted(), embedder=HashingEmbedder())
    app.state.service._embedders["minilm"] = HashingEmbedder()
    sock = listening_socket("127.0.0.1", 0)
    print(sock.getsockname()[1], flush=True)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nothing more to the parent, which stops reading
    server = uvicorn.Server(server_config(app, app.state.service.settings, host="127.0.0.1",
                                          port=sock.getsockname()[1], log_level="critical", access_log=False))
    server.run(sockets=[sock])


class LiveService:
    """The app served over real sockets by uvicorn in a child process (`serve`), so that its memory is its own;
    ``settings`` are `Settings` fields (its bounds; with ``api_key``, the client sends that key), ``model`` the
    name of an `unreachable` model to serve. Requests go through one HTTP client; what comes back is checked
    (`check_reply`) and counted in ``tally``."""

    def __init__(self, home: str | Path, start_timeout: float = 180.0, model: str | None = None,
                 **settings: Any) -> None:
        import os
        import select
        import subprocess
        import sys

        import httpx

        import marginalia

        self.settings = settings
        paths = [str(Path(__file__).resolve().parent), str(Path(marginalia.__file__).resolve().parents[1])]
        code = ("import json, sys; sys.path[:0] = json.loads(sys.argv[1]); import fuzz_support; "
                "fuzz_support.serve(sys.argv[2], json.loads(sys.argv[3]), sys.argv[4] or None)")
        Path(home).mkdir(parents=True, exist_ok=True)
        self.log = Path(home) / "server.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen([sys.executable, "-c", code, json.dumps(paths), str(home),
                                             json.dumps(settings), model or ""], stdout=subprocess.PIPE, stderr=log,
                                            env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)})
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], start_timeout)
        line = self.process.stdout.readline() if ready else b""
        self.process.stdout.close()
        if not line.strip().isdigit():
            self.close()
            raise RuntimeError(f"the server did not start: {self.log.read_text(errors='replace')[-2000:]}")
        self.port = int(line)
        self.url = f"http://127.0.0.1:{self.port}"
        key = settings.get("api_key")
        self.http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(600.0, connect=30.0),
                                 headers={"Authorization": f"Bearer {key}"} if key else {})
        self.tally = Tally()
        wait_for(lambda: self.http.get("/v1/health").status_code == 200, timeout=start_timeout)

    @property
    def pid(self) -> int:
        return self.process.pid

    def request(self, method: str, path: str, what: str = "", **kw: Any) -> tuple[Any, float]:
        """Send one request (httpx's keywords) and check its reply; (the reply or None when none came, seconds)."""
        import httpx

        start = time.perf_counter()
        try:
            reply = self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            seconds = time.perf_counter() - start
            self.tally.note(what or f"{method} {path}", [f"no reply: {type(exc).__name__}: {exc}"])
            return None, seconds
        seconds = time.perf_counter() - start
        self.tally.reply(what or f"{method} {path}", reply.status_code, reply.headers.get("content-type", ""),
                         reply.content, seconds)
        return reply, seconds

    def close(self) -> None:
        import subprocess

        if getattr(self, "http", None) is not None:
            self.http.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> LiveService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _high_water(pid: int) -> int:
    """The most resident memory process ``pid`` has held, in bytes, since it started or its mark was last
    reset (Linux's ``VmHWM``); 0 where the system does not say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class MemoryWatch:
    """The peak resident memory of a process and the processes it started (a document's conversion), summed:
    sampled every ``interval`` seconds in a thread, and the process's own high-water mark where Linux keeps one
    (so a peak between two samples still counts). `reset` starts a new peak (one part of a run)."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        import threading

        import psutil

        self.pid = pid
        self.process = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True, name="memory-watch")
        self._thread.start()

    def rss(self) -> int:
        """The resident bytes of the process and its descendants now."""
        import psutil

        total = 0
        try:
            processes = [self.process, *self.process.children(recursive=True)]
        except psutil.Error:
            return 0
        for process in processes:
            try:
                total += process.memory_info().rss
            except psutil.Error:  # ended between the listing and the reading
                pass
        return total

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.rss())

    def reset(self) -> None:
        """Forget the peak so far (and the process's high-water mark, where Linux lets us)."""
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        except OSError:
            pass
        self.peak = self.rss()

    def peak_mb(self) -> float:
        """The peak since the last `reset`, in MiB."""
        return max(self.peak, self.rss(), _high_water(self.pid)) / MIB

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
