"""Task builders: target lengths, gold depth, distractor rules, size sweeps, needles and common-words lists."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from marginalia.bench.items import Item, TaskSpec
from marginalia.bench.tasks import SEP, build_items
from marginalia.errors import UserError
from marginalia.models.base import Tokenizer
from marginalia.models.fake import WordTokenizer

DATA = Path(os.environ.get("BENCH_DATA_DIR") or Path(__file__).parents[3] / "shared" / "data")

_NOUNS = ["river", "stone", "lantern", "meadow", "copper", "orchard", "willow", "ember", "canvas", "thistle"]
_ADJS = ["quiet", "narrow", "bright", "old", "damp", "tall", "round", "pale"]
_MONTHS = ["March", "April", "May", "June", "July"]


def sentences(rng: random.Random, place: str, n: int) -> str:
    return " ".join(f"The {rng.choice(_ADJS)} {rng.choice(_NOUNS)} near {place} was seen in {rng.choice(_MONTHS)}."
                    for _ in range(n))


def write_squad(path: Path, articles: int = 8, paragraphs: int = 5) -> Path:
    """Articles whose paragraphs all name the article's town; article 3 also names article 0's answer."""
    rng = random.Random(7)
    data = []
    for a in range(articles):
        town = f"Town{chr(65 + a)}"
        paras = []
        for p in range(paragraphs):
            answer = f"Keeper{chr(65 + a)}{p}"
            text = f"{answer} keeps the gate of {town}. " + sentences(rng, town, rng.randint(2, 4))
            if (a, p) == (3, 2):
                text += " A letter from KeeperA0 arrived."
            paras.append({"context": text, "qas": [
                {"id": f"a{a}p{p}q{q}", "question": f"Who keeps the gate of {town} ({q})?",
                 "answers": [{"text": answer, "answer_start": 0}]} for q in range(2)]})
        data.append({"title": town, "paragraphs": paras})
    path.write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")
    return path


def write_texts(path: Path, n: int, per_text: int, seed: int = 3, titled: bool = False) -> Path:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        row: dict[str, Any] = {"id": f"t{i}", "text": sentences(rng, f"Pool{i}", per_text)}
        if titled:
            row["title"] = f"Pool article {i}"
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def check_item(item: Item, tok: Tokenizer, sep: str = SEP) -> None:
    """Invariants every built item keeps: the measured length, the window, passage spans that tile the context."""
    assert item.context_tokens == len(tok.encode(item.context))
    if item.distractor_fraction is None and item.target_tokens is not None:
        assert 0.98 * item.target_tokens <= item.context_tokens <= item.target_tokens
    assert sep.join(item.context[a:b] for a, b in item.passage_spans) == item.context
    assert set(item.gold_spans) <= set(item.passage_spans)


def recount_depth(item: Item, tok: Tokenizer) -> float:
    """The depth from scratch: tokens before the gold block over all tokens outside it."""
    start, end = item.gold_spans[0][0], item.gold_spans[-1][1]
    before = len(tok.encode(item.context[:start]))
    inside = len(tok.encode(item.context[:end])) - before
    return before / (item.context_tokens - inside)


# -- QA contexts with the word tokenizer ------------------------------------------------------------------------


def test_squad_lengths_depths_and_gold(tmp_path: Path) -> None:
    path = write_squad(tmp_path / "squad.json")
    paragraphs = {q["id"]: (art["title"], par["context"]) for art in json.loads(path.read_text())["data"]
                  for par in art["paragraphs"] for q in par["qas"]}
    tok = WordTokenizer()
    spec = TaskSpec("squad", str(path), limit=4, lengths=(512, 1024), depths=(0.0, 0.25, 0.5, 0.75, 1.0))
    items = build_items(spec, tok)
    assert len(items) == 4 * 2 * 5
    assert items[1].id == "squad/a0p0q0/512/d25/s0"
    for item in items:
        check_item(item, tok)
        town, gold = paragraphs[item.example_id]
        (g0, g1), = item.gold_spans
        assert item.context[g0:g1] == gold
        assert item.meta["measured_depth"] == pytest.approx(recount_depth(item, tok))
        assert abs(item.meta["measured_depth"] - item.depth) <= 0.1
        if item.depth == 0.0:
            assert g0 == 0
        if item.depth == 1.0:
            assert g1 == len(item.context)
        distractors = [item.context[a:b] for a, b in item.passage_spans if (a, b) != (g0, g1)]
        assert distractors and all(town not in d for d in distractors)  # never the same article
        assert all(not re.search(rf"\b{item.answers[0]}\b", d) for d in distractors)  # never the answer


def test_the_answer_filter_drops_a_passage_that_names_the_answer(tmp_path: Path) -> None:
    path = write_squad(tmp_path / "squad.json")
    items = build_items(TaskSpec("squad", str(path), limit=1, lengths=(2000,)), WordTokenizer())
    assert items[0].example_id == "a0p0q0"  # its answer KeeperA0 is also named in article 3
    assert "A letter from KeeperA0" not in items[0].context
    assert "TownD" in items[0].context  # article 3's other paragraphs are used


def test_same_spec_same_items_and_depths_only_move_the_gold(tmp_path: Path) -> None:
    path = write_squad(tmp_path / "squad.json")
    spec = TaskSpec("squad", str(path), limit=3, lengths=(700,), depths=(0.0, 0.5, 1.0), seed=4)
    first, again = build_items(spec, WordTokenizer()), build_items(spec, WordTokenizer())
    assert first == again
    other = build_items(TaskSpec("squad", str(path), limit=3, lengths=(700,), depths=(0.0, 0.5, 1.0), seed=5),
                        WordTokenizer())
    assert [i.context for i in other] != [i.context for i in first]
    for k in range(0, len(first), 3):
        passages = [sorted(i.context[a:b] for a, b in i.passage_spans) for i in first[k:k + 3]]
        assert passages[0] == passages[1] == passages[2]


def test_rotated_depths_give_each_example_one_depth_in_turn(tmp_path: Path) -> None:
    path = write_squad(tmp_path / "squad.json")
    depths = (0.0, 0.5, 1.0)
    every = build_items(TaskSpec("squad", str(path), limit=5, lengths=(512, 700), depths=depths), WordTokenizer())
    rotated = build_items(TaskSpec("squad", str(path), limit=5, lengths=(512, 700), depths=depths,
                                   options={"rotate_depths": True}), WordTokenizer())
    assert len(rotated) == 5 * 2 and len(every) == 5 * 2 * 3
    assert [(i.example_id, i.target_tokens, i.depth) for i in rotated] == [
        (ex, length, depths[n % 3]) for n, ex in enumerate(dict.fromkeys(i.example_id for i in every))
        for length in (512, 700)]
    full = {i.id: i for i in every}
    assert all(full[i.id] == i for i in rotated)  # the same items a full sweep builds, a subset of them


def test_size_sweep(tmp_path: Path) -> None:
    path = write_squad(tmp_path / "squad.json")
    tok = WordTokenizer()
    spec = TaskSpec("squad", str(path), limit=2, lengths=(1024,), depths=(0.25,),
                    distractor_fractions=(0.0, 0.5, 1.0, 0.01))
    items = build_items(spec, tok)
    assert [i.id.split("/", 2)[2] for i in items[:4]] == ["1024/f0/s0", "1024/f50/s0", "1024/f100/s0", "1024/f1/s0"]
    for item in items:
        check_item(item, tok)
        assert item.depth == 0.25 and item.target_tokens == 1024
        assert abs(item.meta["measured_fraction"] - item.distractor_fraction) <= 0.03
        assert item.context_tokens <= 1024
    empty, half, full, _ = items[:4]
    assert empty.passage_spans == empty.gold_spans  # no distractors at all
    assert abs(half.meta["measured_depth"] - 0.25) <= 0.1
    assert full.context_tokens >= 0.98 * 1024


def hotpot_file(path: Path, items: int = 6) -> Path:
    rng = random.Random(11)
    rows = []
    for i in range(items):
        context = [[f"Gold {i}{k}", [sentences(rng, f"G{i}{k}", 2)]] for k in range(2)]
        context += [[f"Own {i}{k}", [sentences(rng, f"O{i}{k}", 2)]] for k in range(4)]
        rng.shuffle(context)
        rows.append({"_id": f"h{i}", "question": f"Question {i}?", "answer": f"Answer{i}",
                     "supporting_facts": [[f"Gold {i}0", 0], [f"Gold {i}1", 1]], "context": context})
    path.write_text(json.dumps(rows), encoding="utf-8")
    return path


def test_hotpotqa_own_distractors_first_golds_together_titles(tmp_path: Path) -> None:
    tok = WordTokenizer()
    spec = TaskSpec("hotpotqa", str(hotpot_file(tmp_path / "h.json")), limit=2, lengths=(600,), depths=(0.5,))
    items = build_items(spec, tok)
    for item in items:
        check_item(item, tok)
        i = item.example_id[1:]
        (a0, a1), (b0, b1) = item.gold_spans
        assert b0 == a1 + len(SEP)  # the two gold passages stay together
        assert item.context[a0:a1].startswith(f"Title: Gold {i}")
        assert all(f"Title: Own {i}{k}\n" in item.context for k in range(4))  # every own distractor used
        assert item.meta["distractor_sources"]["own"] == 4 and item.meta["distractor_sources"]["dataset"] >= 1
    untitled = build_items(TaskSpec("hotpotqa", spec.path, limit=1, lengths=(600,), options={"titles": False}), tok)
    assert "Title:" not in untitled[0].context


def multihop_file(path: Path) -> Path:
    rows = [{"query": f"Query {i}?", "question_type": "inference_query", "answer": f"Answer{i}",
             "evidence_list": [{"title": f"Article {i}", "source": "S", "fact": f"Fact number {i} about Answer{i}."}]}
            for i in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_pool_fills_what_the_dataset_lacks(tmp_path: Path) -> None:
    tok = WordTokenizer()
    path = str(multihop_file(tmp_path / "mh.jsonl"))
    with pytest.raises(UserError, match="pool"):
        build_items(TaskSpec("multihop", path, limit=1, lengths=(800,)), tok)
    pool = str(write_texts(tmp_path / "pool.jsonl", n=4, per_text=40, titled=True))
    items = build_items(TaskSpec("multihop", path, pool=pool, limit=2, lengths=(800,)), tok)
    for item in items:
        check_item(item, tok)
        assert item.meta["distractor_sources"]["dataset"] == 3
        assert item.meta["distractor_sources"]["pool"] >= 3  # long pool texts come in paragraph-sized chunks
        assert "Title: Pool article" in item.context


def test_gold_longer_than_the_target_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="gold passages alone"):
        build_items(TaskSpec("squad", str(write_squad(tmp_path / "s.json")), limit=1, lengths=(20,)),
                    WordTokenizer())


def test_babilong_keeps_its_context(tmp_path: Path) -> None:
    path = tmp_path / "babilong_8k.json"
    path.write_text(json.dumps({"context": "Mary went to the garden. John slept.", "query": "Where is Mary?",
                                "target": "garden"}), encoding="utf-8")
    (item,) = build_items(TaskSpec("babilong", str(path), lengths=(8192,), depths=(0.0, 1.0)), WordTokenizer())
    assert (item.id, item.context, item.answers) == ("babilong/babilong_8k", "Mary went to the garden. John slept.",
                                                     ("garden",))
    assert (item.context_tokens, item.target_tokens, item.depth) == (15, None, None)


@pytest.mark.parametrize(("spec", "match"), [
    (TaskSpec("squadd", "x.json"), "did you mean 'squad'"),
    (TaskSpec("squad", None), "path"),
    (TaskSpec("squad", "x.json", depths=(1.5,)), "depths"),
    (TaskSpec("niah", "x.jsonl", distractor_fractions=(0.5,)), "depths instead"),
])
def test_bad_specs(spec: TaskSpec, match: str) -> None:
    with pytest.raises(UserError, match=match):
        build_items(spec, WordTokenizer())


# -- synthetic tasks ---------------------------------------------------------------------------------------------


def test_needle_at_depth(tmp_path: Path) -> None:
    tok = WordTokenizer()
    spec = TaskSpec("niah", str(write_texts(tmp_path / "hay.jsonl", n=5, per_text=60)), limit=3,
                    lengths=(1000, 2500), depths=(0.0, 0.3, 0.7, 1.0))
    items = build_items(spec, tok)
    assert len(items) == 3 * 2 * 4 and len({i.question for i in items}) == 3  # three needles, three templates
    for item in items:
        check_item(item, tok, sep=" ")
        (n0, n1), = item.gold_spans
        needle = item.context[n0:n1]
        value = item.answers[0]
        assert needle == item.meta["needle"] and value in needle and item.context.count(value) == 1
        assert n0 == 0 or (item.context[n0 - 1].isspace() and item.context[:n0].rstrip()[-1] in ".!?")  # a sentence
        assert item.meta["measured_depth"] == pytest.approx(recount_depth(item, tok))
        assert abs(item.meta["measured_depth"] - item.depth) <= 0.05
    assert items[0].id == "niah/needle-000/1000/d0/s0"
    rotated = build_items(TaskSpec("niah", spec.path, limit=3, lengths=(1000,), depths=(0.0, 0.3, 0.7, 1.0),
                                   options={"rotate_depths": True}), tok)
    assert [(i.example_id, i.depth) for i in rotated] == [("needle-000", 0.0), ("needle-001", 0.3),
                                                          ("needle-002", 0.7)]


def test_cwe_answers_are_the_most_common_words() -> None:
    tok = WordTokenizer()
    items = build_items(TaskSpec("cwe", limit=2, lengths=(900, 4000), depths=(0.5,)), tok)
    assert [i.id for i in items] == ["cwe/list-000/900/s0", "cwe/list-000/4000/s0",
                                     "cwe/list-001/900/s0", "cwe/list-001/4000/s0"]
    for item in items:
        check_item(item, tok)
        lines = item.context.split("\n")
        assert [int(line.split(". ")[0]) for line in lines] == list(range(1, len(lines) + 1))
        counts = Counter(line.split(". ")[1] for line in lines)
        assert item.scoring == "set" and len(item.answers) == 10
        assert min(counts[w] for w in item.answers) > max(c for w, c in counts.items() if w not in item.answers)
        assert {w for w, _ in counts.most_common(10)} == set(item.answers)
        assert all(c == item.meta["rare_count"] for w, c in counts.items() if w not in item.answers)
    assert items[0].answers == items[1].answers  # one list of frequent words per example, at every length
    assert items[0].meta["freq_count"] < 30 <= items[1].meta["freq_count"]  # shorter lists repeat less


def test_import_stays_light() -> None:
    probe = ("import sys, marginalia, marginalia.bench.tasks, marginalia.bench.synthetic, "
             "marginalia.bench.datasets, marginalia.bench.metrics; print('wonderwords' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


# -- the real development files with SmolLM2's tokenizer ----------------------------------------------------------


@pytest.fixture(scope="module")
def smol_tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    """SmolLM2's own tokenizer: from the llama.cpp backend (fast to load), else the transformers one."""
    try:
        return request.getfixturevalue("smollm2_llamacpp").tokenizer  # type: ignore[no-any-return]
    except pytest.skip.Exception:
        return request.getfixturevalue("smollm2").tokenizer  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.parametrize(("dataset", "name"), [("squad", "squad-v1.1-dev.part1.json"),
                                               ("hotpotqa", "hotpotqa-dev-distractor.part1.json")])
def test_real_data_with_smollm2_tokenizer(dataset: str, name: str, smol_tokenizer: Tokenizer) -> None:
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"the development data ({path}) is not here")
    spec = TaskSpec(dataset, str(path), limit=3, lengths=(4096, 8192), depths=(0.0, 0.5, 1.0))
    items = build_items(spec, smol_tokenizer)
    assert len(items) == 3 * 2 * 3
    for item in items:
        check_item(item, smol_tokenizer)
        assert len(item.gold_spans) == (1 if dataset == "squad" else 2)
        assert abs(item.meta["measured_depth"] - item.depth) <= 0.05
