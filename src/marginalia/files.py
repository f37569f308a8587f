"""Durable file writes and progress bars: the one place marginalia writes files safely and shows progress.

An atomic write goes to a temporary file in the target's folder, is flushed and fsynced, then renamed
over the target, so a crash leaves the old file or the new one, never half of one. Appended records
are fsynced line by line, so what was written before a kill is on disk. What is too big or too
particular to be written here (a model's folder, a checkpoint) is written beside its target by its own
code and then moved into place here, with `atomic_rename` or, over a folder that exists, `swap_folder`.
What a killed process left behind (a lock's pid, a staged upload) is told apart with `process_alive`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any, TextIO


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (temporary file, fsync, rename, fsync of the folder)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        atomic_rename(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with UTF-8 ``text`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], data: Any, indent: int | None = 2) -> None:
    """Replace ``path`` with ``data`` as JSON (UTF-8, non-ASCII kept) atomically."""
    atomic_write_text(path, json.dumps(data, ensure_ascii=False, indent=indent) + "\n")


def atomic_write_lines(path: str | os.PathLike[str], records: Iterable[Any]) -> None:
    """Replace ``path`` with one JSON object per line (JSONL) atomically."""
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def atomic_rename(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Rename ``source`` to ``target`` in one step and make the rename durable (fsync of the folder).

    Both must be on one file system (write ``source`` beside ``target``). A file replaces a file at
    ``target``; a folder takes the place of a missing or empty folder (over a non-empty one the rename
    fails with `OSError`: use `swap_folder`).
    """
    os.replace(source, target)
    _fsync_dir(Path(target).parent)


def swap_folder(new: str | os.PathLike[str], folder: str | os.PathLike[str]) -> None:
    """Put the finished folder ``new`` in the place of ``folder``, which may exist and hold files: the old
    folder is renamed aside first, renamed back if ``new`` cannot take its place, and deleted after."""
    new, folder = Path(new), Path(folder)
    old = None
    if folder.exists():
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        os.replace(folder, old)
    try:
        atomic_rename(new, folder)
    except BaseException:
        if old is not None and not folder.exists():
            os.replace(old, folder)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def append_line(f: IO[str], record: Any) -> None:
    """Append one JSON record as a line to an open file and fsync it."""
    f.write(json.dumps(record, ensure_ascii=False) + "\n")
    f.flush()
    os.fsync(f.fileno())


def mend_tail(path: str | os.PathLike[str]) -> int:
    """Cut a partial last line (its writer was killed mid-line) off a JSONL file, so that the next line
    appended starts a line of its own. Returns the bytes cut (0 when the file ends with a newline)."""
    target = Path(path)
    if not target.is_file():
        return 0
    with target.open("r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        f.seek(0)
        keep = f.read().rfind(b"\n") + 1
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
        return size - keep


def append_lines(path: str | os.PathLike[str], records: Iterable[Any]) -> None:
    """Append JSON records as lines to ``path`` (created if missing) and fsync once."""
    with Path(path).open("a", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (a no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def progress_bar(stream: TextIO, total: int | None = None, unit: str = "it", desc: str = "",
                 disable: bool = False, **options: Any) -> Any:
    """A tqdm bar on ``stream``, drawn only when it is a terminal (logs and tests stay clean); it is erased
    when done unless ``leave=True``."""
    from tqdm import tqdm

    tty = getattr(stream, "isatty", lambda: False)()
    options.setdefault("leave", False)
    return tqdm(total=total, unit=unit, desc=desc, file=stream, dynamic_ncols=True, disable=disable or not tty,
                **options)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (one of another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # alive, but another user's
        pass
    return True
