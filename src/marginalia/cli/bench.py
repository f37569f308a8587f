"""The ``marginalia bench`` commands: ``run CONFIG`` (resumable), ``runs`` (where they stand), ``report RUN``,
and ``qa-generate`` / ``qa-review`` for benchmarks on the user's own documents."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from .. import app
from ..errors import MissingDependency, UserError
from ..home import ENV_HOME
from .common import non_negative_int, positive_int


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give pattern names separated by commas, e.g. lc,wim")
    return names


def _has_option(parents: Sequence[argparse.ArgumentParser], option: str) -> bool:
    return any(option in action.option_strings for p in parents for action in p._actions)


def add_bench_parser(subparsers: Any, parents: Sequence[argparse.ArgumentParser] = (),
                     formatter_class: type[argparse.HelpFormatter] = argparse.HelpFormatter) -> argparse.ArgumentParser:
    """Add ``bench`` with its ``run`` and ``report`` sub-commands to ``subparsers``.

    ``parents`` are the main command's shared option parsers (``--home``, ``-v``); where they lack
    ``--home`` or ``--verbose`` these sub-commands add their own.
    """
    own = argparse.ArgumentParser(add_help=False)
    if not _has_option(parents, "--home"):
        own.add_argument("--home", metavar="DIR", default=None,
                         help=f"marginalia's home: model caches and named runs (default: ${ENV_HOME}, "
                              "else your user data directory)")
    if not _has_option(parents, "--verbose"):
        own.add_argument("-v", "--verbose", action="store_true", help="log what is loaded and why")
    shared = [*parents, own]

    bench = subparsers.add_parser(
        "bench", formatter_class=formatter_class,
        help="benchmark ways of reading (lc, rag, wim, auto) on built long-context tasks",
        description="Run a benchmark from a TOML config (resumable: run it again to continue after a "
                    "crash or Ctrl-C), and render its report.",
    )
    sub = bench.add_subparsers(dest="bench_command", metavar="COMMAND")
    sub.required = True

    run = sub.add_parser(
        "run", parents=shared, formatter_class=formatter_class,
        help="run (or resume) a benchmark from a config file",
        description="Build each task's items, answer every item with every pattern, score the answers "
                    "(and judge them, if the config has a [judge]) and append one line per answer to "
                    "results.jsonl in the run folder, which also keeps the resolved config, git commit, "
                    "model ids and machine. Running it again skips the finished answers.",
        epilog="Progress goes to stderr; the run folder and a per-pattern summary go to stdout. "
               "Exit 0 ok, 1 failure, 2 usage error, 130 interrupted (run again to resume).",
    )
    run.add_argument("config", metavar="CONFIG", help="the run config (.toml; see configs/bench/example.toml)")
    run.add_argument("--out", metavar="DIR", default=None,
                     help="the run folder (default: <home>/bench/runs/<the config's name>)")
    run.add_argument("--limit", type=positive_int, default=None, metavar="N",
                     help="at most N examples per task (below the config's own limit), for a quick look")
    run.add_argument("--patterns", type=_names, default=None, metavar="A,B",
                     help="run only these patterns (their names in the config), comma-separated (default: all)")
    run.add_argument("--tasks", type=_names, default=None, metavar="A,B",
                     help="run only these tasks (their names in the config: the dataset unless named), "
                          "comma-separated, in this order (default: all, in the config's order)")
    run.add_argument("--retry-errors", action="store_true",
                     help="run again the answers that ended in an error (not overflows)")
    run.add_argument("--no-report", action="store_true",
                     help="do not write report.md and the plots when the run ends")
    run.add_argument("--jobs", type=positive_int, default=1, metavar="N",
                     help="answer with N worker processes, each on its own share of the cores with its own "
                          "copy of the models: faster than one process on N cores on a CPU (Linux only); over an "
                          "HTTP model (openai:), N readings in flight at once, any N")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")

    report = sub.add_parser(
        "report", parents=shared, formatter_class=formatter_class,
        help="write report.md and plots for a run",
        description="Read a run's results.jsonl and write report.md (score tables with 95% confidence "
                    "intervals per pattern, length and depth; cost per pattern) and PNG plots.",
    )
    report.add_argument("run", metavar="RUN", help="a run folder, or the name of a run under <home>/bench/runs")
    report.add_argument("--out", metavar="DIR", default=None,
                        help="where to write the report and plots (default: the run folder)")
    report.add_argument("--no-plots", action="store_true", help="write report.md only (no matplotlib needed)")
    report.add_argument("--rescore", action="store_true",
                        help="score a run's stored answers again with this version's metrics (results.jsonl "
                             "is left as it is; the report says how many changed)")

    judge = sub.add_parser(
        "judge", parents=shared, formatter_class=formatter_class,
        help="judge a run's answers again with a model judge",
        description="Ask a model judge whether each answer of a run is right and replace the stored verdicts "
                    "(results.jsonl is rewritten atomically every few verdicts, so an interrupted call loses "
                    "little and resumes: answers this judge already judged are kept); disagreements.jsonl and "
                    "the report are written anew. Not while the run itself is writing to the folder.",
    )
    judge.add_argument("run", metavar="RUN", help="a run folder, or the name of a run under <home>/bench/runs")
    judge.add_argument("--model", metavar="SPEC", default=None,
                       help="the judge model (default: the run config's [judge] model, else the run's own model)")
    judge.add_argument("--backend", choices=app.BACKENDS, default=None,
                       help="engine for a GGUF judge (default: the run config's)")
    judge.add_argument("--method", choices=("verdict", "probability"), default=None,
                       help="verdict: the model writes a JSON verdict; probability: the model's P(YES) that "
                            "the reply gives the reference answer, against --threshold (in-process models only) "
                            "(default: the run config's, else verdict)")
    judge.add_argument("--threshold", type=float, default=None, metavar="P",
                       help="probability method: P(YES) from which an answer is right (default: the run "
                            "config's, else 0.5)")
    judge.add_argument("--yes-no", choices=("rule", "model"), default=None, dest="yes_no",
                       help="a yes/no question answered yes or no: rule: right when the word is the gold one, "
                            "without asking the model; model: ask the model too (default: the run config's, "
                            "else rule)")
    judge.add_argument("--no-report", action="store_true", help="do not write report.md and the plots afterwards")
    judge.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")

    runs = sub.add_parser(
        "runs", parents=shared, formatter_class=formatter_class,
        help="where the runs stand: answers per task and pattern, and whether each is running now",
        description="List the runs under <home>/bench/runs (or the runs named), each with its answers, the items "
                    "every pattern has answered of those its config plans, per task, errors, when the last answer "
                    "was written, whether a bench run (or judge) is writing to it now, and about how much "
                    "answering is left at the pace so far. Reads the run folders only: it loads no model. A run whose "
                    "folder cannot be read is listed with the reason, after which the exit status is 1.",
    )
    runs.add_argument("run", nargs="*", metavar="RUN", help="run folders or names (default: every named run)")
    runs.add_argument("--json", action="store_true", help="one JSON object per run, a line each")

    export = sub.add_parser(
        "export", parents=shared, formatter_class=formatter_class,
        help="copy a run's results without their texts (to share it, or carry it to another machine)",
        description="Write DIR/results.jsonl and DIR/run.json: every result of the run with its ids, scores, "
                    "verdict, costs and margins' flags, but no text of the documents, questions, gold answers, "
                    "answers or margins (what the report needs of them is worked out first and kept). Results "
                    "DIR already holds that the run lacks are kept. 'bench import DIR' makes it a run again; "
                    "'bench report DIR' reports it as it is.",
    )
    export.add_argument("run", metavar="RUN", help="a run folder, or the name of a run under <home>/bench/runs")
    export.add_argument("dest", metavar="DIR", help="where to write the text-free copy")

    imp = sub.add_parser(
        "import", parents=shared, formatter_class=formatter_class,
        help="make a text-free copy (from 'bench export') a run again, to resume or report it",
        description="Add the results in DIR to the run of that name under <home>/bench/runs (made if missing); "
                    "'bench run' with the same config then skips them and answers the rest. They keep the "
                    "verdicts they were exported with: a model judge cannot judge them again (they have no "
                    "texts), so judge a run before exporting it.",
    )
    imp.add_argument("source", metavar="DIR", help="a folder 'bench export' wrote")
    imp.add_argument("--name", default=None, help="the run's name (default: the config name in DIR/run.json)")
    imp.add_argument("--out", metavar="DIR", default=None, help="a run folder to add to instead of a named run")

    from .common import model_options

    generate = sub.add_parser(
        "qa-generate", parents=[*shared, model_options()], formatter_class=formatter_class,
        help="write QA pairs about your own documents, for review",
        description="Ask the model, in small requests, for question-answer pairs of four kinds about each document "
                    "(pdf, markdown, text, html; folders are walked) or each document of a collection: a single "
                    "fact, a fact joining two sections, a question over the whole document (a list, a count or "
                    "the most frequent thing), and one the document does not answer. Each pair is appended to "
                    "OUT as a pending pair with its evidence spans as soon as it is made, and the requests done "
                    "are listed beside it, so an interrupted run resumes where it stopped. Review the pairs with "
                    "'marginalia bench qa-review OUT'; a run config then uses the accepted ones as "
                    "dataset = \"own\", path = OUT.",
        epilog="A line per document (its sections and the requests planned) and the progress go to stderr; the "
               "summary to stdout.",
    )
    generate.add_argument("paths", nargs="*", metavar="PATH", help="documents or folders")
    generate.add_argument("--collection", metavar="NAME", default=None,
                          help="write pairs about the stored text of this collection's documents instead of PATHs")
    generate.add_argument("--out", "-o", metavar="FILE", default=None,
                          help="the QA file (JSONL) to append to (default with --collection: "
                               "<home>/qa/<NAME>.jsonl; required with PATHs)")
    generate.add_argument("--retries", type=non_negative_int, default=2, metavar="N",
                          help="tries after a malformed reply")
    generate.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")

    review = sub.add_parser(
        "qa-review", parents=shared, formatter_class=formatter_class,
        help="accept, edit or reject generated QA pairs in the terminal",
        description="Show each pending pair with its evidence and ask: [a]ccept, [e]dit, [r]eject, [s]kip, "
                    "[b]ack or [q]uit. Every decision is saved at once; only accepted pairs are used by benchmarks.",
    )
    review.add_argument("file", metavar="FILE", help="the QA file from qa-generate")
    review.add_argument("--all", action="store_true", help="go over decided pairs too, not only pending ones")

    calibrate = sub.add_parser(
        "calibrate", parents=shared, formatter_class=formatter_class,
        help="choose auto's thresholds and second reading from a run, as a collection's reading profile",
        description="From a run that answered the same questions with rag and with wim and/or lc, choose what "
                    "auto escalates to (wim, lc or nothing) and its thresholds: the fewest seconds per answer "
                    "whose score stays within the best single reading's paired 95% interval. The choice is "
                    "stored with the collection for the run's model; 'ask --collection' and the server then read "
                    "with it when a request names no pattern and sets no option.",
    )
    calibrate.add_argument("run", metavar="RUN", help="a run folder, or the name of a run under <home>/bench/runs")
    calibrate.add_argument("--collection", required=True, metavar="NAME", help="the collection the profile is for")
    calibrate.add_argument("--dry-run", action="store_true", help="say what would be chosen; store nothing")
    return bench


def cmd_bench(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run ``bench run`` or ``bench report``; errors propagate as `MarginaliaError` (the caller prints them)."""
    if args.bench_command == "run":
        return _cmd_run(args, out, err)
    if args.bench_command == "report":
        return _cmd_report(args, out, err)
    if args.bench_command == "judge":
        return _cmd_judge(args, out, err)
    if args.bench_command == "runs":
        return _cmd_runs(args, out, err)
    if args.bench_command == "export":
        return _cmd_export(args, out, err)
    if args.bench_command == "import":
        return _cmd_import(args, out, err)
    if args.bench_command == "qa-generate":
        return _cmd_qa_generate(args, out, err)
    if args.bench_command == "qa-review":
        return _cmd_qa_review(args, out, err)
    if args.bench_command == "calibrate":
        return _cmd_calibrate(args, out, err)
    raise UserError(f"unknown bench command {args.bench_command!r}")  # pragma: no cover


def _cmd_run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..bench import report  # noqa: F401  (loaded now: the report at the end of a long run uses the code the run started with)
    from ..bench.config import load_config
    from ..bench.runner import run_benchmark

    config = load_config(args.config)
    quiet = getattr(args, "quiet", False)

    def log(message: str) -> None:
        if not quiet:
            print(message, file=err, flush=True)

    try:
        if args.jobs > 1:
            from ..bench.jobs import run_jobs

            summary = run_jobs(config, args.jobs, home=args.home, out=args.out, limit=args.limit,
                               patterns=args.patterns, tasks=args.tasks, retry_errors=args.retry_errors, err=err,
                               progress=not quiet, log=log)
        else:
            summary = run_benchmark(config, home=args.home, out=args.out, limit=args.limit,
                                    patterns=args.patterns, tasks=args.tasks, retry_errors=args.retry_errors,
                                    err=err, progress=not quiet, log=log)
    except KeyboardInterrupt:
        print("marginalia: interrupted; every finished answer is saved: run the same command again to resume",
              file=err, flush=True)
        return 130  # said once, here (not again by the generic handler)
    statuses = ", ".join(f"{n} {s}" for s, n in sorted(summary.statuses.items())) or "nothing new"
    log(f"wrote {summary.written} results ({statuses}) in {summary.seconds:.1f}s; "
        f"{summary.resumed} were done before" + (f"; {summary.disagreements} judge disagreements"
                                                 if summary.disagreements else ""))
    out.write(f"{summary.folder}\n")
    _print_summary(summary.folder, out)
    if not args.no_report:
        try:
            _write_report(summary.folder, out, log)
        except UserError:  # no results at all (every task built no items)
            return 0
    _offer_calibration(config, summary.folder, log)
    return 0


def _offer_calibration(config: Any, folder: Any, log: Callable[[str], None]) -> None:
    """Say how to make a reading profile from a run on one's own pairs that read with rag and wim or lc."""
    kinds = {p.kind for p in config.patterns}
    own = [t for t in config.tasks if t.dataset == "own" and t.path]
    if "rag" not in kinds or not kinds & {"wim", "lc"} or not own:
        return
    qa = Path(own[0].path)
    # a collection's pairs are <home>/qa/NAME.jsonl ('qa-generate --collection NAME', the page)
    collection = qa.stem if qa.parent.name == "qa" else "NAME"
    log(f"next: marginalia bench calibrate {folder} --collection {collection}   (a reading profile for "
        f"{config.model} from this run; --dry-run shows the choice first)")


def _write_report(folder: Any, out: TextIO, log: Callable[[str], None]) -> None:
    """Write a run's report and plots (the tables alone when matplotlib is missing) and print its path."""
    from ..bench.report import write_report

    try:
        files = write_report(folder)
    except MissingDependency as exc:  # matplotlib missing: the tables still help
        log(f"plots skipped: {exc}")
        files = write_report(folder, plots=False)
    out.write(f"{files.report}\n")


def _print_summary(folder: Any, out: TextIO) -> None:
    from ..bench.analysis import load_run, metric_value, pattern_order, primary_metric
    from ..bench.statistics import estimate

    data = load_run(folder)
    for task in dict.fromkeys(r["task"] for r in data.records):
        records = [r for r in data.records if r["task"] == task]
        metric = primary_metric(records)
        for p in pattern_order(data):
            group = [r for r in records if r["pattern"] == p]
            if not group:
                continue
            vals = [v for v in (metric_value(r, metric) for r in group) if v is not None]
            est = estimate(vals)
            other = sum(r.get("status") != "ok" for r in group)
            out.write(f"{task}\t{p}\t{metric}\t{est.format()}\tn={est.n}"
                      + (f"\tnot answered={other}" if other else "") + "\n")


def _cmd_judge(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import json

    from pydantic import ValidationError

    from ..bench.analysis import find_run
    from ..bench.config import JudgeConfig
    from ..bench.folder import RUN_INFO, check_unlocked
    from ..bench.judge import make_model_judge
    from ..bench.rejudge import rejudge

    folder = find_run(args.run, args.home)
    quiet = getattr(args, "quiet", False)
    try:
        config = json.loads((folder / RUN_INFO).read_text("utf-8")).get("config") or {}
    except (OSError, ValueError):
        config = {}
    stored = config.get("judge") or {}
    spec = args.model or stored.get("model") or config.get("model")
    if not spec:
        raise UserError(f"{folder} does not say which model answered; give the judge with --model SPEC")
    try:
        settings = JudgeConfig.model_validate({  # the stored judge's settings; defaults where it had none
            **{k: v for k, v in stored.items()
               if k in ("retries", "max_new_tokens", "device", "method", "threshold", "yes_no")},
            **{k: v for k, v in (("method", args.method), ("threshold", args.threshold),
                                 ("yes_no", args.yes_no)) if v is not None},
            "model": spec, "backend": args.backend or stored.get("backend") or config.get("backend") or "auto"})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise UserError(f"bad judge settings: {problems}") from None

    def log(message: str) -> None:
        if not quiet:
            print(message, file=err, flush=True)

    check_unlocked(folder)  # a run writing to the folder: say so before loading the judge
    log(f"loading judge {spec}")
    generator = app.load_model(spec, home=args.home, device=settings.device, backend=settings.backend,
                               log=log if args.verbose else None)
    judge = make_model_judge(generator, settings)
    try:
        summary = rejudge(folder, judge, err=err, progress=not quiet)
    except KeyboardInterrupt:
        print("marginalia: interrupted; the verdicts so far are saved: run the same command again to go on",
              file=err, flush=True)
        return 130  # said once, here (not again by the generic handler)
    verdicts = ", ".join(f"{n} {v}" for v, n in sorted(summary.verdicts.items()))
    log(f"judged {summary.judged} answers in {summary.seconds:.1f}s ({summary.kept} judged by it before): "
        f"{verdicts}; {summary.disagreements} disagreements with the lexical scores")
    out.write(f"{folder}\n")
    _print_summary(folder, out)
    if not args.no_report:
        _write_report(folder, out, log)
    return 0


def _cmd_report(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..bench.report import write_report

    files = write_report(args.run, out=args.out, home=args.home, plots=not args.no_plots, rescore=args.rescore)
    if not getattr(args, "quiet", False):
        for path in files.plots:
            print(f"wrote {path}", file=err)
    out.write(f"{files.report}\n")
    return 0


def _cmd_calibrate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..app.indexing import open_collection
    from ..app.profiles import save_profile
    from ..bench.calibrate import calibrate, caution, profile_of

    store = open_collection(args.collection, home=args.home)  # a missing collection fails before the run is read
    found = calibrate(args.run, args.home)
    singles = "; ".join(f"{k} {s:.2f} at {t:.1f} s" for k, (s, t) in found.singles.items())
    print(f"{found.items} items answered by {found.model} ({found.metric}): {singles}; best {found.best}", file=err)
    out.write(f"chosen: {found.chosen.describe()}\n")
    unsure = caution(found)
    if unsure:
        print(f"note: {unsure}", file=err)
    if not args.dry_run:
        path = save_profile(store, profile_of(found))
        out.write(f"stored the reading profile of {args.collection!r} for {found.model} in {path}\n")
    return 0


def _cmd_runs(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import json

    from ..bench.analysis import find_run
    from ..bench.folder import runs_dir
    from ..bench.status import list_runs, read_status, status_lines

    statuses = [read_status(find_run(r, args.home)) for r in args.run] if args.run else list_runs(args.home)
    if not statuses and not args.json:
        print(f"no runs under {runs_dir(args.home)}; start one with: marginalia bench run CONFIG", file=err)
    for status in statuses:
        if args.json:
            out.write(json.dumps(status.to_dict(), ensure_ascii=False) + "\n")
        else:
            out.write("\n".join(status_lines(status)) + "\n")
    unread = [s.name for s in statuses if s.problem]
    if unread:
        print(f"could not read {len(unread)} of {len(statuses)} runs ({', '.join(unread)}); "
              "the line of each says why", file=err)
    return 1 if unread else 0


def _cmd_export(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..bench.analysis import find_run
    from ..bench.export import export_run

    export_run(find_run(args.run, args.home), Path(args.dest).expanduser(), say=lambda m: print(m, file=err))
    out.write(f"{Path(args.dest).expanduser().resolve()}\n")
    return 0


def _cmd_import(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from pathlib import Path

    from ..bench.export import exported_name, import_run
    from ..bench.folder import runs_dir

    source = Path(args.source).expanduser()
    folder = Path(args.out).expanduser() if args.out else runs_dir(args.home) / (args.name or exported_name(source))
    import_run(source, folder, say=lambda m: print(m, file=err))
    out.write(f"{folder}\n")
    return 0


def _cmd_qa_generate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..bench.own import (
        DocumentStarted,
        PairWritten,
        QaEvent,
        RequestDone,
        collection_pairs_path,
        generate_collection_pairs,
        generate_pairs,
    )
    from ..bench.progress import Progress
    from .common import Reporter, load_model

    if bool(args.paths) == bool(args.collection):
        raise UserError("give the documents as PATHs or a collection with --collection NAME (one of the two)")
    if args.out is None and not args.collection:
        raise UserError("give the QA file to write with --out FILE")
    target = args.out or str(collection_pairs_path(args.collection, args.home))
    quiet = getattr(args, "quiet", False)
    generator = load_model(args, Reporter(False, err))
    bar: list[Progress] = []

    def on_event(event: QaEvent) -> None:
        if quiet:
            return
        if isinstance(event, DocumentStarted):
            for old in bar:
                old.close()
            kinds = ", ".join(f"{n} {kind}" for kind, n in event.planned.items())
            print(f"{event.source}: {event.sections} sections; {event.total} requests planned ({kinds})"
                  + (f"; {event.done} done before" if event.done else ""), file=err, flush=True)
            bar[:] = [Progress(event.total, event.done, err, True, unit="request", prefix="qa")]
        elif isinstance(event, RequestDone) and bar:
            dropped = sum(event.dropped.values())
            bar[0].step(f"{event.key}: {event.new_pairs} new" + (f", {dropped} dropped" if dropped else ""))
        elif isinstance(event, PairWritten) and bar:
            bar[0].log(f"  [{event.pair['kind']}] {event.pair['question']}")

    try:
        if args.collection:
            summary = generate_collection_pairs(args.collection, generator, target, home=args.home,
                                                retries=args.retries, on_event=on_event)
        else:
            summary = generate_pairs(args.paths, generator, target, retries=args.retries, on_event=on_event)
    except KeyboardInterrupt:
        print(f"marginalia: interrupted; every pair made is in {target}: run the same command again to resume",
              file=err, flush=True)
        return 130
    finally:
        for old in bar:
            old.close()
    for line in summary.unreadable:
        err.write(f"skipped {line}\n")
    kinds = ", ".join(f"{n} {kind}" for kind, n in summary.kinds.items())
    out.write(f"{target}: {summary.new_pairs} new pairs" + (f" ({kinds})" if kinds else "")
              + f" from {summary.documents} documents ({summary.requests} requests, {summary.skipped_pairs} pairs "
              f"dropped as malformed, unsupported or near duplicates; {summary.resumed_requests} requests and "
              f"{summary.skipped_documents} documents were done before)\n")
    err.write(f"next: marginalia bench qa-review {target}\n")
    return 0


def _cmd_qa_review(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..bench.own import review

    review(args.file, sys.stdin, out, show_all=args.all)
    return 0
