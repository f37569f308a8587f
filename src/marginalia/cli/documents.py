"""Collections of documents: index, search, questions (generate, export) and collections (list, show, delete)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, TextIO

from .. import app
from ..errors import NotFound, UserError
from ..files import atomic_write_text, progress_bar
from ..options import SEARCH_MODES, ChunkingOptions, IngestOptions
from .common import (
    Formatter,
    Reporter,
    add_record_options,
    ingest_options,
    load_model,
    model_options,
    non_negative_int,
    positive_int,
    record_from_args,
    snippet,
)


def collection_option(parser: Any, required: bool = True) -> None:
    parser.add_argument("--collection", "-c", required=required, metavar="NAME",
                        help="the collection (letters, digits, '.', '_', '-'); kept under the home directory")


def chunking_options() -> argparse.ArgumentParser:
    """The chunking options (chunk sizes in the model's tokens), in a group of their own."""
    parent = argparse.ArgumentParser(add_help=False)
    add_record_options(parent.add_argument_group("chunking"), ChunkingOptions)
    return parent


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add index, search, questions and collections."""
    models = model_options()

    index = sub.add_parser(
        "index", parents=[common, models, chunking_options(), ingest_options()], formatter_class=Formatter,
        usage="%(prog)s [options] --collection NAME PATH [PATH ...]",
        help="add files and folders to a collection (pdf, markdown, text, html)",
        description="Load each file (folders are walked), split it into sections and section-bounded chunks, "
                    "and add them to the collection's hybrid (BM25 + dense) index. Re-indexing unchanged files "
                    "does nothing; a changed file replaces its old version. Files that cannot be read are "
                    "skipped with the reason, as is a PDF over a document limit (it is converted in a process of "
                    "its own, stopped at the limit). Chunk sizes are counted with --model's tokenizer.",
    )
    index.add_argument("paths", nargs="+", metavar="PATH", help="files or folders")
    collection_option(index)
    index.add_argument("--embedder", default=app.DEFAULT_EMBEDDER, metavar="SPEC",
                       help="for a new collection: 'minilm' (embedded), 'hashing', or 'st:<local folder>'")
    index.add_argument("--no-recursive", action="store_true", help="do not walk into subfolders")
    index.add_argument("--tree", action="store_true", help="print each document's section tree")
    index.set_defaults(handler=cmd_index)

    search = sub.add_parser(
        "search", parents=[common], formatter_class=Formatter,
        help="search a collection (hybrid BM25 + dense, by default)",
        description="Show the best-matching chunks (and question-bank entries) with their section paths.",
    )
    search.add_argument("query", metavar="QUERY", help="what to look for")
    collection_option(search)
    search.add_argument("-k", type=positive_int, default=5, help="how many hits")
    search.add_argument("--mode", choices=SEARCH_MODES, default="hybrid",
                        help="ranking: reciprocal-rank fusion of BM25 and dense, or one of them")
    search.add_argument("--questions", action="store_true", help="also search the question bank")
    search.add_argument("--json", action="store_true", help="print the hits as JSON")
    search.set_defaults(handler=cmd_search)

    questions = sub.add_parser("questions", parents=[common], formatter_class=Formatter,
                               help="the question bank: generate QA pairs, export them",
                               description="Generate question-answer pairs for a collection's documents with a "
                                           "language model, or export them as fine-tuning data.")
    qsub = questions.add_subparsers(dest="questions_command", metavar="ACTION")
    qsub.required = True
    generate = qsub.add_parser(
        "generate", parents=[common, models], formatter_class=Formatter,
        help="write QA pairs for each document and store them in the collection",
        description="For each document (or --doc), ask the model for QA pairs: sparse = about one per "
                    "paragraph of each top-level section, dense = one per chunk. Replies are validated "
                    "JSON; a pair whose answer the text does not support is dropped; malformed replies "
                    "are retried, then skipped and counted.",
    )
    collection_option(generate)
    generate.add_argument("--density", choices=("sparse", "dense"), default="sparse", help="how many pairs")
    generate.add_argument("--long-answers", action="store_true", help="also ask for a one-to-two-sentence answer")
    generate.add_argument("--doc", metavar="SOURCE", action="append",
                          help="only this document (its path or id; repeatable)")
    generate.add_argument("--retries", type=non_negative_int, default=2, metavar="N",
                          help="tries after a malformed reply")
    generate.set_defaults(handler=cmd_questions_generate)
    export = qsub.add_parser(
        "export", parents=[common], formatter_class=Formatter,
        help="write the question bank as chat-format fine-tuning JSONL",
        description='One line per pair: {"messages": [system, user question, assistant answer]}.',
    )
    collection_option(export)
    export.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    export.add_argument("--long", action="store_true", help="use the long answers where there are some")
    export.add_argument("--system", default=None, metavar="TEXT",
                        help="the system message (default: marginalia's reader prompt; '' for none)")
    export.set_defaults(handler=cmd_questions_export)

    colls = sub.add_parser("collections", parents=[common], formatter_class=Formatter,
                           help="list, show or delete collections",
                           description="Collections live under the home directory, one folder each.")
    csub = colls.add_subparsers(dest="collections_command", metavar="ACTION")
    csub.required = True
    listing = csub.add_parser("list", parents=[common], formatter_class=Formatter, help="list collections")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=cmd_collections_list)
    show = csub.add_parser("show", parents=[common], formatter_class=Formatter,
                           help="list a collection's documents")
    show.add_argument("name", metavar="NAME")
    show.add_argument("--tree", action="store_true", help="print each document's section tree")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=cmd_collections_show)
    delete = csub.add_parser("delete", parents=[common], formatter_class=Formatter,
                             help="delete a collection, or one document from it")
    delete.add_argument("name", metavar="NAME")
    delete.add_argument("--doc", metavar="SOURCE", help="delete only this document (its path or id)")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    delete.set_defaults(handler=cmd_collections_delete)


def cmd_index(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    chunking = record_from_args(ChunkingOptions, args)
    ingest = record_from_args(IngestOptions, args)
    app.check_paths(args.paths)
    tokenizer = load_model(args, Reporter(False, err)).tokenizer
    bar = progress_bar(err, 0, "file", "loading")

    def loaded(done: int, total: int, path: str) -> None:
        bar.total = total
        bar.update(1)

    bars: list[Any] = []

    def chunks_bar(doc: Any, n_chunks: int) -> Any:
        bar.close()
        cbar = progress_bar(err, n_chunks, "chunk", Path(doc.source).name[:30])
        bars.append(cbar)
        return lambda done, total: cbar.update(done - cbar.n)

    def indexed(item: app.Indexed) -> None:
        bars.pop().close()
        result, doc = item.result, item.document
        detail = f"{result.n_chunks} chunks in {len(item.sections) - 1} sections"
        if result.status == "duplicate":
            detail = f"same text as {result.source}, already indexed"
        out.write(f"{result.status:<9} {doc.source}  ({detail})\n")
        if args.tree:
            out.write(app.section_outline(item.sections, doc) + "\n")

    report = app.index_paths(args.paths, args.collection, count_tokens=tokenizer.count, home=args.home,
                             embedder=args.embedder, chunking=chunking, ingest=ingest,
                             recursive=not args.no_recursive, on_file=loaded, on_document=chunks_bar,
                             on_indexed=indexed)
    bar.close()
    for skip in report.skipped:
        out.write(f"skipped   {skip.path}  ({skip.reason})\n")
    for note in report.notes:
        err.write(f"note: {note.path}: {note.message}\n")
    summary = ", ".join(f"{n} {status}" for status, n in report.counts().items()) or "nothing to index"
    err.write(f"collection {args.collection!r}: {summary}\n")
    return 1 if report.skipped and not report.indexed else 0


def _hit_dict(hit: Any) -> dict[str, Any]:
    from dataclasses import asdict

    data = asdict(hit)
    if isinstance(data.get("similarity"), float) and math.isnan(data["similarity"]):
        data["similarity"] = None
    return data


def cmd_search(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    collection = app.open_collection(args.collection, home=args.home)
    kinds = ("chunk", "question") if args.questions else ("chunk",)
    hits = collection.search(args.query, k=args.k, mode=args.mode, kinds=kinds)
    if args.json:
        json.dump([_hit_dict(h) for h in hits], out, ensure_ascii=False, indent=2)
        out.write("\n")
        return 0
    if not hits:
        err.write(f"no hits in collection {args.collection!r}\n")
    for rank, hit in enumerate(hits, 1):
        path = " > ".join(hit.section_path) or "(before the first heading)"
        page = f" p.{hit.page}" if hit.page else ""
        sim = "" if math.isnan(hit.similarity) else f"  sim {hit.similarity:.2f}"
        out.write(f"{rank}. {hit.source}{page} · {path}  [{hit.start}:{hit.end}]{sim}\n")
        if hit.kind == "question":
            out.write(f"   Q: {hit.text}\n   A: {hit.answer}\n")
        else:
            out.write(f"   {snippet(hit.text, 160)}\n")
    return 0


def cmd_questions_generate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    collection = app.open_collection(args.collection, home=args.home)
    bars: list[Any] = []
    try:
        written = app.generate_questions(
            collection, load_model(args, Reporter(False, err)),
            documents=args.doc,
            density=args.density,
            long_answers=args.long_answers, retries=args.retries,
            on_document=lambda source: _request_bar(err, source, bars),
            on_written=lambda done: _written(out, done, bars))
    except NotFound as exc:
        raise NotFound(f"{exc}; see 'marginalia collections show {args.collection}'", exc.kind, exc.name) from None
    err.write(f"collection {args.collection!r}: {sum(w.new for w in written)} new question entries\n")
    return 0


def _request_bar(err: TextIO, source: str, bars: list[Any]) -> Any:
    bar = progress_bar(err, 0, "request", Path(source).name[:30])
    bars.append(bar)

    def advance(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    return advance


def _written(out: TextIO, written: app.DocumentQuestions, bars: list[Any]) -> None:
    bars.pop().close()
    report = written.report
    skipped = ", ".join(f"{n} {why}" for why, n in report.skipped.items()) or "none"
    out.write(f"{written.source}: {len(report.pairs)} pairs ({written.new} new) from {report.requests} requests; "
              f"skipped: {skipped}\n")


def cmd_questions_export(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    lines = app.export_questions(args.collection, home=args.home, system=args.system, long=args.long)
    if args.output:
        target = Path(args.output)
        atomic_write_text(target, "".join(line + "\n" for line in lines))
        err.write(f"wrote {len(lines)} conversations to {target}\n")
    else:
        for line in lines:
            out.write(line + "\n")
    return 0


def cmd_collections_list(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from dataclasses import asdict

    infos = app.list_collections(args.home)
    if args.json:
        json.dump([asdict(i) for i in infos], out, indent=2)
        out.write("\n")
        return 0
    if not infos:
        err.write("no collections yet; create one with 'marginalia index PATH --collection NAME'\n")
    for info in infos:
        if info.n_documents is None:
            out.write(f"{info.name}  (schema version {info.schema_version}: not readable by this marginalia)\n")
        else:
            out.write(f"{info.name}  {info.n_documents} documents, {info.n_chunks} chunks, "
                      f"{info.n_questions} questions  ({info.embedder})\n")
    return 0


def cmd_collections_show(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from dataclasses import asdict

    collection = app.open_collection(args.name, home=args.home)
    docs = collection.documents()
    if args.json:
        json.dump([asdict(d) for d in docs], out, indent=2)
        out.write("\n")
        return 0
    for d in docs:
        out.write(f"{d.source}  {d.format}, {d.n_chunks} chunks, {d.n_questions} questions  "
                  f"[{d.doc_id}] {d.title!r}\n")
        if args.tree:
            out.write(app.section_outline(collection.sections(d.doc_id), collection.document(d.doc_id)) + "\n")
    return 0


def cmd_collections_delete(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    what = f"document {args.doc!r} from collection {args.name!r}" if args.doc else f"collection {args.name!r}"
    if not args.yes:
        if not sys.stdin.isatty():
            raise UserError(f"not deleting {what} without --yes (no terminal to ask on)")
        err.write(f"delete {what}? [y/N] ")
        err.flush()
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            err.write("nothing deleted\n")
            return 1
    if args.doc:
        if not app.open_collection(args.name, home=args.home).delete_document(args.doc):
            raise UserError(f"collection {args.name!r} has no document {args.doc!r}; "
                            f"see 'marginalia collections show {args.name}'")
    else:
        app.open_collection(args.name, home=args.home)  # a clear error for an unknown name
        app.delete_collection(args.name, home=args.home)
    err.write(f"deleted {what}\n")
    return 0
