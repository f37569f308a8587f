"""The options records are the one place defaults, choices and bounds live: the CLI's flags and the
benchmark config's [[patterns]] tables agree with them, field by field."""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Any

import pytest

from marginalia import AutoOptions, LcOptions, RagOptions, WimOptions
from marginalia.app import pattern_options, pattern_specs
from marginalia.bench.config import parse_config, pattern_record
from marginalia.cli import build_parser, main
from marginalia.errors import UserError
from marginalia.models.fake import ScriptedGenerator
from marginalia.options import JUDGE_MODES, TOPIC_THRESHOLD, ChunkingOptions, CollectionOptions, IngestOptions
from marginalia.patterns import make_pattern
from marginalia.patterns.judges import make_judge

READING = [AutoOptions, WimOptions, LcOptions, RagOptions, CollectionOptions]


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_every_ask_and_demo_default_is_the_records() -> None:
    for args in (parse("ask", "doc.md", "q?"), parse("demo")):
        for record in READING if args.command == "ask" else READING[:4]:
            for name, info in record.model_fields.items():
                assert getattr(args, name) == info.default, (args.command, record.__name__, name)


def test_every_index_default_is_the_chunking_records() -> None:
    args = parse("index", "doc.md", "--collection", "c")
    for name, info in ChunkingOptions.model_fields.items():
        assert getattr(args, name) == info.default, name


@pytest.mark.parametrize("command", [("index", "doc.md", "--collection", "c"), ("serve",)])
def test_every_document_limit_default_is_the_ingest_records(command: tuple[str, ...]) -> None:
    args = parse(*command)
    for name, info in IngestOptions.model_fields.items():
        assert getattr(args, name) == info.default, name


def test_every_bench_pattern_default_is_the_records(tmp_path: Path) -> None:
    raw = {"tasks": [{"dataset": "niah"}], "patterns": [{"kind": s.name} for s in pattern_specs()]}
    config = parse_config(raw, tmp_path / "run.toml")
    for table in config.patterns:
        record = next(s.options for s in pattern_specs() if s.name == table.kind)
        assert pattern_record(table) == record()
        for name, info in record.model_fields.items():
            assert type(table).model_fields[name].default == info.default, (table.kind, name)
            assert type(table).model_fields[name].metadata == info.metadata, (table.kind, name)


def test_a_run_level_answer_budget_fills_only_patterns_that_set_none(tmp_path: Path) -> None:
    raw = {"max_new_tokens": 16, "tasks": [{"dataset": "niah"}],
           "patterns": [{"kind": "lc"}, {"kind": "wim", "max_new_tokens": 40}]}
    lc, wim = parse_config(raw, tmp_path / "run.toml").patterns
    assert (lc.max_new_tokens, wim.max_new_tokens) == (16, 40)


def test_cli_choices_come_from_the_records() -> None:
    parser = build_parser()
    ask = next(a for a in parser._subparsers._group_actions[0].choices["ask"]._actions  # type: ignore[union-attr]
               if a.dest == "judge")
    assert tuple(ask.choices) == JUDGE_MODES


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--segment-tokens", "0", "must be above 0"),
    ("--top-k", "-1", "must be above 0"),
    ("--grounding-threshold", "1.5", "must be at most 1.0"),
    ("--topic-threshold", "-0.1", "must be at least 0.0"),
    ("--max-new-tokens", "many", "expected a whole number"),
    ("--judge", "vibes", "invalid choice"),
])
def test_a_bad_flag_is_a_usage_error_naming_it(flag: str, value: str, says: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["ask", "doc.md", "q?", flag, value], out=io.StringIO(), err=io.StringIO())
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and says in err


def test_a_bad_combination_is_a_usage_error(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("Some text.", encoding="utf-8")
    err = io.StringIO()
    code = main(["ask", "--collection", "c", "q?", "--certain", "0.2", "--uncertain", "0.5"],
                out=io.StringIO(), err=err)
    assert code == 2 and "uncertain" in err.getvalue() and "certain" in err.getvalue()


@pytest.mark.parametrize(("pattern", "values", "says"), [
    ("wim", {"segment_tokens": 0}, "segment_tokens"),
    ("wim", {"judge": "vibes"}, "unknown judge 'vibes'"),
    ("rag", {"top_k": 0}, "top_k"),
    ("lc", {"top_k": 3}, "lc has no option 'top_k'"),
    ("skim", {}, "choose one of auto, wim, lc, rag"),
])
def test_records_refuse_bad_values_with_the_field_named(pattern: str, values: dict[str, Any], says: str) -> None:
    with pytest.raises(UserError) as info:
        pattern_options(pattern, **values)
    assert says in str(info.value)


#: choices no longer offered, each with a value it took
REMOVED = {"wim": {"answer_style": "short", "answer_decoding": "distinct", "margin_style": "extract",
                   "instructions": "margin", "tally_lists": False, "tally_only": False, "margin_decoding": "copy",
                   "kept_as": "sentence"},
           "lc": {"answer_style": "lead", "answer_decoding": "distinct"},
           "rag": {"split": "tokens", "answer_style": "short"}}


def test_wim_keeps_one_field_per_setting_that_stays() -> None:
    assert list(WimOptions.model_fields) == ["max_new_tokens", "segment_tokens", "judge", "margin_tokens",
                                             "grounding_threshold", "topic_threshold", "batch_margins",
                                             "stop_at_score"]
    assert JUDGE_MODES == ("grounded", "separate")
    assert list(RagOptions.model_fields) == ["max_new_tokens", "chunk_tokens", "top_k"]
    assert list(LcOptions.model_fields) == ["max_new_tokens"]


@pytest.mark.parametrize(("pattern", "field", "value"),
                         [(p, f, v) for p, fields in REMOVED.items() for f, v in fields.items()])
def test_a_removed_option_is_refused_by_name(pattern: str, field: str, value: Any) -> None:
    with pytest.raises(UserError, match=f"{pattern} has no option '{field}'"):
        pattern_options(pattern, **{field: value})


@pytest.mark.parametrize("judge", ["fused", "combined"])
def test_a_removed_judge_mode_is_refused(judge: str) -> None:
    with pytest.raises(UserError, match=f"unknown judge '{judge}'; choose 'grounded' or 'separate'"):
        WimOptions.build(judge=judge)


@pytest.mark.parametrize("flag", ["--answer-style", "--answer-decoding", "--margin-style", "--instructions",
                                  "--margin-decoding", "--kept-as", "--no-tally-lists", "--keep-list-notes",
                                  "--split"])
def test_a_removed_flag_is_a_usage_error(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["ask", "doc.md", "q?", flag], out=io.StringIO(), err=io.StringIO())
    assert exc.value.code == 2
    assert f"unrecognized arguments: {flag}" in capsys.readouterr().err


@pytest.mark.parametrize(("kind", "field", "value"),
                         [(p, f, v) for p, fields in REMOVED.items() for f, v in fields.items()])
def test_a_bench_config_naming_a_removed_option_fails_naming_it(kind: str, field: str, value: Any,
                                                                 tmp_path: Path) -> None:
    raw = {"tasks": [{"dataset": "niah"}], "patterns": [{"kind": kind, field: value}]}
    with pytest.raises(UserError, match=rf"run.toml: \[\[patterns\]\] #1 \({kind}\): unknown key '{field}'"):
        parse_config(raw, tmp_path / "run.toml")


def test_descriptions_say_what_and_why_not_how_a_benchmark_went() -> None:
    for record in READING:
        for name, info in record.model_fields.items():
            text = info.description or ""
            assert text and "\n" not in text, (record.__name__, name)
            assert "BENCHMARKS" not in text and "%" not in text and "measured" not in text, (record.__name__, name)


def test_records_are_frozen_and_refuse_unknown_fields() -> None:
    options = WimOptions()
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        options.segment_tokens = 3  # type: ignore[misc]
    with pytest.raises(UserError):
        ChunkingOptions.build(min_tokens=300, max_tokens=200)
    with pytest.raises(UserError):
        CollectionOptions.build(certain=0.2, uncertain=0.5)


def test_make_pattern_takes_a_record() -> None:
    gen = ScriptedGenerator()
    wim = make_pattern(WimOptions(segment_tokens=64, margin_tokens=7, max_new_tokens=11), gen)
    assert (wim.segment_tokens, wim.margin_params.max_new_tokens, wim.answer_params.max_new_tokens) == (64, 7, 11)  # type: ignore[attr-defined]
    rag = make_pattern(RagOptions(top_k=2, chunk_tokens=64), gen)
    assert (rag.top_k, rag.chunk_tokens) == (2, 64)  # type: ignore[attr-defined]
    assert make_pattern("lc", gen, max_new_tokens=5).options == LcOptions(max_new_tokens=5)


def test_the_judge_threshold_reaches_the_grounded_judge() -> None:
    wim = make_pattern(WimOptions(grounding_threshold=0.75), ScriptedGenerator())
    assert wim.judge.threshold == 0.75  # type: ignore[attr-defined]
    assert type(wim.judge) is type(make_judge("grounded", ScriptedGenerator()))  # type: ignore[attr-defined]


def test_the_topic_threshold_reaches_the_grounded_judge() -> None:
    default = make_pattern(WimOptions(), ScriptedGenerator())
    assert default.judge.topic_threshold == TOPIC_THRESHOLD  # type: ignore[attr-defined]
    wim = make_pattern(WimOptions(topic_threshold=0.0, grounding_threshold=0.6), ScriptedGenerator())
    assert (wim.judge.topic_threshold, wim.judge.threshold) == (0.0, 0.6)  # type: ignore[attr-defined]
