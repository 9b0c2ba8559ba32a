"""The cores' two speeds at joining: read between rounds, each round's state named against
the host's fast speed, and a figure that parts between the states marked with that cause.

The host here is arithmetic: each round is in the fast or the slow state of a schedule, an
engine's window runs at its rate for that state, and the probe reads the state's speed."""

from __future__ import annotations

import numpy as np
import pytest

from mlflow_ngraph.measure import syncprobe
from mlflow_ngraph.measure.harness import Window
from mlflow_ngraph.measure.rounds import RoundPolicy, moved_with_sync, run_rounds
from mlflow_ngraph.measure.settings import MeasureSettings
from mlflow_ngraph.measure.stability import assess, short_reason
from mlflow_ngraph.measure.syncprobe import SYNC_SLOW, SyncProbe, coordinator_probe, states
from mlflow_ngraph.run.worker import measurement_metrics

FAST, SLOW = 146.0, 89.0  # thousand joins a second: 0.61x, as on the host of measurement.md


class MemoryHost:
    """Rounds in ``slow`` met the slow state; the probe's reads move it from round to round."""

    def __init__(self, slow: set[int]) -> None:
        self.slow, self.round = slow, 0

    def is_slow(self) -> bool:
        return self.round in self.slow


class ScriptedProbe(SyncProbe):
    """The real probe's reference over readings the schedule gives: read k is taken before
    round k (after round k - 1)."""

    def __init__(self, host: MemoryHost) -> None:
        super().__init__()
        self.host, self.reads = host, 0

    def read(self) -> float:
        self.host.round = self.reads
        self.reads += 1
        speed = SLOW if self.host.is_slow() else FAST
        self.readings.append(speed)
        return speed


class StateMeter:
    """An engine whose rate is ``fast`` in the fast state and ``slow`` in the slow one, times
    a little noise of its own."""

    def __init__(self, host: MemoryHost, fast: float, slow: float, seed: int) -> None:
        self.host, self.fast, self.slow = host, fast, slow
        self.rng = np.random.default_rng(seed)

    def window(self, seconds: float) -> Window:
        rate = (self.slow if self.host.is_slow() else self.fast) * self.rng.lognormal(0, 0.02)
        samples = max(1, round(rate * seconds))
        return Window(samples, samples, samples / rate)


def _rounds(host, probe, **meters):
    settings = MeasureSettings(warmup=0, repetitions=1, min_duration_s=0.0)
    policy = RoundPolicy(precision=1e-9)  # to the cap: 40 rounds of 0.1 s
    built = {n: StateMeter(host, *rates, seed=i) for i, (n, rates) in enumerate(meters.items())}
    return run_rounds(built, settings, "identity", policy, probe=probe)


# identity (eager) and two compiled engines: ONNX Runtime's speedup is the state's (1.80x
# fast, 1.46x slow), OpenVINO's is not (2.7x in both: it slows as eager does)
ENGINES = {
    "identity": (100.0, 65.0),
    "onnxruntime": (180.0, 95.0),
    "openvino": (270.0, 175.5),
}


def test_a_speedup_that_is_the_hosts_state_is_found_and_one_that_is_not_is_left_alone():
    host = MemoryHost(slow=set(range(12, 28)))
    figures = _rounds(host, ScriptedProbe(host), **ENGINES)
    ort, ov, identity = figures["onnxruntime"], figures["openvino"], figures["identity"]
    assert ort.sync_rounds == len(ort.sync_readings) >= 40
    # rounds 12-27 met the slow state, and round 11, whose reading after it was slow
    assert ort.sync_slow_rounds == 17
    assert ort.sync_speed == FAST
    assert ort.sync_moved == pytest.approx(95 / 65 / 1.8 - 1, abs=0.03)
    assert ov.sync_moved is None  # the pairing cancels a state both sides slow alike in
    # the baseline is judged on its throughput, which is the state's
    assert identity.sync_moved == pytest.approx(65 / 100 - 1, abs=0.03)


def test_without_a_probe_the_figures_say_nothing_of_the_cores():
    host = MemoryHost(slow=set(range(12, 28)))
    figures = _rounds(host, None, **ENGINES)
    assert figures["onnxruntime"].sync_rounds == 0
    assert figures["onnxruntime"].sync_moved is None


def test_a_state_is_named_only_against_a_fast_speed_the_process_has_seen():
    # a first group wholly in the slow state: no faster reading yet, so no round is slow
    host = MemoryHost(slow=set(range(100)))
    probe = ScriptedProbe(host)
    first = _rounds(host, probe, **ENGINES)["onnxruntime"]
    assert (first.sync_slow_rounds, first.sync_moved) == (0, None)
    # once the process has read the fast state, the same group's rounds are all slow: one
    # state met, so the figure is not split
    probe.readings = [FAST] * 200
    host.round, probe.reads = 0, 0
    again = _rounds(host, probe, **ENGINES)["onnxruntime"]
    assert again.sync_slow_rounds == again.sync_rounds >= 40
    assert again.sync_moved is None


def test_each_side_needs_the_rounds_of_an_interval():
    fast = [Window(100, 100, 1.0)] * 30
    base = [Window(50, 50, 1.0)] * 30
    few = [True] * 5 + [False] * 25  # 5 slow rounds: no signed-rank interval on that side
    assert moved_with_sync(fast, base, few) is None
    assert states([10.0, 30.0, None], None) == [None, None, None]
    assert states([10.0, 30.0, None], 30.0) == [10.0 < SYNC_SLOW * 30.0, False, None]


def test_a_figure_that_parted_between_the_states_is_unstable_for_the_host_and_says_why():
    verdict = assess(0.01, None, what="speedup", sync=(-0.19, 17, 40))
    assert not verdict.stable and verdict.retry and not verdict.own_only
    assert "cores joined at two speeds" in verdict.reason and "17 of 40 rounds" in verdict.reason
    assert short_reason(verdict.reason) == "cores slow -19.0%"
    assert assess(0.01, None, what="speedup", sync=None).stable


def test_the_real_probe_reads_a_speed_and_names_the_fast_one_after_enough_readings(monkeypatch):
    import torch

    threads = torch.get_num_threads()
    probe = SyncProbe(calls=20)
    try:
        torch.set_num_threads(1)  # nothing joins: no reading
        assert probe.read() is None and probe.readings == []
        torch.set_num_threads(2)
        first = probe.read()
        assert first is not None and first > 0
        assert probe.reference() is None
        for _ in range(syncprobe.REFERENCE_MIN):
            probe.read()
    finally:
        torch.set_num_threads(threads)
    assert probe.reference() >= min(probe.readings)
    monkeypatch.setenv(syncprobe.ENV, "0")
    assert coordinator_probe() is None


def test_the_sync_figures_are_logged_with_the_measurement():
    import dataclasses

    from mlflow_ngraph.measure.harness import Measurement

    required = [f.name for f in dataclasses.fields(Measurement) if f.default is dataclasses.MISSING]
    result = Measurement(**{k: 0.0 for k in required if k != "gpu"}, gpu={})
    result.sync_speed, result.sync_rounds = 30.5, 40
    result.sync_slow_rounds, result.sync_moved = 17, -0.19
    metrics = measurement_metrics(result)
    assert metrics["sync_slow_rounds"] == 17 and metrics["sync_moved"] == -0.19
    assert metrics["sync_speed"] == 30.5


def test_each_round_keeps_its_state_where_an_engine_has_holes():
    """Holes (rounds an engine did not take, or windows the screen left out) keep their
    place: the states are the rounds', so a figure's windows are judged by their own
    round's reading, not shifted onto another's."""
    rng = np.random.default_rng(3)

    def window(rate):
        rate *= rng.lognormal(0, 0.02)
        return Window(round(rate * 10), round(rate * 10), 10.0)

    slow = [False] * 20 + [True] * 20
    base = [window(100.0 if not s else 65.0) for s in slow]
    engine = [None] * 10 + [window(180.0) for _ in range(10)] + [window(95.0) for _ in range(20)]
    assert moved_with_sync(engine, base, slow) == pytest.approx(95 / 65 / 1.8 - 1, abs=0.03)
    # the throughput of an engine measured alone, with holes in its slow stretch
    alone = [window(100.0) for _ in range(20)] + [None] * 5 + [window(65.0) for _ in range(15)]
    assert moved_with_sync(alone, None, slow) == pytest.approx(-0.35, abs=0.03)


def test_the_measurement_carries_the_figures_sync_and_none_without_a_reading():
    from mlflow_ngraph.measure.harness import _sync_of
    from mlflow_ngraph.measure.rounds import Figures

    figures = Figures(100.0, None, None, 0.0, "precision", 0.1)
    assert _sync_of(figures) == {}
    figures.sync_speed, figures.sync_rounds = 30.0, 40
    figures.sync_slow_rounds, figures.sync_moved = 17, -0.19
    assert _sync_of(figures) == {
        "sync_speed": 30.0,
        "sync_rounds": 40,
        "sync_slow_rounds": 17,
        "sync_moved": -0.19,
    }
