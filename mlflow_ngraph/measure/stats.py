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


#: bootstrap resamples of a throughput interval: 2,000 put the ends of a 95% interval within
#: about 1% of their converged values on the repetition counts the harness produces
BOOTSTRAP_RESAMPLES = 2000
#: up to this many repetitions the interval is BCa (bias-corrected and accelerated: right
#: for the skewed, right-tailed times a busy host gives); its jackknife costs n^2 work, so
#: beyond it the percentile interval, which with that many repetitions is as good
BCA_MAX_REPETITIONS = 400
#: resampled values held at once (16 MB of float64)
BOOTSTRAP_BATCH_VALUES = 2_000_000
#: the oldest SciPy :func:`rate_interval` runs on: ``scipy.stats.bootstrap`` takes ``rng=``
#: from 1.15 (SPEC 7); 1.11-1.14 raise ``TypeError`` on it. pyproject.toml's floor is this.
SCIPY_MIN_VERSION = "1.15"


def rate_interval(
    times_s, units_per_repetition: float, confidence: float = 0.95
) -> tuple[float, float] | None:
    """A ``confidence`` interval of a rate measured as ``units`` per repetition over
    repetition times ``times_s``: the rate is units / mean time (total units / total
    seconds), bootstrapped over the repetitions with :func:`scipy.stats.bootstrap`.

    The repetitions are resampled as independent draws: the interval covers their spread
    from one to the next, not a slowdown that lasts the whole window (the host noise
    figures measure that). ``None`` with fewer than 3 repetitions or identical times.
    """
    from scipy import stats

    data = np.asarray(times_s, dtype=np.float64)
    if data.size < 3 or np.ptp(data) == 0 or np.any(data <= 0):
        return None
    method = "BCa" if data.size <= BCA_MAX_REPETITIONS else "percentile"
    result = stats.bootstrap(
        (data,),
        np.mean,
        confidence_level=confidence,
        n_resamples=BOOTSTRAP_RESAMPLES,
        method=method,
        vectorized=True,
        batch=max(1, BOOTSTRAP_BATCH_VALUES // data.size),  # bounds memory on long windows
        rng=np.random.default_rng(0),
    )
    low_t, high_t = result.confidence_interval
    if not (math.isfinite(low_t) and math.isfinite(high_t)) or low_t <= 0:
        return None
    # a longer mean time is a lower rate: the interval's ends swap
    return units_per_repetition / high_t, units_per_repetition / low_t
