"""Tuning the composition client: ``marginalia tune data`` (examples labelled by a larger model, resumable)
and ``marginalia tune train`` (LoRA on those labels; prints the tuned model's spec)."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from .. import app
from ..files import progress_bar
from ..options import ComposeOptions, TuneDataOptions, TuneOptions
from .common import Formatter, Reporter, add_record_options, positive_int, record_from_args
from .compose import METAVARS

#: the compose options that say how memory is made (the rest are about typing, or the composer's own)
MEMORY_FIELDS = ("memory_mode", "hits", "search", "min_similarity", "item_tokens")


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add tune (data, train)."""
    tune = sub.add_parser(
        "tune", formatter_class=Formatter, help="instruction-tune the compose client on a larger model's labels",
        description="Tune the small model that suggests as you compose: 'data' cuts your texts into prefixes, "
                    "retrieves memory for each from a collection and has a larger model continue each prefix "
                    "(the labels); 'train' fine-tunes the client with LoRA on those labels and writes a model "
                    "that loads by spec (tuned:<folder>).",
    )
    steps = tune.add_subparsers(dest="tune_command", metavar="STEP")
    steps.required = True

    data = steps.add_parser(
        "data", parents=[common], formatter_class=Formatter, usage="%(prog)s [options] PATH [PATH ...]",
        help="make tuning examples (resumable)",
        description="Cut each text into prefixes at word ends; for each, retrieve memory from --collection (the "
                    "text's own document excluded) as the composer would, and label it with --label-model's "
                    "greedy continuation of the client's prompt (instruction, memory, text). One JSON line per "
                    "example goes to --out as it is made; run the same command again to go on after a crash.",
        epilog="Progress goes to stderr; a summary to stdout. Exit 0 ok, 1 failure, 2 usage error.",
    )
    data.add_argument("paths", nargs="+", metavar="PATH", help="files or folders of texts to cut into prefixes")
    data.add_argument("-o", "--out", required=True, metavar="FILE", help="the examples (JSONL; appended to)")
    data.add_argument("--limit", type=positive_int, default=None, metavar="N", help="at most N examples in --out")
    data.add_argument("--json", action="store_true", help="print the summary as JSON")
    models = data.add_argument_group("models")
    models.add_argument("--label-model", required=True, metavar="SPEC",
                        help="the larger model that writes the labels (and the memory)")
    models.add_argument("--memory-model", metavar="SPEC", default=None,
                        help="the model that writes memory (default: the label model)")
    _engine(models, app.BACKENDS)
    add_record_options(data.add_argument_group("labels"), TuneDataOptions)
    memory = data.add_argument_group("memory")
    memory.add_argument("--collection", "-c", metavar="NAME",
                        help="where memory is retrieved from (none: examples without memory)")
    add_record_options(memory, ComposeOptions, fields=MEMORY_FIELDS, metavars=METAVARS)
    data.set_defaults(handler=cmd_data)

    train = steps.add_parser(
        "train", parents=[common], formatter_class=Formatter, usage="%(prog)s [options] DATA",
        help="LoRA-tune the client on tuning examples",
        description="Fine-tune --model with LoRA (peft, on transformers) on the examples' labels, the loss on the "
                    "label tokens only; texts held out by source measure the label loss before and after. "
                    "Writes the adapter, the merged model and tuning.json into --out (and, for a GGUF client "
                    "such as smollm2, the adapter for llama.cpp, so the tuned client runs there at its speed), "
                    "and prints the tuned model's spec, tuned:<folder> (give it to --model). The training state "
                    "is saved every --checkpoint-every steps beside --out: after a crash or Ctrl-C, the same "
                    "command goes on from there.",
        epilog="Needs the tune and hf extras: pip install 'marginalia[tune,hf]'. Exit 0 ok, 1 failure, 2 usage.",
    )
    train.add_argument("data", metavar="DATA", help="the examples 'marginalia tune data' wrote (JSONL)")
    train.add_argument("-o", "--out", metavar="DIR", default=None,
                       help="the tuned model's folder (default: <home>/tuned/<DATA's name>)")
    train.add_argument("--json", action="store_true", help="print the report as JSON")
    client = train.add_argument_group("model")
    client.add_argument("--model", default="smollm2", metavar="SPEC",
                        help="the client to tune, on transformers: smollm2, gguf:<file> or hf:<folder>")
    _engine(client, ())
    add_record_options(train.add_argument_group("tuning"), TuneOptions)
    train.set_defaults(handler=cmd_train)


def _engine(parser: Any, backends: tuple[str, ...]) -> None:
    parser.add_argument("--device", choices=app.DEVICES, default="auto", help="where in-process models run")
    if backends:
        parser.add_argument("--backend", choices=backends, default="auto",
                            help="engine for GGUF models: llama.cpp when installed, else transformers")
        parser.add_argument("--api-key", default=None, metavar="KEY", help="API key for openai: models")


def cmd_data(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    options: TuneDataOptions = record_from_args(TuneDataOptions, args)
    compose: ComposeOptions = record_from_args(ComposeOptions, args)
    app.check_paths(args.paths)
    store = app.open_collection(args.collection, home=args.home) if args.collection else None
    reporter = Reporter(False, err)

    def load(spec: str, role: str) -> Any:
        reporter.log(f"loading {role} {spec}")
        return app.load_model(spec, home=args.home, device=args.device, backend=args.backend, api_key=args.api_key)

    label_model = load(args.label_model, "the label model")
    memory_model = load(args.memory_model, "the memory model") if args.memory_model and store else None
    bar = progress_bar(err, 0, "cut", "labelling")

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        report = app.tuning_data(args.paths, args.out, options, compose, label_model=label_model, collection=store,
                                 memory_generator=memory_model, home=args.home, limit=args.limit, progress=progress)
    finally:
        bar.close()
    summary = {"path": str(report.path), "written": report.written, "kept": report.kept,
               "documents": report.documents, "too_short": list(report.too_short),
               "empty_labels": report.empty_labels, "seconds": report.seconds}
    if args.json:
        out.write(json.dumps(summary) + "\n")
    else:
        out.write(f"{report.written} examples written to {report.path} ({report.kept} were there already) from "
                  f"{report.documents} texts in {report.seconds:.0f} s\n")
        if report.too_short:
            out.write(f"too short to cut: {', '.join(report.too_short)}\n")
        if report.empty_labels:
            out.write(f"{report.empty_labels} labels are blank (left out of training)\n")
    return 0


def cmd_train(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    options: TuneOptions = record_from_args(TuneOptions, args)
    app.check_tuning(args.data)  # before the model loads: a missing extra or data file is said at once
    reporter = Reporter(False, err)
    reporter.log(f"loading the client {args.model} on transformers")
    generator = app.load_model(args.model, home=args.home, device=args.device, backend="transformers",
                               log=reporter.log)
    bar = progress_bar(err, options.steps, "step", "tuning")

    def on_step(step: int, steps: int, loss: float) -> None:
        bar.n = step  # a resumed tuning starts past step 1
        bar.set_postfix(loss=f"{loss:.3f}")  # (refreshes the bar)
        if args.verbose:
            reporter.log(f"step {step}/{steps}: loss {loss:.4f}")

    try:
        report = app.tune_client(args.data, args.out, options, generator=generator, home=args.home,
                                 on_step=on_step, log=reporter.log)
    except KeyboardInterrupt:
        from ..compose.tuning.checkpoint import checkpoint_path

        bar.close()
        if checkpoint_path(app.tuned_folder(args.data, args.out, args.home)).is_file():
            print("marginalia: interrupted; the training state of a recent step is saved: run the same command "
                  "again to go on from there", file=err, flush=True)
            return 130  # said once, here (not again by the generic handler)
        raise
    finally:
        bar.close()
    if args.json:
        out.write(json.dumps({"spec": report.spec, "folder": str(report.folder), "base_model": report.base_model,
                              "train_examples": report.train_examples,
                              "held_out_examples": report.held_out_examples, "steps": report.steps,
                              "loss_first": report.losses[0], "loss_last": report.losses[-1],
                              "held_out_before": report.held_out_before, "held_out_after": report.held_out_after,
                              "kept_step": report.kept_step, "held_out_curve": report.held_out_curve,
                              "seconds": report.seconds}) + "\n")
        return 0
    if report.held_out_before is not None and report.held_out_after is not None:
        reporter.log(f"held-out label loss {report.held_out_before:.3f} -> {report.held_out_after:.3f} "
                     f"(perplexity {report.perplexity_before:.1f} -> {report.perplexity_after:.1f})")
    if report.kept_step != report.steps:
        reporter.log(f"kept step {report.kept_step} of {report.steps}: its held-out label loss was the lowest")
    reporter.log(f"trained on {report.train_examples} examples, {report.steps} steps, loss {report.losses[0]:.3f} "
                 f"-> {report.losses[-1]:.3f}, in {report.seconds:.0f} s; use it with --model {report.spec}")
    out.write(report.spec + "\n")
    return 0
