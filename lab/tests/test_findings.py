"""lab/findings: each experiment's write-up, the sections its script rewrites, and the index in lab/README.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

LAB = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.stem for p in LAB.glob("*.py") if not p.name.startswith("_"))
FINDINGS = sorted(p.stem for p in (LAB / "findings").glob("*.md"))


def test_a_rerun_replaces_its_own_section_and_keeps_the_rest(load_script: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    common = load_script("_lab_common")
    monkeypatch.setattr(common, "FINDINGS", tmp_path)
    (tmp_path / "x.md").write_text("# X\n\nWhere it came from.\n\n<!-- x:start -->\n## old\n<!-- x:end -->\n\n"
                                   "<!-- x_more:start -->\n## more\n<!-- x_more:end -->\n", "utf-8")
    assert common.write_finding("x", "## new\n\nrows\n") == tmp_path / "x.md"
    common.write_finding("x", "## other", section="x_other")
    assert (tmp_path / "x.md").read_text("utf-8") == (
        "# X\n\nWhere it came from.\n\n<!-- x:start -->\n## new\n\nrows\n<!-- x:end -->\n\n"
        "<!-- x_more:start -->\n## more\n<!-- x_more:end -->\n\n<!-- x_other:start -->\n## other\n<!-- x_other:end -->\n")
    common.write_finding("y", "## y")
    assert (tmp_path / "y.md").read_text("utf-8") == "<!-- y:start -->\n## y\n<!-- y:end -->\n"


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_has_its_write_up(name: str) -> None:
    text = (LAB / "findings" / f"{name}.md").read_text("utf-8")
    assert f"<!-- {name}:start -->" in text and f"<!-- {name}:end -->" in text
    assert f"`lab/{name}.py`" in text


def test_the_index_names_every_write_up() -> None:
    index = (LAB / "README.md").read_text("utf-8")
    assert FINDINGS and [name for name in FINDINGS if f"(findings/{name}.md)" not in index] == []
    assert [name for name in SCRIPTS if f"`{name}.py`" not in index] == []
