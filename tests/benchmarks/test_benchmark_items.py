"""The composition utility benchmark's test items: distinct cuts, only from the articles the tuning left out."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from benchmark_scripts import load
from marginalia.models.base import GenerationParams


def article(i: int, paragraphs: int) -> dict[str, str]:
    body = "\n\n".join(" ".join(f"w{i}p{j}x{k}" for k in range(80)) for j in range(paragraphs))
    return {"title": f"Article {i}", "text": body}


def test_wikitext_items_are_distinct_cuts_of_the_chosen_articles_only() -> None:
    ci = load("compose_items")
    articles = [article(i, 3) for i in range(4)] + [article(i, 9) for i in range(4, 10)]
    files = [Path(f"wiki-{i}.md") for i in range(len(articles))]
    items = ci.wikitext_items(articles, files, range(2, 5), 9, seed=0)
    keys = [item.key for item in items]
    # 3 articles give 3 cuts each: every paragraph of the short ones, none twice
    assert len(keys) == 9 == len(set(keys))
    assert {k.split(":")[0] for k in keys} == {"wiki2", "wiki3", "wiki4"}
    assert all(item.prefix.startswith(f"# Article {item.key[4]}") for item in items)
    # asking for more than the chosen articles hold gives what they hold, never another article's text
    assert len(ci.wikitext_items(articles, files, range(2, 4), 20, seed=0)) == 6
    # when the short articles run out, the long one fills the count, still no paragraph twice
    more = [item.key for item in ci.wikitext_items(articles, files, range(2, 5), 12, seed=0)]
    assert len(more) == 12 == len(set(more))
    assert sum(k.startswith("wiki4:") for k in more) == 6
    # the first items are one per article in turn
    assert [k.split(":")[0] for k in more[:3]] == ["wiki2", "wiki3", "wiki4"]


def test_a_benchmark_says_the_machine_was_shared_only_when_it_was_busy_before() -> None:
    common = load("_common")
    cores = os.cpu_count() or 1
    quiet = common.load_note(0.1, cores * 2.0)  # the run's own load afterwards is no sign of other work
    assert quiet == f"load average 0.1 before, {cores * 2.0:.1f} after"
    busy = common.load_note(cores * 1.0, 0.5, "rounds are few")
    assert busy.endswith("(the machine was shared with other work: rounds are few)")


def test_utility_rows_resume_from_the_completions_kept(tmp_path: Path) -> None:
    """A utility run that stops keeps each completion made: the next run asks the client only for the rest."""
    cu = load("compose_utility")

    class Client:
        params = GenerationParams()

        def __init__(self) -> None:
            self.asked: list[str] = []

        def complete(self, prefix: str, max_new_tokens: int, memory: object) -> object:
            self.asked.append(prefix)
            return type("Suggestion", (), {"text": lambda _self: f"after {prefix}"})()

        def score(self, prefix: str, label: str, memory: object) -> list[float]:
            return [-1.0] * len(label.split())

    items = [cu.Item("wikitext", f"k{i}", "", f"text {i}") for i in range(3)]
    records = [{"key": f"r{i}", "label": "two words"} for i in range(3)]
    path = tmp_path / "client-cache.jsonl"
    first = Client()
    got = cu.run_row(first, items[:2], records[:2], None, 8, "client@1", {}, path)
    assert got == (["after text 0", "after text 1"], [[-1.0, -1.0]] * 2) and first.asked == ["text 0", "text 1"]
    again = Client()
    got = cu.run_row(again, items, records, None, 8, "client@1", cu.load_cache(path), path)
    assert got[0] == ["after text 0", "after text 1", "after text 2"] and again.asked == ["text 2"]
    other = Client()  # the same path tuned again is another client: nothing is taken from the first's
    cu.run_row(other, items[:1], records[:1], None, 8, "client@2", cu.load_cache(path), path)
    assert other.asked == ["text 0"]


def test_cached_takeaways_that_say_nothing_are_dropped_and_their_completions_made_again(tmp_path: Path) -> None:
    cu = load("compose_utility")

    class Client:
        params = GenerationParams()

        def __init__(self) -> None:
            self.memory: list[list[str]] = []

        def complete(self, prefix: str, max_new_tokens: int, memory: Any) -> object:
            self.memory.append([m.text for m in memory])
            return type("Suggestion", (), {"text": lambda _self: "on"})()

        def score(self, prefix: str, label: str, memory: object) -> list[float]:
            return [-1.0]

    def item(text: str) -> dict[str, Any]:
        return {"text": text, "source": "b.md", "doc_id": "b", "section_path": [], "start": 0, "end": 9,
                "kind": "takeaway"}

    items = [cu.Item("wikitext", f"k{i}", "", f"text {i}") for i in range(2)]
    records = [{"key": "r0", "label": "x", "takeaways": [item("The ferry sails at dawn.")]},
               {"key": "r1", "label": "x", "takeaways": [item("The passage does not mention anything that helps."),
                                                          item("The harbour opens at six.")]}]
    path = tmp_path / "client-cache.jsonl"
    # the cache of an earlier version: both completions made with the memory as cached
    old = {}
    for record in records:
        key = hashlib.sha256(json.dumps(["c@1", "takeaways", record["key"], 8]).encode()).hexdigest()[:20]
        old[key] = {"key": key, "prediction": "old", "logprobs": [-2.0]}
    client = Client()
    got = cu.run_row(client, items, records, "takeaways", 8, "c@1", old, path)
    assert got[0] == ["old", "on"]  # the first item's memory is as it was: its completion is kept
    assert client.memory == [["The harbour opens at six."]]


def test_the_tuned_over_vanilla_ratio_interval_is_paired() -> None:
    """The ratio's interval resamples the same items for both rows: when every item is alike the ratio
    barely moves between resamples (unpaired draws would still spread it)."""
    import pytest

    pytest.importorskip("nltk")
    cu = load("compose_utility")
    from marginalia.bench import generation_metrics as gm

    labels = [f"alpha{i} beta{i} gamma{i} delta{i} eps{i} zeta{i}" for i in range(30)]
    better = [" ".join(label.split()[:4]) + " x y" for label in labels]
    worse = [" ".join(label.split()[:2]) + " x y z w" for label in labels]
    low, high = cu.gleu_ratio_interval(better, worse, labels)
    ratio = gm.gleu(better, labels) / gm.gleu(worse, labels)
    assert ratio > 1.5
    assert low <= ratio <= high and high - low < 0.05  # every item alike: the paired ratio barely moves
    low2, high2 = cu.gleu_ratio_interval(worse, better, labels)
    assert high2 < 1.0 and low2 > 0


def test_memory_draw_counts_only_the_labels_new_words_that_the_memory_holds() -> None:
    cu = load("compose_utility")
    prefix = "The bridge over the river was built"
    label = " in 1862 of oak by the river's engineers, who later built a mill"
    new, drawn = cu.memory_draw(label, prefix, ["Engineers used oak for the bridge in 1862.", "A mill stood there."])
    assert "1862" in new and "river" not in new and "built" not in new  # the prefix's words are not new
    assert {"1862", "oak", "engineer", "mill"} <= drawn and "later" not in drawn
    assert drawn <= new
    assert cu.memory_draw(label, prefix, []) == (new, set())


def test_an_email_quoting_or_copying_another_is_kept_out_of_its_memory() -> None:
    """With the other e-mails as the collection, an item's memory must not come from its own e-mail or from one
    that shares a 10-word run with it (a reply quoting it): that would be the text being written."""
    ci = load("compose_items")
    own = " ".join(f"w{k}" for k in range(30))
    reply = "thanks , see below . " + " ".join(f"w{k}" for k in range(5, 16)) + " regards"
    nine = " ".join(f"w{k}" for k in range(20, 29)) + " other words here"  # nine shared words: no quote
    near = ci.shared_runs({"1": own, "2": reply, "3": nine, "4": "unrelated text entirely"})
    assert near == {"1": {"2"}, "2": {"1"}, "3": set(), "4": set()}


def test_enron_items_name_their_own_email_when_the_mail_is_the_collection(tmp_path: Path) -> None:
    ci = load("compose_items")
    rows = [{"id": i, "text": " ".join(f"e{i}x{k}" for k in range(90))} for i in (3, 7)]
    files = {"3": tmp_path / "enron-3.txt", "7": tmp_path / "enron-7.txt"}
    items = ci.enron_items(rows, 5, seed=0, files=files)
    assert [(it.key, it.source) for it in items] == [("enron3", str(files["3"])), ("enron7", str(files["7"]))]
    assert [it.source for it in ci.enron_items(rows, 5, seed=0)] == ["", ""]  # the WikiText collection: none
    # the same cuts either way, so both corpora's rows answer the same prefixes
    assert [it.prefix for it in items] == [it.prefix for it in ci.enron_items(rows, 5, seed=0)]


def test_a_completion_loops_when_few_of_its_words_are_distinct() -> None:
    cu = load("compose_utility")
    assert cu.looping("of heavy, " + "heavy, " * 12)
    assert cu.looping("The storm was so strong. " * 3)
    assert not cu.looping("The storm destroyed 55 houses and damaged many others on Grand Bahama.")
    assert not cu.looping("no no no no")  # too short to tell


def test_a_guarded_row_reuses_the_greedy_rows_label_scores(tmp_path: Path) -> None:
    cu = load("compose_utility")

    class Client:
        def __init__(self, guard: int) -> None:
            self.params = GenerationParams(no_repeat_ngram=guard)
            self.scored = 0

        def complete(self, prefix: str, max_new_tokens: int, memory: object) -> object:
            return type("Suggestion", (), {"text": lambda _self: f"guard {self.params.no_repeat_ngram}"})()

        def score(self, prefix: str, label: str, memory: object) -> list[float]:
            self.scored += 1
            return [-1.5]

    items = [cu.Item("wikitext", "w1:0", "", "The ferry")]
    records = [{"key": "k1", "label": " sails at"}]
    done: dict = {}
    path = tmp_path / "client-cache.jsonl"
    plain, guarded = Client(0), Client(3)
    assert cu.run_row(plain, items, records, None, 4, "smollm2", done, path) == (["guard 0"], [[-1.5]])
    assert cu.run_row(guarded, items, records, None, 4, "smollm2", done, path) == (["guard 3"], [[-1.5]])
    assert plain.scored == 1 and guarded.scored == 0 and len(done) == 2  # its own completion, the scores reused


def test_the_perplexity_ratio_interval_is_paired() -> None:
    # the same items resampled for both rows: a row that is a constant factor better on every item has a
    # zero-width interval at that factor
    cu = load("compose_utility")
    first = [[-1.0, -2.0], [-0.5], [-3.0, -1.0, -2.0]]
    second = [[lp - 0.1 for lp in item] for item in first]
    low, high = cu.perplexity_ratio_interval(first, second)
    assert abs(low - high) < 1e-9 and abs(low - math.exp(-0.1)) < 1e-9


def test_a_datasets_numbers_hold_each_rows_scores_and_its_ratios_to_the_vanilla_client() -> None:
    import pytest

    pytest.importorskip("nltk")
    cu = load("compose_utility")
    labels = [f"alpha{i} beta{i} gamma{i} delta{i} eps{i} zeta{i}" for i in range(12)]
    better = [" ".join(label.split()[:4]) + " x y" for label in labels]
    worse = [" ".join(label.split()[:2]) + " x y z w" for label in labels]
    rows = cu.Rows({}, {}, {}, {}, {}, 0.0)
    rows.results = {"wikitext/vanilla": {"gleu": 10.0, "ppl": 5.0, "with_memory": None},
                    "wikitext/takeaways": {"gleu": 20.0, "ppl": 4.0, "with_memory": 12}}
    rows.predictions["wikitext"] = {"vanilla": worse, "takeaways": better}
    rows.logprobs["wikitext"] = {"vanilla": [[-2.0]] * 12, "takeaways": [[-1.0]] * 12}
    rows.labels["wikitext"] = labels
    rows.draws["wikitext"] = [({"a", "b", "c", "d"}, {"a"})] + [({"e"}, set())] * 11
    rows.copies["wikitext"] = {"takeaways": (0.41, None)}
    numbers = cu.dataset_numbers(rows, "wikitext")
    assert numbers["title"] == "WikiText (in domain)" and set(numbers["rows"]) == {"vanilla", "takeaways"}
    ratio, low, high = numbers["gleu_vs_vanilla"]["takeaways"]
    assert ratio == 2.0 and low <= high and low > 1.0  # better on every item: its interval stays above 1
    ppl, ppl_low, ppl_high = numbers["ppl_vs_vanilla"]["takeaways"]
    assert ppl == 0.8 and abs(ppl_low - math.exp(-1.0)) < 1e-9 and abs(ppl_high - ppl_low) < 1e-9
    assert numbers["draw"]["new_units"] == 15 and numbers["draw"]["from_memory"] == 1
    assert numbers["draw"]["share"] == 1 / 15 and numbers["draw"]["labels_drawing"] == 1
    assert set(numbers["draw"]["gleu_on_them"]) == {"vanilla", "takeaways"}
    assert numbers["copies"] == {"takeaways": [0.41, None]}
    assert numbers["loops"] == {"vanilla": 0, "takeaways": 0, "labels": 0}


def test_a_tuned_clients_section_says_what_it_learned_from(tmp_path: Path) -> None:
    cu = load("compose_utility")
    folder = tmp_path / "client"
    folder.mkdir()
    assert cu.tuning_summary(f"tuned:{folder}") is None  # no record yet
    (folder / "tuning.json").write_text(json.dumps({"train_examples": 332, "steps": 200}), "utf-8")
    assert cu.tuning_summary(f"tuned:{folder}") == "332 training examples, 200 steps"
    (folder / "tuning.json").write_text("{not json", "utf-8")
    assert cu.tuning_summary(f"tuned:{folder}") is None
    assert cu.tuning_summary("smollm2") is None and cu.tuning_summary(None) is None


def test_memory_share_counts_new_units_their_memory_holds():
    cu = load("compose_utility")
    assert cu.memory_share([({"a", "b", "c", "d"}, {"a"}), ({"e"}, set())]) == 0.2
    assert cu.memory_share([]) is None


def test_a_label_guard_relabels_on_the_same_memory_under_its_own_key() -> None:
    cu = load("compose_utility")
    item = cu.Item("wikitext", "w1:p2", "", "The ferry")
    plain = cu.item_key(item, "eval", 44, 2)
    assert cu.item_key(item, "eval", 44, 2, "wikitext", 0) == plain  # keys made before the guard still hold
    assert len({plain, cu.item_key(item, "eval", 44, 2, "wikitext", 4), cu.item_key(item, "eval", 44, 2, "mail")}) == 3
    takeaway = {"text": "The ferry sails at dawn.", "source": "a.md", "doc_id": "d1", "section_path": [],
                "start": 0, "end": 24, "kind": "takeaway"}
    record = {"key": plain, "chunks": [], "takeaways": [takeaway], "margins": [], "label": " sails at sails at",
              "seconds": {"takeaways": 3.0, "margins": 2.0, "label": 1.0}}
    seen = []

    class Labeller:
        def complete(self, prefix: str, max_new_tokens: int, memory: object) -> object:
            seen.append((prefix, max_new_tokens, [m.text for m in memory]))  # type: ignore[attr-defined]
            return type("Label", (), {"text": lambda _self: " sails at dawn"})()

    again = cu.relabel(item, record, Labeller(), 44)
    assert seen == [("The ferry", 44, ["The ferry sails at dawn."])]
    assert again["label"] == " sails at dawn" and again["takeaways"] == record["takeaways"]
    assert again["seconds"]["takeaways"] == 3.0 and record["label"] == " sails at sails at"  # the old one untouched
