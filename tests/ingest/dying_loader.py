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
