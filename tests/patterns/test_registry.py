"""The pattern registry: a pattern from outside the package, named by an entry point, appears in every front
end (the CLI's help, the HTTP schema, the page's options, the run config's kinds) and reads, with no file of
the package changed; the registry refuses bad registrations and finds a pattern by its record's name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import ClassVar

import pytest

from marginalia.errors import UserError
from marginalia.models.fake import ScriptedGenerator
from marginalia.options import PatternOptions
from marginalia.patterns import make_pattern, registry
from marginalia.patterns.long_context import LcOptions, LongContext

SRC = Path(__file__).resolve().parents[2] / "src"

TOY = '''
"""A toy way of reading: the answer is the text's first line, as many times as asked."""

from typing import ClassVar

from pydantic import Field

from marginalia.options import PatternOptions
from marginalia.patterns import Pattern, PatternSpec
from marginalia.records import Answer, AnswerDelta, Done, Started


class ToyOptions(PatternOptions):
    """Toy: the first line."""

    pattern: ClassVar[str] = "toy"
    echoes: int = Field(default=1, gt=0, le=5, description="toy: how many times the first line is said")


class Toy(Pattern):
    name = "toy"

    def __init__(self, generator, options=None):
        super().__init__(generator, options or ToyOptions())

    def _events(self, run, context, question, source):
        yield Started(self.name, 1, len(context.split()))
        text = " ".join([context.strip().splitlines()[0]] * self.options.echoes)
        yield AnswerDelta(text)
        yield Done(Answer(question=question, text=text, pattern=self.name, model=self.generator.name))


SPEC = PatternSpec(name="toy", options=ToyOptions, pattern=Toy, title="toy reading",
                   description="toy: the text's first line, whatever the question")
'''

PROBE = '''
import argparse, io, json, sys
from pathlib import Path

from fastapi.testclient import TestClient

from marginalia.bench.config import parse_config, pattern_record
from marginalia.cli import build_parser, main
from marginalia.index.embedders import HashingEmbedder
from marginalia.models.fake import ScriptedGenerator
from marginalia.server import Settings, create_app

here = Path(sys.argv[1])
parser = build_parser()
sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
help_text = sub.choices["ask"].format_help()

client = TestClient(create_app(Settings(), generator=ScriptedGenerator(default="x"), embedder=HashingEmbedder()),
                    base_url="http://localhost")
openapi = client.get("/openapi.json").json()
page = client.get("/v1/patterns").json()
asked = client.post("/v1/ask", json={"question": "What is it?", "text": "Harbour report\\nThe pier.",
                                     "reading": {"pattern": "toy", "echoes": 2}}).json()

config = parse_config({"tasks": [{"dataset": "niah"}], "patterns": [{"kind": "toy", "echoes": 3}]},
                      here / "run.toml")
record = pattern_record(config.patterns[0])

doc = here / "doc.md"
doc.write_text("Harbour report\\nThe pier is long.\\n", encoding="utf-8")
out, err = io.StringIO(), io.StringIO()
code = main(["ask", str(doc), "What is it?", "--pattern", "toy", "--echoes", "2", "--model", "scripted:x",
             "--json", "-q"], out=out, err=err)
print(json.dumps({
    "help": help_text,
    "openapi": sorted(openapi["components"]["schemas"]),
    "toy_schema": openapi["components"]["schemas"].get("ToyReading"),
    "page": [r["title"] for r in page["properties"]["reading"]["oneOf"]],
    "page_toy": next((r for r in page["properties"]["reading"]["oneOf"] if r["title"] == "toy"), None),
    "asked": asked,
    "kind": config.patterns[0].kind, "record": [type(record).__name__, record.echoes],
    "cli": [code, out.getvalue(), err.getvalue()],
}))
'''


def plugin(folder: Path) -> None:
    """An installed package of one module whose entry point names its `PatternSpec`."""
    (folder / "toy_reading.py").write_text(TOY, encoding="utf-8")
    info = folder / "toy_reading-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-reading\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[marginalia.patterns]\ntoy = toy_reading:SPEC\n", encoding="utf-8")


def test_a_pattern_from_an_entry_point_is_in_every_front_end(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    plugin(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SRC)]),
           "MARGINALIA_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    help_text = " ".join(seen["help"].split())
    assert "{auto,wim,lc,rag,toy}" in help_text
    assert "toy reading (--pattern toy): --echoes N how many times the first line is said (default: 1)" \
        in help_text
    assert "ToyReading" in seen["openapi"]
    assert seen["toy_schema"]["properties"]["echoes"]["maximum"] == 5
    assert seen["toy_schema"]["properties"]["pattern"]["const"] == "toy"
    assert seen["page"] == ["auto", "wim", "lc", "rag", "toy"]
    assert seen["page_toy"]["description"] == "toy: the text's first line, whatever the question"
    assert seen["page_toy"]["properties"]["echoes"]["default"] == 1
    assert seen["asked"]["text"] == "Harbour report Harbour report" and seen["asked"]["pattern"] == "toy"
    assert seen["kind"] == "toy" and seen["record"] == ["ToyOptions", 3]
    code, out, err = seen["cli"]
    assert code == 0, err
    assert json.loads(out)["text"] == "Harbour report Harbour report"


def test_without_the_plugin_the_pattern_is_unknown(tmp_path: Path) -> None:
    """The same probe's request fails where no entry point names the toy: what found it was the plugin."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "MARGINALIA_HOME": str(tmp_path / "home")}
    probe = "from marginalia.patterns import registry; print(','.join(registry.names()))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "auto,wim,lc,rag"


def test_a_broken_plugin_is_named_in_the_error(tmp_path: Path) -> None:
    plugin(tmp_path)
    (tmp_path / "toy_reading.py").write_text("raise RuntimeError('half-installed')\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SRC)])}
    probe = "from marginalia.patterns import registry; registry.names()"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0
    assert "the pattern plugin 'toy' (toy_reading:SPEC" in done.stderr and "half-installed" in done.stderr


class _Echo(PatternOptions):
    pattern: ClassVar[str] = "echo"


def test_register_refuses_what_would_not_work() -> None:
    spec = registry.get("lc")
    with pytest.raises(UserError, match="registered already"):
        registry.register(registry.PatternSpec(name="lc", options=LcOptions, pattern=LongContext,
                                               description="another lc"))
    with pytest.raises(UserError, match="must say pattern"):
        registry.register(registry.PatternSpec(name="echo2", options=LcOptions, pattern=LongContext,
                                               description="x"))
    with pytest.raises(UserError, match="pattern name 'default'"):
        registry.register(registry.PatternSpec(name="default", options=_Echo, pattern=LongContext,
                                               description="x"))
    registry.register(spec)  # the same spec again: nothing changes
    assert registry.names() == ("auto", "wim", "lc", "rag")


def test_a_registered_pattern_is_built_by_name_and_removed() -> None:
    gen = ScriptedGenerator(default="Pier 47.")
    registry.register(registry.PatternSpec(name="echo", options=_Echo, pattern=LongContext, description="echo"))
    try:
        assert "echo" in registry.names()
        built = make_pattern(_Echo(), gen)
        assert isinstance(built, LongContext) and built.answer("The pier is 47.", "Which pier?").text == "Pier 47."
    finally:
        registry.unregister("echo")
    with pytest.raises(UserError, match="unknown pattern 'echo'; choose one of auto, wim, lc, rag"):
        make_pattern("echo", gen)
    with pytest.raises(UserError, match="built-in"):
        registry.unregister("wim")


def test_the_one_embedder_rule() -> None:
    assert {s.name: registry.needs_embedder(s.name) for s in registry.specs()} == {
        "auto": True, "wim": False, "lc": False, "rag": True}


def test_example_in_the_docs_registers() -> None:
    """docs/patterns.md's module, run as written, gives a spec the registry takes and a pattern that reads."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "patterns.md").read_text("utf-8")
    code = page.split("## The module\n\n```python\n", 1)[1].split("```", 1)[0]
    space: dict[str, object] = {}
    exec(compile(textwrap.dedent(code), "patterns.md", "exec"), space)  # noqa: S102 - our own page's example
    spec = space["SPEC"]
    registry.register(spec)  # type: ignore[arg-type]
    try:
        answer = make_pattern("first", ScriptedGenerator(default="x"), sentences=2).answer(
            "The pier is long. It is old. Ships dock there.", "What is it?")
        assert answer.text == "The pier is long. It is old" and answer.pattern == "first"
    finally:
        registry.unregister("first")
