"""What the CLI's commands share: option types, the help formatter, shared options, the stderr reporter."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from ..home import ENV_HOME

DEFAULT_SEGMENT_TOKENS = 512


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def positive_int(text: str) -> int:
    value = _whole_number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
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

    from ..models.registry import known_specs

    rows = "\n".join(f"  {form:<16} {text}" for form, text in known_specs())
    engine = ("llama.cpp (llama-cpp-python is installed)"
              if importlib.util.find_spec("llama_cpp") else
              "transformers (install llama-cpp-python for 3.5-6.5x faster decoding)")
    return f"model specs:\n{rows}\n\nWith --backend auto, GGUF models run on {engine} here."



def common_options() -> argparse.ArgumentParser:
    """Options every command takes (home directory, verbosity)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--home", metavar="DIR", default=None,
                        help=f"where marginalia keeps model caches and collections (default: ${ENV_HOME}, "
                             "else your user data directory)")
    common.add_argument("-v", "--verbose", action="store_true", help="log what is loaded and why")
    return common


def model_options() -> argparse.ArgumentParser:
    """Options that choose and place the language model."""
    opts = argparse.ArgumentParser(add_help=False)
    opts.add_argument("--model", default="smollm2", metavar="SPEC",
                      help="the language model (see 'marginalia models')")
    opts.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                      help="where the in-process model runs (auto: CUDA + bf16 if present)")
    opts.add_argument("--backend", choices=("auto", "llamacpp", "transformers"), default="auto",
                      help="engine for GGUF models (smollm2, gguf:): auto picks llama.cpp when "
                           "installed (3.5-6.5x faster decoding on CPU), else transformers")
    opts.add_argument("--api-key", default=None, metavar="KEY",
                      help="API key for openai: models (default: $MARGINALIA_API_KEY, "
                           "else $OPENAI_API_KEY)")
    return opts


def load_model(args: argparse.Namespace, reporter: Reporter) -> Any:
    """Load the generator the options name, logging what was loaded with -v."""
    import time

    from ..models import load_generator

    t0 = time.perf_counter()
    generator = load_generator(args.model, home=args.home, device=args.device,
                               log=reporter.log if not getattr(args, "quiet", False) else None,
                               backend=args.backend, api_key=args.api_key)
    if args.verbose:
        url = getattr(generator, "base_url", None)
        where = f"at {url}" if url else f"on {getattr(generator, 'device', None) or 'cpu'}"
        more = f", {generator.concurrency} requests in flight at most" if generator.concurrency > 1 else ""
        reporter.log(f"model {generator.name}: {type(generator).__name__} {where}, "
                     f"window {generator.context_window} tokens{more}, loaded in "
                     f"{time.perf_counter() - t0:.1f}s")
    return generator


def progress_bar(err: TextIO, total: int, unit: str, desc: str = "", quiet: bool = False) -> Any:
    """A tqdm bar on stderr (drawn only on a terminal, so logs and tests stay clean)."""
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, desc=desc, file=err, dynamic_ncols=True, leave=False,
                disable=quiet or not getattr(err, "isatty", lambda: False)())


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
        if kind == "retrieved":
            outcome = {"direct": "answered from the question bank", "none": "no relevant references",
                       "references": f"{len(event.references)} references"}[event.outcome]
            self.log(f"retrieval: {outcome} (best similarity {event.best_similarity:.2f})")
            for ref in event.references[:8]:
                self.log(f"  {ref.source} > {' > '.join(ref.section_path) or '(top)'} [{ref.start}:{ref.end}]")
        elif kind == "started":
            self.log(f"reading {event.context_tokens} tokens with {event.pattern} "
                     f"({event.segments_total} {'segments' if event.pattern == 'wim' else 'chunks'})")
            if event.pattern == "wim":
                from tqdm import tqdm

                self.bar = tqdm(total=event.segments_total, unit="seg", file=self.err,
                                dynamic_ncols=True, leave=False,
                                disable=not getattr(self.err, "isatty", lambda: False)())
        elif kind == "segment_read" and self.bar is None:
            seg = event.segment
            self.log(f"  retrieved chunk {seg.index + 1}/{event.total}: {snippet(seg.text)}")
        elif kind == "margin_judged":
            m = event.margin
            mark = "+" if m.relevant else "-"
            self.log(f"  [{m.segment_index + 1}] {mark} {snippet(m.text, 110)}"
                     + ("" if m.relevant else f"   ({m.reason})"))
            if self.bar is not None:
                self.bar.update(1)
        elif kind in ("answer_delta", "done") and self.bar is not None:
            self.bar.close()
            self.bar = None


def snippet(text: str, width: int = 90) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "\u2026"


