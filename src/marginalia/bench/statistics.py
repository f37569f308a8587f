"""The statistics of a benchmark's scores: a mean with its 95% interval (Wilson for 0/1 scores, a percentile
bootstrap otherwise)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959964


@dataclass(frozen=True)
class Estimate:
    """A mean with its 95% interval over ``n`` values."""

    n: int
    mean: float
    low: float
    high: float

    def format(self) -> str:
        if self.n == 0:
            return "–"
        return f"{self.mean:.2f} [{self.low:.2f}, {self.high:.2f}]"


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (``n`` > 0)."""
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap(values: Sequence[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of the mean (deterministic for a seed)."""
    import numpy as np

    data = np.asarray(values, dtype=float)
    if len(data) == 1:
        return float(data[0]), float(data[0])
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(resamples, len(data)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def estimate(values: Sequence[float]) -> Estimate:
    """Mean and 95% interval: Wilson for 0/1 values, a bootstrap for anything else."""
    n = len(values)
    if n == 0:
        return Estimate(0, math.nan, math.nan, math.nan)
    mean = sum(values) / n
    if all(v in (0.0, 1.0) for v in values):
        low, high = wilson(sum(values), n)
    else:
        low, high = bootstrap(values)
    return Estimate(n, mean, low, high)
