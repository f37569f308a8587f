"""The `marginalia` command: read documents, index collections, compose, tune the compose client, run
benchmarks.

Answers go to stdout; margins as they arrive, progress and logs go to stderr.
Exit codes: 0 ok, 1 runtime failure, 2 usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from .. import __version__
from ..errors import ContextOverflow, MarginaliaError
from . import compose, documents, keys, reading, serve, tune
from .bench import add_bench_parser, cmd_bench
from .common import Formatter, common_options
from .reading import demo_files, run_pattern, serve_command

__all__ = ["build_parser", "demo_files", "main", "run_pattern", "serve_command"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="marginalia",
        description="Answer questions over long documents with language models, reading them "
                    "with Writing in the Margins (wim), long context (lc), retrieval (rag), or retrieval first and "
                    "WiM where it is not enough (auto, the default over collections and long texts).",
        formatter_class=Formatter,
        epilog="Press Ctrl-C once while wim reads to stop reading and answer from what was "
               "read so far; twice to abort.",
    )
    parser.add_argument("--version", action="version", version=f"marginalia {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    common = common_options()
    reading.register(sub, common)
    documents.register(sub, common)
    serve.register(sub, common)
    keys.register(sub, common)
    compose.register(sub, common)
    tune.register(sub, common)
    add_bench_parser(sub, [common], Formatter).set_defaults(handler=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args, out, err))
    except MarginaliaError as exc:
        print(f"marginalia: error: {exc}{advice(exc)}", file=err)
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


def advice(exc: MarginaliaError) -> str:
    """What to do about an error, in the CLI's terms (appended to the message)."""
    if isinstance(exc, ContextOverflow):
        return ("; use --pattern rag (it reads only the most relevant chunks), a shorter document, "
                "or a model with a longer window")
    return ""
