"""Speed of the persistent hybrid index: indexing throughput, and query latency at 100k chunks.

(1) Indexing: real WikiText and SQuAD paragraphs as chunks (section path as context), embedded with
the embedded MiniLM. The raw embedder's rate on exactly the texts the store embeds is the
baseline; ``Collection.add_document`` (embedding + Lance writes + BM25 upkeep) is measured
against it, in interleaved rounds so that load from other processes hits both alike.

(2) Querying: a collection of ``--rows`` chunk entries. Embedding that many chunks with
MiniLM on a small CPU takes hours, so the bulk is synthetic, and said so in the output:
texts are real sentences (WikiText, SQuAD, essays) recombined, and vectors are MiniLM
vectors of part (1)'s texts with Gaussian noise (cosine ~0.7 to their base), unrelated to
the text. Queries are real SQuAD questions, embedded by MiniLM at query time. Latency is
measured per ``Collection.search`` call (query embedding included) for hybrid, dense and
BM25, first with exact dense search, then with the IVF-PQ index ``optimize()`` builds. Hybrid
is interleaved query by query with LanceDB's own hybrid query called directly (query embedding
included too), and the measurement says whether ours meets the goal set against it. Stores
benchmarks/measurements/index_speed.json (see benchmarks/report.py).

    python benchmarks/index_speed.py [--rows 100000] [--chunks auto] [--queries 60] [--no-write]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
from _common import BENCHMARKS, Benchmark, measurement, show
from _markdown import Record, made_by, num, ratio, table

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
HEADING = re.compile(r"^ (=(?: =)*) (.+?) \1 $")


def real_documents(max_chunks: int) -> list[tuple[Any, list[Any], list[Any]]]:
    """WikiText articles, then SQuAD articles, as markdown documents: one chunk per paragraph, section path
    (title, heading...) — up to ``max_chunks`` chunks."""
    from marginalia.records import Chunk, Document, Section

    docs = []
    total = 0
    with open(DATA / "wikitext-test-articles.part1.jsonl") as fh:
        for line in fh:
            article = json.loads(line)
            parts: list[str] = [f"# {article['title']}\n\n"]
            pos = len(parts[0])
            path: list[str] = [article["title"]]
            paras: list[tuple[int, int, tuple[str, ...]]] = []
            for raw in article["text"].split("\n"):
                m = HEADING.match(raw)
                if m:
                    level = m.group(1).count("=")  # ' = = X = = ' is a level-2 heading
                    path = path[:level - 1] + [m.group(2)]
                    parts.append("#" * level + f" {m.group(2)}\n\n")
                elif len(raw.strip()) >= 80:
                    paras.append((pos, pos + len(raw.strip()), tuple(path)))
                    parts.append(raw.strip() + "\n\n")
                else:
                    continue
                pos += len(parts[-1])
            text = "".join(parts)
            doc_id = hashlib.sha256(text.encode()).hexdigest()
            doc = Document(source=f"wikitext/{article['title']}.md", text=text, doc_id=doc_id,
                           format="markdown", title=article["title"])
            paras = paras[:max_chunks - total]
            chunks = [Chunk(doc_id, 0, i, a, b, text[a:b], p) for i, (a, b, p) in enumerate(paras)]
            docs.append((doc, [Section(doc_id, 0, 0, "", (), 0, len(text), 0, len(text))], chunks))
            total += len(chunks)
            if total >= max_chunks:
                return docs
    # then SQuAD's articles: one document each, a chunk per paragraph
    squad = json.loads((DATA / "squad-v1.1-dev.part1.json").read_text())
    for article in squad["data"]:
        title = article["title"].replace("_", " ")
        parts = [f"# {title}\n\n"]
        pos = len(parts[0])
        spans = []
        for p in article["paragraphs"][:max_chunks - total]:
            spans.append((pos, pos + len(p["context"].strip())))
            parts.append(p["context"].strip() + "\n\n")
            pos += len(parts[-1])
        text = "".join(parts)
        doc_id = hashlib.sha256(text.encode()).hexdigest()
        doc = Document(source=f"squad/{title}.md", text=text, doc_id=doc_id, format="markdown", title=title)
        chunks = [Chunk(doc_id, 0, i, a, b, text[a:b], (title,)) for i, (a, b) in enumerate(spans)]
        docs.append((doc, [Section(doc_id, 0, 0, "", (), 0, len(text), 0, len(text))], chunks))
        total += len(chunks)
        if total >= max_chunks:
            break
    return docs


def sentence_pool() -> list[str]:
    """Real sentences from the development data (read at run time, never copied into the repository)."""
    texts: list[str] = []
    with open(DATA / "wikitext-test-articles.part1.jsonl") as fh:
        texts += [json.loads(line)["text"] for line in fh]
    squad = json.loads((DATA / "squad-v1.1-dev.part1.json").read_text())
    texts += [p["context"] for a in squad["data"] for p in a["paragraphs"]]
    with open(DATA / "paul-graham-essays.jsonl") as fh:
        texts += [json.loads(line)["text"] for line in fh]
    pool = []
    for text in texts:
        pool += [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if 30 <= len(s.strip()) <= 400]
    return pool


def squad_questions(n: int) -> list[str]:
    squad = json.loads((DATA / "squad-v1.1-dev.part1.json").read_text())
    qs = [q["question"] for a in squad["data"] for p in a["paragraphs"] for q in p["qas"]]
    return qs[:: max(1, len(qs) // n)][:n]


#: how deep each side of a hybrid search at k=5 ranks (Collection.search's max(3k, 30))
HYBRID_DEPTH = 30
#: the goal for hybrid search at k=5 with the IVF-PQ index: p50 at most this many times LanceDB's own query's
#: (query embedding counted on both sides), and p95 at most this many times our own p50
GOAL_RATIO_TO_NATIVE = 1.3
GOAL_TAIL = 3.0


def native_hybrid(table: Any, embedder: Any, query: str, limit: int) -> Any:
    """LanceDB's own hybrid query called directly, the query vector embedded by ``embedder`` first: the same
    query ``Collection.search`` asks of LanceDB (each side ``limit`` deep, cosine, the same IVF-PQ probes and
    refinement, chunks only, ``RRFReranker``), without its visibility prefilter or its ``Hit`` records."""
    from lancedb import query as lance_query
    from lancedb.rerankers import RRFReranker

    from marginalia.index.hybrid import NPROBES, REFINE_FACTOR, RRF_K
    from marginalia.index.schema import FTS_COLUMN

    vector = embedder.embed_query(query)
    q = table.search(query_type="hybrid", vector_column_name="vector", fts_columns=FTS_COLUMN)
    q = q.vector(vector).text(lance_query.MatchQuery(query, FTS_COLUMN)).distance_type("cosine")
    q = q.nprobes(NPROBES).refine_factor(REFINE_FACTOR).where("kind = 'chunk'", prefilter=True)
    return q.limit(limit).rerank(RRFReranker(K=RRF_K)).to_arrow()


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def part1(embedder: Any, n_chunks: int, rounds: int, home: Path) -> tuple[dict[str, Any], Any]:
    """Raw embedder vs Collection.add_document, interleaved by round; returns numbers and the raw vectors."""
    from marginalia.index.schema import chunk_search_text
    from marginalia.index.store import Collection

    docs = real_documents(n_chunks)
    texts = [chunk_search_text(c.section_path, c.text) for _, _, cs in docs for c in cs]
    embedder.embed_documents(texts[:32])  # warm-up: first-call costs stay out of both timings
    col = Collection.open("throughput", home=home, embedder=embedder, create=True)
    # split documents into rounds of about equal chunk counts
    per_round = len(texts) / rounds
    groups: list[list[Any]] = [[] for _ in range(rounds)]
    seen = 0
    for d in docs:
        groups[min(rounds - 1, int(seen / per_round))].append(d)
        seen += len(d[2])
    raw_s, store_s, counts, vectors = [], [], [], []
    for group in groups:
        group_texts = [chunk_search_text(c.section_path, c.text) for _, _, cs in group for c in cs]
        t0 = time.perf_counter()
        vectors.append(embedder.embed_documents(group_texts))
        raw_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for doc, sections, chunks in group:
            col.add_document(doc, sections, chunks)
        store_s.append(time.perf_counter() - t0)
        counts.append(len(group_texts))
        print(f"  round: {len(group_texts)} chunks, raw {len(group_texts) / raw_s[-1]:.1f}/s, "
              f"store {len(group_texts) / store_s[-1]:.1f}/s", flush=True)
    ratios = [r / s for r, s in zip(raw_s, store_s, strict=True)]
    out = {
        "docs": len(docs), "chunks": len(texts), "rounds": rounds,
        "mean_chars": statistics.mean(len(t) for t in texts),
        "raw_rate": sum(counts) / sum(raw_s), "store_rate": sum(counts) / sum(store_s),
        "ratio_total": sum(raw_s) / sum(store_s), "ratio_median": statistics.median(ratios), "ratios": ratios,
    }
    return out, np.vstack(vectors)


class DefaultThreads:
    """MiniLM with queries embedded like documents: on torch's default threads, not on one."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name

    def embed_query(self, text: str) -> np.ndarray:
        return np.asarray(self.inner.embed([text], "document")[0])

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.inner.embed_documents(texts))


class Precomputed:
    """Stands in for MiniLM while filling: hands out prepared vectors by text, under MiniLM's name."""

    name = "minilm"
    batch_size = 1024

    def __init__(self, table: dict[str, np.ndarray], dim: int) -> None:
        self.table = table
        self.dim = dim

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return np.vstack([self.table[t] for t in texts])


def part2(embedder: Any, base: np.ndarray, n_rows: int, n_queries: int, home: Path) -> dict[str, Any]:
    from lancedb.index import FTS

    from marginalia.index import store
    from marginalia.index.schema import FTS_COLUMN
    from marginalia.records import Chunk, Document, Section

    rng = np.random.default_rng(0)
    pool = sentence_pool()
    per_doc = 1000
    dim = base.shape[1]
    out: dict[str, Any] = {"rows": n_rows, "pool_sentences": len(pool), "dim": dim, "bases": len(base)}
    t_fill = time.perf_counter()
    docs = []
    table: dict[str, np.ndarray] = {}
    for d in range(0, n_rows, per_doc):
        n = min(per_doc, n_rows - d)
        texts = [" ".join(pool[j] for j in rng.integers(0, len(pool), rng.integers(2, 6))) for _ in range(n)]
        # unit-norm noise as large as the base vector: cosine ~0.7 to the base, ~0.5 between siblings
        noise = rng.standard_normal((n, dim)).astype(np.float32) / np.sqrt(dim)
        vecs = base[rng.integers(0, len(base), n)] + noise
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        for t, v in zip(texts, vecs, strict=True):
            table[t] = v
        text = "\n\n".join(texts)
        doc_id = hashlib.sha256(text.encode()).hexdigest()
        chunks, pos = [], 0
        for i, t in enumerate(texts):
            chunks.append(Chunk(doc_id, 0, i, pos, pos + len(t), t))
            pos += len(t) + 2
        docs.append((Document(source=f"synthetic/{d // per_doc}.md", text=text, doc_id=doc_id),
                     [Section(doc_id, 0, 0, "", (), 0, len(text), 0, len(text))], chunks))
    print(f"  generated {n_rows} rows in {time.perf_counter() - t_fill:.1f} s", flush=True)

    # keep the vector index out of the way until the exact-search numbers are taken
    store.VECTOR_INDEX_MIN_ROWS = 10 * n_rows
    col = store.Collection.open("latency", home=home, embedder=Precomputed(table, dim), create=True)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    for doc, sections, chunks in docs:
        col.add_document(doc, sections, chunks)
    out["fill_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    col.optimize()
    out["optimize_s"] = time.perf_counter() - t0
    print(f"  filled through add_document in {out['fill_s']:.1f} s "
          f"({n_rows / out['fill_s']:.0f} chunks/s without embedding); optimize {out['optimize_s']:.1f} s",
          flush=True)
    # a from-scratch BM25 index over every row, for its build time
    t0 = time.perf_counter()
    col._entries.create_index(FTS_COLUMN, config=FTS(with_position=False), replace=True)
    out["fts_build_s"] = time.perf_counter() - t0
    print(f"  BM25 index over {n_rows} rows built from scratch in {out['fts_build_s']:.1f} s", flush=True)

    queries = squad_questions(n_queries)
    col = store.Collection.open("latency", home=home, embedder=embedder)
    for q in queries[:5]:  # warm-up: caches and lazily opened index files
        col.search(q, k=5, mode="hybrid")
    # the query embedding alone: as a query (one torch thread, what Collection.search does) and the same text
    # as a document (torch's default threads), in turn
    t_embed: dict[str, list[float]] = {"one": [], "default": []}
    for i, q in enumerate(queries):
        for how in ("one", "default") if i % 2 == 0 else ("default", "one"):
            t0 = time.perf_counter()
            if how == "one":
                embedder.embed_query(q)
            else:
                embedder.embed([q], "document")
            t_embed[how].append(time.perf_counter() - t0)
    for how, values in t_embed.items():
        out[f"embed_query_{how}_p50_ms"] = 1000 * pct(values, 50)
        out[f"embed_query_{how}_p95_ms"] = 1000 * pct(values, 95)
    out["torch_threads"] = _torch_threads()

    # the same collection, its queries embedded on torch's default threads: what one torch thread buys a search
    threaded = store.Collection.open("latency", home=home, embedder=DefaultThreads(embedder))  # type: ignore[arg-type]

    def measure(label: str) -> dict[str, list[str]]:
        top: dict[str, list[str]] = {}
        for mode in ("hybrid", "dense", "bm25"):
            times: dict[str, list[float]] = {"": [], "_native": [], "_threaded": []}
            same = 0
            # hybrid: ours, LanceDB's own query and ours on torch's threads in turn, each first on every third query
            sides = ["", "_native", "_threaded"] if mode == "hybrid" else [""]
            for i, q in enumerate(queries):
                for side in sides[i % len(sides):] + sides[:i % len(sides)]:
                    t0 = time.perf_counter()
                    if side == "_native":
                        rows = native_hybrid(col._entries, embedder, q, HYBRID_DEPTH)
                    else:
                        result = (col if side == "" else threaded).search(q, k=10 if mode == "dense" else 5, mode=mode)
                    times[side].append(time.perf_counter() - t0)
                    if side == "":
                        hits = result
                if mode == "dense":
                    top[q] = [h.id for h in hits]
                if mode == "hybrid":
                    same += rows["id"].to_pylist()[:5] == [h.id for h in hits]
            for side, values in times.items():
                if values:
                    key = f"{label}_{mode}{side}"
                    out[f"{key}_p50_ms"] = 1000 * pct(values, 50)
                    out[f"{key}_p95_ms"] = 1000 * pct(values, 95)
                    print(f"  {label:6} {mode + side:15} p50 {out[f'{key}_p50_ms']:.1f} ms  "
                          f"p95 {out[f'{key}_p95_ms']:.1f} ms", flush=True)
            if mode == "hybrid":
                out[f"{label}_hybrid_same_top5"] = same
        return top

    out["loadavg_start"] = os.getloadavg()[0]
    exact = measure("exact")
    store.VECTOR_INDEX_MIN_ROWS = 50_000
    t0 = time.perf_counter()
    col._build_vector_index()
    out["ivfpq_build_s"] = time.perf_counter() - t0
    print(f"  IVF-PQ index over {n_rows} rows built in {out['ivfpq_build_s']:.1f} s", flush=True)
    approx = measure("ivfpq")
    out["ivfpq_recall_at_10_squad"] = statistics.mean(len(set(approx[q]) & set(exact[q])) / max(1, len(exact[q]))
                                                      for q in queries)
    # SQuAD questions have no true neighbours among the synthetic vectors (their top 10 are near-ties), so
    # recall is also taken for queries that do: part (1)'s MiniLM vectors, each with ~rows/len(base) noisy siblings
    from marginalia.index.hybrid import ranked

    probes = base[rng.choice(len(base), size=min(len(base), len(queries)), replace=False)]
    recalls = []
    for vec in probes:
        found = ranked(col._entries, "dense", "", vec, "kind = 'chunk'", 10)["id"].to_pylist()
        flat = col._entries.search(vec, vector_column_name="vector").distance_type("cosine").bypass_vector_index()
        truth = flat.select(["id", "_distance"]).limit(10).to_arrow()["id"].to_pylist()
        recalls.append(len(set(found) & set(truth)) / 10)
    out["ivfpq_recall_at_10_neighbours"] = statistics.mean(recalls)
    out["queries"] = len(queries)
    out["loadavg_end"] = os.getloadavg()[0]
    # what the latest version takes: versions kept for concurrent readers (optimize() prunes them later) left out
    with warnings.catch_warnings():  # it warns that older versions go: nothing else reads this table
        warnings.simplefilter("ignore", UserWarning)
        col._entries.optimize(cleanup_older_than=timedelta(0))
        col._documents.optimize(cleanup_older_than=timedelta(0))
    out["disk_mb"] = sum(f.stat().st_size for f in col.path.rglob("*") if f.is_file()) / 2**20
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000, help="chunk entries for the latency part (default 100000)")
    ap.add_argument("--chunks", default="auto",
                    help="real chunks for the throughput part; auto: what MiniLM embeds in about 2.5 minutes")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved raw/store rounds (default 3)")
    ap.add_argument("--queries", type=int, default=60, help="SQuAD questions timed per mode (default 60)")
    ap.add_argument("--no-write", action="store_true", help="print the section, store nothing")
    args = ap.parse_args()
    if not DATA.is_dir():
        sys.exit(f"the development data is not at {DATA}")

    from marginalia.index.embedders import load_embedder

    started = time.perf_counter()
    embedder = load_embedder("minilm")
    if args.chunks == "auto":
        probe = [c.text for _, _, cs in real_documents(64) for c in cs]
        embedder.embed_documents(probe[:16])
        t0 = time.perf_counter()
        embedder.embed_documents(probe)
        rate = len(probe) / (time.perf_counter() - t0)
        n_chunks = int(min(3000, max(300, rate * 150)))
        print(f"MiniLM probe: {rate:.1f} chunks/s -> {n_chunks} chunks for part 1 "
              f"(100k chunks would take {100_000 / rate / 60:.0f} min)", flush=True)
    else:
        n_chunks = int(args.chunks)
    home = Path(tempfile.mkdtemp(prefix="marginalia-index-speed-"))
    try:
        print("(1) indexing throughput", flush=True)
        p1, vectors = part1(embedder, n_chunks, args.rounds, home)
        print(json.dumps({k: v for k, v in p1.items()}), flush=True)
        print(f"(2) query latency at {args.rows} chunks", flush=True)
        p2 = part2(embedder, vectors, args.rows, args.queries, home)
        print(json.dumps(p2), flush=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    total_min = (time.perf_counter() - started) / 60

    numbers = {"embedder": "minilm", "dims": p2["dim"], "lancedb": _lancedb_version(), "total_min": total_min,
               "goals": {"p50_to_native": GOAL_RATIO_TO_NATIVE, "p95_to_p50": GOAL_TAIL}, "hybrid_depth": HYBRID_DEPTH,
               "throughput": p1, "latency": p2}
    show(measurement("index_speed", numbers), write=not args.no_write)


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def _lancedb_version() -> str:
    import lancedb

    return str(lancedb.__version__)


def summary(m: Record) -> list[list[str]]:
    t, q = m["numbers"]["throughput"], m["numbers"]["latency"]
    return [[f"Hybrid search, {num(q['rows'], 0)} chunks (IVF-PQ)",
             f"p50 {num(q['ivfpq_hybrid_p50_ms'], 0)} ms, p95 {num(q['ivfpq_hybrid_p95_ms'], 0)} ms; "
             f"{ratio(q['ivfpq_hybrid_p50_ms'], q['ivfpq_hybrid_native_p50_ms'])} LanceDB's own query", made_by(m)],
            ["Indexing (MiniLM embedding, store, BM25)",
             f"{num(t['store_rate'])} chunks/s, {num(t['ratio_median'], 2)}x the bare embedder's rate", made_by(m)]]


def section(m: Record) -> list[str]:
    n = m["numbers"]
    t, q = n["throughput"], n["latency"]
    modes = (("hybrid", "hybrid"), ("hybrid_native", "hybrid, LanceDB's own query"), ("dense", "dense"),
             ("bm25", "bm25"))
    rows = [[label, name, num(q.get(f"{key}_{mode}_p50_ms")), num(q.get(f"{key}_{mode}_p95_ms"))]
            for key, label in (("exact", "exact scan"), ("ivfpq", "IVF-PQ")) for mode, name in modes
            if q.get(f"{key}_{mode}_p50_ms") is not None]
    goal = n["goals"]
    native, tail = (q["ivfpq_hybrid_p50_ms"] / q["ivfpq_hybrid_native_p50_ms"],
                    q["ivfpq_hybrid_p95_ms"] / q["ivfpq_hybrid_p50_ms"])
    return [f"**Indexing**: {num(t['chunks'], 0)} real paragraphs ({t['docs']} WikiText and SQuAD articles) through "
            f"`Collection.add_document` at {num(t['store_rate'])} chunks/s, against {num(t['raw_rate'])} for the bare "
            f"embedder on the same texts: {num(t['ratio_median'], 3)}x (median of {t['rounds']} interleaved rounds).",
            "",
            f"**Search at {num(q['rows'], 0)} chunks** (real sentences recombined, vectors of real texts plus noise: "
            f"latency only), embedder `{n['embedder']}`, LanceDB {n['lancedb']}: {q['queries']} SQuAD questions, "
            f"k=5, the query's embedding included (alone: p50 {num(q['embed_query_one_p50_ms'])} ms).", "",
            *table(["dense search", "mode", "p50 (ms)", "p95 (ms)"], rows, "llrr"), "",
            f"Goal for hybrid search with the IVF-PQ index: p50 at most {goal['p50_to_native']:g}x LanceDB's own "
            f"query ({native:.2f}x: {'met' if native <= goal['p50_to_native'] else 'not met'}), p95 at most "
            f"{goal['p95_to_p50']:g}x the p50 ({tail:.2f}x: {'met' if tail <= goal['p95_to_p50'] else 'not met'}). "
            "The top 5 matched LanceDB's own query on "
            f"{q['ivfpq_hybrid_same_top5']} of {q['queries']} queries. Building: {num(q['rows'], 0)} rows stored in "
            f"{num(q['fill_s'])} s (vectors given), the IVF-PQ index in {num(q['ivfpq_build_s'])} s; its recall@10 "
            f"against the exact scan {num(q['ivfpq_recall_at_10_neighbours'], 3)}; {num(q['disk_mb'], 0)} MiB on disk."]


BENCHMARKS["index_speed"] = Benchmark("The persistent hybrid index", section, summary)


if __name__ == "__main__":
    main()
