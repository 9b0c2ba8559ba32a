"""Summary statistics of repeated measurements (pyperf's lesson: keep mean, std, median, MAD)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Summary:
    mean: float
    std: float  # sample standard deviation (ddof=1); 0 for a single value
    median: float
    mad: float  # median absolute deviation
    p90: float
    p99: float
    minimum: float
    maximum: float
    count: int

    @property
    def cv(self) -> float:
        """Coefficient of variation, std / mean (``nan`` for a zero mean)."""
        return self.std / self.mean if self.mean else math.nan


def summarize(values) -> Summary:
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("no values to summarize")
    median = float(np.median(data))
    return Summary(
        mean=float(data.mean()),
        std=float(data.std(ddof=1)) if data.size > 1 else 0.0,
        median=median,
        mad=float(np.median(np.abs(data - median))),
        p90=float(np.percentile(data, 90)),
        p99=float(np.percentile(data, 99)),
        minimum=float(data.min()),
        maximum=float(data.max()),
        count=int(data.size),
    )
