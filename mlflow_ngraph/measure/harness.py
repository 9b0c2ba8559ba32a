"""The one timer every compiler is measured with.

A compiler's engine only says how to run (``infer``, ``run_many``); this module decides when
the clock starts and stops, synchronizes the device before reading it, samples resources and
computes the statistics.

Scenarios:

- ``latency``: one request at a time. Each repetition is one ``infer()``; latency mean, std,
  p50/p90/p99 in ms; throughput = batch / mean latency.
- ``throughput``: the runtime's best concurrency. Each repetition is one ``run_many(k)`` with
  ``k = parallel_requests * REQUESTS_PER_SLOT`` requests kept in flight.

In both scenarios the throughput is the samples measured over the seconds measured (what
``benchmark_app`` reports), never the mean of per-repetition rates: that mean weighs a
repetition by its speed, so on a loaded machine it over-reports a fast model by up to several
times (a 50 us ONNX Runtime call read 5x its real rate) and favours the noisier runtime. The
standard deviation and the coefficient of variation are over per-repetition rates.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

from mlflow_ngraph.compilers.base import Engine
from mlflow_ngraph.config import MeasureSettings
from mlflow_ngraph.measure.sampler import ResourceSampler
from mlflow_ngraph.measure.stats import summarize

#: requests per repetition per parallel slot in the throughput scenario, for engines that
#: run several requests at once. Each repetition ends by draining the queue (the last
#: requests run with idle slots); 8 rounds per slot keep that tail under ~1/8 of a
#: repetition while leaving enough repetitions for a standard deviation.
REQUESTS_PER_SLOT = 8


@dataclass
class Measurement:
    """What one (engine, batch size) measurement produced; units are in the names."""

    scenario: str
    batch_size: int
    requests_per_repetition: int
    repetitions: int
    duration_s: float
    stop_reason: str
    throughput: float  # samples/s: total samples / total measured seconds
    throughput_std: float  # std of per-repetition samples/s
    throughput_overall: float  # the same as throughput (kept for existing records)
    cv: float
    latency_mean_ms: float
    latency_std_ms: float
    latency_p50_ms: float
    latency_p90_ms: float
    latency_p99_ms: float
    cpu_percent: float
    peak_rss_mb: float
    gpu: dict

    def to_dict(self) -> dict:
        return asdict(self)


def _stop_reason(count: int, elapsed_s: float, settings: MeasureSettings) -> str | None:
    """Why to stop now, or ``None`` to go on.

    Both the minimum count and the minimum duration must be met; the reason names the floor
    that bound last (``repetitions`` when the count took longer than the duration floor,
    ``min_duration`` when the duration floor outlasted the count). ``max_duration`` caps both.
    """
    if settings.max_duration_s is not None and elapsed_s >= settings.max_duration_s:
        return "max_duration"
    if count < settings.repetitions or elapsed_s < settings.min_duration_s:
        return None
    return "min_duration" if count > settings.repetitions else "repetitions"


def measure(
    engine: Engine, batch_size: int, settings: MeasureSettings, gpu: bool = False
) -> Measurement:
    """Warm up, then time repetitions of ``engine`` until the stop rule holds.

    The engine must already be prepared (``engine.prepare(inputs)``).

    Args:
        engine: the compiled engine to measure.
        batch_size: samples per request.
        settings: scenario, warm-up, repetitions, minimum and maximum duration.
        gpu: sample GPU utilisation and memory through NVML as well.

    Returns:
        The statistics of the measured window.
    """
    if settings.scenario == "latency":
        per_rep = 1
        step = engine.infer
    else:
        slots = max(1, engine.parallel_requests)
        per_rep = slots * REQUESTS_PER_SLOT if slots > 1 else 1

        def step() -> None:
            engine.run_many(per_rep)

    for _ in range(settings.warmup):
        step()
    engine.synchronize()

    sampler = ResourceSampler(gpu=gpu)
    clock = time.perf_counter
    times_s: list[float] = []
    sampler.start()
    began = clock()
    while True:
        t0 = clock()
        step()  # every engine synchronizes its device before returning
        t1 = clock()
        times_s.append(t1 - t0)
        reason = _stop_reason(len(times_s), t1 - began, settings)
        if reason:
            break
    usage = sampler.stop()
    return _build(settings.scenario, batch_size, per_rep, times_s, reason, usage)


def _build(scenario, batch_size, per_rep, times_s, reason, usage) -> Measurement:
    throughputs = summarize([per_rep * batch_size / t for t in times_s])
    # In the throughput scenario a repetition holds ``per_rep`` requests; its per-request
    # time is what a caller waits on average when the runtime keeps all slots busy.
    latencies_ms = summarize([1000.0 * t / per_rep for t in times_s])
    total_s = sum(times_s)
    # samples / seconds; in the latency scenario it equals batch / mean latency
    throughput = len(times_s) * per_rep * batch_size / total_s
    return Measurement(
        scenario=scenario,
        batch_size=batch_size,
        requests_per_repetition=per_rep,
        repetitions=len(times_s),
        duration_s=total_s,
        stop_reason=reason,
        throughput=throughput,
        throughput_std=throughputs.std,
        throughput_overall=throughput,
        cv=throughputs.cv if not math.isnan(throughputs.cv) else 0.0,
        latency_mean_ms=latencies_ms.mean,
        latency_std_ms=latencies_ms.std,
        latency_p50_ms=latencies_ms.median,
        latency_p90_ms=latencies_ms.p90,
        latency_p99_ms=latencies_ms.p99,
        cpu_percent=usage.cpu_percent,
        peak_rss_mb=usage.peak_rss_mb,
        gpu=usage.gpu,
    )
