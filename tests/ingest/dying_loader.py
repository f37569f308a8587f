"""An isolated loader whose child process ends itself with a signal, as a crash or the kernel's out-of-memory
killer would end it (for tests/ingest/test_pdf_bounds.py; its child imports this module by name)."""

from __future__ import annotations

import os
import time
from typing import Any

from marginalia.ingest.base import Converted, Loader


class DyingLoader(Loader):
    """Its file holds the number of the signal its child sends itself."""

    format = "dying"
    suffixes = (".dying",)
    isolated = True

    def __init__(self, limits: Any = None) -> None:
        self.limits = limits

    def convert(self, data: bytes, source: str) -> Converted:
        os.kill(os.getpid(), int(data))
        raise AssertionError("still alive after the signal")


class SlowLoader(DyingLoader):
    """Its child sleeps for the number of seconds its file holds (a conversion that takes long)."""

    format = "slow"
    suffixes = (".slow",)

    def convert(self, data: bytes, source: str) -> Converted:
        time.sleep(float(data))
        return Converted("woke up")


class HungryLoader(DyingLoader):
    """Its child runs out of memory as its file says: ``python`` (a MemoryError at the bound), ``library`` (a
    converter's library that says so in its exception) or ``stderr`` (one that says so and exits)."""

    format = "hungry"
    suffixes = (".hungry",)

    def convert(self, data: bytes, source: str) -> Converted:
        how = data.decode()
        if how == "python":
            hoard = [bytearray(64 * 2**20) for _ in range(1024)]  # 64 GiB: past any bound on the address space
            raise AssertionError(f"allocated {len(hoard)} blocks")
        if how == "library":
            raise RuntimeError("code=2: cannot allocate 512 MB for the page's display list")
        os.write(2, b"fatal: out of memory\n")
        os._exit(3)
