"""The architecture is a contract: import-linter's layers (nothing imports upward), no import cycles in the whole
tree (the package, benchmarks/ and lab/), the front ends (cli, server) and the benchmark harness reaching index,
ingest, patterns and models only through `marginalia.app`, and evaluation no larger than the core it measures."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "marginalia"
#: the folders of scripts beside the package; each script imports its neighbours by name (its folder on the path)
SCRIPTS = ("benchmarks", "lab", "lab/tests")

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


def test_front_ends_and_the_harness_go_through_the_application_layer() -> None:
    """cli, server and bench may not import the layers below the application, directly."""
    below = {"marginalia.index", "marginalia.ingest", "marginalia.patterns", "marginalia.models"}
    forbidden = {source: set(c["forbidden_modules"]) for c in contracts() if c["type"] == "forbidden"
                 for source in c["source_modules"] if c.get("allow_indirect_imports") in (True, "true", "True")}
    for source in ("marginalia.cli", "marginalia.server", "marginalia.bench"):
        assert forbidden.get(source, set()) >= below, source


def module_name(path: Path) -> str:
    """A file's module: ``marginalia.bench.report`` in the package, ``benchmarks/report`` beside it."""
    if path.is_relative_to(PACKAGE):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return path.relative_to(ROOT).with_suffix("").as_posix()


def imported(path: Path, modules: set[str]) -> Iterator[str]:
    """The modules of ``modules`` that the file at ``path`` imports anywhere in it (in a function, or for type
    checking, too); ``from package import name`` imports the submodule ``name`` where there is one, else the
    package."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], *filter(None, [base])])
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for name in names:
            local = f"{path.parent.relative_to(ROOT).as_posix()}/{name}"  # a script's neighbour
            found = next((m for m in (name, local) if m in modules), None)
            if found is not None and found != me:
                yield found


def import_graph() -> dict[str, set[str]]:
    """Every module of the tree (the package's, and the scripts' of benchmarks/ and lab/) and what it imports."""
    files = [*PACKAGE.rglob("*.py"), *(p for folder in SCRIPTS for p in (ROOT / folder).glob("*.py"))]
    modules = {module_name(p) for p in files}
    return {module_name(p): set(imported(p, modules)) for p in files}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: each strongly connected component of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                found.append(sorted([node, *component]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_check_finds_a_cycle_and_a_scripts_neighbour() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    graph = import_graph()
    assert "benchmarks/_common" in graph["benchmarks/report"]
    assert "marginalia.bench.analysis" in graph["marginalia.bench.report"]
    assert "marginalia.app" in graph["marginalia.bench.runner"]


def test_the_whole_tree_has_no_import_cycle() -> None:
    """No module imports, through any chain, one that imports it: in the package, among the benchmark scripts
    and the lab's, imports inside functions and for type checking counted."""
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" ↔ ".join(c) for c in found)


def lines_of(*folders: str) -> int:
    return sum(len(p.read_text("utf-8").splitlines()) for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_evaluation_is_no_larger_than_the_core_it_measures() -> None:
    """The lines of bench/, benchmarks/ and lab/ are no more than those of the package's core (app, patterns,
    models, index, ingest, compose): evaluation that repeats itself is made smaller, not the goal moved."""
    evaluation = lines_of("src/marginalia/bench", "benchmarks", "lab")
    core = lines_of(*(f"src/marginalia/{name}" for name in ("app", "patterns", "models", "index", "ingest", "compose")))
    assert evaluation <= core, f"evaluation {evaluation} lines, the core {core}: make evaluation smaller"
