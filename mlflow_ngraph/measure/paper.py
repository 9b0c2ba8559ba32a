"""The paper's protocol (``--protocol paper``): exactly N timed single inferences.

The paper measures each configuration by running one inference ``repetitions`` times after
``warmup`` warm-ups, one request at a time, and reports the mean and standard deviation of
the per-inference throughput b / t_i. This module does exactly that, so that the paper's
tables can be made again from figures measured as the paper measured them:

- each t_i is one ``infer()`` and the device's synchronisation, timed alone (no batching of
  requests into calls, no queue: the engine serves one request at a time);
- ``throughput`` is the mean of b / t_i (the paper's figure) and ``throughput_std`` their
  standard deviation; ``throughput_overall`` is b N / sum(t_i), which the rounds protocol
  reports. The mean of the rates sits above it by a Jensen gap (about the squared CV of
  the t_i: 3.7% at a per-request CV of 0.19), so the two protocols' throughputs differ by
  that much on the same engine;
- the 95% interval is a Student-t interval of the mean of the rates, widened where their
  lag-1 autocorrelation is positive beyond chance (as the rounds do: successive requests on
  a drifting host are not independent draws);
- the speedup is the ratio of two such means, T_c / T_identity, measured one after the
  other: no pairing cancels the host's drift between them, so its interval is not reported
  (the rounds protocol's paired speedup is what to compare engines by);
- every t_i is kept (an artifact of the cell's run), nothing is screened and nothing is
  measured again: the protocol is the paper's, so is what it leaves to chance.
"""

from __future__ import annotations

import math
import time

import numpy as np

from mlflow_ngraph.compilers.base import Engine
from mlflow_ngraph.measure.harness import Measurement, latency_and_usage, percentile_intervals
from mlflow_ngraph.measure.rounds import inflation, lag1, t_quantile
from mlflow_ngraph.measure.sampler import ResourceSampler
from mlflow_ngraph.measure.settings import MeasureSettings
from mlflow_ngraph.measure.stats import summarize

STOP_REASON = "repetitions"


def timed_inferences(engine: Engine, count: int) -> list[float]:
    """``count`` inferences, each timed alone: one request and the device's
    synchronisation (seconds)."""
    clock = time.perf_counter
    times = []
    for _ in range(count):
        began = clock()
        engine.infer()
        engine.synchronize()
        times.append(clock() - began)
    return times


def rate_figures(times_s, batch_size: int) -> dict:
    """The paper's figures of the rates b / t_i: their mean and standard deviation, the 95%
    interval of the mean (t, widened for autocorrelation) and what it rests on."""
    rates = batch_size / np.asarray(times_s, dtype=np.float64)
    n = rates.size
    mean = float(rates.mean())
    std = float(rates.std(ddof=1)) if n > 1 else 0.0
    r = lag1(rates)
    ci = halfwidth = None
    if n >= 3 and std > 0:
        half = t_quantile(n) * std / math.sqrt(n) * inflation(r, n)
        if half < mean:
            ci, halfwidth = (mean - half, mean + half), half / mean
    elif n >= 3:  # every request took the same time: the mean is known exactly
        ci, halfwidth = (mean, mean), 0.0
    return {
        "throughput": mean,
        "std": std,
        "ci": ci,
        "halfwidth": halfwidth,
        "autocorr": r,
        "overall": batch_size * n / float(np.sum(times_s)),
    }


def measure_paper(
    engine: Engine, batch_size: int, settings: MeasureSettings, gpu: bool = False
) -> Measurement:
    """Measure a prepared engine by the paper's protocol; every t_i in ms, in the order
    they were taken, is the measurement's ``times_ms``."""
    from mlflow_ngraph.measure.energy import energy_metrics

    sampler = ResourceSampler(gpu=gpu)
    engine.synchronize()
    for _ in range(settings.warmup):
        engine.infer()
    engine.synchronize()
    sampler.begin()
    times = timed_inferences(engine, settings.repetitions)
    sampler.end()
    usage = sampler.result()
    sampler.close()
    figures = rate_figures(times, batch_size)
    times_ms = [1000.0 * t for t in times]
    lat = summarize(times_ms)
    ci = figures["ci"]
    return Measurement(
        scenario=settings.scenario,
        batch_size=batch_size,
        requests_per_repetition=1,
        repetitions=len(times),
        duration_s=float(sum(times)),
        stop_reason=STOP_REASON,
        throughput=figures["throughput"],
        throughput_std=figures["std"],
        throughput_overall=figures["overall"],
        cv=figures["std"] / figures["throughput"] if figures["throughput"] else math.nan,
        throughput_ci_low=ci[0] if ci else None,
        throughput_ci_high=ci[1] if ci else None,
        **latency_and_usage(lat, usage),
        windows=len(times),  # each request is timed alone: a window of one
        window_s=0.0,
        throughput_halfwidth=figures["halfwidth"],
        latency_samples=lat.count,
        throughput_autocorr=figures["autocorr"],
        **percentile_intervals(times_ms),
        energy=energy_metrics(usage.energy_j, batch_size * len(times), usage.wall_s),
        times_ms=times_ms,
    )
