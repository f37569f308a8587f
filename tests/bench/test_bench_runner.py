"""The benchmark runner and its config: result lines, resume after a kill, overflow/error records, the
embedding cache, medoid voting, the judge's disagreements, and the `bench` commands."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marginalia.bench import runner as runner_module
from marginalia.bench.config import load_config
from marginalia.bench.folder import read_results, result_key
from marginalia.bench.items import Item, TaskSpec
from marginalia.bench.judge import token_f1
from marginalia.bench.runner import run_benchmark
from marginalia.cli import main as cli_main
from marginalia.cli.bench import add_bench_parser, cmd_bench
from marginalia.errors import BackendError, UserError
from marginalia.index.embedders import CachedEmbedder, HashingEmbedder
from marginalia.models.base import Tokenizer
from marginalia.models.fake import Request, ScriptedGenerator
from marginalia.patterns.rag import RAG, paragraph_spans
from marginalia.records import ANSWER_SCHEMA
from wim_requests import is_margin

ROOT = Path(__file__).resolve().parents[2]

EXAMPLES = {
    "ferry": ("Which pier does the night ferry to Brackwater leave from?", ("pier 47",),
              "The night ferry to Brackwater leaves from pier 47."),
    "door": ("What colour is the door of the Skerry lighthouse?", ("green",),
             "The door of the Skerry lighthouse is painted green."),
}
_WORDS = ["market", "harbour", "granary", "canal", "bakery", "choir", "bridge", "orchard", "mill", "square"]
FILLER = [" ".join(f"The {_WORDS[(i + k) % 10]} of Ostervik stayed quiet on day {i * 7 + k}." for k in range(5))
          for i in range(40)]


def make_items(spec: TaskSpec, tokenizer: Tokenizer | None = None) -> list[Item]:
    """Items like the data side builds: the gold passage among filler passages, joined by blank lines.

    ``length / 50`` filler passages; the same filler passage texts recur across items and lengths.
    """
    items = []
    for ex_id, (question, answers, fact) in list(EXAMPLES.items())[:spec.limit]:
        for length in spec.lengths:
            fill = FILLER[: length // 50]
            for depth in spec.depths:
                at = round(depth * len(fill))
                passages = [*fill[:at], fact, *fill[at:]]
                context = "\n\n".join(passages)
                spans, pos = [], 0
                for p in passages:
                    spans.append((pos, pos + len(p)))
                    pos += len(p) + 2
                n = len(tokenizer.encode(context)) if tokenizer else len(context.split())
                items.append(Item(
                    id=f"{spec.name}/{ex_id}/{length}/d{depth}/s{spec.seed}", task=spec.name, example_id=ex_id,
                    question=question, answers=answers, context=context, context_tokens=n, target_tokens=length,
                    depth=depth, gold_spans=(spans[at],), passage_spans=tuple(spans),
                ))
    return items


def score(item: Item, prediction: str) -> dict[str, float]:
    text = prediction.lower().strip(" .")
    return {"em": float(any(text == a for a in item.answers)),
            "f1": max(token_f1(prediction, a) for a in item.answers),
            "contains": float(any(a in text for a in item.answers))}


def answering(req: Request) -> str:
    """Answers a question when its fact is in the prompt; margins copy a fact just read."""
    if is_margin(req):
        for _, _, fact in EXAMPLES.values():
            if fact in req.prefix:
                return fact
        return "NONE"
    for question, answers, fact in EXAMPLES.values():
        if question in req.suffix:
            return f"It is {answers[0]}." if fact in req.prompt else "I do not know."
    return "I do not know."


CONFIG = """\
name = "t"
model = "scripted"
embedder = "hashing"
max_new_tokens = 16

[[tasks]]
dataset = "fake"
lengths = [300, 600]
depths = [0.0, 1.0]
limit = 2

[[patterns]]
kind = "lc"

[[patterns]]
kind = "rag"
chunk_tokens = 300
top_k = 2

[[patterns]]
kind = "wim"
segment_tokens = 300
"""


def write_config(tmp_path: Path, text: str = CONFIG, name: str = "bench.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def run(config_path: Path, out: Path, gen: ScriptedGenerator | None = None, **kwargs: Any) -> Any:
    kwargs.setdefault("embedder", HashingEmbedder())
    kwargs.setdefault("err", io.StringIO())
    return run_benchmark(load_config(config_path), out=out, generator=gen or ScriptedGenerator(answering),
                         build_items=make_items, score_item=score, **kwargs)


def lines(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "results.jsonl").read_text("utf-8").splitlines()]


def keys(records: Sequence[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(r["task"], r["item_id"], r["pattern"]) for r in records]


# -- config -------------------------------------------------------------------------------------------------


def test_config_fills_defaults_and_resolves_paths(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "squad.json").write_text("{}")
    path = write_config(tmp_path / "data", CONFIG.replace('dataset = "fake"', 'dataset = "squad"\npath = "squad.json"')
                        .replace('name = "t"\n', "seed = 3\n"), name="my run.toml")
    config = load_config(path)
    assert config.name == "my-run"  # from the file name, made folder-safe
    assert config.pattern_names() == ["lc", "rag", "wim"]
    resolved = config.resolved()
    task = resolved["tasks"][0]
    assert task["path"] == str((data / "squad.json").resolve())
    assert task["name"] == "squad" and task["seed"] == 3 and task["limit"] == 2
    assert [p["max_new_tokens"] for p in resolved["patterns"]] == [16, 16, 16]
    assert resolved["patterns"][1] == {"name": "rag", "max_new_tokens": 16, "kind": "rag", "top_k": 2,
                                       "chunk_tokens": 300}
    assert resolved["patterns"][2]["judge"] == "grounded" and resolved["judge"] is None
    spec = config.tasks[0].spec(limit=1)
    assert isinstance(spec, TaskSpec) and spec.limit == 1 and spec.lengths == (300, 600) and spec.seed == 3
    assert config.tasks[0].spec(limit=99).limit == 2


@pytest.mark.parametrize(("edit", "expected"), [
    (("max_new_tokens = 16", "max_new_token = 16"),
     ["top level", "unknown key 'max_new_token'", "did you mean 'max_new_tokens'"]),
    (("limit = 2", "limit = 2\nlenghts = [1]"), ["[[tasks]] #1 (fake)", "unknown key 'lenghts'", "'lengths'"]),
    (("segment_tokens = 300", "segment_tokens = 300\ntop_k = 3"), ["[[patterns]] #3 (wim)", "unknown key 'top_k'"]),
    (('kind = "lc"', 'kind = "lcx"'), ["[[patterns]] #1 (lcx)", "kind must be one of auto, wim, lc, rag"]),
    (("depths = [0.0, 1.0]", "depths = [0.0, 1.5]"), ["[[tasks]] #1", "depths.1", "less than or equal to 1"]),
    (('segment_tokens = 300', 'segment_tokens = 300\n[judge]\nmodell = "x"'), ["[judge]", "unknown key 'modell'"]),
    (('kind = "rag"', 'kind = "rag"\nname = "lc"'), ["two patterns are called 'lc'"]),
    (('kind = "rag"', 'kind = "lc"'),
     ["[[patterns]] #2 (lc): unknown key 'chunk_tokens' (an option of kind = \"rag\")"]),
])
def test_config_errors_name_the_file_table_and_key(tmp_path: Path, edit: tuple[str, str],
                                                    expected: list[str]) -> None:
    path = write_config(tmp_path, CONFIG.replace(*edit, 1))
    with pytest.raises(UserError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(str(path))
    for part in expected:
        assert part in message


def test_config_missing_dataset_file_and_bad_toml(tmp_path: Path) -> None:
    path = write_config(tmp_path, CONFIG.replace('dataset = "fake"', 'dataset = "squad"\npath = "nope.json"'))
    with pytest.raises(UserError, match="nope.json.*does not exist"):
        load_config(path)
    with pytest.raises(UserError, match="not valid TOML"):
        load_config(write_config(tmp_path, "name = ", name="bad.toml"))
    with pytest.raises(UserError, match="no run config"):
        load_config(tmp_path / "absent.toml")


def test_an_unknown_dataset_is_said_before_the_model_loads(tmp_path: Path) -> None:
    text = CONFIG.replace('dataset = "fake"', 'dataset = "hotpotqq"')
    text = re.sub(r'(?m)^model = .*$', 'model = "gguf:/no/such/model.gguf"', text)
    assert 'model = "gguf:/no/such/model.gguf"' in text
    with pytest.raises(UserError, match="unknown dataset 'hotpotqq'; did you mean 'hotpotqa'"):
        run_benchmark(load_config(write_config(tmp_path, text)), out=tmp_path / "out", err=io.StringIO())
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["example.toml", "smoke.toml", "quality.toml", "quality-smollm2.toml"])
def test_shipped_configs_load(name: str) -> None:
    path = ROOT / "configs" / "bench" / name
    if not (ROOT.parent / "shared" / "data").is_dir():
        pytest.skip("the development data folder ../shared/data is missing")
    config = load_config(path)
    assert {p.kind for p in config.patterns} >= {"lc", "rag", "wim"}  # quality.toml also routes (auto)
    for task in config.tasks:
        assert task.dataset in ("cwe", "niah") or (task.path is not None and Path(task.path).is_file())


@pytest.mark.parametrize("name", ["long.toml", "quality-4k.toml", "quality-smollm2-4k.toml", "aggregation-8k.toml",
                                  "aggregation-lists-8k.toml"])
def test_other_shipped_configs_load(name: str) -> None:
    if not (ROOT.parent / "shared" / "data").is_dir():
        pytest.skip("the development data folder ../shared/data is missing")
    assert load_config(ROOT / "configs" / "bench" / name).patterns


# -- running --------------------------------------------------------------------------------------------------


def test_run_writes_one_line_per_pair_with_scores_and_run_info(tmp_path: Path) -> None:
    out = tmp_path / "run"
    err = io.StringIO()
    summary = run(write_config(tmp_path), out, err=err)
    records = lines(out)
    assert summary.planned == summary.written == len(records) == 2 * 2 * 2 * 3
    assert summary.resumed == 0 and summary.statuses == {"ok": 24}
    assert len(set(keys(records))) == 24
    # every pattern finds both facts in these small contexts
    assert all(r["prediction"].startswith("It is ") for r in records)
    # each answer as it leaves the program anywhere (`Answer.to_dict`), beside the fields the reports read
    assert all(r["answer"]["text"] == r["prediction"] and r["answer"]["schema"] == ANSWER_SCHEMA
               and r["answer"]["pattern"] == r["kind"] for r in records)
    assert all(r["scores"] == {"em": 0.0, "f1": pytest.approx(r["scores"]["f1"]), "contains": 1.0}
               for r in records)
    first = records[0]
    assert first["task"] == "fake" and first["pattern"] == "lc" and first["status"] == "ok"
    assert first["item_id"] == "fake/ferry/300/d0.0/s0" and first["target_tokens"] == 300
    assert first["depth"] == 0.0 and first["distractor_fraction"] is None
    assert first["answers"] == ["pier 47"] and first["judge"] is None
    assert first["stats"]["prefilled_context_tokens"] == first["context_tokens"] > 0
    assert first["stats"]["generated_answer_tokens"] > 0
    wim = next(r for r in records if r["pattern"] == "wim")
    assert len(wim["margins"]) == wim["segments_total"] >= 1 and wim["margins_kept"] >= 1
    assert wim["margins_kept"] == sum(m["kept"] for m in wim["margins"])
    assert set(wim["margins"][0]) == {"segment", "text", "kept", "reason", "score", "evidence", "read_to"}
    ends = [m["read_to"] for m in wim["margins"]]  # where each margin's segment ends, in the context
    assert ends == sorted(set(ends)) and ends[0] > 0
    # a kept margin says where the context supports it, inside the gold passage the item records
    (start, end), = wim["gold_spans"]
    assert all(start <= m["evidence"][0] < m["evidence"][1] <= end for m in wim["margins"] if m["kept"])
    assert [m["segment"] for m in wim["margins"]] == list(range(wim["segments_total"]))
    assert all(m["reason"] for m in wim["margins"])
    assert any("pier 47" in m["text"].lower() for m in wim["margins"] if m["kept"])
    info = json.loads((out / "run.json").read_text())
    assert info["config"]["name"] == "t" and info["config"]["tasks"][0]["lengths"] == [300, 600]
    assert info["models"]["generator"]["name"] == "scripted"
    assert info["models"]["generator"]["engine"] == "ScriptedGenerator"
    assert info["models"]["embedder"] == "hashing" and info["models"]["judge"] is None
    assert info["machine"]["cores"] >= 1 and "cpu" in info["machine"]
    assert 1 <= info["machine"]["usable_cores"] <= info["machine"]["cores"]
    assert "commit" in info and "started" in info and len(info["invocations"]) == 1
    assert "24/24" in err.getvalue()  # progress lines with an ETA
    assert (out / "disagreements.jsonl").read_text() == ""


def test_rerun_skips_finished_pairs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = write_config(tmp_path)
    run(config, out)
    gen = ScriptedGenerator(answering)
    summary = run(config, out, gen)
    assert summary.resumed == 24 and summary.written == 0 and gen.requests == []
    assert len(lines(out)) == 24
    assert len(json.loads((out / "run.json").read_text())["invocations"]) == 2


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = write_config(tmp_path)
    run(config, out, patterns=["lc"], limit=1)
    err = Terminal()
    run(config, out, err=err, patterns=["lc", "rag"], limit=1)
    text = err.getvalue()
    assert "\r" in text and "8/8" in text and "answer/s" in text  # a tqdm bar that counted the 4 resumed
    assert "4 done before" in text
    quiet = Terminal()
    run(config, tmp_path / "quiet", err=quiet, progress=False, patterns=["lc"], limit=1)
    assert quiet.getvalue() == ""


class Interrupting:
    """A responder that answers, then raises KeyboardInterrupt on its n-th request (as Ctrl-C would)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0

    def __call__(self, req: Request) -> str:
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        return answering(req)


def test_interrupted_run_resumes_without_duplicates(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = write_config(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run(config, out, ScriptedGenerator(Interrupting(15)))
    before = lines(out)
    assert 0 < len(before) < 24
    summary = run(config, out)
    after = lines(out)
    assert summary.resumed == len(before) and summary.written == 24 - len(before)
    assert after[:len(before)] == before  # old lines untouched
    assert len(after) == 24 and len(set(keys(after))) == 24


def test_truncated_last_line_is_repaired(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = write_config(tmp_path)
    run(config, out)
    path = out / "results.jsonl"
    text = path.read_text("utf-8").splitlines(keepends=True)
    lost = json.loads(text[-1])
    path.write_text("".join(text[:-1]) + text[-1][:40], encoding="utf-8")  # killed mid-write
    assert len(read_results(path)) == 23
    err = io.StringIO()
    summary = run(config, out, err=err)
    assert summary.written == 1 and "truncated" in err.getvalue()
    after = lines(out)
    assert len(after) == 24 and len(set(keys(after))) == 24
    assert keys([after[-1]]) == keys([lost])


def test_damaged_middle_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(UserError, match="line 2"):
        read_results(path)


def test_a_different_config_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run(write_config(tmp_path), out)
    changed = write_config(tmp_path, CONFIG.replace("lengths = [300, 600]", "lengths = [300]"), name="b.toml")
    with pytest.raises(UserError) as info:
        run(changed, out)
    assert "tasks[0].lengths" in str(info.value) and "--out" in str(info.value)
    assert len(lines(out)) == 24
    summary = run(changed, tmp_path / "other")
    assert summary.written == 2 * 1 * 2 * 3


def test_overflow_and_errors_are_recorded_and_the_run_goes_on(tmp_path: Path) -> None:
    short = make_items(TaskSpec("fake", lengths=(300,), depths=(0.0,), name="fake"), ScriptedGenerator().tokenizer)
    long = make_items(TaskSpec("fake", lengths=(600,), depths=(0.0,), name="fake"), ScriptedGenerator().tokenizer)
    window = (short[0].context_tokens + long[0].context_tokens) // 2 + 60
    assert short[0].context_tokens + 150 < window < long[0].context_tokens

    def failing(req: Request) -> str:
        if "lighthouse" in req.suffix and not is_margin(req):
            raise BackendError("the server went away")
        return answering(req)

    out = tmp_path / "run"
    gen = ScriptedGenerator(failing, context_window=window)
    summary = run(write_config(tmp_path), out, gen)
    records = lines(out)
    assert summary.written == 24
    by = {(r["example_id"], r["target_tokens"], r["depth"], r["pattern"]): r for r in records}
    over = by[("ferry", 600, 0.0, "lc")]
    assert over["status"] == "overflow" and over["window"] == window and over["needed"] > window
    assert over["prediction"] is None and over["scores"] is None
    assert by[("ferry", 600, 0.0, "rag")]["status"] == "ok"  # rag reads only two chunks
    # each rag answer keeps what auto would read on it, for `bench calibrate`
    signals = by[("ferry", 600, 0.0, "rag")]["signals"]
    assert {"support", "single_support", "topic", "names", "abstains", "gathers"} <= set(signals)
    assert "signals" not in over
    assert by[("ferry", 300, 0.0, "lc")]["status"] == "ok"
    err = by[("door", 300, 0.0, "lc")]
    assert err["status"] == "error" and "BackendError: the server went away" in err["error"]
    assert summary.statuses["error"] == sum(r["status"] == "error" for r in records) > 0
    assert summary.statuses["ok"] > 0

    # the server is back: --retry-errors runs the errored pairs again, and only those
    fixed = ScriptedGenerator(answering, context_window=window)
    again = run(write_config(tmp_path), out, fixed, retry_errors=True)
    after = lines(out)
    assert again.written == summary.statuses["error"]
    assert len(after) == 24 and len(set(keys(after))) == 24
    assert not any(r["status"] == "error" for r in after)
    assert sum(r["status"] == "overflow" for r in after) == summary.statuses["overflow"]


def test_patterns_and_limit_select_a_subset(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = write_config(tmp_path)
    summary = run(config, out, patterns=["lc"], limit=1)
    assert summary.written == 1 * 2 * 2 and {r["pattern"] for r in lines(out)} == {"lc"}
    summary = run(config, out)  # the rest, in the same folder: selections are not part of the config
    assert summary.resumed == 4 and len(lines(out)) == 24
    with pytest.raises(UserError, match="no pattern called 'bm25'"):
        run(config, out, patterns=["bm25"])


def test_tasks_select_and_order_the_tasks(tmp_path: Path) -> None:
    """--tasks runs the named tasks in the order given; the rest resume later in the same folder."""
    two = CONFIG.replace("[[patterns]]\nkind = \"lc\"", "[[tasks]]\nname = \"second\"\ndataset = \"fake\"\n"
                         "lengths = [300]\ndepths = [0.0]\nlimit = 1\n\n[[patterns]]\nkind = \"lc\"", 1)
    out = tmp_path / "run"
    config = write_config(tmp_path, two)
    assert load_config(config).task_names() == ["fake", "second"]
    summary = run(config, out, tasks=["second"])
    assert summary.written == 3 and {r["task"] for r in lines(out)} == {"second"}
    summary = run(config, out, tasks=["second", "fake"])
    assert summary.resumed == 3 and [r["task"] for r in lines(out)][3:] == ["fake"] * 24
    invocations = json.loads((out / "run.json").read_text())["invocations"]
    assert [i["tasks"] for i in invocations] == [["second"], ["second", "fake"]]
    with pytest.raises(UserError, match="no task called 'niah'.*its tasks are: fake, second"):
        run(config, out, tasks=["niah"])


class CountingEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.documents: list[str] = []

    def _embed(self, texts: Sequence[str], kind: Any) -> np.ndarray:
        if kind == "document":
            self.documents.extend(texts)
        return super()._embed(texts, kind)


def test_rag_embeds_each_passage_once_per_run(tmp_path: Path) -> None:
    text = CONFIG.replace("depths = [0.0, 1.0]", "depths = [0.0, 0.5, 1.0]")
    counting = CountingEmbedder()
    cached = CachedEmbedder(counting)
    run(write_config(tmp_path, text), tmp_path / "run", embedder=cached, patterns=["rag"])
    # 2 questions x 3 depths x (7 + 13 passages at the two lengths) = 120 chunks asked for ...
    assert cached.hits + cached.misses == 2 * 3 * (7 + 13)
    # ... but only the 14 distinct passages are embedded, each once
    passages = set(FILLER[:12]) | {fact for _, _, fact in EXAMPLES.values()}
    assert sorted(counting.documents) == sorted(passages) and cached.misses == 14


def test_cached_embedder_matches_the_inner_one() -> None:
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner)
    texts = ["the ferry leaves from pier 47", "apples and wool", "the ferry leaves from pier 47"]
    first = cached.embed_documents(texts)
    assert np.allclose(first, HashingEmbedder().embed_documents(texts))
    again = cached.embed_documents(texts[:2])
    assert np.array_equal(again, first[:2])
    assert inner.documents == texts[:2] and (cached.misses, cached.hits) == (2, 3) and len(cached) == 2
    assert np.allclose(cached.embed_query("pier 47"), inner.embed_query("pier 47"))
    assert inner.documents == texts[:2]  # queries are not cached as documents
    assert cached.embed_documents([]).shape[0] == 0


def test_rag_paragraph_split_keeps_passages_whole() -> None:
    text = "  First paragraph.\n\nSecond one,\nwith a line break.\n \n\n Third.\n\n"
    assert [text[a:b] for a, b in paragraph_spans(text)] == [
        "First paragraph.", "Second one,\nwith a line break.", "Third."]
    item = make_items(TaskSpec("fake", lengths=(300,), depths=(0.5,), name="fake"))[0]
    gen = ScriptedGenerator(answering)
    answer = RAG(gen, embedder=HashingEmbedder(), chunk_tokens=500, top_k=1).answer(
        item.context, item.question)
    (ref,) = answer.references
    assert ref.text == EXAMPLES["ferry"][2] and item.context[ref.start:ref.end] == ref.text
    assert answer.segments_total == len(item.passage_spans)
    assert answer.stats.context_tokens == len(gen.tokenizer.encode(item.context))


def test_voting_keeps_the_medoid_and_records_every_sample(tmp_path: Path) -> None:
    replies = {0: "Pier 47.", 1: "It is pier 47.", 2: "The harbour office.", 3: "pier 47", 4: "Maybe pier 12."}

    def sampled(req: Request) -> str:
        assert req.params.temperature == 0.5
        return replies[(req.params.seed or 0) - 100]

    text = CONFIG.replace('name = "t"', 'name = "t"\nseed = 100') + "\n[voting]\nsamples = 5\ntemperature = 0.5\n"
    out = tmp_path / "run"
    run(write_config(tmp_path, text), out, ScriptedGenerator(sampled), patterns=["lc"], limit=1)
    record = lines(out)[0]
    assert [s["seed"] for s in record["samples"]] == [100, 101, 102, 103, 104]
    assert [s["text"] for s in record["samples"]] == [replies[i] for i in range(5)]
    assert record["prediction"] == "Pier 47."  # closest on average to the other samples
    best = max(record["samples"], key=lambda s: s["mean_f1"])
    assert best["text"] == "Pier 47."
    one = len(ScriptedGenerator().tokenizer.encode("Pier 47."))
    assert record["stats"]["generated_answer_tokens"] > one  # summed over the five samples


def test_voting_leaves_each_pattern_as_it_was_built() -> None:
    """The samples' temperature and seeds go to their runs alone: the next answer is greedy again, and no
    pattern (lc, wim on a shared reading, lc from that reading) was changed."""
    from marginalia.bench.config import VotingConfig
    from marginalia.bench.runner import answer_item
    from marginalia.patterns.long_context import LongContext
    from marginalia.patterns.wim import SharedReading, WiM

    gen = ScriptedGenerator(answering)
    item = make_items(TaskSpec("fake", lengths=(300,), depths=(0.5,), name="fake"))[0]
    shared = SharedReading(WiM(gen, segment_tokens=100))
    for pattern in (LongContext(gen), shared.answering(), shared.answering(LongContext(gen, max_new_tokens=12))):
        built, params = dict(vars(pattern)), pattern.answer_params
        answer, samples = answer_item(pattern, item, VotingConfig(samples=3, temperature=0.5), seed=7)
        asked = [r.params for r in gen.requests if not is_margin(r)][-3:]
        assert [(p.temperature, p.seed) for p in asked] == [(0.5, 7), (0.5, 8), (0.5, 9)], pattern.name
        assert samples is not None and [s["seed"] for s in samples] == [7, 8, 9]
        answer_item(pattern, item)
        last = [r.params for r in gen.requests if not is_margin(r)][-1]
        assert (last.temperature, last.seed, last.max_new_tokens) == (0.0, None, params.max_new_tokens)
        assert vars(pattern) == built and pattern.answer_params is params


def test_judge_verdicts_and_disagreements(tmp_path: Path) -> None:
    def judged(req: Request) -> str:
        if "You grade answers" in req.prompt:
            return 'Sure! ```json\n{"correct": true, "reason": "looks right"}\n```'
        if is_margin(req):
            return "NONE"
        return "The harbour office." if "ferry" in req.suffix else "It is green."

    text = CONFIG + '\n[judge]\nmodel = "scripted"\nretries = 1\n'
    out = tmp_path / "run"
    summary = run(write_config(tmp_path, text), out, ScriptedGenerator(judged), patterns=["lc"])
    records = lines(out)
    assert all(r["judge"]["verdict"] == "correct" and r["judge"]["attempts"] == 1 for r in records)
    disagreements = [json.loads(x) for x in (out / "disagreements.jsonl").read_text().splitlines()]
    ferry = [r for r in records if r["example_id"] == "ferry"]
    assert summary.disagreements == len(disagreements) == len(ferry) == 4
    assert {d["kind"] for d in disagreements} == {"judge_correct_lexical_wrong"}
    assert disagreements[0]["prediction"] == "The harbour office." and disagreements[0]["answers"] == ["pier 47"]
    info = json.loads((out / "run.json").read_text())
    assert info["models"]["judge"]["spec"] == "scripted" and info["config"]["judge"]["retries"] == 1


# -- the commands ----------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="marginalia")
    add_bench_parser(top.add_subparsers(dest="command"))
    return top


def test_bench_help_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    for command, options in (("run", ["--out", "--limit", "--patterns", "--home", "--retry-errors", "--no-report",
                                      "--quiet", "--verbose"]),
                             ("report", ["--out", "--home", "--no-plots"])):
        with pytest.raises(SystemExit) as exc:
            parser().parse_args(["bench", command, "--help"])
        assert exc.value.code == 0
        text = capsys.readouterr().out
        for option in options:
            assert option in text
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["bench", "run", "x.toml", "--limit", "0"])
    assert exc.value.code == 2


def test_parents_options_are_not_added_twice() -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--home", default=None, help="home")
    common.add_argument("-v", "--verbose", action="store_true", help="verbose")
    top = argparse.ArgumentParser(prog="marginalia")
    add_bench_parser(top.add_subparsers(dest="command"), [common])
    args = top.parse_args(["bench", "report", "r", "--home", "h", "-v"])
    assert args.home == "h" and args.verbose and args.bench_command == "report"


def test_bench_run_and_report_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hermetic: Path) -> None:
    monkeypatch.setattr(runner_module, "_default_build", lambda: make_items)
    monkeypatch.setattr(runner_module, "_default_score", lambda: score)
    config = write_config(tmp_path, CONFIG.replace('model = "scripted"', 'model = "scripted:It is pier 47."'))
    out, err = io.StringIO(), io.StringIO()
    args = parser().parse_args(["bench", "run", str(config), "--limit", "1", "--patterns", "lc,rag"])
    assert cmd_bench(args, out, err) == 0
    folder = hermetic / "bench" / "runs" / "t"
    stdout = out.getvalue().splitlines()
    assert stdout[0] == str(folder)
    assert "fake\tlc\tcontains\t1.00 [0.51, 1.00]\tn=4" in stdout
    assert stdout[-1] == str(folder / "report.md") and (folder / "cost.png").is_file()
    assert "loading scripted" in err.getvalue() and "8/8" in err.getvalue()
    assert len(lines(folder)) == 8

    out, err = io.StringIO(), io.StringIO()
    assert cli_main(["bench", "report", "t", "--no-plots", "--out", str(tmp_path / "rep")], out, err) == 0
    assert out.getvalue().strip() == str(tmp_path / "rep" / "report.md")
    assert "| lc | 300 | 2 | 1.00 [0.34, 1.00]" in (tmp_path / "rep" / "report.md").read_text()

    out, err = io.StringIO(), io.StringIO()
    bad = write_config(tmp_path, CONFIG.replace("limit = 2", "limt = 2"), name="bad.toml")
    assert cli_main(["bench", "run", str(bad)], out, err) == 2
    assert "unknown key 'limt'" in err.getvalue() and out.getvalue() == ""
    assert cli_main(["bench", "report", "nothing-here"], out, err) == 2


# -- one reading shared by wim and lc ---------------------------------------------------------------------

SHARED = CONFIG.replace('[[patterns]]\nkind = "lc"\n', '[[patterns]]\nkind = "lc"\nreading = "wim"\n')


def test_lc_answers_from_wims_reading(tmp_path: Path) -> None:
    """lc reads no context token of its own; wim's results are those of a run without sharing."""
    shared_gen = ScriptedGenerator(answering)
    run(write_config(tmp_path, SHARED, "shared.toml"), tmp_path / "shared", shared_gen)
    run(write_config(tmp_path), tmp_path / "alone")
    shared, alone = lines(tmp_path / "shared"), lines(tmp_path / "alone")
    assert sorted(keys(shared)) == sorted(keys(alone))
    by_key = {result_key(r): r for r in alone}
    for record in shared:
        other = by_key[result_key(record)]
        stats = record["stats"]
        if record["pattern"] == "lc":
            assert stats["prefilled_context_tokens"] == 0 and stats["reprefilled_context_tokens"] == 0
            assert stats["cached_context_tokens"] == record["context_tokens"] > 0
            assert other["stats"]["prefilled_context_tokens"] == record["context_tokens"]
        else:
            assert record["prediction"] == other["prediction"] and record["margins"] == other["margins"]
            assert stats["prefilled_context_tokens"] == other["stats"]["prefilled_context_tokens"]
        assert record["scores"] == other["scores"]
    # per item, the wim pattern runs before the lc answering from its reading
    order = [r["pattern"] for r in shared]
    assert order[:3] == ["rag", "wim", "lc"]
    # the context was prefilled once per item: by wim
    per_item = len(EXAMPLES) * 2 * 2
    assert sum(r["stats"]["prefilled_context_tokens"] for r in shared if r["pattern"] != "rag") == \
        sum(r["context_tokens"] for r in shared if r["pattern"] == "wim")
    assert len([r for r in shared_gen.requests if is_margin(r)]) >= per_item


def test_lc_on_a_reading_runs_alone_and_after_a_resume(tmp_path: Path) -> None:
    """Selected without its wim pattern (or with wim's results already on disk), lc reads the context
    through wim's reader itself, once, writing no margin."""
    config = write_config(tmp_path, SHARED, "shared.toml")
    gen = ScriptedGenerator(answering)
    summary = run(config, tmp_path / "run", gen, patterns=["lc"])
    assert summary.written == 8 and not any(is_margin(r) for r in gen.requests)
    records = lines(tmp_path / "run")
    assert all(r["stats"]["prefilled_context_tokens"] == r["context_tokens"] for r in records)
    assert all(r["prediction"].startswith("It is ") for r in records)
    assert run(config, tmp_path / "run").written == 16  # rag and wim join the same folder


def test_a_reading_must_name_a_wim_pattern(tmp_path: Path) -> None:
    for bad, why in (("rag", "not a wim pattern of this config"), ("nope", "its wim patterns: wim")):
        text = CONFIG.replace('kind = "lc"\n', f'kind = "lc"\nreading = "{bad}"\n')
        with pytest.raises(UserError, match=why):
            load_config(write_config(tmp_path, text, f"{bad}.toml"))


# -- judging a run again --------------------------------------------------------------------------------


def test_a_run_is_judged_again_and_a_new_judge_does_not_block_resuming(tmp_path: Path) -> None:
    from marginalia.bench.judge import ModelJudge
    from marginalia.bench.rejudge import rejudge

    out = tmp_path / "run"
    config = write_config(tmp_path, CONFIG + '\n[judge]\nmodel = "scripted"\n')
    lenient = ScriptedGenerator(lambda req: '{"correct": true}' if "You grade answers" in req.prompt
                                else answering(req))
    run(config, out, lenient, patterns=["lc", "rag"], limit=1)
    assert all(r["judge"]["verdict"] == "correct" and r["judge"]["by"] == "scripted, yes/no by rule"
               for r in lines(out))

    def strict(req: Request) -> str:  # right only where the answer holds a gold answer
        return json.dumps({"correct": "pier 47" in req.prompt.split("Predicted answer:")[1]
                           or "green" in req.prompt.split("Predicted answer:")[1]})

    judge = ModelJudge(ScriptedGenerator(strict, name="strict"))
    summary = rejudge(out, judge, err=io.StringIO(), save_every=3)
    records = lines(out)
    assert summary.judged == len(records) == 8 and summary.kept == 0
    assert all(r["judge"]["by"] == "strict" for r in records)
    assert all((r["judge"]["verdict"] == "correct") == (r["scores"]["contains"] == 1.0) for r in records)
    info = json.loads((out / "run.json").read_text())
    assert info["models"]["judge"]["name"] == "strict" and info["rejudged"][0]["judged"] == 8
    # judged again by the same judge: nothing to do
    assert rejudge(out, judge, err=io.StringIO()).judged == 0
    # another judge in the config does not stop the run from resuming; new answers get the new judge
    other = write_config(tmp_path, CONFIG + '\n[judge]\nmodel = "scripted"\nretries = 0\n', "other.toml")
    assert run(other, out, lenient, patterns=["lc", "rag"]).written == 8


def test_answers_scored_as_a_set_are_not_judged(tmp_path: Path) -> None:
    from marginalia.bench.judge import ModelJudge
    from marginalia.bench.rejudge import rejudge

    out = tmp_path / "run"
    lenient = ScriptedGenerator(lambda req: '{"correct": true}' if "You grade answers" in req.prompt
                                else answering(req))
    run(write_config(tmp_path, CONFIG + '\n[judge]\nmodel = "scripted"\n'), out, lenient, patterns=["lc", "rag"],
        limit=1)
    records = lines(out)
    for r in records:  # as word-list answers judged by a run made before the rule
        if r["pattern"] == "lc":
            r["scoring"] = "set"
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    summary = rejudge(out, ModelJudge(ScriptedGenerator(default='{"correct": false}', name="strict")),
                      err=io.StringIO())
    assert (summary.judged, summary.kept) == (4, 0)  # the set-scored answers are neither judged nor kept
    assert all(r["judge"] is None if r["pattern"] == "lc" else r["judge"]["by"] == "strict" for r in lines(out))
    # carried without its texts, the run is judged again without asking for the word lists' texts
    from marginalia.bench.export import export_run, import_run

    export_run(out, tmp_path / "copy")
    import_run(tmp_path / "copy", tmp_path / "carried")
    again = rejudge(tmp_path / "carried", ModelJudge(ScriptedGenerator(default='{"correct": false}', name="strict")),
                    err=io.StringIO())
    assert (again.judged, again.kept) == (0, 4)
    # nor judged while a run answers them
    cwe = ('name = "cwe"\nmodel = "scripted"\nembedder = "hashing"\n[[tasks]]\ndataset = "cwe"\nlengths = [300]\n'
           'limit = 2\n[[patterns]]\nkind = "lc"\n[judge]\nmodel = "scripted"\n')
    def grading() -> int:
        return sum("You grade answers" in r.prompt for r in lenient.requests)

    before = grading()
    run_benchmark(load_config(write_config(tmp_path, cwe, "cwe.toml")), out=tmp_path / "cwe", generator=lenient,
                  embedder=HashingEmbedder(), err=io.StringIO())
    assert [(r["scoring"], r["judge"]) for r in lines(tmp_path / "cwe")] == [("set", None)] * 2
    assert grading() == before


def test_bench_judge_command(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    run(write_config(tmp_path), out, patterns=["lc"], limit=1)
    monkeypatch.setattr("marginalia.models.load_generator", lambda *a, **k: ScriptedGenerator(
        lambda req: '{"correct": false, "reason": "no"}'))
    assert cli_main(["bench", "judge", str(out), "--model", "scripted", "-q"]) == 0
    printed = capsys.readouterr().out
    assert str(out) in printed and "judge" in printed and "report.md" in printed
    assert all(r["judge"]["verdict"] == "wrong" for r in lines(out))
    assert "Primary score: **judge accuracy**" in (out / "report.md").read_text()
    # the probability judge: P(YES) 0.4 passes a 0.3 threshold; these verdicts are a new judge's
    monkeypatch.setattr("marginalia.models.load_generator", lambda *a, **k: ScriptedGenerator(lambda req: "0.4"))
    args = ["bench", "judge", str(out), "--model", "scripted", "--method", "probability", "-q"]
    assert cli_main([*args, "--threshold", "0.3"]) == 0
    judged = [r["judge"] for r in lines(out)]
    assert all(j["verdict"] == "correct" and j["p_yes"] == 0.4 and j["by"] == "scripted P(YES)>=0.3, yes/no by rule"
               for j in judged)
    # --yes-no model: the model alone, a judge of another name, so every answer is judged again
    assert cli_main([*args, "--threshold", "0.3", "--yes-no", "model"]) == 0
    assert all(r["judge"]["by"] == "scripted P(YES)>=0.3" for r in lines(out))
    capsys.readouterr()
    assert cli_main([*args, "--threshold", "1.5"]) != 0
    assert "bad judge settings: threshold" in capsys.readouterr().err


def test_a_run_begun_before_an_option_existed_resumes(tmp_path: Path) -> None:
    """A new option's default changes nothing a run did: its absence from the stored config is no difference."""
    out = tmp_path / "run"
    config = write_config(tmp_path)
    run(config, out, patterns=["lc"], limit=1)
    info = json.loads((out / "run.json").read_text())
    for p in info["config"]["patterns"]:
        p.pop("margin_style", None)  # as a run made before the option was added stored it
    (out / "run.json").write_text(json.dumps(info))
    assert run(config, out).written == 20


def test_a_run_stored_with_a_settled_option_resumes_at_the_behaviour_left(tmp_path: Path) -> None:
    """An option that is no longer a choice changes nothing a run did that chose the behaviour left; a run that
    chose another is a different config."""
    out = tmp_path / "run"
    config = write_config(tmp_path)
    run(config, out, patterns=["lc"], limit=1)
    info = json.loads((out / "run.json").read_text())
    settled = {"lc": {"answer_style": "sentence", "answer_decoding": "free"}, "rag": {"split": "paragraphs"},
               "wim": {"margin_decoding": "lists", "tally_lists": True, "tally_only": True, "kept_as": "written",
                       "margin_style": "sentence", "instructions": "intro"}}
    for p in info["config"]["patterns"]:
        p.update(settled[p["kind"]])  # as a run made while these were options stored them
    (out / "run.json").write_text(json.dumps(info))
    assert run(config, out).written == 20
    for p in info["config"]["patterns"]:
        p.update({"margin_decoding": "free"} if p["kind"] == "wim" else {})
    (out / "run.json").write_text(json.dumps(info))
    with pytest.raises(UserError, match="holds results of a different config .differs in: .*margin_decoding"):
        run(config, out)


def test_a_folder_being_written_is_refused_before_a_judge_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from filelock import FileLock

    out = tmp_path / "run"
    run(write_config(tmp_path), out, patterns=["lc"], limit=1)
    loaded: list[str] = []
    monkeypatch.setattr("marginalia.models.load_generator", lambda spec, *a, **k: loaded.append(spec))
    with FileLock(out / ".lock"):  # as a running `bench run` holds it
        with pytest.raises(UserError, match="another benchmark run is writing"):
            run(write_config(tmp_path), out, patterns=["lc"], limit=1)
        assert cli_main(["bench", "judge", str(out), "--model", "scripted"]) != 0
    err = capsys.readouterr().err
    assert "judge its answers once it has finished or been stopped" in err and not loaded


def test_a_pattern_added_to_the_config_answers_the_same_items(tmp_path: Path) -> None:
    """A run grows by a pattern without answering the others again; a changed or removed one is refused."""
    out = tmp_path / "run"
    run(write_config(tmp_path), out)
    before = lines(out)
    grown = CONFIG + '\n[[patterns]]\nkind = "lc"\nname = "lc-short"\nmax_new_tokens = 4\n'
    logged: list[str] = []
    summary = run(write_config(tmp_path, grown, "grown.toml"), out, log=logged.append)
    assert summary.written == 8 and summary.resumed == len(before) == 24
    added = lines(out)[len(before):]
    assert {r["pattern"] for r in added} == {"lc-short"}
    assert {r["item_id"] for r in added} == {r["item_id"] for r in before}
    assert any("patterns added to the run: lc-short" in m for m in logged)
    info = json.loads((out / "run.json").read_text())
    assert [p.get("name") or p["kind"] for p in info["config"]["patterns"]] == ["lc", "rag", "wim", "lc-short"]
    assert info["invocations"][-1]["added_patterns"] == ["lc-short"]
    assert run(write_config(tmp_path, grown, "grown.toml"), out).written == 0  # the grown config resumes
    for changed in (CONFIG.replace("top_k = 2", "top_k = 3"),  # a stored pattern changed, or one left out
                    CONFIG.replace('[[patterns]]\nkind = "wim"\nsegment_tokens = 300\n', "")):
        with pytest.raises(UserError, match="holds results of a different config"):
            run(write_config(tmp_path, changed + '\n[[patterns]]\nkind = "lc"\nname = "x"\n', "bad.toml"), out)


def test_a_raised_limit_grows_the_run_when_its_first_items_stay(tmp_path: Path) -> None:
    """More examples of the same task answer only the new items (a limit beyond the data is said to be); a
    dataset whose first items change with the limit, or a lowered limit, is refused before anything is
    written."""
    out = tmp_path / "run"
    one = CONFIG.replace("limit = 2", "limit = 1")
    run(write_config(tmp_path, one, "one.toml"), out)
    before = lines(out)
    logged: list[str] = []
    summary = run(write_config(tmp_path), out, log=logged.append)
    assert summary.resumed == len(before) == 12 and summary.written == 12
    assert {r["item_id"] for r in lines(out)[len(before):]}.isdisjoint({r["item_id"] for r in before})
    assert any("limits raised: fake 1 -> 2" in m for m in logged)
    info = json.loads((out / "run.json").read_text())
    assert info["config"]["tasks"][0]["limit"] == 2 and info["invocations"][-1]["raised_limits"] == {"fake": [1, 2]}
    assert run(write_config(tmp_path), out).written == 0  # the grown config resumes
    logged.clear()
    beyond = run(write_config(tmp_path, CONFIG.replace("limit = 2", "limit = 5"), "five.toml"), out,
                 log=logged.append)
    assert beyond.written == 0 and any("limit 5, but its data gives 2 examples" in m for m in logged)

    with pytest.raises(UserError, match="holds results of a different config"):
        run(write_config(tmp_path, one, "one.toml"), out)  # lowered

    def spreading(spec: TaskSpec, tokenizer: Tokenizer | None = None) -> list[Item]:
        picked = list(EXAMPLES)[spec.limit - 1:]  # another first pick at another limit
        return [it for it in make_items(dataclasses.replace(spec, limit=len(EXAMPLES)), tokenizer)
                if it.example_id in picked]

    other = tmp_path / "other"
    run_benchmark(load_config(write_config(tmp_path, one, "one.toml")), out=other, generator=ScriptedGenerator(
        answering), build_items=spreading, score_item=score, embedder=HashingEmbedder(), err=io.StringIO())
    kept = lines(other)
    with pytest.raises(UserError, match="changes the items it already answered"):
        run_benchmark(load_config(write_config(tmp_path)), out=other, generator=ScriptedGenerator(answering),
                      build_items=spreading, score_item=score, embedder=HashingEmbedder(), err=io.StringIO())
    assert lines(other) == kept and json.loads((other / "run.json").read_text())["config"]["tasks"][0]["limit"] == 1


# -- runs without their texts ------------------------------------------------------------------------------


def test_a_text_free_export_keeps_no_text_reports_the_same_and_resumes_elsewhere(tmp_path: Path) -> None:
    from marginalia.bench.report import write_report

    config = write_config(tmp_path)
    out = tmp_path / "run"
    run(config, out)
    records = lines(out)
    assert any(m["kept"] for r in records for m in r.get("margins") or [])  # margins to carry over
    copy = tmp_path / "copy"
    assert cli_main(["bench", "export", str(out), str(copy)], io.StringIO(), io.StringIO()) == 0
    stored = (copy / "results.jsonl").read_text("utf-8")
    texts = {s for q, answers, fact in EXAMPLES.values() for s in (q, fact, *answers)}
    texts |= {r["prediction"] for r in records} | set(FILLER[:3])
    assert not [t for t in texts if t and t in stored]  # no question, gold, answer, margin or document text
    exported = [json.loads(line) for line in stored.splitlines()]
    assert keys(exported) == keys(records)
    assert [r["scores"] for r in exported] == [r["scores"] for r in records]
    margins = [m for r in exported for m in r.get("margins") or []]
    assert any(m["holds_answer"] for m in margins) and all("text" not in m for m in margins)

    def tables(folder: Path) -> str:  # the report without its lines naming the folder
        text = write_report(folder, out=tmp_path / f"report-{folder.name}", plots=False).report.read_text()
        return "\n".join(line for line in text.splitlines() if str(folder) not in line)

    assert tables(copy) == tables(out)

    # on another machine: the copy becomes a run, which resumes without answering anything again
    elsewhere = tmp_path / "elsewhere"
    assert cli_main(["bench", "import", str(copy), "--out", str(elsewhere)], io.StringIO(), io.StringIO()) == 0
    gen = ScriptedGenerator(answering)
    summary = run(config, elsewhere, gen)
    assert summary.resumed == 24 and summary.written == 0 and gen.requests == []
    assert tables(elsewhere) == tables(out)


def test_a_run_carried_by_its_text_free_copy_grows_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from marginalia.bench.export import export_run, import_run
    from marginalia.bench.report import write_report

    config = write_config(tmp_path)
    first = tmp_path / "first"
    run(config, first, patterns=["lc"])
    copy = tmp_path / "copy"
    assert export_run(first, copy) == 8
    second = tmp_path / "second"
    assert import_run(copy, second) == 8
    assert import_run(copy, second) == 0  # nothing twice
    monkeypatch.setattr(runner_module, "machine_info", lambda jobs=1: {"cpu": "Other CPU", "cores": 64})
    summary = run(config, second)
    assert summary.resumed == 8 and summary.written == 16  # only rag and wim were answered here
    report = write_report(second, plots=False).report.read_text()
    assert "answered on 2 machines (" in report and "64 cores, Other CPU" in report
    assert export_run(second, copy) == 24
    assert sorted(keys(lines(copy))) == sorted(keys(lines(second)))
    other = write_config(tmp_path, CONFIG.replace('model = "scripted"', 'model = "scripted:other"'), "other.toml")
    third = tmp_path / "third"
    run(other, third, patterns=["lc"], limit=1)
    with pytest.raises(UserError, match="different configs"):
        export_run(third, copy)
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UserError, match="is a file; give a folder"):
        export_run(second, tmp_path / "a-file")
    with pytest.raises(UserError, match="holds no results.jsonl"):
        import_run(tmp_path / "nothing", tmp_path / "fourth")
    err = io.StringIO()
    assert cli_main(["bench", "import", str(tmp_path / "nothing")], io.StringIO(), err) == 2
    assert "holds no results.jsonl; give the folder 'marginalia bench export' wrote" in err.getvalue()


def test_a_carried_run_is_judged_where_its_texts_are(tmp_path: Path) -> None:
    """Imported answers keep the verdicts they were exported with; a judge that has not judged them refuses."""
    from marginalia.bench.export import export_run, import_run
    from marginalia.bench.judge import ModelJudge
    from marginalia.bench.rejudge import rejudge

    config = write_config(tmp_path)
    first = tmp_path / "first"
    run(config, first, patterns=["lc"], limit=1)
    judge = ModelJudge(ScriptedGenerator(lambda req: '{"correct": true}', name="lenient"))
    assert rejudge(first, judge, err=io.StringIO()).judged == 4
    export_run(first, tmp_path / "copy")
    second = tmp_path / "second"
    import_run(tmp_path / "copy", second)
    run(config, second, patterns=["lc"])  # four more answers, with their texts
    summary = rejudge(second, judge, err=io.StringIO())
    assert summary.judged == 4 and summary.kept == 4  # the imported ones keep their verdicts
    assert all(r["judge"]["by"] == "lenient" for r in lines(second))
    other = ModelJudge(ScriptedGenerator(lambda req: '{"correct": false}', name="strict"))
    with pytest.raises(UserError, match="4 answers of .* were imported without their texts and not judged by strict"):
        rejudge(second, other, err=io.StringIO())


def test_voting_sums_stats_and_an_unknown_count_stays_unknown() -> None:
    from marginalia.records import Stats

    known = Stats(context_tokens=10, prefilled_context_tokens=10, prefilled_other_tokens=5, prompt_tokens_sent=20,
                  prompt_tokens_cached=4, total_seconds=1.5, time_to_first_margin=0.5)
    blind = dataclasses.replace(known, prefilled_context_tokens=None, prefilled_other_tokens=None,
                                prompt_tokens_cached=None, prompt_cache_unreported=2, time_to_first_margin=0.7)
    total = runner_module._sum_stats([known, blind])
    assert (total.context_tokens, total.prompt_tokens_sent, total.prompt_cache_unreported) == (20, 40, 2)
    assert total.prefilled_context_tokens is None and total.prompt_tokens_cached is None
    assert total.total_seconds == 3.0 and total.time_to_first_margin == 0.5
    assert runner_module._sum_stats([known, known]).prefilled_context_tokens == 20
