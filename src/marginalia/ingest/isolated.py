"""Converting a document in a child process that can be killed: bounded in time, and in memory where the system
allows it, so that a decompression bomb or a pathological file costs its own process and never the caller's.

The child is a fresh interpreter (``python -P -c ...``), not a fork: the caller may be a server with threads,
and forking those is unsafe; and unlike `multiprocessing`'s spawn, it never imports the caller's main script
again. The request goes to the child's standard input (one JSON line, then the file's bytes); the reply comes
back on its standard output as one JSON object, while whatever the converter prints goes to standard error.

The child never outlives its caller nor its time: it asks the kernel for SIGKILL when the thread that started
it ends (Linux's parent-death signal), it arms an alarm of its own for its time bound plus a grace, and the
caller kills its whole process group on every way out of `convert_isolated` and in `stop_conversions` (a
server that stops).
"""

from __future__ import annotations

import ctypes
import importlib
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any, NoReturn

from ..errors import BadInput, DocumentTooLarge, EmptyDocument, IngestError, MissingDependency
from ..options import IngestOptions

log = logging.getLogger(__name__)

MIB = 1024 * 1024
#: the folder that holds the ``marginalia`` package: the child imports it from there, as its parent did
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
#: what the child runs; -P keeps the working folder off its import path (a document folder may hold a json.py)
_CHILD = ("-P", "-c", "from marginalia.ingest.isolated import main; main()")
#: the errors a child sends back as themselves; anything else becomes an `IngestError`
_ERRORS: dict[str, type[IngestError]] = {cls.__name__: cls for cls in (IngestError, BadInput, EmptyDocument)}
#: bytes of the child's standard error kept for the log when it dies without a reply
_STDERR_TAIL = 4000
#: the environment variable that names the child's caller, so that a child whose caller is gone ends at once
_PARENT = "MARGINALIA_CONVERTER_PARENT"
#: seconds the child's own alarm allows past its time bound (the caller kills it at the bound itself)
_ALARM_GRACE = 5
#: Linux's prctl option that sends a signal to a process when the thread that forked it ends
_PR_SET_PDEATHSIG = 1
#: what a converter says when an allocation failed (MuPDF, the C library, C++): its memory bound was reached
_OUT_OF_MEMORY = re.compile(r"MemoryError|out of memory|cannot allocate|malloc|bad_alloc|failed to allocate",
                            re.IGNORECASE)
#: the children converting now, so that a server that stops can stop them (`stop_conversions`)
_RUNNING: set[subprocess.Popen[bytes]] = set()
_RUNNING_LOCK = threading.Lock()


def flag(limit: str) -> str:
    """The command-line flag of an `IngestOptions` field (``max_pages`` → ``--max-pages``)."""
    return "--" + limit.replace("_", "-")


def exceeded(source: str, what: str, limit: str, bound: float,
             advice: str = "split it into parts, or") -> DocumentTooLarge:
    """The error for a document over a bound: ``what`` it did (with the bound and its option), then ``advice``
    and the flag that raises the bound."""
    return DocumentTooLarge(f"{source} {what}; {advice} raise the limit with {flag(limit)}",
                            limit=limit, bound=bound, path=source)


def timed_out(source: str, limits: IngestOptions) -> DocumentTooLarge:
    seconds = limits.convert_timeout
    return exceeded(source, f"took more than {seconds:g} s to convert (convert_timeout is {seconds:g}) and was "
                            "stopped", "convert_timeout", seconds)


def out_of_memory(source: str, limits: IngestOptions) -> DocumentTooLarge:
    mb = limits.convert_memory_mb
    return exceeded(source, f"needed more than {mb} MiB of memory to convert (convert_memory_mb is {mb}) and was "
                            "stopped: it may be a decompression bomb", "convert_memory_mb", mb, "if you trust it,")


def convert_isolated(loader: type[Any], data: bytes, source: str, limits: IngestOptions) -> dict[str, Any]:
    """Convert ``data`` with ``loader`` (a `Loader` class, built in the child as ``loader(limits)``) in a child
    process; return the `Converted` record's fields.

    Raises:
        DocumentTooLarge: the conversion ran past ``limits.convert_timeout`` (the child is killed) or out of
            ``limits.convert_memory_mb``, or the loader found the document over another of ``limits``.
        IngestError: the loader refused the document (its own error class and message), or the child died.
        MissingDependency: the child lacks the loader's libraries.
    """
    request = {"loader": f"{loader.__module__}:{loader.__qualname__}", "source": source,
               "limits": limits.model_dump()}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    # one malloc arena per thread reserves 64 MiB of address space each: fewer arenas, so that the memory
    # bound measures memory used rather than the number of threads
    env["MALLOC_ARENA_MAX"] = "2"
    env[_PARENT] = str(os.getpid())
    with tempfile.TemporaryFile() as errors:
        # a session of its own: a terminal's Ctrl-C reaches only the caller, which then stops the child itself;
        # its process group is what the caller kills, the converter's own children included
        child = subprocess.Popen([sys.executable, *_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=errors, env=env, start_new_session=True)
        with _RUNNING_LOCK:
            _RUNNING.add(child)
        try:
            out, _ = child.communicate(json.dumps(request).encode() + b"\n" + data, timeout=limits.convert_timeout)
        except subprocess.TimeoutExpired:
            raise timed_out(source, limits) from None
        finally:  # a reply, a timeout, Ctrl-C, the caller's thread stopped: nothing of the child is left running
            with _RUNNING_LOCK:
                _RUNNING.discard(child)
            _stop(child)
        reply = _reply(out) if child.returncode == 0 else None
        if reply is None:
            _died(child.returncode, source, limits, _tail(errors))
    if "converted" in reply:
        converted: dict[str, Any] = reply["converted"]
        return converted
    raise _error(reply["error"], source, limits)


def _reply(out: bytes) -> dict[str, Any] | None:
    try:
        reply = json.loads(out)
    except ValueError:
        return None
    return reply if isinstance(reply, dict) and ("converted" in reply or "error" in reply) else None


def _stop(child: subprocess.Popen[bytes]) -> None:
    """Kill the child's process group (the child leads it) and reap the child, unless it ended already."""
    if child.returncode is None:
        _kill_group(child)
        child.communicate()


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # all of it ended already
        pass
    except AttributeError:  # no process groups (Windows)
        child.kill()


def stop_conversions() -> int:
    """Kill every conversion running in this process's children now (a server that stops); the calls that
    wait for them raise. Returns how many were running."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for child in running:
        _kill_group(child)
    return len(running)


def _tail(stream: IO[bytes]) -> str:
    stream.seek(0, os.SEEK_END)
    stream.seek(max(0, stream.tell() - _STDERR_TAIL))
    return stream.read().decode("utf-8", "replace").strip()


def _died(code: int, source: str, limits: IngestOptions, tail: str) -> NoReturn:
    """Raise the error for a child that ended without a reply (``code``: its exit status, -N for signal N)."""
    log.warning("the process converting %s ended with status %s; its last output: %s", source, code, tail)
    name = _signal_name(-code) if code < 0 else ""
    if name in ("SIGKILL", "SIGABRT") or _OUT_OF_MEMORY.search(tail):
        # the kernel's out-of-memory killer; a C++ allocation that threw; an allocation that failed at the bound
        name = name or f"status {code}"
        mb = limits.convert_memory_mb
        raise exceeded(source, f"could not be converted: its process was stopped ({name}), most likely for lack "
                               f"of memory (convert_memory_mb is {mb}), and it may be a decompression bomb",
                       "convert_memory_mb", mb, "if you trust it,")
    how = f"signal {name}" if code < 0 else f"status {code}"
    raise IngestError(f"the converter crashed on {source} ({how}); the file may be damaged: try repairing it or "
                      "converting it with another tool", path=source)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _error(fields: dict[str, Any], source: str, limits: IngestOptions) -> Exception:
    """The error a child sent back, rebuilt."""
    kind = fields.get("type")
    if kind == "memory":
        return out_of_memory(source, limits)
    if kind == "DocumentTooLarge":
        return DocumentTooLarge(fields["message"], limit=fields["limit"], bound=fields["bound"], path=fields["path"])
    if kind == "MissingDependency":
        return MissingDependency(fields["what"], fields["command"])
    cls = _ERRORS.get(str(kind), IngestError)
    return cls(fields["message"], path=fields.get("path"), page=fields.get("page"))


# -- the child ------------------------------------------------------------------------------------------------


def _limit_memory(mb: int) -> None:
    """Bound this process's address space to ``mb`` MiB where the system allows it (not on Windows or macOS)."""
    try:
        import resource
    except ImportError:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mb * MIB if hard == resource.RLIM_INFINITY else min(mb * MIB, hard)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):  # a system that does not bound the address space
        log.debug("the address space could not be bounded here")


def _serve(request: dict[str, Any], data: bytes) -> dict[str, Any]:
    source = request["source"]
    limits = IngestOptions(**request["limits"])
    module, _, name = request["loader"].partition(":")
    try:
        loader = getattr(importlib.import_module(module), name)(limits)
        loader.prepare()  # its libraries load before the bound: it bounds what the document costs
        _limit_memory(limits.convert_memory_mb)
        return {"converted": asdict(loader.convert(data, source))}
    except MemoryError:
        return {"error": {"type": "memory"}}
    except DocumentTooLarge as exc:
        return {"error": {"type": "DocumentTooLarge", "message": str(exc), "path": exc.path, "limit": exc.limit,
                          "bound": exc.bound}}
    except IngestError as exc:
        return {"error": {"type": type(exc).__name__, "message": str(exc), "path": exc.path, "page": exc.page}}
    except MissingDependency as exc:
        return {"error": {"type": "MissingDependency", "what": exc.what, "command": exc.command}}
    except Exception as exc:  # noqa: BLE001 - a converter's failure on an odd file: say which file, keep the cause
        if _OUT_OF_MEMORY.search(f"{type(exc).__name__}: {exc}"):  # an allocation under the bound failed
            return {"error": {"type": "memory"}}
        return {"error": {"type": "IngestError", "path": source,
                          "message": f"could not convert {source} ({type(exc).__name__}: {exc}); the file may be "
                                     "damaged: try repairing it or converting it with another tool"}}


def _die_with_parent() -> None:
    """Have the kernel kill this process when its caller's thread ends (Linux), and end now if the caller is
    gone already (it died before the request was made)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # a C library without prctl: the alarm and the caller still bound it
            log.debug("the parent-death signal could not be set")
    parent = os.environ.get(_PARENT, "")
    if parent.isdigit() and os.getppid() != int(parent):
        os._exit(1)


def _arm_alarm(seconds: float) -> None:
    """End this process (SIGALRM's default action) ``seconds`` after now, whatever it is doing."""
    if hasattr(signal, "setitimer"):
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.setitimer(signal.ITIMER_REAL, seconds)


def main() -> None:
    """The child: read the request and the file from standard input, write the reply to standard output."""
    _die_with_parent()
    reply_to = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what the converter prints (MuPDF writes to the C library's stdout) stays out of the reply
    request = json.loads(sys.stdin.buffer.readline())
    _arm_alarm(math.ceil(float(request["limits"]["convert_timeout"])) + _ALARM_GRACE)
    data = sys.stdin.buffer.read()
    try:
        reply = json.dumps(_serve(request, data)).encode()
    except MemoryError:  # the reply itself did not fit under the bound
        reply = json.dumps({"error": {"type": "memory"}}).encode()
    reply_to.write(reply)
    reply_to.flush()
    os._exit(0)  # no teardown: the converter's libraries have nothing to save, and may be slow to unload
