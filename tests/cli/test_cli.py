"""The `marginalia` command: output streams, JSON, exit codes and messages for bad input."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from marginalia.cli import build_parser, main

FACT = "The night ferry to Brackwater leaves from pier 47."


def run_cli(*argv: str, stdin: bytes | None = None, monkeypatch=None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    if stdin is not None:
        assert monkeypatch is not None
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def doc(tmp_path):
    path = tmp_path / "town.md"
    filler = "\n\n".join(
        f"Paragraph {i}. The market opened at dawn and the roads were quiet. "
        f"Rain fell on day {i} and the harbour stayed calm." for i in range(40)
    )
    path.write_text(filler + "\n\n" + FACT + "\n\n" + filler, encoding="utf-8")
    return path


def test_help_lists_every_option_with_defaults(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["ask", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for option in ("--pattern", "--model", "--segment-tokens", "--judge", "--margin-tokens",
                   "--max-new-tokens", "--chunk-tokens", "--top-k", "--embedder", "--support-threshold", "--json",
                   "--home", "--device", "--quiet"):
        assert option in text
    flat = " ".join(text.split())
    assert "(default: auto for a collection or a text over 2048 tokens, else wim)" in flat
    assert "(default: 512)" in text and "smollm2" in text


def test_ask_streams_answer_to_stdout_and_margins_to_stderr(doc):
    code, out, err = run_cli("ask", str(doc), "Which pier does the night ferry leave from?",
                             "--model", f"scripted:{FACT}", "--pattern", "wim", "--segment-tokens", "200")
    assert code == 0
    assert out.strip() == FACT
    assert "reading" in err and "[1]" in err        # margins are reported on stderr
    assert "+ " + FACT in err                        # the grounded margin was kept
    assert FACT not in err.split("[1]")[0]           # nothing of the answer before margins


def test_ask_json_has_answer_margins_references_stats(doc):
    code, out, _ = run_cli("ask", str(doc), "Which pier does the night ferry leave from?",
                           "--model", f"scripted:{FACT}", "--pattern", "wim", "--segment-tokens", "200", "--json",
                           "-q")
    assert code == 0
    data = json.loads(out)
    assert data["text"] == FACT and data["pattern"] == "wim"
    assert data["segments_total"] == len(data["margins"]) > 1
    kept = [m for m in data["margins"] if m["relevant"]]
    assert len(kept) == 1                            # the fact's sentence, cited once
    ref = data["references"][0]
    assert doc.read_text()[ref["start"]:ref["end"]] == FACT
    assert data["stats"]["prefilled_context_tokens"] == data["stats"]["context_tokens"]


def test_ask_reads_stdin(monkeypatch):
    code, out, _ = run_cli("ask", "-", "What is it?", "--model", "scripted:It is blue.",
                           "--pattern", "lc", "-q", stdin=b"The sky is blue.\n",
                           monkeypatch=monkeypatch)
    assert code == 0 and out.strip() == "It is blue."


def test_question_with_special_characters_is_passed_verbatim(doc):
    question = 'What is {x} and $y "z"\n— ü?'
    code, out, _ = run_cli("ask", str(doc), question, "--model", "scripted:ok",
                           "--pattern", "lc", "--json", "-q")
    assert code == 0
    assert json.loads(out)["question"] == question.strip()


@pytest.mark.parametrize(
    "setup, argv_tail, needle",
    [
        (None, ["q"], "no such file"),
        (b"", ["q"], "is empty"),
        (b"   \n\n", ["q"], "is empty"),
        (b"\x00\x01\x02binary", ["q"], "looks binary"),
        ("caf\xe9".encode("latin-1"), ["q"], "not valid UTF-8"),
        (b"some text", ["   "], "question is empty"),
        (b"some text", ["q", "--model", "smolm2"], "did you mean 'smollm2'"),
        (b"some text", ["q", "--model", "gguf:/no/such/model.gguf"], "no GGUF file"),
        (b"some text", ["q", "--model", "hf:/no/such/folder"], "no model directory"),
        (b"some text", ["q", "--model", "scripted:x", "--segment-tokens", "5000000"],
         "does not fit the model's window"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(tmp_path, setup, argv_tail, needle):
    path = tmp_path / "doc.txt"
    if setup is not None:
        path.write_bytes(setup)
    code, out, err = run_cli("ask", str(path), *argv_tail)
    assert code == 2
    assert out == ""
    assert needle in err
    assert "Traceback" not in err and err.startswith("marginalia: error:")


def test_usage_errors_exit_2_without_traceback(tmp_path):
    path = tmp_path / "doc.txt"
    path.write_text("text")
    for argv in (["ask", str(path), "q", "--segment-tokens", "0"],
                 ["ask", str(path), "q", "--pattern", "nope"],
                 ["ask", str(path)]):
        proc = subprocess.run([sys.executable, "-m", "marginalia.cli", *argv],
                              capture_output=True, text=True)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and "error" in proc.stderr


def test_lc_overflow_exits_2_naming_both_numbers(tmp_path, monkeypatch):
    from marginalia.models import registry
    from marginalia.models.fake import ScriptedGenerator

    monkeypatch.setitem(registry._NAMED, "tiny-window", (
        lambda arg, ctx: ScriptedGenerator(default="x", context_window=300), "test"))
    path = tmp_path / "long.txt"
    path.write_text("word " * 2000)
    code, _, err = run_cli("ask", str(path), "q", "--model", "tiny-window", "--pattern", "lc")
    assert code == 2
    assert "300" in err and "needs" in err and "window" in err


def test_demo_lists_bundled_questions():
    code, out, _ = run_cli("demo", "--list")
    assert code == 0
    lines = out.rstrip("\n").splitlines()
    assert len(lines) >= 12 and lines[0].startswith(" 1.")


def test_demo_runs_on_the_bundled_report_with_a_scripted_model():
    code, out, err = run_cli("demo", "--model", "scripted:The Orla Maye.", "-q")
    assert code == 0 and out.strip() == "The Orla Maye."


def test_failure_mid_run_keeps_margins_in_json(doc, monkeypatch):
    from marginalia.errors import BackendError
    from marginalia.models import registry
    from marginalia.models.fake import ScriptedGenerator

    calls = []

    def respond(request):
        calls.append(request)
        if len(calls) == 3:
            raise BackendError("the model server went away")
        return FACT

    monkeypatch.setitem(registry._NAMED, "flaky", (
        lambda arg, ctx: ScriptedGenerator(respond=respond), "test"))
    code, out, err = run_cli("ask", str(doc), "Which pier does the night ferry leave from?",
                             "--model", "flaky", "--pattern", "wim", "--segment-tokens", "200", "--json", "-q")
    assert code == 1
    assert "went away" in err
    data = json.loads(out)
    assert data["complete"] is False and "went away" in data["error"]
    assert [m["segment_index"] for m in data["margins"]] == [0, 1]


def test_api_key_option_reaches_the_backend(monkeypatch):
    from marginalia.models import registry

    seen = {}

    def factory(arg, ctx):
        seen["key"] = ctx.api_key
        from marginalia.models.fake import ScriptedGenerator
        return ScriptedGenerator(default="ok")

    monkeypatch.setitem(registry._NAMED, "keyed", (factory, "test"))
    code, _, _ = run_cli("ask", "-", "q", "--model", "keyed", "--api-key", "sk-test", "-q",
                         "--pattern", "lc", stdin=b"text", monkeypatch=monkeypatch)
    assert code == 0 and seen["key"] == "sk-test"


@pytest.mark.parametrize("command", [["questions", "generate", "--collection", "c"],
                                     ["bench", "qa-generate", "x.md", "--out", "o.jsonl"]])
def test_negative_retries_are_refused_before_a_model_loads(command, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*command, "--retries", "-1"])
    assert exc.value.code == 2
    assert "--retries: must be 0 or more, got -1" in capsys.readouterr().err
    assert build_parser().parse_args([*command, "--retries", "0"]).retries == 0


def test_counts_a_server_did_not_report_are_unknown_not_guessed(doc, monkeypatch):
    from blind_server import blind_generator
    from marginalia.models import registry

    def respond(prompt: str) -> str:  # a margin quotes the fact once it has been read; the answer names it
        return FACT if FACT in prompt else "Nothing about ferries here."

    monkeypatch.setitem(registry._NAMED, "blind", (lambda arg, ctx: blind_generator(respond), "test"))
    ask = ("ask", str(doc), "Which pier does the night ferry leave from?", "--model", "blind",
           "--pattern", "wim", "--segment-tokens", "200")
    code, out, _ = run_cli(*ask, "--json", "-q")
    assert code == 0
    stats = json.loads(out)["stats"]
    assert stats["prompt_cache_unreported"] > 0 and stats["prompt_tokens_sent"] > stats["context_tokens"]
    for key in ("prefilled_context_tokens", "reprefilled_context_tokens", "prefilled_other_tokens",
                "prompt_tokens_cached"):
        assert stats[key] is None, key
    code, out, err = run_cli(*ask)
    assert code == 0 and FACT in out
    summary = next(line for line in err.splitlines() if line.startswith("wim") and " generated, " in line)
    assert "tokens prefilled not reported by the server" in summary
    assert not any(ch.isdigit() for ch in summary.split(",")[0])  # no count of prefilled tokens


def test_model_folder_prints_the_converted_folder_of_a_gguf_model(tmp_path, monkeypatch):
    from marginalia.models.hf import loaders

    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    converted = []

    def convert(path, home, log=None):
        converted.append((path, home))
        return home / "models" / "tiny"

    monkeypatch.setattr(loaders, "convert_gguf", convert)
    code, out, _ = run_cli("model-folder", f"gguf:{gguf}", "--home", str(tmp_path / "home"))
    assert code == 0 and out == f"{tmp_path / 'home' / 'models' / 'tiny'}\n"
    assert converted == [(gguf, tmp_path / "home")]
    code, _, err = run_cli("model-folder", f"hf:{tmp_path}")
    assert code == 2 and "give 'smollm2' or 'gguf:<file>'" in err
    code, _, err = run_cli("model-folder", f"gguf:{tmp_path / 'missing.gguf'}")
    assert code == 2 and "no GGUF file" in err
