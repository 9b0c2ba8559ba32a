"""The one timer every compiler is measured with.

A compiler's engine only says how to run (``infer``, ``run_many``); this module decides when
the clock starts and stops, synchronizes the device before reading it, samples resources and
computes the statistics.

Scenarios:

- ``latency``: one request at a time. Each repetition is one ``infer()``; latency mean, std,
  p50/p90/p99 in ms; throughput = batch / mean latency.
- ``throughput``: the runtime's best concurrency. Each repetition is ``k = parallel_requests *
  REQUESTS_PER_SLOT`` requests, or, for a one-slot engine, as many requests as last
  ``MIN_REPETITION_S`` (calibrated before the warm-up; one request for any slower model).
  An engine that can keep requests in flight across calls (``start_many(k)``: start k
  requests, return once the last is started; OpenVINO's async queue) is never drained
  between repetitions: a repetition is the time between two returns of ``start_many``, and
  the drain at the end of the window (``synchronize()``) belongs to the last repetition, so
  the window is ``benchmark_app``'s: requests in flight from the first start to the last
  completion. Draining every repetition left slots idle at each boundary and cost a 50 us
  model 12%. Other engines run ``run_many(k)``.

Latencies are per request in both scenarios: in the throughput scenario a one-slot engine on
the host stamps each request's end inside ``run_many`` (about 0.1 us a request), and
OpenVINO's queue gives each request's own time from the runtime's timer (read for one
request in a few on fast models, to keep the reads under 1% of the time). Where requests
overlap on a device queue (CUDA engines in the throughput scenario) there is no per-request
time: latency mean and percentiles are then not reported, rather than reporting the inverse
throughput under their names.

Repetitions are timed back to back (each starts where the previous one ended), so the
measured seconds are the whole window, harness included.

In both scenarios the throughput is the samples measured over the seconds measured (what
``benchmark_app`` reports), never the mean of per-repetition rates: that mean weighs a
repetition by its speed, so on a loaded machine it over-reports a fast model by up to several
times (a 50 us ONNX Runtime call read 5x its real rate) and favours the noisier runtime. The
coefficient of variation is that of the repetition times (std / mean of the seconds each
repetition took), and the throughput's standard deviation is the throughput times that CV.
The throughput's 95% interval is bootstrapped over the repetitions
(:func:`mlflow_ngraph.measure.stats.rate_interval`).

Over the window the sampler also reads what the rest of the host did (other processes' CPU
time, steal, load, frequency, throttling): the measurement carries it so a caller can judge
the number (:mod:`mlflow_ngraph.measure.stability`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from mlflow_ngraph.compilers.base import Engine
from mlflow_ngraph.config import MeasureSettings
from mlflow_ngraph.measure.sampler import ResourceSampler
from mlflow_ngraph.measure.stats import rate_interval, summarize

#: requests per repetition per parallel slot in the throughput scenario, for engines that
#: run several requests at once: 8 rounds per slot make a repetition long enough for its
#: rate to mean something while leaving enough repetitions for a standard deviation. An
#: engine without ``start_many`` drains its queue every repetition (the last requests run
#: with idle slots); 8 rounds keep that tail under ~1/8 of a repetition.
REQUESTS_PER_SLOT = 8
#: a throughput repetition of a one-slot engine holds enough requests to last at least this
#: long, so that what each ``run_many`` call costs besides its requests (entering PyTorch's
#: inference mode, ~2 us; the harness's own bookkeeping, ~0.3 us) is spread over its calls,
#: as in a caller's own loop; on a ~100 us model it cost 3-7% with one request per
#: repetition. 1 ms still leaves a thousand repetitions in the default 1 s window.
MIN_REPETITION_S = 1e-3
#: single requests timed to calibrate (the fastest counts: a preempted call only lowers the
#: count); a call that alone lasts MIN_REPETITION_S ends the calibration.
CALIBRATION_CALLS = 3
MAX_REQUESTS_PER_REPETITION = 4096


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
    throughput_std: float  # samples/s: throughput x cv (the spread of repetition times)
    throughput_overall: float  # the same as throughput (kept for existing records)
    cv: float  # coefficient of variation of the repetition times
    throughput_ci_low: float | None  # 95% bootstrap interval of the throughput (samples/s)
    throughput_ci_high: float | None
    # per-request latencies (None where the runtime gives no per-request time)
    latency_mean_ms: float | None
    latency_std_ms: float | None
    latency_p50_ms: float | None
    latency_p90_ms: float | None
    latency_p99_ms: float | None
    cpu_percent: float
    peak_rss_mb: float
    gpu: dict
    # what the rest of the host did over the window (None: not exposed, or too short)
    host_other_cpu_percent: float | None = None
    host_steal_percent: float | None = None
    host_load_avg: float | None = None
    cpu_freq_mhz: float | None = None
    cpu_throttle_events: float | None = None

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
    plan = _plan(engine, settings.scenario)
    clock = time.perf_counter
    warm_began = clock()
    for _ in range(settings.warmup):
        plan.step()
    engine.synchronize()
    if settings.warmup:
        plan.tune((clock() - warm_began) / (settings.warmup * plan.per_rep))
    plan.collected.clear()

    sampler = ResourceSampler(gpu=gpu)
    times_s: list[float] = []
    sampler.start()
    began = last = clock()
    while True:
        plan.step()  # returns when its requests are done, or all but the last few in flight
        now = clock()
        times_s.append(now - last)
        last = now
        reason = _stop_reason(len(times_s), now - began, settings)
        if reason:
            break
    engine.synchronize()  # requests still in flight are part of the last repetition
    times_s[-1] += clock() - last
    usage = sampler.stop()
    latencies = plan.latencies(began, times_s)
    return _build(settings.scenario, batch_size, plan.per_rep, times_s, reason, usage, latencies)


#: what reading one request's latency costs the thread that starts requests (OpenVINO: two
#: calls into the runtime), and the share of a request's time that reading may take: the
#: harness reads one request in ``every`` so that the reads stay under that share
LATENCY_READ_COST_S = 2e-6
LATENCY_READ_SHARE = 0.01


@dataclass
class _Plan:
    """How the harness drives an engine in a scenario, and where per-request latencies come
    from: ``repetitions`` (the latency scenario: a repetition is one request), ``stamps``
    (a one-slot host engine stamps each request's end), ``runtime`` (the runtime's own
    per-request timer, read for one request in ``every``) or ``""`` (requests overlap on a
    device queue: no per-request time, so no percentiles are reported)."""

    per_rep: int
    call: Callable[..., None]
    source: str = ""
    collected: list[float] = field(default_factory=list)
    every: int = REQUESTS_PER_SLOT

    def step(self) -> None:
        if self.source == "stamps":
            self.call(self.per_rep, self.collected)
        elif self.source == "runtime":
            self.call(self.per_rep, self.collected, self.every)
        else:
            self.call()

    def tune(self, request_s: float) -> None:
        """Set how often the runtime's timer is read from the warm-up's time per request."""
        if request_s > 0:
            every = math.ceil(LATENCY_READ_COST_S / (LATENCY_READ_SHARE * request_s))
            self.every = max(1, min(self.per_rep, every))

    def latencies(self, began: float, times_s: list[float]) -> list[float] | None:
        if self.source == "repetitions":
            return times_s
        if self.source == "stamps" and self.collected:
            ends = np.asarray(self.collected)
            return np.diff(ends, prepend=began).tolist()
        if self.source == "runtime" and self.collected:
            return self.collected
        return None


def _plan(engine: Engine, scenario: str) -> _Plan:
    """Requests per repetition, the call that runs one repetition, and how per-request
    latencies are read."""
    if scenario == "latency":
        return _Plan(1, engine.infer, "repetitions")
    slots = max(1, engine.parallel_requests)
    if slots == 1:
        per_rep = _calibrate(engine)
        if engine.asynchronous_device:  # requests pipeline on the device queue
            return _Plan(per_rep, lambda: engine.run_many(per_rep))
        return _Plan(per_rep, engine.run_many, "stamps")
    per_rep = slots * REQUESTS_PER_SLOT
    start_many = getattr(engine, "start_many", None)
    if start_many is not None:
        return _Plan(per_rep, start_many, "runtime")
    return _Plan(per_rep, lambda: engine.run_many(per_rep))


def _calibrate(engine: Engine) -> int:
    """Requests per repetition for a one-slot engine: enough to last ``MIN_REPETITION_S``,
    from the fastest of up to ``CALIBRATION_CALLS`` single requests (outside the window)."""
    clock = time.perf_counter
    fastest_s = math.inf
    for _ in range(CALIBRATION_CALLS):
        t0 = clock()
        engine.run_many(1)
        fastest_s = min(fastest_s, clock() - t0)
        if fastest_s >= MIN_REPETITION_S:
            return 1
    return max(1, min(MAX_REQUESTS_PER_REPETITION, math.ceil(MIN_REPETITION_S / fastest_s)))


def _build(scenario, batch_size, per_rep, times_s, reason, usage, latencies_s) -> Measurement:
    durations = summarize(times_s)
    # every request's own time, or None where requests overlap on a device queue (their
    # time per request would be the inverse throughput, not a latency)
    lat = summarize([1000.0 * t for t in latencies_s]) if latencies_s else None
    total_s = sum(times_s)
    # samples / seconds; in the latency scenario it equals batch / mean latency
    throughput = len(times_s) * per_rep * batch_size / total_s
    # The spread is that of the repetition times, carried to the throughput (delta method:
    # std/mean of T = std/mean of t). Per-repetition rates (samples / t) would let one short
    # interval dominate: a streaming engine's repetition can end in a burst of completions.
    cv = durations.std / durations.mean if durations.mean > 0 else 0.0
    interval = rate_interval(times_s, per_rep * batch_size)
    host = usage.host
    return Measurement(
        scenario=scenario,
        batch_size=batch_size,
        requests_per_repetition=per_rep,
        repetitions=len(times_s),
        duration_s=total_s,
        stop_reason=reason,
        throughput=throughput,
        throughput_std=throughput * cv,
        throughput_overall=throughput,
        cv=cv,
        throughput_ci_low=interval[0] if interval else None,
        throughput_ci_high=interval[1] if interval else None,
        latency_mean_ms=lat.mean if lat else None,
        latency_std_ms=lat.std if lat else None,
        latency_p50_ms=lat.median if lat else None,
        latency_p90_ms=lat.p90 if lat else None,
        latency_p99_ms=lat.p99 if lat else None,
        cpu_percent=usage.cpu_percent,
        peak_rss_mb=usage.peak_rss_mb,
        gpu=usage.gpu,
        host_other_cpu_percent=host.other_cpu_percent,
        host_steal_percent=host.steal_percent,
        host_load_avg=host.load_avg,
        cpu_freq_mhz=host.cpu_freq_mhz,
        cpu_throttle_events=host.throttle_events,
    )
