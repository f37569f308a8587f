"""The lab runs on marginalia's public API only: every import of marginalia in lab/ names a public module (the
package or one of its subpackages) and, from it, a name in its ``__all__``."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parent.parent
PUBLIC = ("marginalia", "marginalia.bench", "marginalia.compose", "marginalia.index", "marginalia.ingest",
          "marginalia.models", "marginalia.patterns")


def private_imports(source: str) -> list[str]:
    """The imports of marginalia in ``source`` that reach past the public API, as written."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names
                      if alias.name.split(".")[0] == "marginalia" and alias.name not in PUBLIC]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "marginalia":
            if node.module not in PUBLIC:
                found.append(node.module)
                continue
            public = set(importlib.import_module(node.module).__all__)
            found += [f"{node.module}.{alias.name}" for alias in node.names if alias.name not in public]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                and str(node.args[0].value).split(".")[0] == "marginalia" and node.args[0].value not in PUBLIC:
            found.append(str(node.args[0].value))
    return found


def test_the_check_finds_private_imports() -> None:
    source = """
import marginalia
import marginalia.patterns.wim
from marginalia import WimOptions, app
from marginalia.bench import wilson
from marginalia.bench.report import bootstrap
from marginalia.models import load_generator, registry
importlib.import_module("marginalia.home")
"""
    assert private_imports(source) == ["marginalia.patterns.wim", "marginalia.app", "marginalia.bench.report",
                                       "marginalia.models.registry", "marginalia.home"]


@pytest.mark.parametrize("path", sorted(LAB.rglob("*.py")), ids=lambda p: str(p.relative_to(LAB)))
def test_lab_code_imports_only_the_public_api(path: Path) -> None:
    found = private_imports(path.read_text("utf-8"))
    assert not found, f"{path.relative_to(LAB)} reaches past the public API: {', '.join(found)}"
