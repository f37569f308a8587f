"""BENCHMARKS.md from the stored measurements: a summary table first, then one short section per benchmark.

Every benchmark script writes its result to benchmarks/measurements/<name>.json (`_common.measurement`: the
command that made it, the commit, the machine, the date and the numbers); this script reads them all and writes
BENCHMARKS.md anew, so the file only ever shows what the stored measurements hold.

    python benchmarks/report.py              (write BENCHMARKS.md)
    python benchmarks/report.py --check      (exit 1 when BENCHMARKS.md is not what the measurements give)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import MEASUREMENTS, ROOT, SCHEMA  # noqa: E402

OUT = ROOT / "BENCHMARKS.md"
#: the most BENCHMARKS.md may weigh: results on one screen, not a history
MAX_BYTES = 25_000

Record = dict[str, Any]

# -- formatting ------------------------------------------------------------------------------------------------


def num(value: Any, digits: int = 1, suffix: str = "") -> str:
    """A number with ``digits`` decimals (thousands grouped when it has none), or "–" for none."""
    if value is None:
        return "–"
    if digits == 0:
        return f"{value:,.0f}{suffix}"
    return f"{value:.{digits}f}{suffix}"


def ratio(a: Any, b: Any, digits: int = 2) -> str:
    """``a / b`` as "1.23x", or "–" when either is missing or ``b`` is zero."""
    return "–" if a is None or not b else f"{a / b:.{digits}f}x"


def estimate(e: dict[str, Any] | None) -> str:
    """A mean with its 95% interval: "0.38 [0.25, 0.52]"."""
    if not e or e.get("mean") is None:
        return "–"
    if e.get("low") is None:
        return f"{e['mean']:.2f}"
    return f"{e['mean']:.2f} [{e['low']:.2f}, {e['high']:.2f}]"


def difference(d: dict[str, Any] | None) -> str:
    """A paired difference with its 95% interval: "+0.12 [+0.00, +0.24]"."""
    if not d or d.get("mean") is None:
        return "–"
    if d.get("low") is None:
        return f"{d['mean']:+.2f}"
    return f"{d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}]"


def times_interval(r: Sequence[float | None] | None) -> str:
    """A ratio with its paired 95% interval: "1.54x [1.24, 1.87]"."""
    if not r or r[0] is None:
        return "–"
    return f"{r[0]:.2f}x" + (f" [{r[1]:.2f}, {r[2]:.2f}]" if len(r) > 2 and r[1] is not None else "")


def table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str = "") -> list[str]:
    """A markdown table; ``align`` holds one letter per column, "l" or "r" (default: the first left, the rest
    right)."""
    align = align or "l" + "r" * (len(header) - 1)
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|",
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


def short_commit(commit: str) -> str:
    """A commit as 7 hex digits, with its "+dirty" mark if it has one."""
    head, plus, rest = str(commit).partition("+")
    return head[:7] + plus + rest


def made_by(m: Record) -> str:
    """The command and commit that made a measurement, for a summary row: the script or config the command runs
    (the table says which program runs it; the section quotes the command whole) and the commit."""
    words = str(m["command"]).split()
    named = next((w for w in words if w.endswith((".py", ".toml"))), " ".join(words))
    return f"`{named.rsplit('/', 1)[-1]}` · {short_commit(m['commit'])}"


def provenance(m: Record) -> str:
    """A section's opening line: command, commit (and how many later ones a resumed run went on at), machine,
    date, and where transcribed numbers come from."""
    hardware = str(m["machine"]).split(", Python")[0]  # the software versions stay in the file
    resumed = len(m["numbers"].get("resumed_at") or [])
    line = (f"Made by `{m['command']}` at {short_commit(m['commit'])}"
            + (f" (resumed at {resumed} later commit{'s' * (resumed > 1)})" if resumed else "") + f" on {hardware}, {str(m['date'])[:10]}.")
    if m.get("source"):
        line += f" {m['source']}"
    return line


def load(folder: Path = MEASUREMENTS) -> list[Record]:
    """Every measurement file in ``folder``, by name."""
    records = []
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text("utf-8"))
        if not isinstance(record, dict) or "benchmark" not in record:
            continue  # another kind of file (a run's own export)
        if record.get("schema") != SCHEMA:
            raise SystemExit(f"{path}: schema {record.get('schema')!r}, this renderer reads {SCHEMA}")
        records.append(record)
    return records


# -- quality: long context vs RAG vs WiM ---------------------------------------------------------------------


#: short names of the models the runs used (a spec not named here shows as its file's stem)
MODEL_NAMES = {"smollm2": "SmolLM2-135M", "qwen2.5-coder-0.5b-instruct-q4_k_m": "Qwen2.5-Coder-0.5B (Q4_K_M)"}


def model_name(spec: str) -> str:
    """A model spec as a short name."""
    stem = spec.rsplit("/", 1)[-1].removesuffix(".gguf")
    return MODEL_NAMES.get(stem, stem)


def tokens(lengths: Sequence[int]) -> str:
    """Context lengths in thousands of tokens: "8k", "7.5k"."""
    return "/".join(f"{x / 1024:g}k" for x in lengths)


#: the order quality tasks are shown in (others after them, by name)
TASK_ORDER = ("hotpotqa", "multihop", "squad", "cwe")


def task_order(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(tasks, key=lambda t: (TASK_ORDER.index(t["task"]) if t["task"] in TASK_ORDER else len(TASK_ORDER),
                                        t["task"]))


def quality_rows(m: Record) -> list[list[str]]:
    """Summary rows of a quality run: per task, long context, RAG and WiM with intervals, WiM's paired
    differences and the seconds per answer."""
    n = m["numbers"]
    rows = []
    lc, rag, wim = n["lc"], n.get("rag"), n["wim"]
    where = f"{model_name(n['model']).split(' (')[0]}, {tokens(n['lengths'])}"
    for t in task_order(n["tasks"]):
        p = t["patterns"]
        if wim not in p:
            continue
        task = t["task"] + (f" ({n['wim_label']})" if n.get("wim_label") else "")
        seconds = " · ".join(num((p[x]["cost"] or {}).get("seconds"), 0) if x in p else "–" for x in (lc, rag, wim))
        rows.append([task, where, estimate(p.get(lc, {}).get("score")),
                     estimate(p.get(rag, {}).get("score")) if rag else "–", estimate(p[wim]["score"]),
                     difference(t["paired"].get(lc)), difference(t["paired"].get(rag)) if rag else "–",
                     seconds, made_by(m)])
    return rows


def quality_cell(p: dict[str, Any]) -> str:
    """A pattern's results on one task, compactly: score (/ judge) · tokens generated · seconds, per answer."""
    cost = p.get("cost") or {}
    judge = p.get("judge") or {}
    return (f"{num((p.get('score') or {}).get('mean'), 2)}"
            + (f" / {num(judge.get('mean'), 2)}" if judge.get("mean") is not None else "")
            + f" · {num(cost.get('generated'), 0)} tok · {num(cost.get('seconds'), 0)} s")


def quality_section(runs: list[Record]) -> list[str]:
    lines = ["## Quality: long context vs RAG vs WiM", "",
             "Each question once per pattern, on the same items; a QA task's gold at one of five depths in turn. "
             "A cell: the mean score, then the model judge's accuracy where the run was judged (a small, lenient "
             "judge), tokens generated and seconds per answer. Margins WiM kept: precision (holding a gold answer "
             "or a multi-hop bridge fact) / recall (answer-bearing notes kept).", ""]
    for m in runs:
        n = m["numbers"]
        patterns = list(dict.fromkeys(p for t in n["tasks"] for p in t["patterns"]))
        lines += [f"### {n['config']}: {model_name(n['model'])}, {tokens(n['lengths'])} tokens", "",
                  provenance(m) + "".join(f" `{p}`: {note}." for p, note in (n.get("pattern_notes") or {}).items()), "",
                  *table(["task", *patterns],
                         [[f"{t['task']} ({t['patterns'][n['wim']]['n'] if n['wim'] in t['patterns'] else '?'})",
                           *(quality_cell(t["patterns"][p]) if p in t["patterns"] else "–" for p in patterns)]
                          for t in task_order(n["tasks"])], "l" + "r" * len(patterns))]
        margins = [f"{t['task']} {num(t['margins']['precision'], 2)} / {num(t['margins']['recall'], 2)}"
                   for t in task_order(n["tasks"]) if t.get("margins")]
        if margins:
            lines += ["", f"Margins `{n['wim']}` kept: " + ", ".join(margins) + "."]
        if n.get("figure"):
            lines += ["", f"![{n['config']}: scores and paired differences]({n['figure']})"]
        lines.append("")
    return lines


# -- speed, service, composition: one summary row and one section each ---------------------------------------


def wim_overhead_summary(m: Record) -> list[list[str]]:
    n = m["numbers"]
    lc, wim = n["lc"], n["wim"]
    return [[f"WiM vs long context, one question ({num(lc['context_tokens'], 0)}-token report)",
             f"wall time {ratio(wim['wall_s'], lc['wall_s'])}; context tokens prefilled "
             f"{ratio(wim['prefilled_context'], lc['prefilled_context'], 3)}, none twice"
             if not n["problems"] else "; ".join(n["problems"]), made_by(m)]]


def wim_overhead_section(m: Record) -> list[str]:
    n = m["numbers"]
    lc, wim = n["lc"], n["wim"]

    def row(label: str, key: str, digits: int = 1) -> list[str]:
        return [label, num(lc.get(key), digits), num(wim.get(key), digits)]

    return [f"The demo report and its first question; model `{n['model']}`; WiM with {wim.get('segments') or '?'} "
            f"segments of at most {n['segment_tokens']} tokens; each pattern in a process of its own.", "",
            *table(["", "long context", "WiM"], [
                row("context tokens prefilled (the backend's count)", "prefilled_context", 0),
                row("other tokens prefilled (instructions, margin prompts)", "prefilled_other", 0),
                [*row("tokens generated", "generated", 0)[:2], f"{num(wim['generated'], 0)} "
                 f"({num(wim['margin_tokens'], 0)} in margins)"],
                row("wall time (s)", "wall_s"),
                row("time to the first margin (s)", "first_margin_s"),
                row("time to the first answer token (s)", "first_answer_token_s"),
                row("peak RSS (MiB)", "peak_rss_mb", 0),
                ["answer holds the gold", "yes" if lc["correct"] else "no", "yes" if wim["correct"] else "no"]]),
            "",
            f"WiM prefilled {ratio(wim['prefilled_context'], lc['prefilled_context'], 3)} long context's context "
            "tokens (goal: none twice, none more than long context: "
            + ("met" if not n["problems"] else "not met: " + "; ".join(n["problems"])) + ")."]


def read_once_summary(m: Record) -> list[list[str]]:
    n = m["numbers"]
    r = n["rows"]
    return [[f"A second question on a kept reading (WiM, {n['runtime']})",
             f"{ratio(r['sequential']['wall_s'], r['first']['wall_s'])} the first question's wall time "
             f"({ratio(r['batched']['wall_s'], r['first']['wall_s'])} with batch_margins), "
             f"{num(r['sequential']['prefilled_context'], 0)} document tokens prefilled again", made_by(m)]]


READ_ONCE_ROWS = {
    "first": "WiM, first question (reads the report)",
    "sequential": "WiM, second question (median)",
    "batched": "WiM, second question, batch_margins (median)",
    "fresh": "WiM, second question, batch_margins, a fresh process",
    "lc_first": "long context, first question",
    "lc_second": "long context, second question (median)",
}


def read_once_section(m: Record) -> list[str]:
    n = m["numbers"]
    r = n["rows"]
    doc = n["document_tokens"]
    first = r["first"]["wall_s"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "not met"

    seq, bat, fresh = (r[k]["wall_s"] / first for k in ("sequential", "batched", "fresh"))
    margin = r["batched"]["margin_s"] / r["sequential"]["margin_s"]
    lines = [f"The demo report ({num(doc, 0)} tokens) read for one question, then a second asked from the kept "
             f"reading ({n['rounds']} times each way); SmolLM2-135M on {n['runtime']}, {n['segment_tokens']}-token "
             "segments.", "",
             *table(["", "wall (s)", "document tokens prefilled", "margin phase (s)", "margin tokens"],
                    [[label, num(r[k]["wall_s"]), num(r[k]["prefilled_context"], 0), num(r[k]["margin_s"]),
                      num(r[k]["margin_tokens"], 0)] for k, label in READ_ONCE_ROWS.items() if k in r]), "",
             f"- The second question prefilled {r['sequential']['prefilled_context'] / doc:.3f}x the document (goal "
             f"at most 0.05x: {verdict(r['sequential']['prefilled_context'] <= 0.05 * doc)}) and took {seq:.2f}x "
             f"the first's wall time by default, {bat:.2f}x with batch_margins, {fresh:.2f}x from a fresh process "
             f"(goal at most 0.25x: {', '.join(verdict(x <= 0.25) for x in (seq, bat, fresh))}).",
             f"- batch_margins: margin phase {margin:.2f}x the default's (goal at most 0.5x: {verdict(margin <= 0.5)}); "
             f"{n['same_margins']} of {n['margins']} margins the same word for word (branches side by side round "
             "differently: why batching is not the default)."]
    if "lc_second" in r:
        lines.append(f"- Long context's second question: {ratio(r['lc_second']['wall_s'], r['lc_first']['wall_s'])} "
                     f"its first; WiM's took {ratio(r['sequential']['wall_s'], r['lc_second']['wall_s'])} long context's.")
    return lines


def backends_summary(m: Record) -> list[list[str]]:
    n = m["numbers"]
    rows = {r["label"]: r for r in n["rows"]}
    a, b = rows.get("(a) transformers, in-process"), rows.get("(b) llama.cpp, in-process")
    reuse = [r for label, r in rows.items() if label.startswith("(c)")]
    fresh = [r for label, r in rows.items() if label.startswith("(d)")]
    out = []
    if a and b:
        out.append(["Decoding: llama.cpp vs transformers, in process",
                    f"{ratio(b['decode_tps'], a['decode_tps'])} the tokens per second", made_by(m)])
    if reuse:
        doc = n["document_tokens"]
        out.append(["WiM over an OpenAI-compatible server: prompt tokens evaluated",
                    f"{ratio(reuse[0]['evaluated'], doc)} the document with prefix reuse"
                    + (f", {ratio(fresh[0]['evaluated'], doc)} without" if fresh else ""), made_by(m)])
    return out


def backends_section(m: Record) -> list[str]:
    n = m["numbers"]
    doc = n["document_tokens"]
    rows = [[r["label"], num(r["wall"]), num(r["evaluated"], 0), ratio(r["evaluated"], doc), num(r["generated"], 0),
             num(r["decode_tps"]), "yes" if r["correct"] else "no"] for r in n["rows"]]
    lines = [f"WiM (segments of {n['segment_tokens']} tokens unless said) over the demo report ({num(doc, 0)} tokens); "
             f"{n['model']}. The server is `marginalia serve-model` (llama-cpp-python), its counts from its log; (d) "
             "resets its context before every request.",
             "", *table(["backend", "wall (s)", "prompt tokens evaluated", "/ document", "generated", "decode tok/s",
                         "answer holds the gold"], rows, "lrrrrrl"), ""]
    by = {r["label"]: r for r in n["rows"]}
    b = by.get("(b) llama.cpp, in-process")
    if b and b.get("round_ratios"):
        lines.append(f"- (b) decodes {ratio(b['decode_tps'], by['(a) transformers, in-process']['decode_tps'])} as "
                     f"fast as (a): medians of {len(b['round_ratios'])} interleaved rounds (per round "
                     f"{min(b['round_ratios']):.2f}-{max(b['round_ratios']):.2f}).")
    again = [f"{ratio(r['follow_up_evaluated'], doc)} ({r['label'].rsplit(', ', 1)[-1]})" for r in n["rows"]
             if r.get("follow_up_evaluated") is not None]
    if again:
        lines.append("- (c): a second question on the same document evaluated " + ", ".join(again) + " the document "
                     "again: this server keeps only its last prompt's cache, while WiM's document prefix does not "
                     "depend on the question (a block prefix cache, as vLLM's or SGLang's, keeps it).")
    if n.get("decode_step"):
        steps = n["decode_step"]
        lines.append(f"- The decode step alone, (b) against (a): {ratio(steps[0]['llamacpp'], steps[0]['transformers'])} "
                     f"after {num(steps[0]['prefix'], 0)} tokens, {ratio(steps[-1]['llamacpp'], steps[-1]['transformers'])} "
                     f"after {num(steps[-1]['prefix'], 0)}: attention over a long cache narrows the gap.")
    return lines


def index_speed_summary(m: Record) -> list[list[str]]:
    t, q = m["numbers"]["throughput"], m["numbers"]["latency"]
    return [[f"Hybrid search, {num(q['rows'], 0)} chunks (IVF-PQ)",
             f"p50 {num(q['ivfpq_hybrid_p50_ms'], 0)} ms, p95 {num(q['ivfpq_hybrid_p95_ms'], 0)} ms; "
             f"{ratio(q['ivfpq_hybrid_p50_ms'], q['ivfpq_hybrid_native_p50_ms'])} LanceDB's own query", made_by(m)],
            ["Indexing (MiniLM embedding, store, BM25)",
             f"{num(t['store_rate'])} chunks/s, {num(t['ratio_median'], 2)}x the bare embedder's rate", made_by(m)]]


def index_speed_section(m: Record) -> list[str]:
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


def server_load_summary(m: Record) -> list[list[str]]:
    n = m["numbers"]
    many = n["many"][0]
    o = n["overhead"]
    return [[f"HTTP service: {n['clients']} streaming clients at once",
             f"{many['answers']} of {many['asked']} answered, {many['errors']} errors, {many['wrong']} delivered to "
             f"the wrong client; queue FIFO on the real model: {'yes' if n['fair']['fifo'] else 'no'}", made_by(m)],
            ["HTTP against in process, a WiM reading",
             f"{o['ratio_first']:.3f}x the in-process time to the first margin, {o['ratio_total']:.3f}x to the "
             "answer", made_by(m)]]


def server_load_section(m: Record) -> list[str]:
    n = m["numbers"]
    o, fair = n["overhead"], n["fair"]
    waits = [c["wait_s"] for c in fair["clients"] if c.get("wait_s") is not None]
    lines = ["The server in its own process, as `marginalia serve` runs it; clients stream `POST /v1/ask`; one reading "
             "at a time, the rest queue, and beyond the queue get 429 with `Retry-After`.", "",
             f"**(a) {n['clients']} clients at once**, {n['requests']} questions each, a scripted model "
             f"({n['model_ms']:g} ms per call) echoing each request's own token, checked in every event:", "",
             *table(["queue", "answers", "errors", "to the wrong client", "429s", "first event p50 / p99 ms",
                     "`done` p50 / p99 ms", "answers/s"],
                    [[str(r["queue"]), f"{r['answers']} of {r['asked']}", str(r["errors"]), str(r["wrong"]),
                      str(r["refused"]), f"{num(r['first_p50_ms'], 0)} / {num(r['first_p99_ms'], 0)}",
                      f"{num(r['done_p50_ms'], 0)} / {num(r['done_p99_ms'], 0)}", num(r["answers_per_s"])]
                     for r in n["many"]], "rrrrrrrr"), "",
             f"**(b) {len(fair['clients'])} clients on SmolLM2** ({fair['threads']}), each a short question sent "
             f"{fair['stagger']:g} s after the one before: served in the order asked: "
             f"{'yes' if fair['fifo'] else 'no'}; every client answered its own question: "
             f"{'yes' if fair['everyone'] else 'no'}" + (f"; waits {min(waits):.2f}-{max(waits):.2f} s" if waits else "")
             + ".", "",
             "**(c) HTTP against in process**: a WiM reading of the demo report"
             + ("" if o.get("whole", True) else f"'s first {num(o.get('chars'), 0)} characters")
             + f" ({num(o['tokens'], 0)} tokens), "
             f"{o['rounds']} rounds each way, interleaved, the server keeping no readings (`serve --no-cache`).", "",
             *table(["s, median", "first margin", "answer"],
                    [[way, num(w["first"], 2), num(w["total"], 2)] for way, w in o["ways"].items()]
                    + [["http / in process", f"{o['ratio_first']:.3f}x", f"{o['ratio_total']:.3f}x"]]), "",
             (f"All {len(n['goals'])} goals met (no errors or misdelivery, FIFO, HTTP at most 1.05x in process)."
              if all(g["met"] for g in n["goals"]) else
              "Goals not met: " + "; ".join(g["goal"] for g in n["goals"] if not g["met"]) + ".")]
    return lines


def server_fuzz_summary(m: Record) -> list[list[str]]:
    n = m["numbers"]
    if "bounds" not in n:  # a run that counted statuses only
        return [["Fuzzing the HTTP service",
                 f"{num(n['http']['requests'], 0)} requests, {n['http']['server_errors']} server errors; "
                 f"{num(n['hypothesis_inputs'], 0)} generated inputs, {n['unhandled']} unhandled exceptions",
                 made_by(m)]]
    b = n["bounds"]
    return [["Fuzzing the HTTP service",
             f"{num(n['inputs'], 0)} inputs: {n['server_errors']} server errors, {n['unhandled']} unhandled, "
             f"{n['over_time_bound']} over {b['time_s']:g} s; {num(n['peak_rss_mb'], 0)} MiB "
             f"{'≤' if n['memory_ok'] else '>'} {num(b['memory_mb'], 0)}", made_by(m)]]


def outcomes(part: Record) -> str:
    """A fuzz part's outcomes: by status, summed over kinds ("kind: status"), unless the part shows its kinds
    ("Host: 421 3; own: 2xx 2", the page's own by status class); a loader's errors together ("ok 5, refused 2");
    then its server errors and unhandled exceptions, if any."""
    kinds: dict[str, dict[str, int]] = {}
    for outcome, count in part["outcomes"].items():
        kind, _, what = outcome.rpartition(": ")
        if kind == "own":
            what = f"{what[0]}xx"
        elif part["where"] == "in process" and what != "ok" and not what.endswith("xx"):
            what = "refused"
        mine = kinds.setdefault(kind if part.get("by_kind") else "", {})
        mine[what] = mine.get(what, 0) + count
    text = "; ".join(f"{kind}: " * bool(kind) + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                     for kind, counts in kinds.items())
    errors = [f"{what} {part.get(key)}" for what, key in (("5xx", "server_errors"), ("unhandled", "unhandled"))
              if part.get(key)]
    return "; ".join([text, *errors])


def server_fuzz_section(m: Record) -> list[str]:
    n = m["numbers"]
    h = n["http"]
    if "bounds" not in n:  # a run that counted statuses only
        return ["Requests generated from the service's OpenAPI schema (schemathesis) and bodies, uploads and "
                "documents generated by hypothesis, on the scripted model and the hashing embedder. "
                f"HTTP requests: {num(h['requests'], 0)} ("
                + ", ".join(f"{k} {v}" for k, v in h["classes"].items())
                + f"); **server errors: {h['server_errors']}**; replies or jobs with a problem: {h['bad']}. "
                f"Unhandled exceptions in all parts: **{n['unhandled']}**.", "",
                *table(["part", "inputs", "outcomes", "unhandled", "wall s"],
                       [[p["name"], num(p["inputs"], 0), ", ".join(f"{k} {v}" for k, v in sorted(p["outcomes"].items())),
                         str(p["unhandled"]), num(p["seconds"], 0)] for p in n["parts"]], "lrlrr"),
                *(["", "Problems (first ones):", "", *(f"- `{q[:300]}`" for q in n["problems"][:10])]
                  if n.get("problems") else [])]
    t = n["live_server"]
    health = max((p["health_slowest_s"] for p in n["parts"] if p.get("health_slowest_s") is not None), default=None)
    first = next((p["name"] for p in n["parts"] if p["where"] != "in process"), None)
    live = (f" From {first} on: `serve` in its own process, no key, timeouts {t['header_timeout']:g} s (headers, "
            f"body pause), {t['body_total_timeout']:g} s (body), {t['max_connections']} connections; `/v1/health` "
            f"every 0.1 s ≤ {num(health, 2)} s." if first else "")
    lines = ["Scripted model." + live, "",
             *table(["part", "inputs", "outcomes", "max s", "MiB (+ conversions)"],
                    [[p["name"], num(p["inputs"], 0), outcomes(p), num(p["slowest_s"]), num(p["peak_rss_mb"], 0)]
                     for p in n["parts"]], "lrlrr")]
    if n.get("problems"):
        lines += ["", "Problems (first ones):", "", *(f"- `{q[:300]}`" for q in n["problems"][:10])]
    return lines


def judge_speed_summary(m: Record) -> list[list[str]]:
    n = m["numbers"]
    rows = sorted(n["rows"], key=lambda r: r["tokens"])
    kinds = ", ".join(f"{kind} {num(mine[0]['median_ms'])} → {num(mine[-1]['median_ms'])}"
                      for kind in n["goal"] if (mine := [r for r in rows if r["kind"] == kind]))
    flat = all(g["flat"] for g in n["goal"].values())
    return [[f"Grounded judge ms/segment, {tokens([rows[0]['tokens']])} → {tokens([rows[-1]['tokens']])} tokens",
             f"{kinds} ({'flat' if flat else 'not flat'}: ≤{n['flat']:g}x)", made_by(m)]]


def judge_speed_section(m: Record) -> list[str]:
    n = m["numbers"]
    sizes = sorted({r["tokens"] for r in n["rows"]})
    cell = {(r["kind"], r["tokens"]): num(r["median_ms"]) for r in n["rows"]}
    return [f"Median ms per segment; scripted WiM, {n['segment_tokens']}-token segments.", "",
            *table(["tokens", *n["goal"]], [[tokens([x]), *(cell.get((k, x), "–") for k in n["goal"])] for x in sizes])]


COMPOSE_LATENCY_ROWS = {
    "first": "first suggestion token",
    "full": "full 15-token suggestion",
    "first_refresh": "first token, memory refreshing",
    "full_refresh": "full suggestion, memory refreshing",
    "full_calm": "full suggestion, no refresh",
    "baseline_first": "baseline: first token",
    "baseline_full": "baseline: 15 tokens",
}


def compose_latency_summary(m: Record) -> list[list[str]]:
    n = m["numbers"]
    if "give_way" in n:
        return []
    r = n["rows"]
    return [["Composition latency (SmolLM2 suggesting as one types)",
             f"first suggestion token p50 {num(r['first']['p50_ms'], 0)} ms (p99 {num(r['first']['p99_ms'], 0)}), "
             f"full suggestion p50 {num(r['full']['p50_ms'], 0)} ms; retrieve-then-write "
             f"{num(n['baseline_first_ratio'])}x slower to its first token", made_by(m)]]


def compose_latency_section(m: Record) -> list[str]:
    n = m["numbers"]
    if "give_way" in n:
        return compose_give_way_section(n)
    s, r, c = n["setup"], n["rows"], n["counts"]
    return [f"Client: {s['client']}; memory model: {s['memory_model']}; memory: {s['memory_mode']}, threshold "
            f"{s['threshold']} token edits. {s['words']} words of WikiText's {s['article']!r} typed "
            f"({s['keystrokes']} keystrokes, {s['char_delay_ms']:g} ms apart, {s['word_pause_ms']:g} ms more after "
            f"each word), each keystroke starting a suggestion; {c['memory_updates']} memory updates, "
            f"{c['memory_failed']} failures. Baseline at {c['baseline_texts']} word ends: retrieve, then the memory "
            "model writes the 15 tokens.", "",
            *table(["ms", "p50", "p90", "p99", "n"],
                   [[label, num(r[k]["p50_ms"], 0), num(r[k]["p90_ms"], 0), num(r[k]["p99_ms"], 0), str(r[k]["n"])]
                    for k, label in COMPOSE_LATENCY_ROWS.items() if k in r]), "",
            f"The baseline takes {num(n['baseline_first_ratio'])}x compose's median time to the first token and "
            f"{num(n['baseline_full_ratio'])}x its median full suggestion. Memory updates took "
            f"{num(n['memory_update_p50_s'])} s (median); suggestions never wait for them."]


def compose_give_way_section(n: dict[str, Any]) -> list[str]:
    s = n["setup"]
    return [f"The first {s['words']} words of WikiText's {s['article']!r} typed {s['replays']} times in one process "
            f"({s['keystrokes']} keystrokes each), the memory model ({s['memory_model']}) pausing before each of its "
            "steps while a suggestion is written, and not, in ABBA order; times pooled over the replays of each "
            "kind (n in brackets).", "",
            *table(["memory model", "first token p50 (ms)", "full suggestion p50 (ms)", "full p99", "full p50 during "
                    "a refresh", "full p50, no refresh", "memory update p50 (s)"],
                   [[kind, num(c["first_p50_ms"], 0), f"{num(c['full_p50_ms'], 0)} ({c['full_n']})",
                     num(c["full_p99_ms"], 0), f"{num(c['refresh_full_p50_ms'], 0)} ({c['refresh_n']})",
                     f"{num(c['calm_full_p50_ms'], 0)} ({c['calm_n']})", num(c["update_p50_s"])]
                    for kind, c in n["give_way"].items()])]


def compose_utility_summary(m: Record) -> list[list[str]]:
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


def compose_utility_section(m: Record) -> list[str]:
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


def compose_tuning_summary(m: Record) -> list[list[str]]:
    n = m["numbers"]
    return [["Tuning the composition client (LoRA, CPU)",
             f"held-out label perplexity {num(n['perplexity_before'], 2)} → {num(n['perplexity_after'], 2)}",
             made_by(m)]]


def compose_tuning_section(m: Record) -> list[str]:
    n = m["numbers"]
    lo = n["lora"]
    curve = ", ".join(f"{step}: {loss:.3f}" for step, loss in n.get("held_out_curve") or [])
    return [f"Labels by {n['label_model']} (at most {n['label_tokens']} tokens) for prefixes of {n['articles']} (not "
            f"those the utility benchmark cuts), each with memory ({n['memory_mode']} by {n['memory_model']}); "
            f"{num(n['examples'], 0)} examples. LoRA on {n['client']} (CPU, {n['precision']}): rank {lo['rank']} on "
            f"{lo['modules']}; {lo['steps']} steps of {lo['batch_size']} examples, lr {lo['learning_rate']:g} "
            f"({lo['schedule']}), loss on the label tokens; {n['train_examples']} training examples, "
            f"{n['held_out_examples']} held out (whole articles); {num(n['train_s'] / 60)} min.", "",
            *table(["", "before", "after"], [
                [f"training loss (mean of the first / last {n['loss_steps']} steps)", num(n["loss_first"], 3),
                 num(n["loss_last"], 3)],
                ["held-out label loss (nats per token)", num(n["held_out_before"], 3), num(n["held_out_after"], 3)],
                ["held-out label perplexity", num(n["perplexity_before"], 2), num(n["perplexity_after"], 2)]]), "",
            (f"Held-out loss every {n['eval_every']} steps: {curve}; step {n['kept_step']} kept (the lowest, so "
             "'after' is a little optimistic)." if curve else "The last step's model is kept.")
            + f" The tuned client loads as `{n['spec']}` (e.g. `marginalia compose --model <spec>`)."]


def bench_example_section(m: Record) -> list[str]:
    n = m["numbers"]
    lengths = [str(x) for x in n["lengths"]]
    seconds = {c["pattern"]: c["seconds"] for c in n["cost"]}
    rows = []
    for t in n["tasks"]:
        for p in t["patterns"]:
            cells = [f"{p['by_length'][x][0]:.0f}/{p['by_length'][x][1]}" if x in p["by_length"] else "–"
                     for x in lengths]
            rows.append([t["task"], p["pattern"], *cells, estimate(p["contains"]), num(p["f1"], 2),
                         num(seconds.get(p["pattern"]))])
    a = n["answers"]
    tasks = ", ".join(f"{t['task']} ({t['questions']} questions)" for t in n["tasks"])
    return [f"Tasks {tasks}, contexts of {' and '.join(lengths)} tokens, the gold at depths 0, 0.5 and 1; model "
            f"`{n['model']}` ({n['engine']}); {a['ok']} answered, {a['overflow']} overflow, {a['error']} errors. So "
            f"few questions show the harness at work, not a verdict (`marginalia bench report {n['run']}` for "
            "depths and plots).", "",
            *table(["task", "pattern", *(f"contains @ {x}" for x in lengths), "contains (95% CI)", "F1",
                    "s / answer"], rows, "ll" + "r" * (len(lengths) + 3))]


# -- routing ---------------------------------------------------------------------------------------------------


def routing_summary(m: Record) -> list[list[str]]:
    g = m["numbers"]["goals"]
    tasks = ", ".join(f"{t} {num(v['auto'], 2)} (best {num(v['best_score'], 2)})" for t, v in g["tasks"].items())
    return [["Routing (auto: RAG, then WiM where needed), Qwen2.5-Coder-0.5B, 8k",
             f"score {tasks}; {num(g['cost_ratio'], 2)}x WiM's seconds per answer", made_by(m)]]


def live_line(live: dict[str, Any]) -> str:
    """Live auto against the best single pattern of the stored run, on the same items."""
    parts = []
    for task, v in live.items():
        by = v["patterns"]
        best = max((k for k in by if k in ("rag", "wim", "lc-own")), key=lambda k: by[k]["score"])
        parts.append(f"{task} {num(by['auto']['score'], 2)} against {best}'s {num(by[best]['score'], 2)}")
    return ("Live, on the same items, auto against the best single pattern: " + ", ".join(parts)
            + "; the live answers were today's code's, the others the stored run's.")


def routing_section(m: Record) -> list[str]:
    n = m["numbers"]
    d = n["default"]
    live = n.get("live", {})
    rows = []
    for task, by in n["singles"].items():
        auto = d["tasks"].get(task, {})
        lv = live.get(task, {}).get("patterns", {}).get("auto")
        cells = [num(by[p]["score"], 2) if p in by else "–" for p in ("rag", "wim", "lc-own")]
        seconds = " · ".join(num(by[p]["seconds"], 0) if p in by else "–" for p in ("rag", "wim"))
        rows.append([f"{task} ({auto.get('items', '–')})", *cells, num(auto.get("score"), 2),
                     f"{num(100 * auto.get('escalated', 0), 0)}%",
                     f"{num(lv['score'], 2)} ({lv['items']}) · {num(lv['seconds'], 0)} s" if lv else "–",
                     f"{seconds} · {num(auto.get('seconds'), 0)}"])
    g = n["goals"]
    missed = [f"{t} {num(v['auto'], 2)} against {v['best']}'s {num(v['best_score'], 2)} (short by "
              f"{num(v['best_score'] - 0.02 - v['auto'], 2)}: RAG's answer kept on {d['tasks'][t]['kept_worse']} "
              f"items WiM had right and RAG wrong, WiM read on {d['tasks'][t]['escalated_worse']} it had wrong and "
              "RAG right)" for t, v in g["tasks"].items() if not v["met"]]
    best, none = [], []
    for signal, sweep in n["sweeps"].items():
        fits = [r for r in sweep if all(r["tasks"][t]["score"] >= g["tasks"][t]["best_score"] - 0.02 - 1e-9
                                       for t in r["tasks"])]
        cheapest = min(fits, key=lambda r: sum(v["seconds"] for v in r["tasks"].values()), default=None)
        if cheapest is None:
            none.append(signal)
        else:
            best.append(f"{signal} ≥ {cheapest['threshold']:g} holds every QA task's goal, escalating "
                        + ", ".join(f"{t} {num(100 * v['escalated'], 0)}%" for t, v in cheapest["tasks"].items()))
    if none:
        best.append(f"no threshold of {' or '.join(none)} holds every QA task's goal")
    cwe = ""
    if n.get("cwe_from"):
        source = n["cwe_from"].removesuffix(" (live auto)")
        cwe = (f" CWE: its questions gather over the whole document and go to WiM at once, so the live auto run "
               f"(`{source}`) stands for WiM too; LC: that run's stored summary." if n["cwe_from"] != source else
               f" CWE: `{source}`'s WiM, where such a question goes at once.")
    check = n.get("timing_check")
    timing = (f" The stored run's WiM seconds were {num(check['ratio'], 2)}x a fresh WiM run's on {check['items']} of "
              f"its items (median; {num(check['lowest'], 2)}–{num(check['highest'], 2)}x), timed beside the live CWE "
              "run; with the QA tasks' seconds divided by that, "
              f"{num(n['goals'].get('checked_cost_ratio'), 2)}x." if check else "")
    return [f"`auto` keeps RAG's answer where a sentence of its passages supports it (support ≥ {d['threshold']:g}) "
            "and it does not say they are silent; else WiM reads the document. Offline: the router's signals per "
            f"item ({n['signals_from']} step), the stored run's rag or WiM score and seconds.{cwe} Score: contains "
            "(QA), set F1 (CWE); LC: lc-own.", "",
            *table(["task (items)", "RAG", "WiM", "LC", "auto", "escalated", "auto, live",
                    "s / answer (RAG · WiM · auto)"], rows, "lrrrrrrr"), "",
            "Goal, auto ≥ the best single pattern − 0.02 on every task: "
            + ("met." if not missed else f"missed on {'; '.join(missed)}.")
            + " Goal, at most half of WiM's seconds per answer over the tasks (each task's mean): "
            f"{num(g['auto_seconds'], 0)} s against {num(g['wim_seconds'], 0)} s ({num(g['cost_ratio'], 2)}x): "
            + ("met" if g["cost_met"] else "missed"
               + (", as CWE's questions go to WiM, its costliest reading, at once" if "cwe" in g["tasks"] else ""))
            + f"; over the QA tasks alone {num(g['qa_cost_ratio'], 2)}x.{timing}", "",
            *([live_line(live), ""] if live else []),
            "Made with `python benchmarks/routing.py signals configs/bench/quality.toml` and, after "
            "`marginalia bench import benchmarks/measurements/quality`, `marginalia bench run "
            "configs/bench/quality.toml --patterns auto --limit 30` (the live run; squad without the limit)"
            + ("; the same with `aggregation-lists-8k` for CWE" if (n.get("cwe_from") or "").endswith("(live auto)") else "")
            + (f"; `{check['run']}`: `--limit 2 --patterns wim` of the quality run" if check and check.get("run") else "")
            + ".", "",
            (lambda t: t[:1].upper() + t[1:])("; ".join(best))
            + (" (passages_answer: the model's P(YES), measured, not used)" if "passages_answer" in n["sweeps"] else "")
            + ".", "",
            "![routing: score against seconds per answer as the threshold varies](benchmarks/measurements/routing.png)"]


def _best(settings: list[Record], question: str) -> Record:
    """The concurrency setting whose question's margin phase took the least time."""
    return min(settings, key=lambda r: r[question]["margin_phase_s"])


def vllm_serving_summary(m: Record) -> list[list[str]]:
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


def vllm_serving_section(m: Record) -> list[str]:
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


#: each benchmark: its section's title, the summary rows it gives, and its section's body
BENCHMARKS: dict[str, tuple[str, Callable[[Record], list[list[str]]] | None, Callable[[Record], list[str]]]] = {
    "bench_example": ("`marginalia bench` on the example config", None, bench_example_section),
    "wim_overhead": ("WiM's overhead against long context", wim_overhead_summary, wim_overhead_section),
    "read_once": ("Read once, ask many", read_once_summary, read_once_section),
    "backends": ("WiM through four backends", backends_summary, backends_section),
    "index_speed": ("The persistent hybrid index", index_speed_summary, index_speed_section),
    "server_load": ("The HTTP service under load", server_load_summary, server_load_section),
    "server_fuzz": ("Fuzzing the service", server_fuzz_summary, server_fuzz_section),
    "judge_speed": ("The grounded judge's speed", judge_speed_summary, judge_speed_section),
    "routing": ("Routing: RAG first, WiM where RAG's answer does not stand", routing_summary, routing_section),
    "vllm_serving": ("At scale: WiM, the service and the benchmark over vLLM", vllm_serving_summary,
                     vllm_serving_section),
    "compose_latency": ("Composition latency", compose_latency_summary, compose_latency_section),
    "compose_utility": ("Composition utility", compose_utility_summary, compose_utility_section),
    "compose_tuning": ("Instruction tuning of the composition client", compose_tuning_summary, compose_tuning_section),
}


def section(m: Record) -> str:
    """One measurement's section as BENCHMARKS.md shows it (what a script prints after a run)."""
    if m["benchmark"] == "quality":
        return "\n".join(quality_section([m])).rstrip() + "\n"
    title, _, body = BENCHMARKS[m["benchmark"]]
    name = f" ({m['name']})" if m["name"] != m["benchmark"] else ""
    return "\n".join([f"## {title}{name}", "", provenance(m), "", *body(m)]) + "\n"


#: benchmarks whose sections BENCHMARKS.md leaves out (their summary rows stay; the script prints the section,
#: and `python benchmarks/report.py --show NAME` prints it from the stored measurement): how a run went, not a
#: result a user needs
PRINTED_ONLY = ("backends", "bench_example", "compose_tuning")
#: runs of some of a benchmark's parts (its script's ``--only``): left out like those, their summary rows too
PARTIAL = ("server_fuzz-some-parts",)
QUALITY_ORDER = ("quality", "aggregation-lists-8k", "quality-smollm2")
#: quality runs shown in their sections only, not in the summary
NOT_IN_SUMMARY: tuple[str, ...] = ()


def render(records: list[Record]) -> str:
    """BENCHMARKS.md: the summary tables, then the quality runs' section and one section per other benchmark."""
    unknown = sorted({m["benchmark"] for m in records} - set(BENCHMARKS) - {"quality"})
    if unknown:
        raise SystemExit(f"no section for the measurements of {', '.join(unknown)}: add it to report.BENCHMARKS")
    quality = sorted((m for m in records if m["benchmark"] == "quality"),
                     key=lambda m: (QUALITY_ORDER.index(m["name"]) if m["name"] in QUALITY_ORDER else len(QUALITY_ORDER),
                                    m["name"]))
    others = sorted((m for m in records if m["benchmark"] != "quality"),
                    key=lambda m: (list(BENCHMARKS).index(m["benchmark"]), m["name"]))
    lines = ["# Benchmarks", "",
             "Regenerated by `make benchmarks-md` from `benchmarks/measurements/`. Summary rows name the script or "
             "config and commit; sections quote the command. Timings come from shared 2-core machines unless said: "
             "compare within a row or section. Transcribed numbers are as an earlier BENCHMARKS.md showed them.", "",
             "## Summary", ""]
    if quality:
        lines += ["**Quality.** Mean score per answer with its 95% interval (`contains` for QA, set F1 for CWE), "
                  "WiM minus long context and minus RAG on the same items (paired 95% interval: clear when it "
                  "excludes zero), and seconds per answer; made by `marginalia bench run configs/bench/<config>` and "
                  "summarised by `python benchmarks/quality.py`.", "",
                  *table(["task", "model, context tokens", "long context", "RAG", "WiM", "WiM − long context",
                          "WiM − RAG", "s / answer (LC · RAG · WiM)", "made by"],
                         [row for m in quality if m["name"] not in NOT_IN_SUMMARY for row in quality_rows(m)],
                         "llrrrrrrl"), ""]
    rows = [row for m in others if m["name"] not in PARTIAL and (summary := BENCHMARKS[m["benchmark"]][1])
            for row in summary(m)]
    if rows:
        lines += ["**Speed, service and composition**, made by `python benchmarks/<script>`.", "",
                  *table(["what", "result", "made by"], rows, "lll"), ""]
    if quality:
        lines += quality_section(quality)
    left = [m for m in others if m["benchmark"] in PRINTED_ONLY or m["name"] in PARTIAL]
    for m in others:
        if m not in left:
            lines += section(m).splitlines() + [""]
    if left:
        lines += ["## Left out here", "",
                  "The sections of " + ", ".join(f"`{m['name']}`" for m in left) + " say how those runs went; "
                  "`python benchmarks/report.py --show NAME` prints one from its stored measurement."]
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measurements", type=Path, default=MEASUREMENTS, help="the folder of measurement files")
    ap.add_argument("--out", type=Path, default=OUT, help="the file written (default: BENCHMARKS.md)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when the file differs")
    ap.add_argument("--show", metavar="NAME", help="print one measurement's section (e.g. one left out of the file)")
    args = ap.parse_args()
    if args.show:
        found = [m for m in load(args.measurements) if m["name"] == args.show]
        if not found:
            raise SystemExit(f"no measurement named {args.show!r} in {args.measurements}")
        print(section(found[0]), end="")
        return
    text = render(load(args.measurements))
    size = len(text.encode("utf-8"))
    if size > MAX_BYTES:
        raise SystemExit(f"BENCHMARKS.md would be {size} bytes, more than {MAX_BYTES}: shorten a section")
    if args.check:
        current = args.out.read_text("utf-8") if args.out.is_file() else ""
        if current != text:
            raise SystemExit(f"{args.out} is not what the measurements give: run `make benchmarks-md`")
        return
    from marginalia.files import atomic_write_text

    atomic_write_text(args.out, text)
    print(f"wrote {args.out} ({size} bytes, {len(text.splitlines())} lines)", file=sys.stderr)


if __name__ == "__main__":
    main()
