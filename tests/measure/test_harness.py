"""The shared harness: request counts per scenario, stop reasons, and how throughput is derived.

Real engines (eager PyTorch, OpenVINO) on tiny models; no assertion depends on how fast the
machine is, only on the structure of what the harness did and on arithmetic identities.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from mlflow_ngraph.compilers._torch import TorchCallableEngine
from mlflow_ngraph.compilers.base import CompileContext, Engine
from mlflow_ngraph.compilers.registry import get_compiler
from mlflow_ngraph.measure.harness import (
    CALIBRATION_CALLS,
    MAX_REQUESTS_PER_REPETITION,
    MIN_REPETITION_S,
    P99_MIN_SAMPLES,
    REQUESTS_PER_SLOT,
    measure,
    quantile_interval,
)
from mlflow_ngraph.measure.rounds import RoundPolicy
from mlflow_ngraph.measure.settings import MeasureSettings
from mlflow_ngraph.models.registry import load_model

BATCH = 2


@pytest.fixture(scope="module")
def model():
    return load_model("conv_block", {"width": 8, "depth": 1, "image_size": 16})


class CountingEngine(TorchCallableEngine):
    """Eager PyTorch that records how the harness drives it."""

    def __init__(self, module, parallel_requests: int = 1) -> None:
        super().__init__(module, "cpu")
        self.parallel_requests = parallel_requests
        self.infer_calls = 0
        self.run_many_counts: list[int] = []

    def infer(self) -> None:
        self.infer_calls += 1
        super().infer()

    def run_many(self, count: int, stamps=None) -> None:
        self.run_many_counts.append(count)
        super().run_many(count, stamps)


class StreamingEngine(CountingEngine):
    """Adds ``start_many``, the call that leaves requests in flight across repetitions."""

    def __init__(self, module, parallel_requests: int = 1) -> None:
        super().__init__(module, parallel_requests)
        self.start_many_counts: list[int] = []
        self.synchronize_calls = 0

    def start_many(self, count: int, latencies=None, every: int = 1) -> None:
        import torch

        self.start_many_counts.append(count)
        with torch.inference_mode():
            for _ in range(count):
                self.fn(self._input)

    def synchronize(self) -> None:
        self.synchronize_calls += 1


def counting_engine(model, parallel_requests: int = 1, kind=CountingEngine) -> CountingEngine:
    engine = kind(model.module, parallel_requests)
    engine.prepare(model.random_input(BATCH))
    return engine


def settings(**kwargs) -> MeasureSettings:
    base = {"warmup": 2, "repetitions": 5, "min_duration_s": 0.0}
    return MeasureSettings(**{**base, **kwargs})


#: short windows and few rounds keep these tests fast; the defaults are tested in test_rounds
# the screen off: a 10 ms window that a busy host stretches past 50 ms would be judged
FAST = RoundPolicy(window_s=0.01, min_rounds=3, precision=0.5, screen=False)


def run(engine, scenario="throughput", policy=FAST, **kwargs):
    return measure(engine, BATCH, settings(scenario=scenario, **kwargs), policy=policy)


def test_throughput_scenario_runs_every_call_through_run_many(model):
    engine = counting_engine(model, parallel_requests=3)
    result = run(engine)
    per_rep = 3 * REQUESTS_PER_SLOT
    assert result.requests_per_repetition == per_rep
    assert engine.run_many_counts == [per_rep] * (2 + result.repetitions // per_rep)
    assert result.repetitions % per_rep == 0
    assert engine.infer_calls == 0


def test_one_slot_engine_is_calibrated_before_the_warm_up(model):
    """Up to CALIBRATION_CALLS single requests, then every call the same count."""
    engine = counting_engine(model, parallel_requests=1)
    result = run(engine)
    per_rep, calls = result.requests_per_repetition, engine.run_many_counts
    measured_calls = result.repetitions // per_rep
    calibration = calls[: len(calls) - 2 - measured_calls]
    assert 1 <= len(calibration) <= CALIBRATION_CALLS
    assert set(calibration) == {1}
    assert calls[len(calibration) :] == [per_rep] * (2 + measured_calls)
    assert 1 <= per_rep <= MAX_REQUESTS_PER_REPETITION
    assert engine.infer_calls == 0


class SlowEngine(CountingEngine):
    """Every request lasts at least MIN_REPETITION_S."""

    def run_many(self, count: int, stamps=None) -> None:
        time.sleep(MIN_REPETITION_S * count)
        super().run_many(count, stamps)


def test_one_slot_engine_slower_than_a_call_runs_one_request_each(model):
    engine = counting_engine(model, parallel_requests=1, kind=SlowEngine)
    result = run(engine)
    assert result.requests_per_repetition == 1
    assert engine.run_many_counts == [1] * (1 + 2 + result.repetitions)  # one calibration call


def test_an_engine_that_can_stream_is_drained_once_per_window(model):
    """Calls follow each other with requests in flight; one drain ends each window, and a
    call starts one request per slot (not eight: the paper's unit is one inference)."""
    engine = counting_engine(model, parallel_requests=2, kind=StreamingEngine)
    result = run(engine)
    assert result.requests_per_repetition == 2
    assert engine.start_many_counts == [2] * (2 + result.repetitions // 2)
    assert engine.run_many_counts == []
    assert engine.synchronize_calls == 1 + result.windows  # after the warm-up, each window


def test_one_slot_engine_is_not_streamed(model):
    engine = counting_engine(model, parallel_requests=1, kind=StreamingEngine)
    run(engine)
    assert engine.start_many_counts == []


def test_latency_scenario_times_one_infer_per_request(model):
    engine = counting_engine(model, parallel_requests=3)
    result = run(engine, scenario="latency")
    assert result.requests_per_repetition == 1
    assert engine.run_many_counts == []
    assert engine.infer_calls == 2 + result.repetitions
    assert result.latency_samples == result.repetitions


@pytest.mark.serial
@pytest.mark.parametrize("scenario", ["throughput", "latency"])
def test_throughput_is_samples_over_measured_seconds(model, scenario):
    """Not the mean of per-window rates, which over-reports whenever windows vary."""
    engine = counting_engine(model, parallel_requests=1)
    result = run(engine, scenario=scenario, repetitions=20)
    samples = result.repetitions * BATCH
    assert result.throughput == pytest.approx(samples / result.duration_s, rel=1e-9)
    assert result.throughput_overall == result.throughput
    # one request at a time: the mean per-request latency and the throughput describe the
    # same windows (the stamps miss only the harness's last clock read of each window)
    assert result.throughput == pytest.approx(BATCH / (result.latency_mean_ms / 1000), rel=2e-2)


class BurstyEngine(CountingEngine):
    """One request in ten takes 20 ms, the others 1 ms."""

    def __init__(self, module, parallel_requests: int = 1) -> None:
        super().__init__(module, parallel_requests)
        self.requests = 0

    def infer(self) -> None:
        self.requests += 1
        time.sleep(0.02 if self.requests % 10 == 0 else 0.001)

    def run_many(self, count: int, stamps=None) -> None:
        self.run_many_counts.append(count)
        Engine.run_many(self, count, stamps)  # the base loop: infer() per request


@pytest.mark.serial
def test_throughput_percentiles_are_per_request(model):
    """A window's mean would hide the slow request: p50 near 1 ms, the upper end of p90's
    interval at 20 ms. p99 is not reported from fewer than 299 requests: no
    distribution-free 95% interval for it exists below that."""
    engine = counting_engine(model, parallel_requests=1, kind=BurstyEngine)
    result = run(engine, repetitions=60, warmup=0)
    assert result.requests_per_repetition == 1  # each 1 ms request fills a call
    assert 0.9 < result.latency_p50_ms < 10
    assert result.latency_p50_low_ms <= result.latency_p50_ms <= result.latency_p50_high_ms
    assert result.latency_p90_high_ms > 19
    assert result.latency_samples == result.repetitions < P99_MIN_SAMPLES
    assert result.latency_p99_ms is None


def test_a_percentile_interval_holds_95_percent_and_needs_enough_values():
    rng = np.random.default_rng(4)
    true_p90 = -math.log(0.1)  # of the exponential law
    held = 0
    for _ in range(400):
        interval = quantile_interval(np.sort(rng.exponential(1.0, 200)), 0.9)
        held += interval[0] <= true_p90 <= interval[1]
    assert held / 400 >= 0.94
    assert quantile_interval(np.sort(rng.exponential(1.0, 298)), 0.99) is None
    assert quantile_interval(np.sort(rng.exponential(1.0, 1000)), 0.99) is not None


def test_a_p99_of_too_few_values_for_equal_sides_reaches_the_largest_and_holds_95_percent():
    """From 299 values (where p99 is first reported) to 367 the equal-sided interval would
    reach past the largest value: the largest is its upper end, its lower end as high as
    95% allows, and it holds the true p99 at least 95% of the time."""
    rng = np.random.default_rng(5)
    true_p99 = -math.log(0.01)
    for n in (299, 330, 367):
        held, trials = 0, 2000
        for _ in range(trials):
            values = np.sort(rng.exponential(1.0, n))
            low, high = quantile_interval(values, 0.99)
            assert high == values[-1] and low < high
            held += low <= true_p99 <= high
        assert held / trials >= 0.94, n
    low, _ = quantile_interval(np.arange(1.0, 300.0), 0.99)  # 299 values
    assert 285 <= low <= 292  # about the tenth largest: exact, not the smallest


def test_overlapping_requests_have_no_percentiles(model):
    """Several requests in flight without a per-request timer: no latency is reported
    rather than the inverse throughput under its name."""
    engine = counting_engine(model, parallel_requests=2)
    result = run(engine)
    assert result.latency_p50_ms is None and result.latency_p99_ms is None
    assert result.latency_mean_ms is None and result.throughput > 0
    assert result.latency_samples == 0


def test_windows_last_at_least_the_window_length(model):
    engine = counting_engine(model)
    result = run(
        engine, policy=RoundPolicy(window_s=0.05, min_rounds=4, precision=0.5, screen=False)
    )
    assert result.windows >= 4
    assert result.duration_s >= 0.05 * result.windows
    assert result.window_s == 0.05


@pytest.mark.serial
def test_repetitions_are_a_floor_of_requests(model):
    """``--repetitions 100`` counts the paper's unit: 100 inferences, not 100 calls."""
    engine = counting_engine(model, parallel_requests=1, kind=SlowEngine)
    result = run(engine, repetitions=30, policy=RoundPolicy(0.001, 3, precision=10.0, screen=False))
    assert 30 <= result.repetitions < 30 + 3


def test_stop_reason_precision(model):
    result = run(
        counting_engine(model),
        repetitions=1,
        policy=RoundPolicy(0.01, 3, precision=1e9, screen=False),
    )
    assert result.stop_reason == "precision" and result.windows == 3


def test_stop_reason_max_duration_caps_the_count(model):
    result = run(counting_engine(model), repetitions=10**9, max_duration_s=1e-9)
    assert (result.stop_reason, result.windows) == ("max_duration", 1)
    assert result.throughput_ci_low is None  # one window: no interval


@pytest.mark.e2e
def test_openvino_throughput_keeps_every_infer_request_busy(model, tmp_path):
    """The OpenVINO engine is measured with its optimal number of requests in flight, and
    its queue is drained once per window, not once per repetition."""
    pytest.importorskip("openvino")
    from mlflow_ngraph.compilers.openvino import OpenVinoEngine

    class Recording(OpenVinoEngine):
        def __init__(self, compiled, device) -> None:
            super().__init__(compiled, device)
            self.calls: list[str] = []

        def start_many(self, count: int, latencies=None, every: int = 1) -> None:
            self.calls.append("start_many")
            super().start_many(count, latencies, every)

        def run_many(self, count: int, stamps=None) -> None:
            self.calls.append("run_many")
            super().run_many(count, stamps)

        def synchronize(self) -> None:
            self.calls.append("synchronize")
            super().synchronize()

    compiler = get_compiler("openvino")
    ctx = CompileContext(
        workdir=tmp_path, device="cpu", batch_size=BATCH, cache_dir=tmp_path, scenario="throughput"
    )
    compiled = compiler.compile(model, compiler.resolve_flags({}), ctx)
    engine = Recording(compiled.compiled, compiled.device)
    engine.prepare(model.random_input(BATCH))
    try:
        result = run(engine, repetitions=3)
        assert all(request.wait_for(0) for request in engine.queue)  # nothing left running
    finally:
        engine.close()
    slots = engine.parallel_requests
    if slots > 1:
        assert result.requests_per_repetition == slots
        assert engine.calls[:3] == ["start_many"] * 2 + ["synchronize"]
        windows = "".join("S" if c == "synchronize" else "s" for c in engine.calls[3:])
        assert windows.count("S") == result.windows and windows.endswith("S")
        assert "SS" not in windows and not windows.startswith("S")
    assert result.throughput * result.duration_s == pytest.approx(
        result.repetitions * BATCH, rel=1e-9
    )
    # per-request latencies from the runtime's own timer, under full load
    assert 0 < result.latency_p50_ms <= result.latency_p90_ms
