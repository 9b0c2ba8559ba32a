"""The paper's protocol (measure/paper.py): exactly N timed single inferences after W
warm-ups, the mean and standard deviation of b / t_i, every t_i kept.

Eager PyTorch on a tiny model, counted; the figures' arithmetic on given times. No assertion
depends on how fast the machine is.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.measure.paper import STOP_REASON, measure_paper, rate_figures
from mlflow_ngraph.measure.settings import MeasureSettings
from mlflow_ngraph.models.registry import load_model
from tests.measure.test_harness import BATCH, CountingEngine


@pytest.fixture(scope="module")
def model():
    return load_model("conv_block", {"width": 8, "depth": 1, "image_size": 16})


class SyncCounting(CountingEngine):
    """Counts the synchronisations too: one must close each timed request."""

    def __init__(self, module) -> None:
        super().__init__(module)
        self.events: list[str] = []

    def infer(self) -> None:
        self.events.append("infer")
        super().infer()

    def synchronize(self) -> None:
        self.events.append("sync")


def test_exactly_the_requests_asked_each_timed_alone(model):
    engine = SyncCounting(model.module)
    engine.prepare(model.random_input(BATCH))
    settings = MeasureSettings(scenario="latency", warmup=4, repetitions=37, protocol="paper")
    result = measure_paper(engine, BATCH, settings)
    # the warm-up, then each timed request, each closed by the device's synchronisation
    assert engine.infer_calls == 4 + 37
    collapsed = [e for i, e in enumerate(engine.events) if i == 0 or e != engine.events[i - 1]]
    assert collapsed == ["sync"] + ["infer", "sync"] * (4 + 37)
    assert engine.run_many_counts == []  # no request batched into a call
    assert result.repetitions == 37 and result.requests_per_repetition == 1
    assert result.latency_samples == 37 and len(result.times_ms) == 37
    assert result.stop_reason == STOP_REASON
    # the figures are those of the kept times: nothing screened, nothing left out
    figures = rate_figures([t / 1000 for t in result.times_ms], BATCH)
    assert result.throughput == pytest.approx(figures["throughput"])
    assert result.throughput_std == pytest.approx(figures["std"])
    assert result.duration_s == pytest.approx(sum(result.times_ms) / 1000)
    assert result.latency_p99_ms is None  # 37 requests give no p99 interval, nor a p99
    assert result.latency_p50_ms == pytest.approx(float(np.median(result.times_ms)))


def test_the_paper_figure_is_the_mean_of_the_rates_not_the_rate_of_the_mean():
    times = [0.010, 0.010, 0.020, 0.010, 0.040, 0.010, 0.010, 0.020, 0.010, 0.010]
    b = 8
    got = rate_figures(times, b)
    rates = [b / t for t in times]
    assert got["throughput"] == pytest.approx(np.mean(rates))
    assert got["std"] == pytest.approx(np.std(rates, ddof=1))
    assert got["overall"] == pytest.approx(b * len(times) / sum(times))
    assert got["throughput"] > got["overall"]  # the Jensen gap, here large
    # a Student-t interval of the mean (these times show no autocorrelation to widen for)
    half = 2.2621571627409915 * np.std(rates, ddof=1) / math.sqrt(len(times))
    assert got["ci"] == pytest.approx((np.mean(rates) - half, np.mean(rates) + half))
    assert got["halfwidth"] == pytest.approx(half / np.mean(rates))


def test_autocorrelated_requests_widen_the_interval():
    rng = np.random.default_rng(3)
    independent = 0.01 * np.exp(0.05 * rng.standard_normal(200))
    drifting = np.sort(independent)  # the same times, a slow drift: lag-1 near 1
    a, b = rate_figures(independent, 1), rate_figures(drifting, 1)
    assert a["std"] == pytest.approx(b["std"])
    assert b["autocorr"] > 0.9
    assert b["halfwidth"] > 2 * a["halfwidth"]


def test_the_protocol_is_checked_with_the_settings():
    with pytest.raises(NgraphError, match="is not one of: rounds, paper"):
        MeasureSettings(protocol="pyperf").validate()
    with pytest.raises(NgraphError, match="--scenario latency"):
        MeasureSettings(protocol="paper").validate()
    MeasureSettings(scenario="latency", protocol="paper").validate()


def test_the_default_protocol_keeps_the_keys_of_earlier_runs():
    rounds = MeasureSettings()
    assert "protocol" not in rounds.key()
    assert MeasureSettings(scenario="latency", protocol="paper").key()["protocol"] == "paper"
