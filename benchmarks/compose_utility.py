"""Composition utility: how good are the client's suggestions, with and without memory, against labels
written by a stronger model; and how fresh memory stays against what it costs (memory requests) as the
coordinator's edit-distance threshold varies.

Test items are prefixes of real documents, cut inside a paragraph: WikiText articles (in domain: the
collection memory is drawn from holds WikiText articles, never the item's own) and Enron e-mails (out of
domain). For each item, the eval model (a stronger GGUF) writes the memory from what is retrieved for the
prefix's last words, both as takeaways and as WiM margins, and the label: its own continuation of the
prefix, ``--tokens`` tokens, given the takeaways memory (labels come from a stronger model, as in
Hybrid-RACA). These are cached per item in a JSONL under the home, so reruns and the freshness
experiment reuse them; so are each row's completions (per client, its files' change time included), so a
run that stops goes on where it stopped. Rows, each a client completing the prefix with ``--tokens`` new
tokens:

- vanilla client: no memory;
- client + retrieved chunks: the raw retrieved chunks as memory;
- client + memory (takeaways) and client + memory (margins): the eval model's memory;
- instruction-tuned client, no memory, and instruction-tuned client + memory (takeaways): ``--tuned-client
  SPEC`` (not run when not given); the first tells how much of the tuned client's gain is the memory's.

Columns: perplexity of the labels under that client and prompt, GLEU, METEOR, BLEU-4, ROUGE-1, ROUGE-L,
BERTScore (``marginalia.bench.generation_metrics``), with a bootstrap 95% interval on GLEU; the tuned
client's GLEU over the vanilla client's, with a paired bootstrap interval (the same resampled items).
And how much the labels take from their memory: the share of the word units a label adds to its prefix
that its takeaways hold, and each row's GLEU on the labels that take any (the items where reading the
memory can pay).

Freshness vs cost: the WikiText prefixes are typed again token by token through the augmentation
coordinator at several thresholds; every request it makes is answered at once (retrieval only: the
retrieved chunks are the memory, so that dozens of requests per item stay affordable), and the client
completes the whole prefix with the memory the coordinator holds at its end. Reported: memory requests per
1,000 typed tokens and GLEU against the labels, as a table and a plot.

With ``--enron-corpus mail`` the Enron items draw their memory from the other e-mails instead (a collection
of the e-mails, as a user's own mailbox would be), never from the item's own e-mail or one that shares a
10-word run with it (a reply quoting it, a copy): what memory does when the collection holds related text.
That run stores a measurement of its own (``--name``) and skips the freshness replay with ``--fresh-items 0``.

    python benchmarks/compose_utility.py [--wiki 32] [--enron 32] [--tuned-client SPEC] [--fresh-items 15]
    python benchmarks/compose_utility.py --wiki 0 --enron 60 --enron-corpus mail --fresh-items 0 \
        --name compose_utility_mail

Stores benchmarks/measurements/<name>.json (see benchmarks/report.py) and the freshness plot beside it.

The texts are read at run time from ../shared/data (``--data``); nothing of them is kept in the repository.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    BENCHMARKS,
    MEASUREMENTS,
    ROOT,
    Benchmark,
    git_commit,
    load_note,
    measurement,
    show,
    write_if_changed,
)
from _markdown import Record, made_by, num, table, times_interval
from compose_items import (
    SHARED_RUN,
    Item,
    detokenize_email,
    enron_items,
    shared_runs,
    wikitext_items,
)
from compose_latency import clean
from compose_tuning import span

DATA = ROOT.parent / "shared" / "data"
EVAL_MODEL = Path.home() / ".cache" / "marginalia-eval" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
#: a completion with fewer than this share of its words distinct loops (`looping`)
LOOPING = 0.6
#: words of the prefix's end that retrieval searches with
QUERY_WORDS = 60
CACHE_VERSION = 3  # 2: margins asked as a request to help continue the passage, no topicality asked;
#                    3: a takeaway two chunks of one document yield is held once
ROWS = ("vanilla", "chunks", "takeaways", "margins", "tuned-bare", "tuned")
ROW_NAMES = {
    "vanilla": "client (SmolLM2-135M), no memory",
    "chunks": "client + retrieved chunks",
    "takeaways": "client + memory (takeaways)",
    "margins": "client + memory (WiM margins)",
    "tuned-bare": "instruction-tuned client, no memory",
    "tuned": "instruction-tuned client + memory (takeaways)",
}


# -- the eval model's memory and labels, cached --------------------------------------------------------


def item_key(item: Item, eval_name: str, tokens: int, hits: int, corpus: str = "wikitext", label_guard: int = 0) -> str:
    """The cache key of an item's memory and label (a label guard of 0 and the WikiText corpus leave the keys of
    earlier versions as they were)."""
    fields = [CACHE_VERSION, item.dataset, item.key, item.prefix, eval_name, tokens, hits]
    if corpus != "wikitext":
        fields.append(corpus)
    if label_guard:
        fields.append(f"label-guard-{label_guard}")
    raw = json.dumps(fields)
    return hashlib.sha256(raw.encode()).hexdigest()[:20]


def query_request(prefix: str) -> Any:
    from marginalia.compose import MemoryRequest

    return MemoryRequest(1, " ".join(prefix.split()[-QUERY_WORDS:]), prefix, 0)


def chunk_items(hits: Sequence[Any]) -> list[Any]:
    from marginalia.compose import MemoryItem

    return [MemoryItem(h.text, h.source, h.doc_id, h.section_path, h.start, h.end, "margin") for h in hits]


def relabel(item: Item, record: dict[str, Any], label_client: Any, tokens: int) -> dict[str, Any]:
    """``record`` (`eval_record`) with a new label by ``label_client``, on the same takeaways memory."""
    from marginalia.compose.memory import items_from_records

    t0 = time.perf_counter()
    takeaways = items_from_records(record["takeaways"])
    label = label_client.complete(item.prefix, max_new_tokens=tokens, memory=takeaways).text()
    return {**record, "label": label, "seconds": {**record["seconds"], "label": round(time.perf_counter() - t0, 2)}}


def eval_record(item: Item, takeaway: Any, margin: Any, label_client: Any, tokens: int) -> dict[str, Any]:
    """The eval model's memory (takeaways and margins) for an item, its label, and the retrieved chunks."""
    request = query_request(item.prefix)
    t0 = time.perf_counter()
    hits = takeaway.retrieve(request)
    takeaways = takeaway.compress(request, hits) if hits else []
    t1 = time.perf_counter()
    margins = margin(request)
    t2 = time.perf_counter()
    label = label_client.complete(item.prefix, max_new_tokens=tokens, memory=takeaways).text()
    t3 = time.perf_counter()
    return {"chunks": [asdict(x) for x in chunk_items(hits)], "takeaways": [asdict(x) for x in takeaways],
            "margins": [asdict(x) for x in margins], "label": label,
            "seconds": {"takeaways": round(t1 - t0, 2), "margins": round(t2 - t1, 2), "label": round(t3 - t2, 2)}}


def load_cache(path: Path) -> dict[str, dict[str, Any]]:
    cache: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text("utf-8").splitlines():
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by a crash: that item is redone
                    continue
                cache[record["key"]] = record
    return cache


# -- the rows ------------------------------------------------------------------------------------------------


def model_identity(spec: str) -> str:
    """``spec`` with the newest change time of the files it names: a client tuned again at the same path is
    another client."""
    name = spec.split(":", 1)[1] if ":" in spec else ""
    path = Path(name).expanduser() if name else None
    if path is None or not path.exists():
        return spec
    files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else [path]
    return f"{spec}@{max((f.stat().st_mtime for f in files), default=0.0):.0f}"


def tuning_summary(spec: str | None) -> str | None:
    """What a tuned client learned from, read from its folder's tuning.json ("332 training examples, 200 steps"), or
    None (no tuned client, or one whose folder has no readable record)."""
    if not spec or not spec.startswith("tuned:"):
        return None
    from marginalia.models.llamacpp.lora_gguf import TUNED_RECORD

    try:
        record = json.loads((Path(spec.split(":", 1)[1]).expanduser() / TUNED_RECORD).read_text("utf-8"))
        return f"{record['train_examples']} training examples, {record['steps']} steps"
    except (OSError, ValueError, KeyError, TypeError):
        return None


def looping(text: str) -> bool:
    """Whether a completion repeats itself: fewer than `LOOPING` of its words distinct (10 words or more)."""
    words = text.split()
    return len(words) >= 10 and len(set(words)) < LOOPING * len(words)


def run_row(client: Any, items: Sequence[Item], records: Sequence[dict[str, Any]], memory_of: str | None,
            tokens: int, identity: str, done: dict[str, dict[str, Any]],
            path: Path) -> tuple[list[str], list[list[float]]]:
    """Each item's completion and the label's token log-probabilities, under one client and memory. Each item's
    pair is appended to ``path`` as it is made (``done``: those read from it), so a run that stops is resumed.
    The log-probabilities do not depend on the decoding: those of a greedy run are reused under a loop guard."""
    from marginalia.compose.memory import items_from_records

    predictions, logprobs = [], []
    guard = client.params.no_repeat_ngram
    for item, record in zip(items, records, strict=True):
        # cached memory is read as memory is made now: a takeaway saying its passage holds nothing is dropped
        # (the label was written with it; it holds no fact), and the completion is made again without it
        memory = items_from_records(record[memory_of]) if memory_of else ()
        what = [identity, memory_of, record["key"], tokens]
        if memory_of and len(memory) < len(record[memory_of]):
            what.append("without-empty-takeaways")
        plain = hashlib.sha256(json.dumps(what).encode()).hexdigest()[:20]
        # "numbers-free": the guard lets tokens of digits and blanks repeat (completions made before are redone)
        key = hashlib.sha256(json.dumps([*what, f"no-repeat-{guard}-numbers-free"]).encode()).hexdigest()[:20] \
            if guard else plain
        if key not in done:
            text = client.complete(item.prefix, max_new_tokens=tokens, memory=memory).text()
            if plain in done:
                lps = done[plain]["logprobs"]
            else:
                lps = client.score(item.prefix, record["label"], memory=memory) if record["label"].strip() else []
            done[key] = {"key": key, "prediction": text, "logprobs": lps}
            with path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(done[key]) + "\n")
        predictions.append(done[key]["prediction"])
        logprobs.append(done[key]["logprobs"])
    return predictions, logprobs


def scores(predictions: list[str], labels: list[str], logprobs: list[list[float]], home: Path) -> dict[str, Any]:
    from marginalia.bench import generation_metrics as gm

    low, high = gm.corpus_interval(lambda idx: gm.gleu([predictions[i] for i in idx], [labels[i] for i in idx]),
                                   len(labels))
    rouge = gm.rouge(predictions, labels)
    return {"ppl": gm.perplexity(logprobs), "gleu": gm.gleu(predictions, labels), "gleu_ci": (low, high),
            "meteor": gm.meteor(predictions, labels, home=home), "bleu4": gm.bleu4(predictions, labels),
            "rouge1": rouge["rouge1"], "rougeL": rouge["rougeL"], "bertscore": gm.bertscore(predictions, labels),
            "n": len(labels)}


def gleu_ratio_interval(first: list[str], second: list[str], labels: list[str]) -> tuple[float, float]:
    """A paired bootstrap 95% interval of GLEU(first) / GLEU(second): both on the same resampled items."""
    from marginalia.bench import generation_metrics as gm

    def ratio(idx: Sequence[int]) -> float:
        base = gm.gleu([second[i] for i in idx], [labels[i] for i in idx])
        return gm.gleu([first[i] for i in idx], [labels[i] for i in idx]) / base if base else float("inf")

    return gm.corpus_interval(ratio, len(labels))


def memory_draw(label: str, prefix: str, memory: Sequence[str]) -> tuple[set[str], set[str]]:
    """The label's word units that its prefix does not hold (what the label adds), and those of them that
    the memory holds: a label that adds nothing from its memory cannot be matched better by a client that
    reads the memory."""
    from marginalia.patterns.grounding import units

    new = set(units(label)) - set(units(prefix))
    return new, new & {u for text in memory for u in units(text)}


# -- freshness vs cost ---------------------------------------------------------------------------------------


def replay(client: Any, item: Item, fetch: Any, threshold: int, memory_size: int) -> tuple[int, int, tuple[Any, ...]]:
    """Type the prefix token by token through a coordinator whose requests are answered at once: (typed
    tokens, requests made, the memory at the end)."""
    from marginalia.compose import AugmentationCoordinator

    ids = client.encode(item.prefix)
    tok = client.generator.tokenizer
    coordinator = AugmentationCoordinator(fetch, threshold=threshold, memory_size=memory_size, timeout=600)
    requests = 0
    try:
        for k in range(1, len(ids) + 1):
            if coordinator.observe(tok.decode(ids[:k]), ids[:k]) is not None:
                requests += 1
                coordinator.wait_idle()
        return len(ids), requests, coordinator.memory
    finally:
        coordinator.close()


def plot(thresholds: list[int], rates: list[float], gleus: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, left = plt.subplots(figsize=(6.4, 3.8), dpi=110)
    left.plot(thresholds, rates, "o-", color="tab:blue", label="memory requests / 1,000 typed tokens")
    left.set_xscale("log", base=2)
    left.set_xticks(thresholds, [str(t) for t in thresholds])
    left.set_xlabel("edit-distance threshold (client tokens)")
    left.set_ylabel("requests per 1,000 typed tokens", color="tab:blue")
    right = left.twinx()
    right.plot(thresholds, gleus, "s--", color="tab:red", label="GLEU")
    right.set_ylabel("GLEU vs labels", color="tab:red")
    left.set_title("Freshness vs cost (WikiText prefixes, retrieved-chunk memory)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# -- the verdicts -------------------------------------------------------------------------------------------


def memory_share(draws: Sequence[tuple[set[str], set[str]]]) -> float | None:
    """Of the labels' new word units (see `memory_draw`), the share their memory holds (None: no labels)."""
    new_units = sum(len(new) for new, _ in draws)
    return sum(len(got) for _, got in draws) / new_units if new_units else None


def perplexity_ratio_interval(first: list[list[float]], second: list[list[float]]) -> tuple[float, float]:
    """A paired bootstrap 95% interval of PPL(first) / PPL(second), both on the same resampled items (each
    item's label token log-probabilities)."""
    from marginalia.bench import generation_metrics as gm

    def ratio(idx: Sequence[int]) -> float:
        return gm.perplexity([first[i] for i in idx]) / gm.perplexity([second[i] for i in idx])

    return gm.corpus_interval(ratio, len(first))


# -- the run, stage by stage: arguments, items, labels, rows, freshness ------------------------------------


def parse_args() -> argparse.Namespace:
    from marginalia.options import NO_REPEAT_NGRAM

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--wiki", type=int, default=16, help="WikiText items (in domain)")
    ap.add_argument("--wiki-articles", default="0:8",
                    help="the articles (a:b) WikiText items are cut from: by default the ones compose_tuning.py "
                         "leaves out, so a tuned client never saw them")
    ap.add_argument("--enron", type=int, default=16, help="Enron e-mail items (out of domain)")
    ap.add_argument("--tokens", type=int, default=44, help="new tokens per label and per completion")
    ap.add_argument("--eval-model", type=Path, default=EVAL_MODEL, help="the GGUF that writes labels and memory")
    ap.add_argument("--client", default="smollm2", help="the client model spec")
    ap.add_argument("--tuned-client", default=None, help="an instruction-tuned client model spec (its row is "
                                                        "not run without it)")
    ap.add_argument("--no-repeat-ngram", type=int, default=NO_REPEAT_NGRAM,
                    help="the clients' loop guard: no run of this many tokens written twice in a completion (0: "
                         "plain greedy; default: the compose default for in-process models); the labels follow "
                         "--label-guard")
    ap.add_argument("--label-guard", type=int, default=0,
                    help="the eval model writes no run of this many tokens twice in a label (numbers apart; 0: "
                         "plain greedy); an item labelled without the guard keeps its memory, only its label "
                         "is written again")
    ap.add_argument("--hits", type=int, default=2, help="chunks retrieved per memory request")
    ap.add_argument("--threads", type=int, default=1,
                    help="llama.cpp threads per model (1 decodes faster than 2 on a machine busy with other work)")
    ap.add_argument("--thresholds", default="8,16,32,64,128,256", help="edit-distance thresholds to replay")
    ap.add_argument("--fresh-items", type=int, default=8, help="WikiText items replayed per threshold")
    ap.add_argument("--home", type=Path, default=None, help="marginalia home (the collection and the cache)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--enron-corpus", choices=("wikitext", "mail"), default="wikitext",
                    help="where the Enron items' memory comes from: the WikiText collection, or the other e-mails")
    ap.add_argument("--name", default="compose_utility", help="the measurement's name")
    ap.add_argument("--no-write", action="store_true",
                    help="print the section, store nothing (the plot goes to the home)")
    return ap.parse_args()


@dataclass
class Corpus:
    """The test items, and the collections their memory comes from."""

    items: list[Item]
    store_of: dict[str, Any]  # per dataset, the collection its memory is retrieved from
    ids_of: dict[str, str]  # a collection file's resolved path -> its document id
    mail_files: dict[str, Path]  # e-mail id -> its file (only when the e-mails are the Enron items' collection)
    near: dict[str, set[str]]  # e-mail id -> the e-mails quoting or copying it
    description: str  # where memory comes from, in the section's words

    def has(self, dataset: str) -> bool:
        return any(it.dataset == dataset for it in self.items)

    def count(self, dataset: str) -> int:
        return sum(1 for it in self.items if it.dataset == dataset)

    def excluded(self, item: Item) -> set[str]:
        """What an item's memory must not come from: its own document, and e-mails quoting or copying it."""
        sources = {item.source} | ({str(self.mail_files[k]) for k in self.near.get(item.key.removeprefix("enron"), ())}
                                   if item.dataset == "enron" else set())
        return {x for s in sources for x in (s, self.ids_of.get(s, ""))} - {""}


def data_files(args: argparse.Namespace) -> tuple[Path, Path]:
    """The WikiText articles and the Enron e-mails under ``--data``."""
    return args.data / "wikitext-test-articles.part1.jsonl", args.data / "enron-ham.part1.jsonl"


def load_corpus(args: argparse.Namespace, home: Path, count_tokens: Any) -> Corpus:
    """The items (WikiText articles and e-mails written into files under ``home``) and their collections, indexed
    with ``count_tokens`` (the client's tokenizer)."""
    from marginalia import app

    wiki_path, enron_path = data_files(args)
    docs = home / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    articles = [json.loads(line) for line in wiki_path.read_text("utf-8").splitlines() if line.strip()]
    files = [write_if_changed(docs / f"wiki-{i:02d}.md", f"# {article['title']}\n\n{clean(article['text'])}").resolve()
             for i, article in enumerate(articles)]
    emails = [json.loads(line) for line in enron_path.read_text("utf-8").splitlines() if line.strip()]
    items = wikitext_items(articles, files, span(args.wiki_articles, len(articles)), args.wiki, args.seed)
    if len(items) < args.wiki:
        sys.exit(f"--wiki {args.wiki}: articles {args.wiki_articles} give only {len(items)} prefixes; ask for fewer "
                 "or widen --wiki-articles (an article compose_tuning.py cut would flatter the tuned client)")
    mail_files: dict[str, Path] = {}
    near: dict[str, set[str]] = {}
    if args.enron_corpus == "mail":
        mail_docs = home / "mail"
        mail_docs.mkdir(parents=True, exist_ok=True)
        texts = {str(row["id"]): detokenize_email(row["text"]) for row in emails}
        mail_files = {key: write_if_changed(mail_docs / f"enron-{key}.txt", text).resolve()
                      for key, text in texts.items()}
        near = shared_runs(texts)
    items += enron_items(emails, args.enron, args.seed, mail_files or None)

    t0 = time.perf_counter()
    app.index_paths([docs], "wikitext", count_tokens=count_tokens, home=home)
    store = app.open_collection("wikitext", home=home)
    n_chunks = sum(d.n_chunks for d in store.documents())
    print(f"collection: {len(files)} articles, {n_chunks} chunks ({time.perf_counter() - t0:.0f} s)", flush=True)
    # every item's own article is excluded by its source; documents' ids are what memory generators see
    ids_of = {str(Path(d.source).resolve()): d.doc_id for d in store.documents()}
    corpus = Corpus(items, {"wikitext": store, "enron": store}, ids_of, mail_files, near, "")
    wiki_corpus = f"a collection of the {len(files)} WikiText articles ({n_chunks} chunks)"
    if not mail_files:
        corpus.description = wiki_corpus + ", never from the WikiText item's own article"
        return corpus
    app.index_paths([home / "mail"], "enron-mail", count_tokens=count_tokens, home=home)
    corpus.store_of["enron"] = mail = app.open_collection("enron-mail", home=home)
    mail_chunks = sum(d.n_chunks for d in mail.documents())
    ids_of.update({str(Path(d.source).resolve()): d.doc_id for d in mail.documents()})
    quoted = sum(1 for it in items if it.dataset == "enron" and near.get(it.key.removeprefix("enron")))
    mail_corpus = (f"a collection of the {len(mail_files)} e-mails ({mail_chunks} chunks), never the item's own "
                   f"e-mail nor one sharing a {SHARED_RUN}-word run with it (a reply quoting it, a copy: "
                   f"{quoted} of the Enron items have one)")
    corpus.description = (f"{wiki_corpus} for the WikiText items (never the item's own article), and for the Enron "
                          f"items from {mail_corpus}") if corpus.has("wikitext") else mail_corpus
    return corpus


@dataclass
class Labelled:
    """The eval model's memory and label per item (`eval_record`), and what making them cost this run."""

    records: list[dict[str, Any]]
    seconds: float
    made: int  # items given memory and a label
    relabelled: int  # items given only a new label (a new label guard)
    drafted: int  # memory items from what an item must not draw on (0, or a leak)


def label_items(args: argparse.Namespace, corpus: Corpus, eval_gen: Any, home: Path) -> Labelled:
    """Each item's record: from the cache under ``home`` where it is there, else made by ``eval_gen`` and
    appended to the cache at once (a run that stops goes on where it stopped)."""
    from marginalia.compose import CompletionClient, MarginMemory, TakeawayMemory
    from marginalia.options import ComposeOptions

    options = ComposeOptions()
    # no memory is ever prepared in the background here, so a fork sharing the context can stand by
    label_client = CompletionClient(eval_gen.fork(keep_cache=False), standby=eval_gen.fork(keep_cache=False),
                                    suggestion_tokens=args.tokens, no_repeat_ngram=args.label_guard)
    cache_path = home / "eval-cache.jsonl"
    cache = load_cache(cache_path)
    run = Labelled([], 0.0, 0, 0, 0)
    for n, item in enumerate(corpus.items, 1):
        source = args.enron_corpus if item.dataset == "enron" else "wikitext"
        key = item_key(item, eval_gen.name, args.tokens, args.hits, source, args.label_guard)
        plain = item_key(item, eval_gen.name, args.tokens, args.hits, source)
        if key not in cache:
            t0 = time.perf_counter()
            if plain in cache:  # the memory is made (a label guard is new): only the label is written again
                record = {**relabel(item, cache[plain], label_client, args.tokens), "key": key}
                run.relabelled += 1
            else:
                common = {"hits": args.hits, "search": options.search, "min_similarity": options.min_similarity,
                          "exclude": corpus.excluded(item), "item_tokens": options.item_tokens}
                takeaway = TakeawayMemory(corpus.store_of[item.dataset], eval_gen, **common)
                margin = MarginMemory(corpus.store_of[item.dataset], eval_gen.fork(keep_cache=False), **common)
                record = {"key": key, **eval_record(item, takeaway, margin, label_client, args.tokens)}
                run.made += 1
            run.seconds += time.perf_counter() - t0
            with cache_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            cache[key] = record
            print(f"[{n}/{len(corpus.items)}] {item.key}: {record['seconds']} label={record['label'][:60]!r}",
                  flush=True)
        run.records.append(cache[key])
    run.drafted = sum(1 for r, it in zip(run.records, corpus.items, strict=True)
                      for x in r["takeaways"] + r["margins"] + r["chunks"]
                      if it.source and x["doc_id"] in corpus.excluded(it))
    return run


#: the memory each row's client reads (None: none)
MEMORY_OF = {"vanilla": None, "chunks": "chunks", "takeaways": "takeaways", "margins": "margins",
             "tuned-bare": None, "tuned": "takeaways"}


@dataclass
class Rows:
    """Each row's scores (by "dataset/row"), and per dataset its rows' completions, its labels and what the
    labels draw from their memory (`memory_draw`)."""

    results: dict[str, dict[str, Any]]
    predictions: dict[str, dict[str, list[str]]]
    logprobs: dict[str, dict[str, list[list[float]]]]
    labels: dict[str, list[str]]
    draws: dict[str, list[tuple[set[str], set[str]]]]
    seconds: float
    # per dataset and memory row: the share of the completions' new word units their own memory holds, and
    # the same share for the labels against that memory (`memory_share`)
    copies: dict[str, dict[str, tuple[float | None, float | None]]] = field(default_factory=dict)

    def gleu(self, dataset: str) -> dict[str, float]:
        return {row: self.results[f"{dataset}/{row}"]["gleu"] for row in ROWS if f"{dataset}/{row}" in self.results}


def score_rows(args: argparse.Namespace, corpus: Corpus, records: Sequence[dict[str, Any]], client: Any,
               tuned: Any, home: Path) -> Rows:
    """Every row on the items with a label; completions cached per client, row and item under ``home``."""
    completions_path = home / "client-cache.jsonl"  # completions and label scores, per client, row and item
    completions = load_cache(completions_path)
    rows = Rows({}, {}, {}, {}, {}, 0.0)
    t0 = time.perf_counter()
    for dataset in ("wikitext", "enron"):
        labelled = [(it, r) for it, r in zip(corpus.items, records, strict=True)
                    if it.dataset == dataset and r["label"].strip()]
        ds_items, ds_records = [c[0] for c in labelled], [c[1] for c in labelled]
        labels = rows.labels[dataset] = [r["label"] for r in ds_records]
        memories = {source: [[x["text"] for x in r[source]] for r in ds_records]
                    for source in dict.fromkeys(m for m in MEMORY_OF.values() if m)}
        draws = {source: [memory_draw(label, it.prefix, m) for label, it, m in zip(labels, ds_items, texts, strict=True)]
                 for source, texts in memories.items()}
        rows.draws[dataset] = draws["takeaways"]
        for row in ROWS:
            row_client = tuned if row.startswith("tuned") else client
            if row_client is None or not ds_items:
                continue
            identity = model_identity(args.tuned_client if row.startswith("tuned") else args.client)
            preds, lps = run_row(row_client, ds_items, ds_records, MEMORY_OF[row], args.tokens, identity,
                                 completions, completions_path)
            result = rows.results[f"{dataset}/{row}"] = scores(preds, labels, lps, home)
            # how many items had any memory at all in this row (an empty memory is the vanilla prompt)
            source = MEMORY_OF[row]
            result["with_memory"] = sum(bool(r[source]) for r in ds_records) if source else None
            rows.predictions.setdefault(dataset, {})[row] = preds
            rows.logprobs.setdefault(dataset, {})[row] = lps
            if source:
                rows.copies.setdefault(dataset, {})[row] = (
                    memory_share([memory_draw(p, it.prefix, m)
                                  for p, it, m in zip(preds, ds_items, memories[source], strict=True)]),
                    memory_share(draws[source]))
            print(f"{dataset} {row}: GLEU {result['gleu']:.1f} PPL {result['ppl']:.1f}", flush=True)
    rows.seconds = time.perf_counter() - t0
    return rows


def freshness(args: argparse.Namespace, corpus: Corpus, records: Sequence[dict[str, Any]], client: Any,
              eval_gen: Any) -> tuple[list[dict[str, Any]], int]:
    """Per threshold: memory requests per 1,000 typed tokens and GLEU, over the first ``--fresh-items`` labelled
    WikiText items typed again token by token; and how many items that was."""
    from marginalia.bench import generation_metrics as gm
    from marginalia.compose import TakeawayMemory
    from marginalia.options import ComposeOptions

    options = ComposeOptions()
    store = corpus.store_of["wikitext"]
    fresh = [(it, r) for it, r in zip(corpus.items, records, strict=True)
             if it.dataset == "wikitext" and r["label"].strip()][: args.fresh_items]
    out = []
    for threshold in [int(t) for t in args.thresholds.split(",")] if fresh else []:
        typed = made_requests = 0
        preds, labels = [], []
        for item, record in fresh:
            exclude = {item.source, corpus.ids_of.get(item.source, "")} - {""}
            retriever = TakeawayMemory(store, eval_gen, hits=args.hits, search=options.search,
                                       min_similarity=options.min_similarity, exclude=exclude)

            def fetch(request: Any, retriever: Any = retriever) -> list[Any]:
                return chunk_items(retriever.retrieve(request))

            n_typed, n_requests, memory = replay(client, item, fetch, threshold, args.hits)
            typed += n_typed
            made_requests += n_requests
            preds.append(client.complete(item.prefix, max_new_tokens=args.tokens, memory=memory).text())
            labels.append(record["label"])
        out.append({"threshold": threshold, "rate": 1000 * made_requests / typed, "requests": made_requests,
                    "typed": typed, "gleu": gm.gleu(preds, labels)})
        print(f"threshold {threshold}: {out[-1]}", flush=True)
    return out, len(fresh)


# -- the numbers ------------------------------------------------------------------------------------------------


def times(a: float, b: float) -> float:
    return a / b if b else float("inf")


TITLES = {"wikitext": "WikiText (in domain)", "enron": "Enron e-mails (out of domain)"}


def dataset_numbers(rows: Rows, dataset: str) -> dict[str, Any]:
    """One dataset's rows as the measurement file holds them: each row's scores, each row's GLEU and label
    perplexity over the vanilla client's with paired 95% intervals, the completions that loop, what the labels
    take from their memory (`memory_draw`) and each row's GLEU on the labels that take any, and what each memory
    row's completions take from their memory beside the labels' share."""
    from marginalia.bench import generation_metrics as gm

    results = {row: rows.results[f"{dataset}/{row}"] for row in ROWS if f"{dataset}/{row}" in rows.results}
    kept, labels, scored = rows.predictions[dataset], rows.labels[dataset], rows.logprobs[dataset]
    vanilla = results["vanilla"]
    versus = {row: [times(results[row]["gleu"], vanilla["gleu"]), *gleu_ratio_interval(kept[row], kept["vanilla"], labels)]
              for row in ROWS if row != "vanilla" and row in kept}
    perplexity = {row: [results[row]["ppl"] / vanilla["ppl"], *perplexity_ratio_interval(scored[row], scored["vanilla"])]
                  for row in ("chunks", "takeaways", "margins", "tuned") if row in scored}
    draws = rows.draws[dataset]
    drawing = [i for i, (_, got) in enumerate(draws) if got]
    return {
        "title": TITLES[dataset], "rows": results, "gleu_vs_vanilla": versus, "ppl_vs_vanilla": perplexity,
        "loops": {**{row: sum(looping(p) for p in preds) for row, preds in kept.items()},
                  "labels": sum(looping(label) for label in labels)},
        "draw": {"new_units": sum(len(new) for new, _ in draws), "from_memory": sum(len(got) for _, got in draws),
                 "share": memory_share(draws), "labels_drawing": len(drawing), "labels": len(draws),
                 "gleu_on_them": {row: gm.gleu([preds[i] for i in drawing], [labels[i] for i in drawing])
                                  for row, preds in kept.items()} if drawing else {}},
        "copies": {row: list(shares) for row, shares in rows.copies.get(dataset, {}).items()},
    }


def numbers(args: argparse.Namespace, corpus: Corpus, labelled: Labelled, rows: Rows,
            fresh_rows: list[dict[str, Any]], fresh_items: int) -> dict[str, Any]:
    """The run as the measurement file holds it: its setup, each dataset's `dataset_numbers`, and the freshness
    replay."""
    wiki_n, enron_n = corpus.count("wikitext"), corpus.count("enron")
    items = " and ".join(
        ([f"{wiki_n} WikiText prefixes (in domain, from articles {args.wiki_articles}, which the tuning left out)"]
         if wiki_n else []) + ([f"{enron_n} Enron e-mail prefixes (out of domain)"] if enron_n else []))
    return {
        "setup": {
            "items": items, "eval_model": args.eval_model.name, "hits": args.hits,
            "memory_from": f"{corpus.description}; memory items from what an item must not draw on: {labelled.drafted}",
            "client": f"{args.client} on llama.cpp", "tokens": args.tokens,
            "decoding": (f"greedy, no run of {args.no_repeat_ngram} tokens twice" if args.no_repeat_ngram else "greedy")
                        + "; the labels " + (f"with no run of {args.label_guard} tokens twice" if args.label_guard
                                             else "plain greedy"),
            "tuned_client": args.tuned_client, "tuned_on": tuning_summary(args.tuned_client),
            "query_words": QUERY_WORDS, "looping_share": LOOPING,
        },
        "datasets": {dataset: dataset_numbers(rows, dataset) for dataset in ("wikitext", "enron")
                     if f"{dataset}/vanilla" in rows.results},
        "freshness": {"items": fresh_items, "rows": fresh_rows},
        "labelled": {"made": labelled.made, "relabelled": labelled.relabelled, "minutes": labelled.seconds / 60},
        "rows_minutes": rows.seconds / 60,
    }


# -- main ----------------------------------------------------------------------------------------------------


def load_clients(args: argparse.Namespace, home: Path) -> tuple[Any, Any, Any]:
    """(the client's generator, the client, the tuned client or None)."""
    from marginalia import app
    from marginalia.compose import CompletionClient
    from marginalia.models.base import CachingGenerator
    from marginalia.models.llamacpp.backend import LlamaCppGenerator
    from marginalia.models.weights import embedded_gguf

    if args.client == "smollm2":
        client_gen = LlamaCppGenerator(embedded_gguf(), name="smollm2", n_threads=args.threads, n_branches=0)
    else:
        client_gen = app.load_model(args.client, home=home, backend="llamacpp")
    client = CompletionClient(client_gen.fork(keep_cache=False), standby=client_gen.fork(keep_cache=False),
                              suggestion_tokens=args.tokens, no_repeat_ngram=args.no_repeat_ngram)
    tuned = None
    if args.tuned_client:
        tuned_gen = app.load_model(args.tuned_client, home=home)
        if not isinstance(tuned_gen, CachingGenerator):
            sys.exit(f"the tuned client {args.tuned_client} keeps no KV cache; give an in-process model")
        tuned = CompletionClient(tuned_gen, standby=tuned_gen.fork(keep_cache=False), suggestion_tokens=args.tokens,
                                 no_repeat_ngram=args.no_repeat_ngram)
    return client_gen, client, tuned


def main() -> None:
    args = parse_args()
    for path in (*data_files(args), args.eval_model):
        if not path.is_file():
            sys.exit(f"{path} is missing; give --data or --eval-model")

    from marginalia.home import resolve_home
    from marginalia.models.llamacpp.backend import LlamaCppGenerator

    t_start = time.perf_counter()
    load_before = os.getloadavg()
    home = resolve_home(args.home) / "bench-compose-utility"
    plot_path = (home if args.no_write else MEASUREMENTS) / f"{args.name}_freshness.png"
    client_gen, client, tuned = load_clients(args, home)
    corpus = load_corpus(args, home, client_gen.tokenizer.count)
    eval_gen = LlamaCppGenerator(args.eval_model, name=f"gguf:{args.eval_model.name}", n_ctx=8192,
                                 n_threads=args.threads, n_branches=0)
    labelled = label_items(args, corpus, eval_gen, home)
    rows = score_rows(args, corpus, labelled.records, client, tuned, home)
    t_fresh = time.perf_counter()
    fresh_rows, fresh_items = freshness(args, corpus, labelled.records, client, eval_gen)
    fresh_s = time.perf_counter() - t_fresh
    if fresh_rows:
        plot([r["threshold"] for r in fresh_rows], [r["rate"] for r in fresh_rows], [r["gleu"] for r in fresh_rows],
             plot_path)
    result = numbers(args, corpus, labelled, rows, fresh_rows, fresh_items)
    result["load"] = load_note(load_before[0], os.getloadavg()[0])
    result["total_min"] = (time.perf_counter() - t_start) / 60
    result["freshness_minutes"] = fresh_s / 60
    if fresh_rows and plot_path.is_relative_to(ROOT):
        result["figure"] = plot_path.relative_to(ROOT).as_posix()
    show(measurement("compose_utility", result, name=args.name), write=not args.no_write)
    out = home / "last-run.json"
    out.write_text(json.dumps({"results": rows.results, "freshness": fresh_rows, "predictions": rows.predictions,
                               "commit": git_commit(), "args": {k: str(v) for k, v in vars(args).items()}},
                              indent=1), "utf-8")


def summary(m: Record) -> list[list[str]]:
    out = []
    for d in m["numbers"]["datasets"].values():
        g = d["gleu_vs_vanilla"]
        result = (f"tuned client + memory {times_interval(g.get('tuned'))} the vanilla client's GLEU; "
                  if g.get("tuned") else "") + f"takeaways memory alone {times_interval(g.get('takeaways'))}"
        out.append([f"Composition utility, {d['title'].split(' (')[0]} ({d['rows']['vanilla']['n']} items)", result,
                    made_by(m)])
    return out


UTILITY_ROWS = {
    "vanilla": "vanilla client, no memory",
    "chunks": "client + retrieved chunks",
    "takeaways": "client + memory (takeaways)",
    "margins": "client + memory (WiM margins)",
    "tuned-bare": "tuned client, no memory",
    "tuned": "tuned client + memory (takeaways)",
}


def section(m: Record) -> list[str]:
    n = m["numbers"]
    s = n["setup"]
    lines = [f"Items: {s['items']}. The eval model ({s['eval_model']}) writes each item's memory from {s['hits']} "
             f"retrieved chunks ({s['memory_from']}) and its label, its own continuation given that memory. Each row's "
             f"client ({s['client']}, {s['tokens']} new tokens{', ' + s['decoding'] if s.get('decoding') else ''}) "
             "completes the prefix; PPL: the labels' perplexity under it; GLEU: its completions against the labels; "
             "with memory: items whose memory held anything."
             + (f" The tuned client learned from {s['tuned_on']}." if s.get("tuned_on") else ""), ""]
    datasets = list(n["datasets"].values())
    lines += table(["row", *(f"{d['title'].split(' (')[0]} ({d['rows']['vanilla']['n']}): PPL · GLEU [95% CI] · "
                             "with memory" for d in datasets)],
                   [[label, *(f"{num(r['ppl'])} · {num(r['gleu'])} [{num(r['gleu_ci'][0])}, {num(r['gleu_ci'][1])}]"
                              + ("" if r.get("with_memory") is None else f" · {r['with_memory']}")
                              if (r := d["rows"].get(key)) else "–" for d in datasets)]
                    for key, label in UTILITY_ROWS.items() if any(key in d["rows"] for d in datasets)]) + [""]
    for d in datasets:
        g = d["gleu_vs_vanilla"]
        line = (f"{d['title']}: GLEU over the vanilla client's (paired 95% interval) "
                + ", ".join(f"{row} {times_interval(g[row])}" for row in ("chunks", "takeaways", "margins", "tuned")
                            if g.get(row)) + ".")
        if g.get("tuned"):
            line += f" Goal for the tuned client + memory, at least 2x: {'met' if g['tuned'][0] >= 2 else 'not met'}."
        # the labels' perplexity per row is in the table; its ratios with intervals stay in the measurement file
        if d["draw"].get("share") is not None:
            line += (f" The labels draw {100 * d['draw']['share']:.0f}% of the words they add from their memory, the "
                     "most memory can give a client.")
        lines += [line, ""]
    fresh = n.get("freshness") or {}
    if fresh.get("rows"):
        lines += [f"**Freshness against cost**: {fresh['items']} WikiText prefixes typed token by token through the "
                  "coordinator, retrieved chunks as memory; a lower threshold asks for memory more often.", "",
                  *table(["threshold (token edits)", "memory requests / 1,000 typed tokens", "GLEU"],
                         [[str(r["threshold"]), num(r["rate"]), num(r["gleu"])] for r in fresh["rows"]]), ""]
        if n.get("figure"):
            lines += [f"![freshness against cost]({n['figure']})", ""]
    return lines[:-1]


BENCHMARKS["compose_utility"] = Benchmark("Composition utility", section, summary)


if __name__ == "__main__":
    main()
