"""README.md and the docs/ pages against the code: their commands parse, their flags, config keys and imports exist."""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from marginalia.cli import build_parser

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: flags of other tools that the pages show: pip's (in the llama.cpp build command), vLLM's, SGLang's, llama-server's
OTHER_FLAGS = {"--no-cache-dir", "--enable-prefix-caching", "--enable-prompt-tokens-details", "--enable-cache-report",
               "--slot-save-path", "--parallel", "--show"}  # --show: benchmarks/report.py
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[tuple[str, str]]:
    """(page name, block text) for every fenced block in ``language`` on the pages."""
    return [(page.name, m.group(2)) for page in PAGES for m in FENCE.finditer(page.read_text("utf-8"))
            if m.group(1) == language]


def commands() -> list[tuple[str, list[str]]]:
    """(page name, arguments) of every ``marginalia ...`` command in the pages' shell blocks."""
    found = []
    for name, block in blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            if not re.search(r"(^|[\s|&(])marginalia\s", line):
                continue
            lex = shlex.shlex(line, posix=True, punctuation_chars=True)
            lex.whitespace_split = True
            tokens = list(lex)
            while "marginalia" in tokens:
                tokens = tokens[tokens.index("marginalia") + 1:]
                args = []
                for token in tokens:
                    if set(token) <= set("();<>|&"):
                        break
                    args.append(token)
                found.append((name, args))
    return found


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of ``parser`` and of its sub-commands, all the way down."""
    names: set[str] = set()
    for action in parser._actions:
        names.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                names |= option_strings(sub)
    return names


def test_the_pages_show_commands() -> None:
    pages = {name for name, _ in commands()}
    assert {"README.md", "reading.md", "collections.md", "serving.md", "composing.md", "benchmarking.md"} <= pages


@pytest.mark.parametrize(("page", "args"), commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_each_command_parses(page: str, args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        build_parser().parse_args(args)
    except SystemExit as exc:  # --help exits 0; a bad flag or value exits 2
        assert exc.code == 0, f"{page}: marginalia {' '.join(args)}: {capsys.readouterr().err}"


def test_every_flag_written_exists() -> None:
    known = option_strings(build_parser()) | OTHER_FLAGS
    written = {(page.name, flag) for page in PAGES
               for span in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", page.read_text("utf-8"), flags=re.S))
               for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", span)}
    assert written, "no flags found on the pages"
    assert {(page, flag) for page, flag in written if flag not in known} == set()


def test_config_blocks_are_valid_run_configs() -> None:
    from marginalia.bench.config import RunConfig

    configs = blocks("toml")
    assert configs
    for name, block in configs:
        config = RunConfig.model_validate(tomllib.loads(block))
        assert config.patterns, name


def test_python_blocks_import_what_exists() -> None:
    checked = 0
    for name, block in blocks("python"):
        tree = ast.parse(block, filename=name)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("marginalia"):
                module = importlib.import_module(node.module or "")
                for alias in node.names:
                    assert hasattr(module, alias.name), f"{name}: {node.module} has no {alias.name}"
                    checked += 1
    assert checked
