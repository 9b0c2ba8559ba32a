"""The one timer every compiler is measured with.

A compiler's engine only says how to run (``infer``, ``run_many``, ``start_many``); this
module decides when the clock starts and stops, synchronizes the device before reading it and
samples resources. :mod:`mlflow_ngraph.measure.rounds` decides how many windows each engine
gets and in which order, and turns them into figures with intervals.

A :class:`Meter` holds one warm engine at one batch size. It is measured in *windows*: the
engine runs back to back for at least ``window_s`` seconds (100 ms by default, pyperf's
choice for one value) and the window reports the requests and samples it completed and the
seconds they took. A window, not a single request, is the unit whose spread is judged: a
1 ms repetition's spread measures timer and scheduler jitter (a one-cell run read CV 0.19 on
a quiet host), a 100 ms window's measures what the user reads.

Within a window:

- ``latency`` scenario: one request at a time, each ``infer()`` timed: latency mean, std,
  p50/p90/p99 in ms.
- ``throughput`` scenario: the runtime's best concurrency. A one-slot engine runs
  ``run_many(k)`` with ``k`` calibrated so a call lasts about ``MIN_REPETITION_S`` (what
  each call costs besides its requests, ~2 us, is then spread over its requests, as in a
  caller's own loop). An engine that keeps requests in flight across calls (``start_many``:
  OpenVINO's async queue) is never drained inside a window: the window is
  ``benchmark_app``'s, from the first start to the last completion. Other multi-slot engines
  run ``run_many(slots x REQUESTS_PER_SLOT)``.

Latencies are per request in both scenarios (one-slot host engines stamp each request's end;
OpenVINO's queue gives each request's own time, read for one request in a few on fast models
to keep the reads under 1% of the time; the reads that a window's first requests make of a
request that ran before the window are dropped). Where requests overlap on a device queue
(CUDA engines in the throughput scenario) there is no per-request time: latency mean and
percentiles are not reported, rather than reporting the inverse throughput under their names.

Throughput is samples measured over seconds measured (what ``benchmark_app`` reports), never
the mean of per-window rates.

Over its windows (and only its windows: another engine's window in between is not counted)
the sampler reads the process's CPU and RSS and what the rest of the host did (other
processes' CPU time, steal, load, frequency, throttling).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from mlflow_ngraph.compilers.base import Engine
from mlflow_ngraph.measure.sampler import ResourceSampler
from mlflow_ngraph.measure.settings import MeasureSettings
from mlflow_ngraph.measure.stats import summarize

#: requests per call per parallel slot for a multi-slot engine without ``start_many`` (it
#: drains its queue every call: 8 rounds keep that tail under ~1/8 of a call)
REQUESTS_PER_SLOT = 8
#: a one-slot engine's ``run_many`` call holds enough requests to last at least this long
MIN_REPETITION_S = 1e-3
#: single requests timed to calibrate (the fastest counts); a call that alone lasts
#: MIN_REPETITION_S ends the calibration
CALIBRATION_CALLS = 3
MAX_REQUESTS_PER_REPETITION = 4096


@dataclass
class Measurement:
    """What one (engine, batch size) measurement produced; units are in the names."""

    scenario: str
    batch_size: int
    requests_per_repetition: int  # requests per runtime call inside a window
    repetitions: int  # requests measured (the paper's unit: one inference of one batch)
    duration_s: float
    stop_reason: str
    throughput: float  # samples/s: total samples / total measured seconds
    throughput_std: float  # samples/s: the spread of one window's rate (throughput x cv)
    throughput_overall: float  # the same as throughput (kept for existing records)
    cv: float  # coefficient of variation of the windows' rates
    throughput_ci_low: float | None  # 95% interval of the throughput, over the windows
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
    # what the rest of the host did over the windows (None: not exposed, or too short)
    host_other_cpu_percent: float | None = None
    host_steal_percent: float | None = None
    host_load_avg: float | None = None
    cpu_freq_mhz: float | None = None
    cpu_throttle_events: float | None = None
    windows: int = 0  # windows measured (one per round when interleaved)
    window_s: float = 0.0  # the windows' target length
    throughput_halfwidth: float | None = None  # the interval's relative half-width
    latency_samples: int = 0  # per-request latencies behind the percentiles
    interleaved: float = 0.0  # 1: measured in rounds with other engines of the model
    host_drift: float | None = None  # the baseline's spread across rounds (sd of log rate)
    #: the speedup's change between the rounds' halves, where their intervals part
    speedup_moved: float | None = None
    speedup_paired: float | None = None  # per-round ratio to identity (Hodges-Lehmann)
    speedup_ci_low: float | None = None  # its 95% interval (signed-rank, over the rounds)
    speedup_ci_high: float | None = None
    speedup_halfwidth: float | None = None
    #: measured past the default cap because the figure was wider than the UNSTABLE limit
    stretched: bool = False
    #: windows left out of the figures because the process lost CPU during them
    windows_disturbed: int = 0
    #: what the intervals rest on (measure/rounds.py): rounds, the lag-1 autocorrelation of
    #: the windows' rates and of the per-round ratios, whether the halves could be compared
    rounds: int = 0
    speedup_rounds: int | None = None  # the paired rounds (None without a paired speedup)
    throughput_autocorr: float | None = None
    speedup_autocorr: float | None = None
    drift_checked: float | None = None  # 1/0 for a paired speedup, None without one
    #: the figures with the disturbed windows kept in (None where none was left out)
    throughput_unscreened: float | None = None
    speedup_unscreened: float | None = None
    #: the host's state over the rounds (measure/hostprobe.py): the probe's median reading
    #: (the join's adds/s, or the memory's GB/s: whichever read them), the rounds read, those
    #: of them that met its slow state, and the figure's change in those rounds against the
    #: rest where their intervals part
    host_join_rate: float | None = None
    memory_speed_gbs: float | None = None
    host_state_rounds: int | None = None
    host_slow_rounds: int | None = None
    host_state_moved: float | None = None
    #: order-statistic 95% intervals of the percentiles (None: too few requests)
    latency_p50_low_ms: float | None = None
    latency_p50_high_ms: float | None = None
    latency_p90_low_ms: float | None = None
    latency_p90_high_ms: float | None = None
    latency_p99_low_ms: float | None = None
    latency_p99_high_ms: float | None = None
    #: where a re-run on this host is expected to land (measure/history.py), set after
    #: the measurement from the host's spread between sittings
    throughput_rerun_low: float | None = None
    throughput_rerun_high: float | None = None
    speedup_rerun_low: float | None = None
    speedup_rerun_high: float | None = None
    rerun_sd: float | None = None
    rerun_df: float | None = None
    #: energy_j_per_sample and power_w (total and per RAPL domain), where RAPL is readable
    energy: dict = field(default_factory=dict)
    #: every request's time in ms, in order, where the protocol keeps them (the paper's)
    times_ms: list[float] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Window:
    """One window of one engine: requests and samples completed, seconds they took."""

    requests: int
    samples: int
    seconds: float
    #: the process's CPU seconds over the window (every thread: the engine's pool, spinning
    #: included); ``None`` where it was not read
    cpu_s: float | None = None
    #: the seconds the process's threads together waited to run (runnable, no core free:
    #: the kernel's run delay, /proc/self/task/*/schedstat); ``None`` where not readable
    wait_s: float | None = None
    #: CPU seconds other processes and the hypervisor (steal) took during the window, from
    #: /proc/stat less this process's own (tick-grained: 10 ms); ``None`` where not readable
    other_s: float | None = None
    #: the wall clock (seconds since the epoch) at its start: to set it beside what the host
    #: logged at that time (the windows log, ``MLFLOW_NGRAPH_WINDOWS_LOG``)
    began: float | None = None

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else math.nan


#: what reading one request's latency costs the thread that starts requests (OpenVINO: two
#: calls into the runtime), and the share of a request's time that reading may take: the
#: harness reads one request in ``every`` so that the reads stay under that share
LATENCY_READ_COST_S = 2e-6
LATENCY_READ_SHARE = 0.01


class Meter:
    """One prepared engine at one batch size, warmed up once, then measured window by
    window. It keeps every window's latencies and resource usage for :meth:`summary`."""

    def __init__(
        self, engine: Engine, batch_size: int, settings: MeasureSettings, gpu: bool = False
    ) -> None:
        self.engine = engine
        self.batch_size = batch_size
        self.scenario = settings.scenario
        self.plan = _plan(engine, settings.scenario)
        self.sampler = ResourceSampler(gpu=gpu)
        self.windows: list[Window] = []
        #: each window's per-request latencies (empty where the runtime gives none)
        self.window_latencies: list[list[float]] = []
        self._warm(settings.warmup)

    def _warm(self, warmup: int) -> None:
        clock = time.perf_counter
        began = clock()
        for _ in range(warmup):
            self.plan.step()
        self.engine.synchronize()
        if warmup:
            self.plan.tune((clock() - began) / (warmup * self.plan.per_rep))
        self.plan.collected.clear()

    def window(self, seconds: float) -> Window:
        """Run the engine for at least ``seconds`` (at least one call) and return what it
        completed."""
        plan, clock = self.plan, time.perf_counter
        plan.collected.clear()
        steps: list[float] = []
        self.sampler.begin()
        wait0 = run_delay_s()
        cpu0 = time.process_time()
        wall = time.time()
        began = last = clock()
        calls = 0
        while True:
            plan.step()
            calls += 1
            if calls == 1 and plan.source == "runtime":
                # the first starts read requests that ran before this window (or never)
                plan.collected.clear()
            now = clock()
            steps.append(now - last)
            last = now
            if now - began >= seconds:
                break
        self.engine.synchronize()  # requests in flight are the window's
        end = clock()
        cpu_s = time.process_time() - cpu0
        wait1 = run_delay_s()
        self.sampler.end()
        requests = calls * plan.per_rep
        wait_s = wait1 - wait0 if wait0 is not None and wait1 is not None else None
        window = Window(
            requests,
            requests * self.batch_size,
            end - began,
            cpu_s,
            wait_s,
            self.sampler.last_other_s,
            wall,
        )
        self.windows.append(window)
        self.window_latencies.append(list(plan.latencies(began, steps) or ()))
        return window

    def latencies_ms(self, kept: list[int] | None = None) -> list[float]:
        """The per-request latencies in ms of the windows ``kept`` (every window's when
        ``None``): the percentiles rest on the same windows as the throughput."""
        chosen = (
            self.window_latencies
            if kept is None
            else [self.window_latencies[i] for i in kept if i < len(self.window_latencies)]
        )
        return [1000.0 * t for per_window in chosen for t in per_window]


_TASKS = "/proc/self/task"


def run_delay_s() -> float | None:
    """The seconds this process's threads have waited to run so far (runnable, no core
    free: the second field of each thread's /proc/self/task/<tid>/schedstat), ``None``
    where the kernel does not give it. A thread that ended between two readings takes its
    wait with it: the windows' engines keep their pools for their whole life."""
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    total = 0
    read = False
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[1])
            read = True
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9 if read else None


@dataclass
class _Plan:
    """How the harness drives an engine in a scenario, and where per-request latencies come
    from: ``repetitions`` (the latency scenario: a step is one request), ``stamps`` (a
    one-slot host engine stamps each request's end), ``runtime`` (the runtime's own
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

    def latencies(self, began: float, steps_s: list[float]) -> list[float] | None:
        if self.source == "repetitions":
            return steps_s
        if self.source == "stamps" and self.collected:
            ends = np.asarray(self.collected)
            return np.diff(ends, prepend=began).tolist()
        if self.source == "runtime" and self.collected:
            return list(self.collected)
        return None


def _plan(engine: Engine, scenario: str) -> _Plan:
    """Requests per call, the call, and how per-request latencies are read."""
    if scenario == "latency":
        return _Plan(1, engine.infer, "repetitions")
    slots = max(1, engine.parallel_requests)
    if slots == 1:
        per_rep = _calibrate(engine)
        if engine.asynchronous_device:  # requests pipeline on the device queue
            return _Plan(per_rep, lambda: engine.run_many(per_rep))
        return _Plan(per_rep, engine.run_many, "stamps")
    start_many = getattr(engine, "start_many", None)
    if start_many is not None:  # never drained inside a window: one round of the slots a call
        return _Plan(slots, start_many, "runtime")
    per_rep = slots * REQUESTS_PER_SLOT
    return _Plan(per_rep, lambda: engine.run_many(per_rep))


def _calibrate(engine: Engine) -> int:
    """Requests per call for a one-slot engine: enough to last ``MIN_REPETITION_S``, from
    the fastest of up to ``CALIBRATION_CALLS`` single requests (outside the windows)."""
    clock = time.perf_counter
    fastest_s = math.inf
    for _ in range(CALIBRATION_CALLS):
        t0 = clock()
        engine.run_many(1)
        fastest_s = min(fastest_s, clock() - t0)
        if fastest_s >= MIN_REPETITION_S:
            return 1
    return max(1, min(MAX_REQUESTS_PER_REPETITION, math.ceil(MIN_REPETITION_S / fastest_s)))


def measure(
    engine: Engine, batch_size: int, settings: MeasureSettings, gpu: bool = False, policy=None
) -> Measurement:
    """Measure one engine alone: warm up, then windows back to back until the stop rule of
    :mod:`~mlflow_ngraph.measure.rounds` holds (the same statistics as interleaved rounds,
    without a baseline to pair with).

    The engine must already be prepared (``engine.prepare(inputs)``).
    """
    from mlflow_ngraph.measure.rounds import RoundPolicy, run_rounds

    meter = Meter(engine, batch_size, settings, gpu)
    results = run_rounds({"engine": meter}, settings, None, policy or RoundPolicy())
    return finish(meter, results["engine"])


def finish(meter: Meter, figures) -> Measurement:
    """The measurement of ``meter`` from its windows and the figures the rounds computed
    (:class:`mlflow_ngraph.measure.rounds.Figures`)."""
    from mlflow_ngraph.measure.energy import energy_metrics

    latencies = meter.latencies_ms(figures.kept)
    lat = summarize(latencies) if latencies else None
    percentile = percentile_intervals(latencies)
    usage = meter.sampler.result()
    meter.sampler.close()
    samples = sum(w.samples for w in meter.windows)
    return Measurement(
        scenario=meter.scenario,
        batch_size=meter.batch_size,
        requests_per_repetition=meter.plan.per_rep,
        repetitions=sum(w.requests for w in meter.windows),
        duration_s=sum(w.seconds for w in meter.windows),
        stop_reason=figures.stop_reason,
        throughput=figures.throughput,
        throughput_std=figures.throughput * figures.cv,
        throughput_overall=figures.throughput,
        cv=figures.cv,
        throughput_ci_low=figures.ci[0] if figures.ci else None,
        throughput_ci_high=figures.ci[1] if figures.ci else None,
        **latency_and_usage(lat, usage),
        windows=len(meter.windows),
        window_s=figures.window_s,
        throughput_halfwidth=figures.halfwidth,
        latency_samples=lat.count if lat else 0,
        interleaved=float(figures.interleaved),
        host_drift=figures.drift,
        speedup_moved=figures.moved,
        speedup_paired=figures.speedup,
        speedup_ci_low=figures.speedup_ci[0] if figures.speedup_ci else None,
        speedup_ci_high=figures.speedup_ci[1] if figures.speedup_ci else None,
        speedup_halfwidth=figures.speedup_halfwidth,
        stretched=figures.stretched,
        windows_disturbed=figures.disturbed,
        rounds=figures.rounds,
        speedup_rounds=figures.speedup_rounds,
        throughput_autocorr=figures.throughput_autocorr,
        speedup_autocorr=figures.speedup_autocorr,
        drift_checked=float(figures.drift_checked) if figures.speedup is not None else None,
        throughput_unscreened=figures.throughput_unscreened,
        speedup_unscreened=figures.speedup_unscreened,
        **_state_of(figures),
        **percentile,
        energy=energy_metrics(usage.energy_j, samples, usage.wall_s),
    )


def _state_of(figures) -> dict:
    """The host probe's fields of a measurement (none where the host was not read)."""
    from mlflow_ngraph.measure.hostprobe import READING_METRIC

    if not getattr(figures, "state_rounds", 0) or figures.state_kind not in READING_METRIC:
        return {}
    return {
        READING_METRIC[figures.state_kind]: figures.state_reading,
        "host_state_rounds": figures.state_rounds,
        "host_slow_rounds": figures.state_slow_rounds,
        "host_state_moved": figures.state_moved,
    }


def latency_and_usage(lat, usage) -> dict:
    """The latency summary ``lat`` (None: no per-request times) and what the sampler read
    over the measurement, as :class:`Measurement` fields."""
    host = usage.host
    return {
        "latency_mean_ms": lat.mean if lat else None,
        "latency_std_ms": lat.std if lat else None,
        "latency_p50_ms": lat.median if lat else None,
        "latency_p90_ms": lat.p90 if lat else None,
        "latency_p99_ms": lat.p99 if lat and lat.count >= P99_MIN_SAMPLES else None,
        "cpu_percent": usage.cpu_percent,
        "peak_rss_mb": usage.peak_rss_mb,
        "gpu": usage.gpu,
        "host_other_cpu_percent": host.other_cpu_percent,
        "host_steal_percent": host.steal_percent,
        "host_load_avg": host.load_avg,
        "cpu_freq_mhz": host.cpu_freq_mhz,
        "cpu_throttle_events": host.throttle_events,
    }


#: the fewest requests with a distribution-free 95% interval for the 99th percentile (the
#: largest of 299 values lies above it with probability 1 - 0.99**299 = 0.95): below it
#: p99 is not reported (p50 and p90 still are)
P99_MIN_SAMPLES = 299


def quantile_interval(sorted_values, q: float, confidence: float = 0.95):
    """The distribution-free ``confidence`` interval of the ``q`` quantile: two order
    statistics of the sorted values, chosen from the binomial law of how many fall below
    it (each side at most (1 - confidence) / 2). Where equal sides would reach past the
    largest value (a high quantile of few values: p99 of 299-367), the largest is the upper
    end and the lower end is as high as the rest of the ``confidence`` allows
    (:func:`_up_to_the_largest`). ``None`` where the values are too few for any."""
    from scipy import stats

    n = len(sorted_values)
    if n == 0:
        return None
    alpha = (1 - confidence) / 2
    lower = int(stats.binom.ppf(alpha, n, q))  # P(B <= lower - 1) < alpha
    upper = int(stats.binom.ppf(1 - alpha, n, q))
    if lower >= 1 and upper >= n:
        return _up_to_the_largest(sorted_values, q, confidence)
    if lower < 1 or upper >= n:
        return None
    return float(sorted_values[lower - 1]), float(sorted_values[upper])


def _up_to_the_largest(sorted_values, q: float, confidence: float):
    """[the r-th smallest, the largest] of ``sorted_values`` with the highest r whose
    interval holds the ``q`` quantile with probability ``confidence``: it misses where
    every value lies below the quantile (q**n) or fewer than r do; ``None`` where the first
    alone exceeds 1 - ``confidence``."""
    from scipy import stats

    n = len(sorted_values)
    room = (1 - confidence) - q**n  # what the lower side may miss
    if room <= 0:
        return None
    below = int(stats.binom.ppf(room, n, q))  # the most values below r: P(B <= r - 1)
    if stats.binom.cdf(below, n, q) > room:  # ... at most room
        below -= 1
    if below < 0:
        return None
    return float(sorted_values[below]), float(sorted_values[-1])


def percentile_intervals(latencies_ms: list[float]) -> dict[str, float | None]:
    """The order-statistic 95% interval of p50, p90 and p99, each where there are enough."""
    out: dict[str, float | None] = {}
    if not latencies_ms:
        return out
    values = np.sort(latencies_ms)
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        interval = quantile_interval(values, q)
        if interval is not None:
            out[f"latency_{name}_low_ms"], out[f"latency_{name}_high_ms"] = interval
    return out
