"""The composition utility benchmark's test items: distinct cuts, only from the articles the tuning left out."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def utility_script() -> Any:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("compose_utility", BENCHMARKS / "compose_utility.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault("compose_utility", module)  # its dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def article(i: int, paragraphs: int) -> dict[str, str]:
    body = "\n\n".join(" ".join(f"w{i}p{j}x{k}" for k in range(80)) for j in range(paragraphs))
    return {"title": f"Article {i}", "text": body}


def test_wikitext_items_are_distinct_cuts_of_the_chosen_articles_only() -> None:
    cu = utility_script()
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
