"""The progress of a benchmark run, judge or question generation: a bar on a terminal, a line per step elsewhere."""

from __future__ import annotations

import time
from typing import Any, TextIO

from ..files import progress_bar


class Progress:
    """A tqdm bar with ETA on a terminal; elsewhere (logs, CI) one line per result."""

    def __init__(self, total: int, initial: int, err: TextIO, enabled: bool, unit: str = "answer",
                 prefix: str = "bench") -> None:
        from tqdm import tqdm

        self.tqdm = tqdm
        self.total, self.initial, self.n = total, initial, initial
        self.err, self.enabled, self.unit, self.prefix = err, enabled, unit, prefix
        self.t0 = time.perf_counter()
        self.bar: Any = None
        if enabled and getattr(err, "isatty", lambda: False)():
            self.bar = progress_bar(err, total, unit, initial=initial, smoothing=0.05, leave=True)

    def log(self, message: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(message, file=self.err)
        else:
            print(message, file=self.err, flush=True)

    def step(self, label: str) -> None:
        self.n += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(1)
        elif self.enabled:
            meter = self.tqdm.format_meter(self.n, self.total, time.perf_counter() - self.t0,
                                           initial=self.initial, unit=self.unit,
                                           bar_format="{n_fmt}/{total_fmt} [{elapsed}<{remaining}]")
            print(f"{self.prefix} {meter} {label}", file=self.err, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
