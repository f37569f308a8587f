"""The architecture is a contract: import-linter's layers (nothing imports upward), no import cycles, and the
front ends (cli, server) reaching index, ingest, patterns and models only through `marginalia.app`."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# in a child process: import-linter configures logging for the whole process it runs in
CHECK = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"


def contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["importlinter"]["contracts"]


def test_import_linter_contracts_are_kept() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "BROKEN" not in done.stdout
    kept = re.search(r"Contracts: (\d+) kept, 0 broken", done.stdout)
    assert kept is not None and int(kept.group(1)) == len(contracts()), done.stdout


def test_front_ends_go_through_the_application_layer() -> None:
    """cli and server may not import the layers below the application, directly."""
    below = {"marginalia.index", "marginalia.ingest", "marginalia.patterns", "marginalia.models"}
    forbidden = {source: set(c["forbidden_modules"]) for c in contracts() if c["type"] == "forbidden"
                 for source in c["source_modules"] if c.get("allow_indirect_imports") in (True, "true", "True")}
    assert forbidden.get("marginalia.cli", set()) >= below
    assert forbidden.get("marginalia.server", set()) >= below
