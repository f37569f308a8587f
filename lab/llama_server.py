"""Read once, ask many over HTTP: WiM against llama.cpp's own ``llama-server``.

llama-cpp-python's server keeps one slot and only its last prompt's cache, so a second question over
the same document makes it evaluate the whole document again (see the backends section). llama.cpp's
``llama-server`` runs several slots on one unified KV cache and keeps a host-memory prompt cache
(``--cache-ram``), which is what a server with shared prefixes (vLLM, SGLang) offers. This script builds
``llama-server`` once from the llama.cpp source that the installed llama-cpp-python's sdist carries
(into ``--tools``, by default ``~/.cache/marginalia-lab/tools/``), serves the embedded SmolLM2 with it, and reads the bundled report with WiM
through the ``openai:`` backend (``concurrency`` = slots). Counted: the prompt tokens the server says it
evaluated (``timings.prompt_n``) for a first question and for a second and third over the same reading
(``WiM.reader``: the document is not sent to be read again, only each margin's prompt on its prefix).

    python lab/llama_server.py [--slots 4] [--segment-tokens 512] [--rebuild]

Writes the ``llama_server`` section of lab/findings/llama_server.md.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from _lab_common import command_line, git_commit, machine, write_finding

QUESTIONS = (0, 1, 2)  # the bundled report's own questions, by position in its list


def build_server(tools: Path, rebuild: bool = False) -> Path:
    """``llama-server`` from the sdist of the installed llama-cpp-python (downloaded from the package index
    once, built with cmake into ``<tools>/llama-server-<version>/``)."""
    release = version("llama_cpp_python")
    target = tools / f"llama-server-{release}" / "llama-server"
    if target.exists() and not rebuild:
        return target
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise SystemExit(f"building llama-server needs {tool}; install it (Debian: apt-get install cmake g++)")
    with tempfile.TemporaryDirectory(prefix="llama-server-") as tmp:
        print(f"downloading the llama-cpp-python {release} sdist", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={release}", "-d", tmp], check=True)
        archive = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        source = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
        build = Path(tmp) / "build"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        print("building llama-server (several minutes)", file=sys.stderr)
        subprocess.run(["cmake", "-S", str(source), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Release",
                        "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_NATIVE=ON"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", str(os.cpu_count() or 2)],
                       check=True, stdout=subprocess.DEVNULL)
        built = next(build.glob("**/bin/llama-server"))
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        shutil.copy2(built, partial)
        partial.replace(target)
    return target


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(binary: Path, gguf: Path, slots: int, window: int, cache_ram: int, log: Path) -> tuple[Any, str]:
    import httpx

    port = free_port()
    files = tempfile.mkdtemp(prefix="llama-slots-")  # slot files: a later question puts its reading back
    atexit.register(shutil.rmtree, files, ignore_errors=True)
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
               "--parallel", str(slots), "--kv-unified", "-c", str(window * slots),
               "--cache-ram", str(cache_ram), "-t", str(os.cpu_count() or 2), "--no-webui",
               "--slot-save-path", files + os.sep]
    with log.open("w") as err:
        proc = subprocess.Popen(command, stdout=err, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited ({proc.returncode}); its log: {log}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit(f"llama-server did not come up; its log: {log}")


def measure(gen: Any, run: Any) -> dict[str, Any]:
    from marginalia.models import Usage

    gen.usage = Usage()
    t0 = time.perf_counter()
    answer = run()
    wall = time.perf_counter() - t0
    return {"wall": wall, "evaluated": gen.usage.prefilled_tokens, "sent": answer.stats.prompt_tokens_sent,
            "answer": answer.text, "margins": len(answer.margins)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=4, help="llama-server's parallel slots = WiM's concurrency")
    ap.add_argument("--segment-tokens", type=int, default=512)
    ap.add_argument("--cache-ram", type=int, default=2048, help="llama-server's prompt cache (MiB)")
    ap.add_argument("--rebuild", action="store_true", help="build llama-server again")
    ap.add_argument("--tools", type=Path, default=Path.home() / ".cache" / "marginalia-lab" / "tools",
                    help="where llama-server is built and kept")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave lab/findings alone")
    args = ap.parse_args()

    from marginalia import demo, make_pattern
    from marginalia.models import gguf_file, load_generator

    t_all = time.perf_counter()
    binary = build_server(args.tools.expanduser(), args.rebuild)
    doc, asked = demo()
    questions = [asked[i]["question"] for i in QUESTIONS]
    log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
    proc, url = start(binary, gguf_file("smollm2"), args.slots, 8192, args.cache_ram, log)
    rows: list[tuple[str, dict[str, Any]]] = []
    try:
        gen = load_generator(f"openai:{url}/v1#smollm2;concurrency={args.slots};window=8192")
        wim = make_pattern("wim", gen, segment_tokens=args.segment_tokens)
        n_doc = len(gen.tokenizer.encode(doc))
        reader = wim.reader(doc, "harbour_report.md")
        rows.append(("first question (reads the document)", measure(gen, lambda: reader.answer(questions[0]))))
        rows.append(("second question, same reading", measure(gen, lambda: reader.answer(questions[1]))))
        rows.append(("third question, same reading", measure(gen, lambda: reader.answer(questions[2]))))
        fresh = make_pattern("wim", gen, segment_tokens=args.segment_tokens)
        rows.append(("second question, a fresh pattern (no reader)",
                     measure(gen, lambda: fresh.answer(doc, questions[1]))))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    total = time.perf_counter() - t_all

    lines = [f"Command: `{command_line()}` · commit {git_commit()} · llama-server from the llama-cpp-python "
             f"{version('llama_cpp_python')} sdist, {args.slots} slots on a unified KV cache "
             f"(`--parallel {args.slots} --kv-unified --cache-ram {args.cache_ram}`), SmolLM2-135M · WiM "
             f"{args.segment_tokens}-token segments, `concurrency={args.slots}` · machine: {machine()} · "
             f"total {total / 60:.1f} min",
             "",
             f"The bundled report ({n_doc} tokens). Prompt tokens evaluated are the server's own count "
             "(`timings.prompt_n`, summed over requests); sent is what the client sent.",
             "",
             "| | wall (s) | prompt tokens evaluated | / document | prompt tokens sent | margins | answer |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for label, r in rows:
        lines.append(f"| {label} | {r['wall']:.1f} | {r['evaluated']} | {r['evaluated'] / n_doc:.2f} | "
                     f"{r['sent']} | {r['margins']} | {r['answer'][:80]!r} |")
    second = rows[1][1]
    lines += ["", f"- A second question over the same reading evaluated {second['evaluated'] / n_doc:.2f}x the "
              f"document's tokens on llama-server (llama-cpp-python's one-slot server: 1.00x, backends section)."]
    if second["evaluated"] > 0.5 * n_doc:
        lines.append("- Each slot reuses only the prefix it holds itself: margin requests sent side by side land on "
                     "slots that hold another segment's prefix and evaluate the difference again, so concurrency "
                     "costs prompt tokens here. A stored reading's margins asked one at a time from the last "
                     "segment back would each find their prefix in the slot the previous request left.")
    body = "## Read once over HTTP: llama.cpp's llama-server (`lab/llama_server.py`)\n\n" + "\n".join(lines)
    print(body)
    if not args.no_write:
        write_finding("llama_server", body)


if __name__ == "__main__":
    main()
