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
That run writes its own section (``--section``) and skips the freshness replay with ``--fresh-items 0``.

    python benchmarks/compose_utility.py [--wiki 32] [--enron 32] [--tuned-client SPEC] [--fresh-items 15]
    python benchmarks/compose_utility.py --wiki 0 --enron 60 --enron-corpus mail --fresh-items 0 \
        --section compose_utility_mail

The texts are read at run time from ../shared/data (``--data``); nothing of them is kept in the repository.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import ROOT, command_line, git_commit, load_note, machine, write_section  # noqa: E402
from compose_latency import clean  # noqa: E402
from compose_tuning import span  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
EVAL_MODEL = Path.home() / ".cache" / "marginalia-eval" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
PLOT = ROOT / "benchmarks" / "compose_freshness.png"
#: a completion with fewer than this share of its words distinct loops (`looping`)
LOOPING = 0.6
#: words of the prefix's end that retrieval searches with
QUERY_WORDS = 60
#: characters of earlier text a prefix keeps before its paragraph (cut at a paragraph start)
PREFIX_CHARS = 700
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


@dataclass(frozen=True)
class Item:
    dataset: str  # "wikitext" or "enron"
    key: str  # the document's id and the cut
    source: str  # the document's file in the collection ("" for an e-mail: not in it)
    prefix: str


# -- test items ------------------------------------------------------------------------------------------


def _cut(paragraph: str, rng: random.Random) -> str | None:
    """The paragraph up to a word end 40-70% into it (None when it is too short to leave 20 words after)."""
    ws = paragraph.split(" ")
    if len(ws) < 60:
        return None
    k = rng.randint(int(0.4 * len(ws)), int(0.7 * len(ws)))
    return " ".join(ws[:k])


def wikitext_items(articles: list[dict[str, Any]], files: list[Path], chosen: range, n: int,
                   seed: int) -> list[Item]:
    """``n`` prefixes from the articles ``chosen`` (indices), a paragraph per article in turn (each article's
    paragraphs in a random order), so that no article gives more than the count needs; an article whose
    paragraphs run out leaves its turn to the others."""
    rng = random.Random(seed)
    picks: dict[int, tuple[list[str], list[int]]] = {}  # article -> its paragraphs, the order they are cut in
    for i in chosen:
        paragraphs = clean(articles[i]["text"]).split("\n\n")
        body = [j for j, p in enumerate(paragraphs) if not p.startswith("#") and len(p.split()) >= 60]
        picks[i] = (paragraphs, rng.sample(body, len(body)))
    items: list[Item] = []
    for round_ in range(max((len(order) for _, order in picks.values()), default=0)):
        for i in chosen:
            if len(items) >= n:
                return items
            paragraphs, cut_at = picks[i]
            if len(cut_at) <= round_:
                continue
            j = cut_at[round_]
            cut = _cut(paragraphs[j], rng)
            if cut is None:
                continue
            before = "\n\n".join(paragraphs[:j])
            if len(before) > PREFIX_CHARS:
                at = before.find("\n\n", len(before) - PREFIX_CHARS)
                before = before[at + 2:] if at >= 0 else before[-PREFIX_CHARS:]
            prefix = f"# {articles[i]['title']}\n\n" + (before + "\n\n" if before else "") + cut
            items.append(Item("wikitext", f"wiki{i}:p{j}", str(files[i]), prefix))
    return items


def detokenize_email(text: str) -> str:
    """The Enron release's spaced tokens closed up a little (``we ' ll`` -> ``we'll``, ``a , b`` -> ``a, b``)."""
    text = re.sub(r" ' (s|t|ll|re|ve|d|m)\b", r"'\1", text)
    text = re.sub(r" ([,.;:!?)])", r"\1", text)
    return text.replace("( ", "(")


#: a header line of an e-mail quoted or forwarded inside another
_HEADER = re.compile(r"^\s*(from|to|cc|bcc|subject|date|sent|message - id|importance)\s*:", re.IGNORECASE)
#: forwarding marks, separator rules, and "name 10 / 31 / 2000 07 : 21 am" stamps above a quoted reply
_MARK = re.compile(r"forwarded|original message|- - - -|\d+ / \d+ / \d+\s+\d+\s?:\s?\d+", re.IGNORECASE)


def email_body(text: str) -> str:
    """The e-mail's own writing: its longest run of lines (by characters) holding no header line of a
    forwarded or quoted message, no forwarding mark and no reply stamp."""
    runs: list[list[str]] = [[]]
    for line in text.split("\n"):
        if not line.strip():
            continue
        if _HEADER.match(line) or _MARK.search(line):
            runs.append([])
        else:
            runs[-1].append(line.strip())
    return max((" ".join(run) for run in runs), key=len)


def enron_items(rows: list[dict[str, Any]], n: int, seed: int, files: dict[str, Path] | None = None) -> list[Item]:
    """``n`` prefixes of e-mail bodies; ``files``: each e-mail's file in a collection (by id), which becomes the
    item's source (left out of its memory)."""
    rng = random.Random(seed)
    items = []
    for row in rows:
        text = detokenize_email(row["text"])
        cut = _cut(" ".join(email_body(text).split()), rng)
        if cut is None:
            continue
        source = str(files[str(row["id"])]) if files else ""
        items.append(Item("enron", f"enron{row['id']}", source, cut[-PREFIX_CHARS:].lstrip()))
        if len(items) >= n:
            break
    return items


#: words in a run two e-mails share when one quotes or copies the other
SHARED_RUN = 10


def shared_runs(texts: dict[str, str], words: int = SHARED_RUN) -> dict[str, set[str]]:
    """For each text (by key), the other texts that share a run of ``words`` words with it (lower-cased)."""
    seen: dict[tuple[str, ...], set[str]] = {}
    for key, text in texts.items():
        ws = text.lower().split()
        for i in range(len(ws) - words + 1):
            seen.setdefault(tuple(ws[i:i + words]), set()).add(key)
    near: dict[str, set[str]] = {key: set() for key in texts}
    for keys in seen.values():
        if len(keys) > 1:
            for key in keys:
                near[key] |= keys - {key}
    return near


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


# -- main ----------------------------------------------------------------------------------------------------


def memory_share(draws: Sequence[tuple[set[str], set[str]]]) -> float | None:
    """Of the labels' new word units (see `memory_draw`), the share their memory holds (None: no labels)."""
    new_units = sum(len(new) for new, _ in draws)
    return sum(len(got) for _, got in draws) / new_units if new_units else None


def paper_order(gleu: dict[str, float], share: float | None) -> str:
    """Whether the paper's order holds on its rows' mean GLEU: each memory row it has (retrieved chunks,
    takeaways) above the vanilla client, the tuned client + memory above each of them. The pairs that break it are
    named, with the share of the labels' new words their memory holds (`memory_share`), which bounds what memory
    can give a client. The WiM margins row, which the paper does not have, is placed against the same rows in a
    sentence of its own."""
    def broken(pairs: list[tuple[str, str]]) -> list[str]:
        return [f"{low} {gleu[low]:.1f} >= {high} {gleu[high]:.1f}" for low, high in pairs
                if low in gleu and high in gleu and gleu[low] >= gleu[high]]

    why = (f"; the labels take {100 * share:.0f}% of their new word units from their memory (below), all that "
           "memory can add to a client's words" if share is not None else "")
    against = broken([("vanilla", row) for row in ("chunks", "takeaways")] +
                     [(row, "tuned") for row in ("chunks", "takeaways")])
    verdict = (f" The paper's order does not hold: {', '.join(against)}{why}." if against else
               " The paper's order (vanilla < client + chunks or takeaways < tuned client + memory) holds on the "
               "means.")
    if "margins" in gleu:
        margins_against = broken([("vanilla", "margins"), ("margins", "tuned")])
        verdict += (" The WiM margins row (not in the paper) breaks the same order: "
                    f"{', '.join(margins_against)}{why if not against else ''}." if margins_against else
                    " The WiM margins row (not in the paper) falls in the same order.")
    return verdict


def main() -> None:
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
    ap.add_argument("--section", default="compose_utility", help="the BENCHMARKS.md section written")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave BENCHMARKS.md alone")
    args = ap.parse_args()
    plot_path = PLOT if args.section == "compose_utility" else PLOT.with_name(f"{args.section}_freshness.png")
    wiki_path, enron_path = args.data / "wikitext-test-articles.part1.jsonl", args.data / "enron-ham.part1.jsonl"
    for path in (wiki_path, enron_path, args.eval_model):
        if not path.is_file():
            sys.exit(f"{path} is missing; give --data or --eval-model")

    from marginalia import app
    from marginalia.compose import CompletionClient, MarginMemory, TakeawayMemory
    from marginalia.home import resolve_home
    from marginalia.models.llamacpp_backend import LlamaCppGenerator
    from marginalia.options import ComposeOptions

    t_start = time.perf_counter()
    load_before = os.getloadavg()
    home = resolve_home(args.home) / "bench-compose-utility"
    docs = home / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    articles = [json.loads(line) for line in wiki_path.read_text("utf-8").splitlines() if line.strip()]
    files = []
    for i, article in enumerate(articles):
        path = docs / f"wiki-{i:02d}.md"
        text = f"# {article['title']}\n\n{clean(article['text'])}"
        if not path.is_file() or path.read_text("utf-8") != text:
            path.write_text(text, "utf-8")
        files.append(path.resolve())
    emails = [json.loads(line) for line in enron_path.read_text("utf-8").splitlines() if line.strip()]
    chosen = span(args.wiki_articles, len(articles))
    items = wikitext_items(articles, files, chosen, args.wiki, args.seed)
    if len(items) < args.wiki:
        sys.exit(f"--wiki {args.wiki}: articles {args.wiki_articles} give only {len(items)} prefixes; ask for fewer "
                 "or widen --wiki-articles (an article compose_tuning.py cut would flatter the tuned client)")
    mail_files: dict[str, Path] = {}
    near: dict[str, set[str]] = {}
    if args.enron_corpus == "mail":
        mail_docs = home / "mail"
        mail_docs.mkdir(parents=True, exist_ok=True)
        texts = {str(row["id"]): detokenize_email(row["text"]) for row in emails}
        for key, text in texts.items():
            path = mail_docs / f"enron-{key}.txt"
            if not path.is_file() or path.read_text("utf-8") != text:
                path.write_text(text, "utf-8")
            mail_files[key] = path.resolve()
        near = shared_runs(texts)
    items += enron_items(emails, args.enron, args.seed, mail_files or None)

    from marginalia.models.loaders import embedded_gguf

    if args.client == "smollm2":
        client_gen = LlamaCppGenerator(embedded_gguf(), name="smollm2", n_threads=args.threads, n_branches=0)
    else:
        client_gen = app.load_model(args.client, home=home, backend="llamacpp")
    t0 = time.perf_counter()
    app.index_paths([docs], "wikitext", count_tokens=client_gen.tokenizer.count, home=home)
    store = app.open_collection("wikitext", home=home)
    n_chunks = sum(d.n_chunks for d in store.documents())
    print(f"collection: {len(files)} articles, {n_chunks} chunks ({time.perf_counter() - t0:.0f} s)", flush=True)
    # every item's own article is excluded by its source; documents' ids are what memory generators see
    ids_of = {str(Path(d.source).resolve()): d.doc_id for d in store.documents()}
    store_of = {"wikitext": store, "enron": store}
    wiki_corpus = f"a collection of the {len(files)} WikiText articles ({n_chunks} chunks)"
    mail_corpus = ""
    if mail_files:
        app.index_paths([home / "mail"], "enron-mail", count_tokens=client_gen.tokenizer.count, home=home)
        store_of["enron"] = app.open_collection("enron-mail", home=home)
        mail_chunks = sum(d.n_chunks for d in store_of["enron"].documents())
        ids_of.update({str(Path(d.source).resolve()): d.doc_id for d in store_of["enron"].documents()})
        quoted = sum(1 for it in items if it.dataset == "enron" and near.get(it.key.removeprefix("enron")))
        mail_corpus = (f"a collection of the {len(mail_files)} e-mails ({mail_chunks} chunks), never the item's own "
                       f"e-mail nor one sharing a {SHARED_RUN}-word run with it (a reply quoting it, a copy: "
                       f"{quoted} of the Enron items have one)")
    has_wiki = any(it.dataset == "wikitext" for it in items)
    has_enron = any(it.dataset == "enron" for it in items)
    if not mail_corpus:
        corpus_text = wiki_corpus + ", never from the WikiText item's own article"
    elif has_wiki:
        corpus_text = (f"{wiki_corpus} for the WikiText items (never the item's own article), and for the Enron "
                       f"items from {mail_corpus}")
    else:
        corpus_text = mail_corpus

    def excluded(item: Item) -> set[str]:
        """What an item's memory must not come from: its own document, and e-mails quoting or copying it."""
        sources = {item.source} | ({str(mail_files[k]) for k in near.get(item.key.removeprefix("enron"), ())}
                                   if item.dataset == "enron" else set())
        return {x for s in sources for x in (s, ids_of.get(s, ""))} - {""}

    options = ComposeOptions()
    eval_gen = LlamaCppGenerator(args.eval_model, name=f"gguf:{args.eval_model.name}", n_ctx=8192,
                                 n_threads=args.threads, n_branches=0)
    # no memory is ever prepared in the background here, so a fork sharing the context can stand by
    label_client = CompletionClient(eval_gen.fork(keep_cache=False), standby=eval_gen.fork(keep_cache=False),
                                    suggestion_tokens=args.tokens, no_repeat_ngram=args.label_guard)
    cache_path = home / "eval-cache.jsonl"
    cache = load_cache(cache_path)
    records: list[dict[str, Any]] = []
    eval_seconds, made, relabelled = 0.0, 0, 0
    for n, item in enumerate(items, 1):
        corpus = args.enron_corpus if item.dataset == "enron" else "wikitext"
        key = item_key(item, eval_gen.name, args.tokens, args.hits, corpus, args.label_guard)
        plain = item_key(item, eval_gen.name, args.tokens, args.hits, corpus)
        if key not in cache:
            t0 = time.perf_counter()
            if plain in cache:  # the memory is made (a label guard is new): only the label is written again
                record = {**relabel(item, cache[plain], label_client, args.tokens), "key": key}
                relabelled += 1
            else:
                common = {"hits": args.hits, "search": options.search, "min_similarity": options.min_similarity,
                          "exclude": excluded(item), "item_tokens": options.item_tokens}
                takeaway = TakeawayMemory(store_of[item.dataset], eval_gen, **common)
                margin = MarginMemory(store_of[item.dataset], eval_gen.fork(keep_cache=False), **common)
                record = {"key": key, **eval_record(item, takeaway, margin, label_client, args.tokens)}
                made += 1
            eval_seconds += time.perf_counter() - t0
            with cache_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            cache[key] = record
            print(f"[{n}/{len(items)}] {item.key}: {record['seconds']} label={record['label'][:60]!r}", flush=True)
        records.append(cache[key])
    drafted = sum(1 for r, it in zip(records, items, strict=True) for x in r["takeaways"] + r["margins"] + r["chunks"]
                  if it.source and x["doc_id"] in excluded(it))

    client = CompletionClient(client_gen.fork(keep_cache=False), standby=client_gen.fork(keep_cache=False),
                              suggestion_tokens=args.tokens, no_repeat_ngram=args.no_repeat_ngram)
    tuned = None
    if args.tuned_client:
        from marginalia.models.base import CachingGenerator

        tuned_gen = app.load_model(args.tuned_client, home=home)
        if not isinstance(tuned_gen, CachingGenerator):
            sys.exit(f"the tuned client {args.tuned_client} keeps no KV cache; give an in-process model")
        tuned = CompletionClient(tuned_gen, standby=tuned_gen.fork(keep_cache=False), suggestion_tokens=args.tokens,
                                 no_repeat_ngram=args.no_repeat_ngram)
    memory_of = {"vanilla": None, "chunks": "chunks", "takeaways": "takeaways", "margins": "margins",
                 "tuned-bare": None, "tuned": "takeaways"}
    completions_path = home / "client-cache.jsonl"  # completions and label scores, per client, row and item
    completions = load_cache(completions_path)
    results: dict[str, dict[str, Any]] = {}
    predictions_kept: dict[str, dict[str, list[str]]] = {}
    labels_of: dict[str, list[str]] = {}
    drawn_of: dict[str, list[tuple[set[str], set[str]]]] = {}  # per label: its new units, those in its memory
    t_rows = time.perf_counter()
    for dataset in ("wikitext", "enron"):
        labelled = [(it, r) for it, r in zip(items, records, strict=True)
                    if it.dataset == dataset and r["label"].strip()]
        ds_items, ds_records = [c[0] for c in labelled], [c[1] for c in labelled]
        labels = labels_of[dataset] = [r["label"] for r in ds_records]
        draws = [memory_draw(r["label"], it.prefix, [x["text"] for x in r["takeaways"]])
                 for it, r in zip(ds_items, ds_records, strict=True)]
        drawn_of[dataset] = draws
        for row in ROWS:
            row_client = tuned if row.startswith("tuned") else client
            if row_client is None or not ds_items:
                continue
            identity = model_identity(args.tuned_client if row.startswith("tuned") else args.client)
            preds, lps = run_row(row_client, ds_items, ds_records, memory_of[row], args.tokens, identity,
                                 completions, completions_path)
            results[f"{dataset}/{row}"] = scores(preds, labels, lps, home)
            # how many items had any memory at all in this row (an empty memory is the vanilla prompt)
            source = memory_of[row]
            results[f"{dataset}/{row}"]["with_memory"] = sum(bool(r[source]) for r in ds_records) if source else 0
            predictions_kept.setdefault(dataset, {})[row] = preds
            print(f"{dataset} {row}: GLEU {results[f'{dataset}/{row}']['gleu']:.1f} "
                  f"PPL {results[f'{dataset}/{row}']['ppl']:.1f}", flush=True)
    rows_s = time.perf_counter() - t_rows

    # -- freshness vs cost
    from marginalia.bench import generation_metrics as gm

    thresholds = [int(t) for t in args.thresholds.split(",")]
    fresh = [(it, r) for it, r in zip(items, records, strict=True)
             if it.dataset == "wikitext" and r["label"].strip()][: args.fresh_items]
    fresh_rows = []
    t_fresh = time.perf_counter()
    for threshold in thresholds if fresh else []:
        typed = made_requests = 0
        preds, labels = [], []
        for item, record in fresh:
            exclude = {item.source, ids_of.get(item.source, "")} - {""}
            retriever = TakeawayMemory(store, eval_gen, hits=args.hits, search=options.search,
                                       min_similarity=options.min_similarity, exclude=exclude)

            def fetch(request: Any, retriever: Any = retriever) -> list[Any]:
                return chunk_items(retriever.retrieve(request))

            n_typed, n_requests, memory = replay(client, item, fetch, threshold, args.hits)
            typed += n_typed
            made_requests += n_requests
            preds.append(client.complete(item.prefix, max_new_tokens=args.tokens, memory=memory).text())
            labels.append(record["label"])
        fresh_rows.append({"threshold": threshold, "rate": 1000 * made_requests / typed, "requests": made_requests,
                           "typed": typed, "gleu": gm.gleu(preds, labels)})
        print(f"threshold {threshold}: {fresh_rows[-1]}", flush=True)
    fresh_s = time.perf_counter() - t_fresh
    if fresh_rows:
        plot(thresholds, [r["rate"] for r in fresh_rows], [r["gleu"] for r in fresh_rows], plot_path)
    load_after = os.getloadavg()

    # -- the section
    def fmt_row(dataset: str, row: str) -> str:
        r = results.get(f"{dataset}/{row}")
        if r is None:
            why = "not run (no tuned client given)" if row.startswith("tuned") else "not run"
            return f"| {ROW_NAMES[row]} | {why} | | | | | | | | |"
        low, high = r["gleu_ci"]
        return (f"| {ROW_NAMES[row]} | {r['ppl']:.1f} | {r['gleu']:.1f} [{low:.1f}, {high:.1f}] | {r['meteor']:.1f} | "
                f"{r['bleu4']:.1f} | {r['rouge1']:.1f} | {r['rougeL']:.1f} | {r['bertscore']:.1f} | {r['n']} | "
                f"{r['with_memory'] if memory_of[row] else '–'} |")

    tables = []
    for dataset, title in (("wikitext", "WikiText (in domain)"), ("enron", "Enron e-mails (out of domain)")):
        if not any(it.dataset == dataset for it in items):
            continue
        tables += [f"**{title}**", "",
                   "| row | PPL (labels) | GLEU [95% CI] | METEOR | BLEU-4 | ROUGE-1 | ROUGE-L | BERTScore F1 | n | "
                   "with memory |",
                   "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
                   *[fmt_row(dataset, row) for row in ROWS], ""]

    def ordering(dataset: str) -> str:
        got = [row for row in ROWS if f"{dataset}/{row}" in results]
        ranked = sorted(got, key=lambda row: -results[f"{dataset}/{row}"]["gleu"])
        return " > ".join(ranked)

    def times(a: float, b: float) -> float:
        return a / b if b else float("inf")

    verdicts = []
    for dataset in ("wikitext", "enron"):
        vanilla = results.get(f"{dataset}/vanilla")
        tuned_r = results.get(f"{dataset}/tuned")
        best_memory = max((results[f"{dataset}/{r}"]["gleu"] for r in ("takeaways", "margins")
                           if f"{dataset}/{r}" in results), default=float("nan"))
        if vanilla is None:
            continue
        line = (f"- {dataset}: GLEU ordering {ordering(dataset)}; the best client + memory row has "
                f"{times(best_memory, vanilla['gleu']):.2f}x the vanilla client's GLEU ({vanilla['gleu']:.1f} -> "
                f"{best_memory:.1f})." + paper_order(
                    {row: results[f"{dataset}/{row}"]["gleu"] for row in ROWS if f"{dataset}/{row}" in results},
                    memory_share(drawn_of.get(dataset) or [])))
        against = []
        for row in ("chunks", "takeaways", "margins"):
            if row in predictions_kept[dataset]:
                low, high = gleu_ratio_interval(predictions_kept[dataset][row], predictions_kept[dataset]["vanilla"],
                                                labels_of[dataset])
                against.append(f"{row} {times(results[f'{dataset}/{row}']['gleu'], vanilla['gleu']):.2f}x "
                               f"[{low:.2f}, {high:.2f}]")
        if against:
            line += " Untuned client with memory over the vanilla client, GLEU (paired 95% interval): " + \
                ", ".join(against) + "."
        if tuned_r is not None:
            ratio = times(tuned_r["gleu"], vanilla["gleu"])
            low, high = gleu_ratio_interval(predictions_kept[dataset]["tuned"], predictions_kept[dataset]["vanilla"],
                                            labels_of[dataset])
            line += (f" Tuned client + memory: {ratio:.2f}x the vanilla GLEU ({vanilla['gleu']:.1f} -> "
                     f"{tuned_r['gleu']:.1f}; paired 95% interval of the ratio [{low:.2f}, {high:.2f}]): goal (at "
                     f"least 2x) {'met' if ratio >= 2 else 'not met'}.")
            bare = results.get(f"{dataset}/tuned-bare")
            if bare is not None:
                line += (f" Without memory the tuned client has {times(bare['gleu'], vanilla['gleu']):.2f}x "
                         f"({bare['gleu']:.1f}).")
        else:
            line += " The goal (the tuned client + memory at least doubles the vanilla GLEU) is not measured: no tuned client was given."
        verdicts.append(line)
    draw_lines = []
    for dataset in ("wikitext", "enron"):
        if not drawn_of.get(dataset):
            continue
        draws = drawn_of[dataset]
        new_units = sum(len(new) for new, _ in draws)
        from_memory = sum(len(got) for _, got in draws)
        drawing = [i for i, (_, got) in enumerate(draws) if got]
        line = (f"- {dataset}: of the labels' {new_units} new word units (not in their prefix), {from_memory} "
                f"({100 * (memory_share(draws) or 0.0):.0f}%) are in their takeaways memory; {len(drawing)} of "
                f"{len(draws)} labels take any from it.")
        if drawing:
            gleus = []
            for row in ROWS:
                row_preds = predictions_kept.get(dataset, {}).get(row)
                if row_preds is not None:
                    sub = gm.gleu([row_preds[i] for i in drawing], [labels_of[dataset][i] for i in drawing])
                    gleus.append(f"{row} {sub:.1f}")
            line += " GLEU on them: " + ", ".join(gleus) + "."
        draw_lines.append(line)
    fresh_table = ["| threshold (token edits) | memory requests / 1,000 typed tokens | requests | typed tokens | GLEU |",
                   "|---:|---:|---:|---:|---:|",
                   *[f"| {r['threshold']} | {r['rate']:.1f} | {r['requests']} | {r['typed']} | {r['gleu']:.1f} |"
                     for r in fresh_rows]]
    guard_note = f" with no run of {args.no_repeat_ngram} tokens twice" if args.no_repeat_ngram else ""
    loop_lines = []
    for dataset, rows in predictions_kept.items():
        counts = [f"{row} {sum(looping(p) for p in preds)}" for row, preds in rows.items()]
        counts.append(f"the labels themselves {sum(looping(label) for label in labels_of[dataset])}")
        loop_lines.append(f"- {dataset} ({len(labels_of[dataset])} items): " + ", ".join(counts) + ".")
    wiki_n = sum(1 for it in items if it.dataset == "wikitext")
    enron_n = len(items) - wiki_n
    body = "\n".join([
        "## Composition utility (`benchmarks/compose_utility.py`)"
        + (": the Enron items' memory from the other e-mails" if mail_files else ""),
        "",
        f"Command: `{command_line()}` · commit {git_commit()} · client: {args.client} on llama.cpp "
        f"(greedy{guard_note}, {args.tokens} new tokens, stops at a line end; the labels "
        f"{f'greedy with no run of {args.label_guard} tokens twice' if args.label_guard else 'plain greedy'}) · "
        "eval model (labels and memory): "
        f"{args.eval_model.name} on llama.cpp · tuned client: {args.tuned_client or 'none given'} · "
        f"machine: {machine()} · {load_note(load_before[0], load_after[0])} · total {(time.perf_counter() - t_start) / 60:.1f} min "
        f"(eval model on {made} new items{f' and {relabelled} new labels' if relabelled else ''}: "
        f"{eval_seconds / 60:.1f} min; client rows {rows_s / 60:.1f} min; "
        f"freshness replay {fresh_s / 60:.1f} min)",
        "",
        "Items: " + " and ".join(
            ([f"{wiki_n} WikiText prefixes (in domain; from articles {args.wiki_articles}, which the tuning left "
              "out, a paragraph per article in turn, each cut 40-70% into a paragraph of 60+ words, after "
              f"up to {PREFIX_CHARS} characters of the text before it)"] if has_wiki else [])
            + ([f"{enron_n} Enron e-mail prefixes (out of domain; each cut 40-70% into the e-mail's body)"]
               if has_enron else []))
        + f". Memory is retrieved ({args.hits} chunks, hybrid search on the prefix's last {QUERY_WORDS} words) "
        f"from {corpus_text} (memory items from what an item must not draw on: {drafted}). The "
        f"eval model writes the takeaways, the WiM margins and the label: its own continuation of the prefix given "
        f"the takeaways memory and our compose prompt (so the takeaways rows share the label's memory, as in the "
        f"paper's setup). PPL is the perplexity of the label's tokens under that row's client and prompt; GLEU, "
        f"METEOR, BLEU-4, ROUGE and BERTScore (all-MiniLM-L6-v2, last layer, no baseline rescaling) compare each "
        f"completion with the label, 0-100; GLEU's interval is a bootstrap over items. Items with an empty label "
        f"are left out.",
        "",
        *tables,
        *verdicts,
        "",
        f"**Completions that loop** (fewer than {LOOPING:.0%} of their words distinct), per row:",
        "",
        *loop_lines,
        "",
        "**What the labels take from the memory.** A word unit (`marginalia.patterns.grounding.units`: "
        "lower-cased, lightly stemmed, stopwords dropped) that a label adds to its prefix and that its takeaways "
        "memory holds is one a client could take from the memory; the rest no memory can supply:",
        "",
        *draw_lines,
        "",
        *([f"**Freshness vs cost** ({len(fresh)} WikiText prefixes typed token by token through the coordinator; "
           f"each request's query is the text new since the last one, answered at once with the {args.hits} "
           f"retrieved chunks as memory (memory size {args.hits}); the client then completes the prefix with the "
           "memory held at its end). The paper's Fig. 5 trade-off: a lower threshold asks for memory more often.",
           "",
           *fresh_table,
           "",
           f"![freshness vs cost]({plot_path.relative_to(ROOT).as_posix()})"] if fresh_rows else []),
    ])
    if not args.no_write:
        write_section(args.section, body)
    print(body)
    out = home / "last-run.json"
    out.write_text(json.dumps({"results": results, "freshness": fresh_rows, "predictions": predictions_kept,
                               "commit": git_commit(), "args": {k: str(v) for k, v in vars(args).items()}},
                              indent=1), "utf-8")


if __name__ == "__main__":
    main()
