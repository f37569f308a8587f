"""Reading one document: ask, demo, models, serve-model and model-folder."""

from __future__ import annotations

import argparse
import json
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any, TextIO

import annotated_types

from .. import app
from ..errors import MarginaliaError, UserError
from ..options import ROUTE_TOKENS, CollectionOptions, PatternOptions
from ..records import to_json
from .common import (
    MODEL_NOTE,
    Formatter,
    Reporter,
    _checked,
    _model_help,
    add_record_options,
    load_model,
    model_options,
    port_number,
    positive_int,
    record_from_args,
    snippet,
)

#: how to stop a reading, said under the reading commands' options
STOP_NOTE = ("Ctrl-C once while wim reads: answer from what was read so far; twice: abort. "
             + MODEL_NOTE)
METAVARS = {"top_k": "K", "certain": "SIM", "uncertain": "SIM"}


def add_reading_options(parser: argparse.ArgumentParser, *, collection: bool = False,
                        default: str | None = None) -> None:
    """The registered patterns' options: the reading group (the pattern, what every pattern takes, the
    embedder and the stored readings), then a group per record for the options it adds to those it is built
    on; then (with ``collection``) a collection's, then the output's. ``default``: the pattern when none is
    given (None: the route by size, `app.default_options`)."""
    specs = app.pattern_specs()
    reading = parser.add_argument_group("reading")
    by_size = f"auto for a collection or a text over {ROUTE_TOKENS} tokens, else wim"
    names = [s.name for s in specs]
    reading.add_argument("--pattern", choices=names, default=default,
                         help="the way of reading" + ("" if default else f" (default: {by_size})"))
    add_record_options(reading, PatternOptions, metavars=METAVARS)
    # the embedder loads only for a pattern that needs one (`app.needs_embedder`)
    reading.add_argument("--embedder", default=app.DEFAULT_EMBEDDER, metavar="SPEC",
                         help="minilm, hashing or st:<folder>")
    cached = ", ".join(s.name for s in specs if s.read_text is not None)
    reading.add_argument("--no-cache", action="store_true", help=f"neither use nor keep a stored reading ({cached})")
    reading.add_argument("--cache-size", type=_checked(float, [annotated_types.Gt(0)]),
                         default=app.DEFAULT_CACHE_BYTES / 2**30, metavar="GB",
                         help="the most disk stored readings take")
    claimed = set(PatternOptions.model_fields)
    for spec in sorted(specs, key=lambda s: len(s.options.__mro__)):  # a record before those built on it
        own = [name for name in spec.options.model_fields if name not in claimed]
        if own:
            users = _for([spec.name] + [s.name for s in specs
                                        if s is not spec and set(own) & set(s.options.model_fields)])
            add_record_options(parser.add_argument_group(f"{spec.heading} ({users})"), spec.options, fields=own,
                               metavars=METAVARS)
            claimed.update(own)
    if collection:
        coll = parser.add_argument_group("collection (--collection NAME)")
        coll.add_argument("--collection", "-c", metavar="NAME", help="answer from this indexed collection")
        add_record_options(coll, CollectionOptions, metavars=METAVARS)
    output = parser.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="print the answer, margins, route and stats as JSON")
    output.add_argument("-q", "--quiet", action="store_true", help="no margins or progress on stderr")


def _for(names: Any) -> str:
    """``--pattern a or b`` for the patterns named."""
    names = list(names)
    return "--pattern " + (" or ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + f" or {names[-1]}")


def pattern_from_args(args: argparse.Namespace) -> PatternOptions:
    """The chosen pattern's options record, from the flags (auto's when no pattern is chosen: the route by
    size picks from it once the text is known)."""
    result: PatternOptions = record_from_args(app.pattern_spec(args.pattern or app.AutoOptions.pattern).options,
                                              args)
    return result


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ask, demo, models, serve-model and model-folder."""
    models = model_options()
    ask = sub.add_parser(
        "ask", parents=[common, models], formatter_class=Formatter,
        usage="%(prog)s [options] FILE|- QUESTION\n       %(prog)s [options] --collection NAME QUESTION",
        help="answer a question about a file, or about a collection",
        description="Answer QUESTION about FILE, or about an indexed collection (from its question bank when a "
                    "stored question matches, else by reading what retrieval finds).",
        epilog=STOP_NOTE,
    )
    ask.add_argument("file", metavar="FILE|-", nargs="?",
                     help="the document to read, - for stdin")
    ask.add_argument("question", metavar="QUESTION", help="the question to answer")
    add_reading_options(ask, collection=True)

    demo = sub.add_parser(
        "demo", parents=[common, models], formatter_class=Formatter, usage="%(prog)s [options]",
        help="read the bundled sample report with WiM and answer a question about it",
        description="Run a pattern on the bundled sample document (a ~6.5k-token harbour "
                    "report with planted facts) and compare the answer with the known one.",
        epilog=STOP_NOTE,
    )
    demo.add_argument("--question", type=int, default=1, metavar="N",
                      help="which of the bundled questions to ask (see --list)")
    demo.add_argument("--list", action="store_true", help="list the bundled questions and exit")
    add_reading_options(demo, default="wim")  # the demo shows WiM reading

    models_cmd = sub.add_parser("models", parents=[common], formatter_class=Formatter,
                                help="list the model spec forms", description=_model_help())
    models_cmd.set_defaults(handler=cmd_models)

    serve = sub.add_parser(
        "serve-model", parents=[common], formatter_class=Formatter,
        help="serve a GGUF model (default: the embedded one) over an OpenAI-compatible API",
        description="Start llama-cpp-python's OpenAI-compatible server on a GGUF model, for "
                    "use as --model openai:http://HOST:PORT/v1#ALIAS;prompt=text. It keeps the "
                    "last prompt's KV cache, so WiM's prefix-extending requests read the "
                    "document once; requests that arrive together wait their turn. The exact "
                    "--model spec is printed at start. Stop it with Ctrl-C.",
    )
    serve.add_argument("--model", default="smollm2", metavar="SPEC",
                       help="'smollm2' or 'gguf:<file>'")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=port_number, default=8080, help="port to listen on")
    serve.add_argument("--n-ctx", type=positive_int, default=8192, metavar="N",
                       help="context window to allocate, in tokens")
    folder = sub.add_parser(
        "model-folder", parents=[common], formatter_class=Formatter,
        help="print the Hugging Face folder of a GGUF model (default: the embedded one), for vLLM or SGLang",
        description="De-quantize a GGUF model once into a Hugging Face folder (config, safetensors weights, "
                    "tokenizer) under the home directory, and print its path: what a serving engine loads, e.g. "
                    "`vllm serve $(marginalia model-folder) --served-model-name smollm2`. `make vllm-serve` "
                    "serves the embedded model so on vLLM's CPU build.",
    )
    folder.add_argument("model", nargs="?", default="smollm2", metavar="SPEC", help="'smollm2' or 'gguf:<file>'")
    ask.set_defaults(handler=cmd_ask)
    demo.set_defaults(handler=cmd_demo)
    serve.set_defaults(handler=cmd_serve_model)
    folder.set_defaults(handler=cmd_model_folder)


def run_pattern(args: argparse.Namespace, text: str, question: str, source: str,
                out: TextIO, err: TextIO) -> Any:
    """Load the model, read ``text`` (or the collection) with the chosen pattern, stream the answer."""
    options = pattern_from_args(args)
    reading = record_from_args(CollectionOptions, args) if getattr(args, "collection", None) else None
    reporter = Reporter(args.quiet, err)
    generator = load_model(args, reporter)
    if args.pattern is None and isinstance(options, app.AutoOptions):  # the route by size
        options = app.default_options(None if reading is not None else text, generator, options)
    if reading is not None:
        # no pattern and no option set: the collection's reading profile for this model, where it has one
        named = None if args.pattern is None and options == app.AutoOptions() else options
        run = app.ask_collection(args.collection, question, named, reading, generator=generator, home=args.home)
    else:
        embedder = app.load_embedder(args.embedder) if app.needs_embedder(options) else None
        cache = None if args.no_cache else app.document_cache(args.home, int(args.cache_size * 2**30))
        run = app.ask_text(text, question, options, generator=generator, source=source, embedder=embedder,
                           cache=cache)

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if run.stop_requested:
            raise KeyboardInterrupt
        run.stop()
        reporter.log("stopping: answering from what was read so far (Ctrl-C again to abort)")

    previous = signal.signal(signal.SIGINT, on_sigint)
    margins: list[Any] = []
    try:
        for event in run:
            reporter.event(event)
            if event.kind == "answer_delta" and not args.json:
                out.write(event.text)
                out.flush()
            elif event.kind == "margin_judged":
                margins.append(event.margin)
    except MarginaliaError as exc:
        if args.json:  # what was read before the failure is not lost
            json.dump({"error": str(exc), "question": question, "pattern": options.pattern,
                       "margins": [to_json(m) for m in margins], "complete": False},
                      out, ensure_ascii=False, indent=2)
            out.write("\n")
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
    answer = run.answer()
    if args.json:
        json.dump(answer.to_dict(), out, ensure_ascii=False, indent=2)
        out.write("\n")
    else:
        out.write("\n")
        if not args.quiet:
            for ref in answer.references[:5]:
                if ref.text != "(the whole document)":
                    where = " > ".join(ref.section_path)
                    where = f" {where}" if where else ""
                    page = f" p.{ref.page}" if ref.page else ""
                    reporter.log(f"  ref {ref.source}{page}{where} [{ref.start}:{ref.end}]: {snippet(ref.text)}")
            s = answer.stats
            extra = f", stopped after {answer.segments_read}/{answer.segments_total} segments" \
                if answer.stopped_early else ""
            if s.dropped_context_tokens:
                extra += (f", {s.dropped_context_tokens} context tokens dropped to make room "
                          f"(the cache held {s.peak_cache_tokens} at most)")
            cached = f" ({s.cached_context_tokens} more from a cache)" if s.cached_context_tokens else ""
            if s.prefilled_context_tokens is None or s.prefilled_other_tokens is None:
                prefilled = f"tokens prefilled not reported by the server{cached}"
            else:
                prefilled = (f"{s.prefilled_context_tokens} context{cached} + "
                             f"{s.prefilled_other_tokens} other tokens prefilled")
            route = f" \u2192 {answer.route.taken}" if answer.route is not None else ""
            reporter.log(
                f"{answer.pattern}{route}: {prefilled}, "
                f"{s.generated_margin_tokens + s.generated_answer_tokens + s.generated_other_tokens}"
                f" generated, {s.total_seconds:.1f}s{extra}"
            )
            if s.prompt_cache_unreported:
                reporter.log(f"  ({s.prompt_cache_unreported} of the server's replies did not say what its prompt "
                             "cache saved; vLLM says so when started with --enable-prompt-tokens-details, "
                             "SGLang with --enable-cache-report)")
    return answer


def cmd_ask(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    app.check_question(args.question)
    pattern_from_args(args)  # a bad combination of options fails before anything loads
    if args.collection:
        if args.file is not None:
            raise UserError("give either FILE or --collection, not both")
        record_from_args(CollectionOptions, args)
        app.open_collection(args.collection, home=args.home)  # fail fast, before loading the model
        run_pattern(args, "", args.question, args.collection, out, err)
        return 0
    if args.file is None:
        raise UserError("give the document to read (FILE, or - for stdin) before the question, "
                        "or --collection NAME to ask an indexed collection")
    doc = app.read_file(args.file)
    run_pattern(args, doc.text, args.question, doc.source, out, err)
    return 0


def demo_files() -> tuple[str, list[dict[str, Any]]]:
    """The bundled report and its questions (see `marginalia.app.demo`)."""
    return app.demo()


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


def serve_command(args: argparse.Namespace, log: Callable[[str], None] | None = None) -> tuple[list[str], str]:
    """The server's command line and the model spec that reaches it (``log``: what making the embedded
    model's Q8_0 copy says, the first time)."""
    return app.model_server_command(args.model, host=args.host, port=args.port, n_ctx=args.n_ctx,
                                    verbose=args.verbose, log=log)


def cmd_model_folder(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    path = app.model_folder(args.model, home=args.home, log=lambda line: print(f"marginalia: {line}", file=err,
                                                                              flush=True))
    out.write(f"{path}\n")
    return 0


def cmd_serve_model(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import subprocess

    command, spec = serve_command(args, log=lambda line: print(line, file=err, flush=True))
    print(f"serving {args.model} on http://{args.host}:{args.port}/v1 — use it with:\n"
          f"  marginalia ask FILE \"question\" --model '{spec}'", file=err, flush=True)
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 0


