"""A PDF that would cost far more than its size — a decompression bomb, too many pages, a conversion that runs
on, one that eats memory — is refused quickly with a `DocumentTooLarge` that names the bound, its value and the
flag that raises it. The conversion runs in a child process that is killed at the bound; the caller never opens
the file with MuPDF."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fuzz_support import MB, SAMPLE_PDF, pdf_bomb, pdf_of_pages
from marginalia.errors import DocumentTooLarge, IngestError
from marginalia.ingest.loaders import load_document, load_paths
from marginalia.options import IngestOptions

pytest.importorskip("pymupdf4llm")

#: seconds a refusal may take: the child's start (its imports take a few seconds on a busy machine) and the check
QUICK = 20.0


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def refused(path: Path, limits: IngestOptions | None, limit: str, *words: str, within: float = QUICK) -> str:
    """Load ``path`` within ``limits``: it must be refused for ``limit`` within ``within`` seconds; the message."""
    start = time.monotonic()
    with pytest.raises(DocumentTooLarge) as info:
        load_document(path, limits=limits)
    took = time.monotonic() - start
    error = info.value
    message = str(error)
    bound = getattr(limits or IngestOptions(), limit)
    assert (error.limit, error.bound, error.path) == (limit, bound, str(path)), message
    assert str(path) in message and (f"{limit} is {bound:g}" in message or f"{limit} ({bound:g})" in message)
    assert f"raise the limit with --{limit.replace('_', '-')}" in message, message
    for word in words:
        assert word in message, message
    assert took < within, f"refused after {took:.1f} s"
    return message


def converting_children() -> list[int]:
    """The pids of this process's children that convert a document (Linux: read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"marginalia.ingest.isolated" in command:
            found.append(int(entry.name))
    return found


def test_a_pdf_with_more_pages_than_max_pages_is_refused(tmp_path):
    path = write(tmp_path, "long.pdf", pdf_of_pages(8))
    refused(path, IngestOptions(max_pages=5), "max_pages", "has 8 pages", "(5)")
    doc = load_document(path, limits=IngestOptions(max_pages=8))
    assert len(doc.page_starts) == 8 and "Page 8 says" in doc.text


def test_a_decompression_bomb_is_refused_by_its_inflated_size(tmp_path):
    path = write(tmp_path, "bomb.pdf", pdf_bomb(30 * MB))
    assert path.stat().st_size < 200_000
    refused(path, IngestOptions(max_inflated_mb=20), "max_inflated_mb", "more than 20 MiB", "decompression bomb")


def test_the_issues_bomb_is_refused_quickly_with_the_defaults(tmp_path):
    # about 600 KB that inflate to 200 MB of text-drawing operators
    path = write(tmp_path, "bomb.pdf", pdf_bomb(200 * MB))
    assert path.stat().st_size < 1_000_000
    refused(path, None, "max_inflated_mb", f"more than {IngestOptions().max_inflated_mb} MiB")


def test_a_conversion_past_its_time_is_killed(tmp_path):
    path = write(tmp_path, "slow.pdf", pdf_of_pages(300))  # its conversion takes far longer than 3 s
    refused(path, IngestOptions(convert_timeout=3), "convert_timeout", "more than 3 s", within=3 + 5)
    if Path("/proc").is_dir():
        assert converting_children() == []  # killed and reaped, not left running


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the memory bound is Linux's RLIMIT_AS")
def test_a_conversion_past_its_memory_is_stopped(tmp_path):
    # 400 MB of spaces, zlib-compressed then hex-encoded: MuPDF must decode such a stream whole, and the
    # converting process's 700 MiB of address space, much of it taken by its libraries, has no room for it
    bomb = pdf_bomb(400 * MB, unit=b" " * 64, filters="[/ASCIIHexDecode /FlateDecode]", level=1)
    path = write(tmp_path, "bomb.pdf", bomb)
    refused(path, IngestOptions(convert_memory_mb=700, max_inflated_mb=1024), "convert_memory_mb",
            "more than 700 MiB of memory")


def test_a_bomb_in_a_folder_is_skipped_with_the_reason(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    write(folder, "bomb.pdf", pdf_bomb(30 * MB))
    write(folder, "notes.md", b"# Notes\n\nThe ferry leaves from pier 47.\n")
    report = load_paths([folder], limits=IngestOptions(max_inflated_mb=20))
    assert [d.source for d in report.documents] == ["docs/notes.md"]  # named from the folder given down
    (skipped,) = report.skipped
    assert skipped.path == str(folder / "bomb.pdf") and "--max-inflated-mb" in skipped.reason


def test_the_caller_never_opens_a_pdf_itself(tmp_path):
    """The conversion happens in another process: the caller loads the document without importing MuPDF."""
    script = ("import sys\nfrom marginalia.ingest.loaders import load_document\n"
              f"doc = load_document({str(SAMPLE_PDF)!r})\n"
              "assert doc.text and len(doc.page_starts) == 3, doc\n"
              "print(sorted(m for m in sys.modules if m.startswith(('pymupdf', 'fitz'))))\n")
    src = str(Path(__import__("marginalia").__file__).parents[1])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": src})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# -- a child that dies --------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")
@pytest.mark.parametrize(("sig", "error", "words"), [
    (signal.SIGKILL, DocumentTooLarge, ("SIGKILL", "lack of memory", "--convert-memory-mb")),
    (signal.SIGSEGV, IngestError, ("crashed", "SIGSEGV", "damaged")),
])
def test_a_child_that_dies_is_a_clear_error(monkeypatch, sig, error, words):
    # the child imports the loader's module by name, as it would a third-party loader's
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    from dying_loader import DyingLoader

    with pytest.raises(error) as info:
        DyingLoader().load(str(int(sig)).encode(), "doomed.dying")
    assert type(info.value) is error and "doomed.dying" in str(info.value)
    for word in words:
        assert word in str(info.value)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the memory bound is Linux's RLIMIT_AS")
@pytest.mark.parametrize("how", ["python", "library", "stderr"])
def test_a_conversion_out_of_memory_names_the_memory_bound(monkeypatch, how):
    # whatever way the converter says it ran out (a MemoryError, a library's error, its last words and an exit
    # status), the caller is told the bound, not that the file may be damaged
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    from dying_loader import HungryLoader

    with pytest.raises(DocumentTooLarge) as info:
        HungryLoader().load(how.encode(), "hungry.hungry", IngestOptions(convert_memory_mb=600))
    message = str(info.value)
    assert (info.value.limit, info.value.bound, info.value.path) == ("convert_memory_mb", 600, "hungry.hungry")
    assert "convert_memory_mb is 600" in message and "--convert-memory-mb" in message, message
    assert "damaged" not in message


def _converters_of(parent: int) -> list[int]:
    """The processes converting for ``parent`` (its children running the isolated converter)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if b"marginalia.ingest.isolated" in cmdline and f"MARGINALIA_CONVERTER_PARENT={parent}\0".encode() in environ:
            found.append(int(entry.name))
    return found


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc (Linux)")
def test_a_converter_dies_with_its_killed_caller(tmp_path: Path) -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from dying_loader import SlowLoader; "
            "from marginalia.options import IngestOptions; "
            "SlowLoader().load(b'120', 'slow.slow', IngestOptions(convert_timeout=300))")
    caller = subprocess.Popen([sys.executable, "-c", code, str(Path(__file__).parent)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not _converters_of(caller.pid):  # polled: the child's start is what is waited for
            assert time.monotonic() < deadline, "no converter started"
            assert caller.poll() is None, "the caller ended"
            time.sleep(0.05)
        (converter,) = _converters_of(caller.pid)
        os.kill(caller.pid, signal.SIGKILL)  # as kill -9 of a server mid-conversion
        caller.wait()
        deadline = time.monotonic() + 5
        while _running(converter):
            assert time.monotonic() < deadline, "the converter outlived its caller by 5 s"
            time.sleep(0.05)
    finally:
        if caller.poll() is None:
            caller.kill()
