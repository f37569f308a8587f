"""Moving finished files and folders into place (`marginalia.files`), and no rename anywhere else in the package."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from marginalia.files import atomic_rename, swap_folder

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "marginalia"


def renames(path: Path) -> list[int]:
    """The lines of ``path`` that call ``os.replace`` or ``os.rename``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("replace", "rename")
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "os"]


def test_only_files_py_renames() -> None:
    """A rename that leaves a half-written target or skips the folder's fsync is easy to write again; the
    package moves things into place through `marginalia.files` only."""
    found = {str(p.relative_to(PACKAGE)): lines for p in sorted(PACKAGE.rglob("*.py")) if (lines := renames(p))}
    assert found.pop("files.py")  # the scan sees the renames that are allowed
    assert found == {}, f"os.replace/os.rename outside marginalia/files.py: {found}"


def test_a_file_replaces_a_file(tmp_path: Path) -> None:
    (tmp_path / "new").write_text("new")
    (tmp_path / "target").write_text("old")
    atomic_rename(tmp_path / "new", tmp_path / "target")
    assert [p.name for p in tmp_path.iterdir()] == ["target"] and (tmp_path / "target").read_text() == "new"


def test_a_folder_takes_a_free_place_but_not_one_with_files(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "a").write_text("a")
    atomic_rename(tmp_path / "work", tmp_path / "done")
    assert (tmp_path / "done" / "a").read_text() == "a" and not (tmp_path / "work").exists()
    (tmp_path / "other").mkdir()
    with pytest.raises(OSError):
        atomic_rename(tmp_path / "other", tmp_path / "done")
    assert (tmp_path / "done" / "a").read_text() == "a"


def test_a_folder_swap_replaces_the_old_folder_and_deletes_it(tmp_path: Path) -> None:
    new, folder = tmp_path / ".new", tmp_path / "model"
    for path, text in ((new, "new"), (folder, "old")):
        path.mkdir()
        (path / "weights").write_text(text)
    (folder / "stale").write_text("only in the old folder")
    swap_folder(new, folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing left aside
    assert sorted(p.name for p in folder.iterdir()) == ["weights"] and (folder / "weights").read_text() == "new"
    other = tmp_path / ".other"
    other.mkdir()
    swap_folder(other, tmp_path / "fresh")  # no folder there yet
    assert (tmp_path / "fresh").is_dir() and not other.exists()


def test_a_failed_folder_swap_puts_the_old_folder_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    new, folder = tmp_path / ".new", tmp_path / "model"
    new.mkdir()
    folder.mkdir()
    (folder / "weights").write_text("old")
    real = os.replace

    def failing(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        if Path(source) == new:
            raise OSError(28, "No space left on device")  # the OS fault a swap must survive
        real(source, target)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="No space left"):
        swap_folder(new, folder)
    assert (folder / "weights").read_text() == "old" and new.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".new", "model"]
