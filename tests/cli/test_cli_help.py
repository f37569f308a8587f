"""`--help` on one screen: options in groups (reading, a group per pattern record, collection, output), one line
of help each with its default, and every flag of an options record named as its field."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from marginalia import AutoOptions, RagOptions, WimOptions
from marginalia.cli import build_parser
from marginalia.cli.common import short_help
from marginalia.options import (
    ChunkingOptions,
    CollectionOptions,
    ComposeOptions,
    IngestOptions,
    Options,
    PatternOptions,
    TuneDataOptions,
    TuneOptions,
)


def command(*names: str) -> argparse.ArgumentParser:
    parser: Any = build_parser()
    for name in names:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return parser


def help_text(monkeypatch: pytest.MonkeyPatch, *names: str) -> str:
    monkeypatch.setenv("COLUMNS", "80")  # argparse fills to the terminal's width
    return command(*names).format_help()


def groups(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    return {g.title or "": {a.dest for a in g._group_actions} for g in parser._action_groups}


def test_ask_help_fits_on_one_screen(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = help_text(monkeypatch, "ask").splitlines()
    assert len(lines) <= 80, f"{len(lines)} lines"


@pytest.mark.parametrize("names", [("ask",), ("demo",), ("index",), ("compose",), ("serve",), ("tune", "data"),
                                   ("tune", "train")])
def test_help_lines_fit_the_terminal(monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...]) -> None:
    """What is counted is what is seen: descriptions are filled, not one long line."""
    lines = help_text(monkeypatch, *names).splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)


def test_ask_options_come_in_groups_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A group per pattern record for what it adds to the records it is built on, titled by the patterns that
    take those options (the registry's order, a record before those built on it)."""
    parser = command("ask")
    found = groups(parser)
    titles = ["options", "model", "reading", "WiM (--pattern wim or auto)", "retrieval (--pattern rag or auto)",
              "routing (--pattern auto)", "collection (--collection NAME)", "output"]
    text = help_text(monkeypatch, "ask")
    assert [t for t in found if t in titles] == titles
    assert [text.index(f"\n{t}:\n") for t in titles] == sorted(text.index(f"\n{t}:\n") for t in titles)
    assert {"pattern", "embedder", "no_cache", "cache_size", *PatternOptions.model_fields} == found["reading"]
    assert set(WimOptions.model_fields) - set(PatternOptions.model_fields) == found["WiM (--pattern wim or auto)"]
    assert set(RagOptions.model_fields) - set(PatternOptions.model_fields) \
        == found["retrieval (--pattern rag or auto)"]
    assert set(AutoOptions.model_fields) - set(WimOptions.model_fields) - set(RagOptions.model_fields) \
        == found["routing (--pattern auto)"]
    assert {"collection", *CollectionOptions.model_fields} == found["collection (--collection NAME)"]
    assert {"json", "quiet"} == found["output"]
    assert {"model", "device", "backend", "api_key"} == found["model"]
    assert "--no-cache neither use nor keep a stored reading (auto, wim)" in " ".join(text.split())


@pytest.mark.parametrize(("names", "records"), [
    (("ask",), [PatternOptions, AutoOptions, WimOptions, RagOptions, CollectionOptions]),
    (("demo",), [PatternOptions, AutoOptions, WimOptions, RagOptions]),
    (("index",), [ChunkingOptions, IngestOptions]),
    (("serve",), [IngestOptions]),
    (("compose",), [ComposeOptions]),
    (("tune", "data"), [TuneDataOptions]),
    (("tune", "train"), [TuneOptions]),
])
def test_flags_are_named_as_their_fields(names: tuple[str, ...], records: list[type[Options]]) -> None:
    actions = {a.dest: a for a in command(*names)._actions}
    for record in records:
        for name, info in record.model_fields.items():
            flag = "--" + name.replace("_", "-")
            if info.annotation is bool and info.default is True:  # a switch that is on: the flag turns it off
                flag = "--no-" + flag[2:]
            assert actions[name].option_strings == [flag], (name, actions[name].option_strings)


@pytest.mark.parametrize("names", [("ask",), ("index",), ("serve",), ("compose",), ("tune", "data"),
                                   ("tune", "train")])
def test_record_options_have_one_clause_of_help_and_show_their_default(monkeypatch: pytest.MonkeyPatch,
                                                                      names: tuple[str, ...]) -> None:
    parser = command(*names)
    text = " ".join(help_text(monkeypatch, *names).split())
    fields = {**PatternOptions.model_fields, **AutoOptions.model_fields, **WimOptions.model_fields,
              **RagOptions.model_fields,
              **CollectionOptions.model_fields, **ChunkingOptions.model_fields, **ComposeOptions.model_fields,
              **TuneDataOptions.model_fields, **TuneOptions.model_fields, **IngestOptions.model_fields}
    for action in parser._actions:
        if action.dest not in fields or not action.option_strings:
            continue
        assert "\n" not in (action.help or "") and "; " not in (action.help or ""), action.dest
        default = action.default
        if default is not None and not isinstance(default, bool):
            assert f"{action.option_strings[0]}" in text
            assert f"(default: {default})" in text, action.dest


def test_short_help_is_the_first_clause_without_asides_or_scope() -> None:
    assert short_help("wim: model tokens per segment") == "model tokens per segment"
    assert short_help("wim, grounded and separate judges: share of a margin's new words (by rarity) one sentence "
                      "read must hold; a margin copied from the text holds them all") \
        == "share of a margin's new words one sentence read must hold"
    assert short_help("how the answer is decoded: freely, or distinct (a (nested) aside)") \
        == "how the answer is decoded"
    assert short_help("stop reading at this score. Off when not given") == "stop reading at this score"
    assert short_help("below this similarity for every hit: 'no relevant references found'") \
        == "below this similarity for every hit: 'no relevant references found'"
    assert short_help(None) == ""
