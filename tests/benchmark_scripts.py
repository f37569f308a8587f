"""Load a script of benchmarks/ as a module, for tests of the parts of it that replay or pick data."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str) -> Any:
    """``benchmarks/<name>.py`` as a module (its folder on the path while it imports its neighbours), loaded once:
    the scripts register how BENCHMARKS.md shows them in the one `_common.BENCHMARKS`."""
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(BENCHMARKS / f"{name}.py"):
        return loaded
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(name, module)  # its dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))
