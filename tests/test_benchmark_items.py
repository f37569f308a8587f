"""The composition utility benchmark's test items: distinct cuts, only from the articles the tuning left out."""

from __future__ import annotations

import os
from pathlib import Path

from benchmark_scripts import load


def article(i: int, paragraphs: int) -> dict[str, str]:
    body = "\n\n".join(" ".join(f"w{i}p{j}x{k}" for k in range(80)) for j in range(paragraphs))
    return {"title": f"Article {i}", "text": body}


def test_wikitext_items_are_distinct_cuts_of_the_chosen_articles_only() -> None:
    cu = load("compose_utility")
    articles = [article(i, 3) for i in range(4)] + [article(i, 9) for i in range(4, 10)]
    files = [Path(f"wiki-{i}.md") for i in range(len(articles))]
    items = cu.wikitext_items(articles, files, range(2, 5), 9, seed=0)
    keys = [item.key for item in items]
    # 3 articles give 3 cuts each: every paragraph of the short ones, none twice
    assert len(keys) == 9 == len(set(keys))
    assert {k.split(":")[0] for k in keys} == {"wiki2", "wiki3", "wiki4"}
    assert all(item.prefix.startswith(f"# Article {item.key[4]}") for item in items)
    # asking for more than the chosen articles hold gives what they hold, never another article's text
    assert len(cu.wikitext_items(articles, files, range(2, 4), 20, seed=0)) == 6


def test_a_benchmark_says_the_machine_was_shared_only_when_it_was_busy_before() -> None:
    common = load("_common")
    cores = os.cpu_count() or 1
    quiet = common.load_note(0.1, cores * 2.0)  # the run's own load afterwards is no sign of other work
    assert quiet == f"load average 0.1 before, {cores * 2.0:.1f} after"
    busy = common.load_note(cores * 1.0, 0.5, "rounds are few")
    assert busy.endswith("(the machine was shared with other work: rounds are few)")
