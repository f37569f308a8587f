"""The `marginalia` command: ask questions of a document, run the demo, list models.

Answers go to stdout; margins as they arrive, progress and logs go to stderr.
Exit codes: 0 ok, 1 runtime failure, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Sequence
from importlib import resources
from types import FrameType
from typing import Any, TextIO

from . import __version__
from .errors import MarginaliaError, UserError
from .home import ENV_HOME

DEFAULT_SEGMENT_TOKENS = 512


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value}")
    return value


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default, except where there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "%(default)" not in text \
                and action.option_strings:
            text += " (default: %(default)s)"
        return text


def _model_help() -> str:
    import importlib.util

    from .models.registry import known_specs

    rows = "\n".join(f"  {form:<16} {text}" for form, text in known_specs())
    engine = ("llama.cpp (llama-cpp-python is installed)"
              if importlib.util.find_spec("llama_cpp") else
              "transformers (install llama-cpp-python for ~5x faster decoding)")
    return f"model specs:\n{rows}\n\nWith --backend auto, GGUF models run on {engine} here."


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--home", metavar="DIR", default=None,
                        help=f"where marginalia keeps model caches (default: ${ENV_HOME}, "
                             "else your user data directory)")
    common.add_argument("-v", "--verbose", action="store_true", help="log what is loaded and why")

    reading = argparse.ArgumentParser(add_help=False)
    reading.add_argument("--pattern", choices=("wim", "lc", "rag"), default="wim",
                         help="how to read: Writing in the Margins, long context, or retrieval")
    reading.add_argument("--model", default="smollm2", metavar="SPEC",
                         help="the language model (see 'marginalia models')")
    reading.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                         help="where the in-process model runs (auto: CUDA + bf16 if present)")
    reading.add_argument("--backend", choices=("auto", "llamacpp", "transformers"), default="auto",
                         help="engine for GGUF models (smollm2, gguf:): auto picks llama.cpp when "
                              "installed (about 5x faster decoding on CPU), else transformers")
    reading.add_argument("--segment-tokens", type=positive_int, default=DEFAULT_SEGMENT_TOKENS,
                         metavar="N", help="wim: model tokens per segment")
    reading.add_argument("--judge", choices=("grounded", "fused", "separate"), default="grounded",
                         help="wim: how margins are classified relevant (see README)")
    reading.add_argument("--margin-tokens", type=positive_int, default=48, metavar="N",
                         help="wim: the most tokens per margin")
    reading.add_argument("--max-tokens", type=positive_int, default=96, metavar="N",
                         help="the most tokens of the answer")
    reading.add_argument("--chunk-tokens", type=positive_int, default=128, metavar="N",
                         help="rag: model tokens per retrieved chunk")
    reading.add_argument("--top-k", type=positive_int, default=4, metavar="K",
                         help="rag: how many chunks the answer sees")
    reading.add_argument("--embedder", default="minilm", metavar="SPEC",
                         help="rag: 'minilm' (embedded), 'hashing', or 'st:<local folder>'")
    reading.add_argument("--api-key", default=None, metavar="KEY",
                         help="API key for openai: models (default: $MARGINALIA_API_KEY, "
                              "else $OPENAI_API_KEY)")
    reading.add_argument("--json", action="store_true",
                         help="print the answer, margins, references and stats as one JSON object")
    reading.add_argument("-q", "--quiet", action="store_true",
                         help="no margins or progress on stderr")

    parser = argparse.ArgumentParser(
        prog="marginalia",
        description="Answer questions over long documents with language models, reading them "
                    "with Writing in the Margins (wim), long context (lc) or retrieval (rag).",
        formatter_class=Formatter,
        epilog="Press Ctrl-C once while wim reads to stop reading and answer from what was "
               "read so far; twice to abort.",
    )
    parser.add_argument("--version", action="version", version=f"marginalia {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    ask = sub.add_parser(
        "ask", parents=[common, reading], formatter_class=Formatter,
        help="answer a question about a text or markdown file",
        description="Answer QUESTION about FILE (a text or markdown file, or - for stdin).",
        epilog=_model_help(),
    )
    ask.add_argument("file", metavar="FILE|-", help="the document (text or markdown), - for stdin")
    ask.add_argument("question", metavar="QUESTION", help="the question to answer")

    demo = sub.add_parser(
        "demo", parents=[common, reading], formatter_class=Formatter,
        help="read the bundled sample report with WiM and answer a question about it",
        description="Run a pattern on the bundled sample document (a ~6.5k-token harbour "
                    "report with planted facts) and compare the answer with the known one.",
        epilog=_model_help(),
    )
    demo.add_argument("--question", type=int, default=1, metavar="N",
                      help="which of the bundled questions to ask (see --list)")
    demo.add_argument("--list", action="store_true", help="list the bundled questions and exit")

    sub.add_parser("models", parents=[common], formatter_class=Formatter,
                   help="list the model spec forms", description=_model_help())

    serve = sub.add_parser(
        "serve-model", parents=[common], formatter_class=Formatter,
        help="serve a GGUF model (default: the embedded one) over an OpenAI-compatible API",
        description="Start llama-cpp-python's OpenAI-compatible server on a GGUF model, for "
                    "use as --model openai:http://HOST:PORT/v1#ALIAS;prompt=text. It keeps the "
                    "last prompt's KV cache, so WiM's prefix-extending requests read the "
                    "document once. Stop it with Ctrl-C.",
    )
    serve.add_argument("--model", default="smollm2", metavar="SPEC",
                       help="'smollm2' or 'gguf:<file>'")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=positive_int, default=8080, help="port to listen on")
    serve.add_argument("--n-ctx", type=positive_int, default=8192, metavar="N",
                       help="context window to allocate, in tokens")
    return parser


class Reporter:
    """Writes margins and progress to stderr as events arrive."""

    def __init__(self, quiet: bool, err: TextIO) -> None:
        self.quiet = quiet
        self.err = err
        self.bar: Any = None

    def log(self, message: str) -> None:
        if not self.quiet:
            if self.bar is not None:
                self.bar.write(message, file=self.err)
            else:
                print(message, file=self.err, flush=True)

    def event(self, event: Any) -> None:
        if self.quiet:
            return
        kind = event.kind
        if kind == "started":
            self.log(f"reading {event.context_tokens} tokens with {event.pattern} "
                     f"({event.segments_total} {'segments' if event.pattern == 'wim' else 'chunks'})")
            if event.pattern == "wim":
                from tqdm import tqdm

                self.bar = tqdm(total=event.segments_total, unit="seg", file=self.err,
                                dynamic_ncols=True, leave=False,
                                disable=not getattr(self.err, "isatty", lambda: False)())
        elif kind == "segment_read" and self.bar is None:
            seg = event.segment
            self.log(f"  retrieved chunk {seg.index + 1}/{event.total}: {_snippet(seg.text)}")
        elif kind == "margin_judged":
            m = event.margin
            mark = "+" if m.relevant else "-"
            self.log(f"  [{m.segment_index + 1}] {mark} {_snippet(m.text, 110)}"
                     + ("" if m.relevant else f"   ({m.reason})"))
            if self.bar is not None:
                self.bar.update(1)
        elif kind in ("answer_delta", "done") and self.bar is not None:
            self.bar.close()
            self.bar = None


def _snippet(text: str, width: int = 90) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "\u2026"


def run_pattern(args: argparse.Namespace, text: str, question: str, source: str,
                out: TextIO, err: TextIO) -> Any:
    """Load the model, read ``text`` with the chosen pattern, stream the answer."""
    from .models import load_generator
    from .patterns import make_pattern

    reporter = Reporter(args.quiet, err)
    t0 = time.perf_counter()
    generator = load_generator(args.model, home=args.home, device=args.device,
                               log=reporter.log if not args.quiet else None, backend=args.backend,
                               api_key=args.api_key)
    if args.verbose:
        device = getattr(generator, "device", "?")
        reporter.log(f"model {generator.name}: {type(generator).__name__} on {device}, "
                     f"window {generator.context_window} tokens, loaded in "
                     f"{time.perf_counter() - t0:.1f}s")
    options: dict[str, Any] = {"max_new_tokens": args.max_tokens}
    if args.pattern == "wim":
        options.update(segment_tokens=args.segment_tokens, judge=args.judge,
                       margin_tokens=args.margin_tokens)
    elif args.pattern == "rag":
        from .index.embedders import load_embedder

        options.update(embedder=load_embedder(args.embedder), chunk_tokens=args.chunk_tokens,
                       top_k=args.top_k)
    pattern = make_pattern(args.pattern, generator, **options)
    run = pattern.run(text, question, source=source)

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if run.stop_requested:
            raise KeyboardInterrupt
        run.stop()
        reporter.log("stopping: answering from what was read so far (Ctrl-C again to abort)")

    previous = signal.signal(signal.SIGINT, on_sigint)
    answer = None
    margins: list[Any] = []
    try:
        for event in run:
            reporter.event(event)
            if event.kind == "answer_delta" and not args.json:
                out.write(event.text)
                out.flush()
            elif event.kind == "margin_judged":
                margins.append(event.margin)
            elif event.kind == "done":
                answer = event.answer
    except MarginaliaError as exc:
        if args.json:  # what was read before the failure is not lost
            from dataclasses import asdict

            json.dump({"error": str(exc), "question": question, "pattern": args.pattern,
                       "margins": [asdict(m) for m in margins], "complete": False},
                      out, ensure_ascii=False, indent=2)
            out.write("\n")
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
    assert answer is not None
    if args.json:
        json.dump(answer.to_dict(), out, ensure_ascii=False, indent=2)
        out.write("\n")
    else:
        out.write("\n")
        if not args.quiet:
            for ref in answer.references[:5]:
                if ref.text != "(the whole document)":
                    reporter.log(f"  ref {ref.source}[{ref.start}:{ref.end}]: {_snippet(ref.text)}")
            s = answer.stats
            extra = f", stopped after {answer.segments_read}/{answer.segments_total} segments" \
                if answer.stopped_early else ""
            reporter.log(
                f"{answer.pattern}: {s.prefilled_context_tokens} context + "
                f"{s.prefilled_other_tokens} other tokens prefilled, "
                f"{s.generated_margin_tokens + s.generated_answer_tokens + s.generated_other_tokens}"
                f" generated, {s.total_seconds:.1f}s{extra}"
            )
    return answer


def cmd_ask(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .ingest.text import read_document
    from .patterns.base import check_question

    check_question(args.question)
    doc = read_document(args.file)
    run_pattern(args, doc.text, args.question, doc.source, out, err)
    return 0


def demo_files() -> tuple[str, list[dict[str, Any]]]:
    base = resources.files(__package__).joinpath("data", "demo")
    text = base.joinpath("harbour_report.md").read_text("utf-8")
    questions = json.loads(base.joinpath("harbour_report.questions.json").read_text("utf-8"))
    return text, questions


def cmd_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    text, questions = demo_files()
    if args.list:
        for i, q in enumerate(questions, 1):
            out.write(f"{i:>2}. {q['question']}  [{q['answer']}, at {q['position']:.0%}]\n")
        return 0
    if not 1 <= args.question <= len(questions):
        raise UserError(f"--question must be between 1 and {len(questions)} (see --list)")
    item = questions[args.question - 1]
    if not args.quiet:
        print(f"Demo: the bundled Kettleby Harbour Trust report, {len(text.split())} words.\n"
              f"Question: {item['question']}\n", file=err, flush=True)
    answer = run_pattern(args, text, item["question"], "harbour_report.md", out, err)
    if not args.quiet and not args.json:
        found = item["answer"].lower() in answer.text.lower()
        print(f"Expected: {item['answer']} ({'found' if found else 'not found'} in the answer)",
              file=err)
    return 0


def cmd_models(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    out.write(_model_help() + "\n")
    return 0


def serve_command(args: argparse.Namespace) -> tuple[list[str], str]:
    """The server's command line and the model spec that reaches it."""
    import importlib.util
    from pathlib import Path

    from .models.llamacpp_backend import LLAMACPP_INSTALL
    from .models.loaders import embedded_gguf

    if args.model == "smollm2":
        path, alias = embedded_gguf(), "smollm2"
    elif args.model.startswith("gguf:") and len(args.model) > 5:
        path = Path(args.model[5:]).expanduser()
        alias = path.stem
        if not path.is_file():
            raise UserError(f"no GGUF file at {path}; check the path after 'gguf:'")
    else:
        raise UserError(f"serve-model serves GGUF models: give 'smollm2' or 'gguf:<file>', not {args.model!r}")
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("uvicorn") is None:
        from .errors import MissingDependency

        raise MissingDependency("llama-cpp-python's server", LLAMACPP_INSTALL)
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(path),
               "--model_alias", alias, "--host", args.host, "--port", str(args.port),
               "--n_ctx", str(args.n_ctx), "--verbose", "true" if args.verbose else "false"]
    tokenizer = "" if alias == "smollm2" else f";tokenizer={args.model}"
    # that server penalises repeats by default: ask for plain greedy/temperature sampling
    # the server's /models does not report its window, so the spec carries it
    return command, (f"openai:http://{args.host}:{args.port}/v1#{alias};prompt=text"
                     f";window={args.n_ctx};x-repeat_penalty=1{tokenizer}")


def cmd_serve_model(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import subprocess

    command, spec = serve_command(args)
    print(f"serving {args.model} on http://{args.host}:{args.port}/v1 — use it with:\n"
          f"  marginalia ask FILE \"question\" --model '{spec}'", file=err, flush=True)
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    args = parser.parse_args(argv)
    commands = {"ask": cmd_ask, "demo": cmd_demo, "models": cmd_models,
                "serve-model": cmd_serve_model}
    try:
        return commands[args.command](args, out, err)
    except MarginaliaError as exc:
        print(f"marginalia: error: {exc}", file=err)
        return exc.exit_code
    except KeyboardInterrupt:
        print("marginalia: interrupted", file=err)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # an unexpected failure: short message, traceback on -v
        if getattr(args, "verbose", False):
            raise
        print(f"marginalia: unexpected error: {type(exc).__name__}: {exc} "
              "(run again with -v for the traceback)", file=err)
        return 1


if __name__ == "__main__":
    sys.exit(main())
