"""What the CLI's commands share: option types, the help formatter, shared options, the stderr reporter."""

from __future__ import annotations

import argparse
import re
import textwrap
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TextIO, Union, get_args, get_origin

import annotated_types

from .. import app
from ..files import progress_bar
from ..home import ENV_HOME
from ..options import IngestOptions, Options


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


def port_number(text: str) -> int:
    value = _whole_number(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _field_type(annotation: Any) -> tuple[type, tuple[Any, ...] | None]:
    """The scalar type and the choices (a Literal's values) of an options field, None stripped."""
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    if get_origin(annotation) is Literal:
        choices = get_args(annotation)
        return type(choices[0]), choices
    return annotation, None


def _checked(kind: type, metadata: Sequence[Any]) -> Any:
    """An argparse type that converts to ``kind`` and checks the field's bounds (from its metadata)."""
    name = {int: "a whole number", float: "a number"}.get(kind, "a value")

    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {name}, got {text!r}") from None
        for bound in metadata:
            for attr, ok, words in (("gt", lambda v, b: v > b, "above"), ("ge", lambda v, b: v >= b, "at least"),
                                    ("lt", lambda v, b: v < b, "below"), ("le", lambda v, b: v <= b, "at most")):
                limit = getattr(bound, attr, None)
                if isinstance(bound, annotated_types.BaseMetadata) and limit is not None and not ok(value, limit):
                    raise argparse.ArgumentTypeError(f"must be {words} {limit}, got {value}")
        return value

    convert.__name__ = kind.__name__  # argparse names the type in its messages
    return convert


def add_record_options(parser: Any, record: type[Options], *, fields: Iterable[str] | None = None,
                       skip: Iterable[str] = (), metavars: Mapping[str, str] | None = None) -> None:
    """Add one flag per field of an options ``record`` to ``parser`` (or an argument group of it): every
    field, or only those of ``fields`` the record has, less those in ``skip``.

    The flag is named as the field (``--field-name``; a switch that is on by default is ``--no-field-name``);
    its default, choices and bounds come from the record, its help is `short_help` of its description.
    """
    metavars = metavars or {}
    wanted = record.model_fields if fields is None else [f for f in fields if f in record.model_fields]
    left_out = set(skip)
    for name in wanted:
        if name in left_out:
            continue
        info = record.model_fields[name]
        flag = "--" + name.replace("_", "-")
        text = short_help(info.description)
        kind, choices = _field_type(info.annotation)
        if kind is bool and info.default:
            parser.add_argument("--no-" + flag[2:], dest=name, action="store_false", help=f"turn off: {text}")
        elif kind is bool:
            parser.add_argument(flag, dest=name, action="store_true", help=text)
        elif choices is not None:
            parser.add_argument(flag, dest=name, choices=choices, default=info.default, help=text)
        else:
            parser.add_argument(flag, dest=name, type=_checked(kind, info.metadata), default=info.default,
                                metavar=metavars.get(name, {int: "N", float: "X"}.get(kind, "VALUE")), help=text)


_ASIDE = re.compile(r"\s*\([^()]*\)")
# a clause ends at a semicolon, a full stop, or a colon that does not introduce a quotation
_CLAUSE_END = re.compile(r";\s|:\s(?![\"'])|(?<=[a-z0-9])\.\s+(?=[A-Z])")


def short_help(description: str | None) -> str:
    """An option's help on the command line, one line: the first clause of its record's description, without
    its asides in parentheses or the pattern it is for (the option's group names that). The whole description
    is in the HTTP API's schema."""
    names = "|".join(re.escape(spec.name) for spec in app.pattern_specs())
    text = re.sub(rf"^(?:{names})\b[^:]*?:\s+", "", description or "")  # "wim: ", "wim, grounded judge: "
    while _ASIDE.search(text):
        text = _ASIDE.sub("", text)
    return _CLAUSE_END.split(text, maxsplit=1)[0].strip().rstrip(".")


def record_from_args(record: type[Options], args: argparse.Namespace) -> Any:
    """The record built from the parsed flags of its fields (a `UserError` for a bad combination)."""
    return record.build(**{name: getattr(args, name) for name in record.model_fields if hasattr(args, name)})


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default, except where there is none to show; fills the description and epilog to
    the terminal's width, except paragraphs with indented lines (tables), which stay as written."""

    # the help column: most flags with their metavar fit before it, leaving about 50 characters of help on 80 columns
    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 27,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, width)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        nothing = default is None or isinstance(default, bool) or default == argparse.SUPPRESS or default == []
        if not nothing and "%(default)" not in text and action.option_strings:
            text += " (default: %(default)s)"
        return text

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.split("\n\n"):
            lines = paragraph.splitlines()
            if any(line[:1].isspace() for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(textwrap.fill(" ".join(paragraph.split()), width, initial_indent=indent,
                                                subsequent_indent=indent))
        return "\n\n".join(paragraphs)


#: where a command that loads a model points for the model specs (`_model_help` lists them)
MODEL_NOTE = "Model specs: 'marginalia models'."


def _model_help() -> str:
    import importlib.util

    rows = "\n".join(f"  {form:<16} {text}" for form, text in app.model_specs())
    engine = ("llama.cpp (llama-cpp-python is installed)"
              if importlib.util.find_spec("llama_cpp") else
              "transformers (install llama-cpp-python for much faster decoding on CPU)")
    return f"model specs:\n{rows}\n\nWith --backend auto, GGUF models run on {engine} here."



def common_options() -> argparse.ArgumentParser:
    """Options every command takes (home directory, verbosity)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--home", metavar="DIR", default=None,
                        help=f"where models and collections are kept (default: ${ENV_HOME}, else your "
                             "user data folder)")
    common.add_argument("-v", "--verbose", action="store_true", help="log what is loaded and why")
    return common


def ingest_options() -> argparse.ArgumentParser:
    """The bounds on converting one document (a PDF: pages, inflated size, seconds, memory), in a group of their
    own."""
    parent = argparse.ArgumentParser(add_help=False)
    add_record_options(parent.add_argument_group("document limits"), IngestOptions,
                       metavars={"convert_timeout": "SECONDS", "max_inflated_mb": "MB", "convert_memory_mb": "MB"})
    return parent


def model_options(key_flag: str = "--api-key") -> argparse.ArgumentParser:
    """Options that choose and place the language model (in a group of their own); ``key_flag`` is the flag
    of the key sent to an ``openai:`` model server (serve names it ``--model-api-key``, apart from the key its
    own clients send)."""
    parent = argparse.ArgumentParser(add_help=False)
    opts = parent.add_argument_group("model")
    opts.add_argument("--model", default="smollm2", metavar="SPEC", help="the language model's spec")
    opts.add_argument("--device", choices=app.DEVICES, default="auto",
                      help="where in-process models run")
    opts.add_argument("--backend", choices=app.BACKENDS, default="auto",
                      help="engine for GGUF models: llama.cpp when installed, else transformers")
    opts.add_argument(key_flag, dest="api_key", default=None, metavar="KEY",
                      help="API key for openai: models (default: $MARGINALIA_API_KEY, else $OPENAI_API_KEY)")
    return parent


def load_model(args: argparse.Namespace, reporter: Reporter) -> Any:
    """Load the generator the options name, logging what was loaded with -v."""
    import time

    t0 = time.perf_counter()
    generator = app.load_model(args.model, home=args.home, device=args.device,
                               log=reporter.log if not getattr(args, "quiet", False) else None,
                               backend=args.backend, api_key=args.api_key)
    if args.verbose:
        url = getattr(generator, "shown_url", None)
        where = f"at {url}" if url else f"on {getattr(generator, 'device', None) or 'cpu'}"
        more = f", {generator.concurrency} requests in flight at most" if generator.concurrency > 1 else ""
        reporter.log(f"model {generator.name}: {type(generator).__name__} {where}, "
                     f"window {generator.context_window} tokens{more}, loaded in "
                     f"{time.perf_counter() - t0:.1f}s")
    return generator


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
        elif kind == "routed":  # auto: before WiM reads, or before RAG's answer
            then = "reading with WiM" if event.route.taken == "wim" else "answering with RAG"
            self.log(f"route: {event.route.reason}: {then}")
        elif kind == "started":
            self.log(f"reading {event.context_tokens} tokens with {event.pattern} "
                     f"({event.segments_total} {'segments' if event.pattern == 'wim' else 'chunks'})")
            if event.pattern == "wim":
                self.bar = progress_bar(self.err, event.segments_total, "seg")
        elif kind == "segment_read" and self.bar is None:
            seg = event.segment
            self.log(f"  retrieved chunk {seg.index + 1}/{event.total}: {snippet(seg.text)}")
        elif kind == "segments_dropped":
            self.log(f"  (segments {event.first + 1}-{event.last} left the cache to make room: "
                     f"{event.tokens} tokens; their relevant margins are kept)")
        elif kind == "reading_stopped" and event.reason == "found":
            self.log(f"  stopped reading after segment {event.after + 1}: a margin met --stop-at-score")
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


