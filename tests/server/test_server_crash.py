"""A server killed (SIGKILL) while it indexes an upload loses nothing: the collection stays at its last good
state, and the same upload to a new server completes it, reusing the chunks already embedded."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from marginalia.index.store import Collection
from server_support import REPORT, index_text, wait_for

pytest.importorskip("uvicorn")
pytest.importorskip("lancedb")

# a server that writes chunks in batches of 4; told to hold, its embedder stops for good at long.md's third batch,
# so that the kill lands mid-document
SERVER = """
import sys, threading
import uvicorn
import marginalia.index.store as store
from marginalia.index.embedders import HashingEmbedder
from marginalia.models.fake import ScriptedGenerator
from marginalia.server import Settings, create_app

store.WRITE_BATCH = 4
HOLD = sys.argv[3] == "hold"

class Holding(HashingEmbedder):
    batches = 0

    def _embed(self, texts, kind):
        if HOLD and kind == "document" and any("Paragraph" in t for t in texts):
            if Holding.batches == 2:
                threading.Event().wait()  # until the test kills the server
            Holding.batches += 1
        return super()._embed(texts, kind)

app = create_app(Settings(home=sys.argv[1]), generator=ScriptedGenerator(), embedder=Holding())
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""

LONG = "\n\n".join(f"Paragraph {i} tells of the harbour and its {i} boats." for i in range(80)) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(home: Path, hold: bool = False) -> tuple[subprocess.Popen[bytes], httpx.Client]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(home), str(port), "hold" if hold else "go"], env=env)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def up() -> bool:
        try:
            return client.get("/v1/health").status_code == 200
        except httpx.TransportError:
            return False

    wait_for(up, timeout=60, step=0.2)
    return proc, client


def test_a_server_killed_mid_index_loses_nothing(tmp_path):
    home = tmp_path / "home"
    proc, client = start(home, hold=True)
    try:
        assert index_text(client, "docs", "report.md", REPORT)["status"] == "done"
        reply = client.post("/v1/collections/docs/documents?min_tokens=5&max_tokens=30",
                            files={"file": ("long.md", LONG.encode())})
        job_url = reply.headers["location"]
        job = wait_for(lambda: (j := client.get(job_url).json())["chunks_done"] >= 8 and j, timeout=60)
        assert job["status"] == "running" and job["chunks_done"] == 8 < job["chunks_total"]  # held at its third batch
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        client.close()

    survivor = Collection.open("docs", home=home)
    assert [d.source for d in survivor.documents()] == ["report.md"]  # the last good state

    proc, client = start(home)
    try:
        reply = client.post("/v1/collections/docs/documents?min_tokens=5&max_tokens=30",
                            files={"file": ("long.md", LONG.encode())})
        done = wait_for(lambda: (j := client.get(reply.headers["location"]).json())["status"] != "running"
                        and j["status"] != "queued" and j, timeout=120)
        assert done["status"] == "done", done
        result = done["result"]
        assert result["status"] == "added" and result["embedded"] < result["chunks"]  # the rest was reused
        sources = [d["source"] for d in client.get("/v1/collections/docs").json()["documents"]]
        assert sources == ["long.md", "report.md"]
    finally:
        proc.terminate()
        proc.wait(30)
        client.close()
