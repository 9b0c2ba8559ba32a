"""The host's two states: read between rounds, each round's state named against the host's
fast state, and a figure that parts between the states marked with that cause.

The host here is arithmetic: each round is in the fast or the slow state of a schedule, an
engine's window runs at its rate for that state, and the probe reads the state's speed."""

from __future__ import annotations

import numpy as np
import pytest

from mlflow_ngraph.measure import hostprobe
from mlflow_ngraph.measure.harness import Window
from mlflow_ngraph.measure.hostprobe import SLOW, JoinProbe, MemoryProbe, coordinator_probe, states
from mlflow_ngraph.measure.rounds import RoundPolicy, moved_with_state, run_rounds
from mlflow_ngraph.measure.settings import MeasureSettings
from mlflow_ngraph.measure.stability import assess, short_reason
from mlflow_ngraph.run.worker import measurement_metrics

FAST_GBS, SLOW_GBS = 32.0, 21.0  # 1.5x apart, as on the host of docs/measurement.md


class StateHost:
    """Rounds in ``slow`` met the slow state; the probe's reads move it from round to round."""

    def __init__(self, slow: set[int]) -> None:
        self.slow, self.round = slow, 0

    def is_slow(self) -> bool:
        return self.round in self.slow


class ScriptedProbe(MemoryProbe):
    """The real probe's reference over readings the schedule gives: read k is taken before
    round k (after round k - 1)."""

    def __init__(self, host: StateHost) -> None:
        super().__init__()
        self.host, self.reads = host, 0

    def _read(self) -> float:
        self.host.round = self.reads
        self.reads += 1
        return SLOW_GBS if self.host.is_slow() else FAST_GBS


class StateMeter:
    """An engine whose rate is ``fast`` in the fast state and ``slow`` in the slow one, times
    a little noise of its own."""

    def __init__(self, host: StateHost, fast: float, slow: float, seed: int) -> None:
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
# fast, 1.46x slow: the attention block's on that host), OpenVINO's is not (2.7x in both)
ENGINES = {
    "identity": (100.0, 65.0),
    "onnxruntime": (180.0, 95.0),
    "openvino": (270.0, 175.5),
}


def test_a_speedup_that_is_the_hosts_state_is_found_and_one_that_is_not_is_left_alone():
    host = StateHost(slow=set(range(12, 28)))
    figures = _rounds(host, ScriptedProbe(host), **ENGINES)
    ort, ov, identity = figures["onnxruntime"], figures["openvino"], figures["identity"]
    assert ort.state_rounds == len(ort.state_readings) >= 40
    # rounds 12-27 met the slow state, and round 11, whose reading after it was slow
    assert ort.state_slow_rounds == 17
    assert ort.state_reading == FAST_GBS
    assert ort.state_moved == pytest.approx(95 / 65 / 1.8 - 1, abs=0.03)
    assert ov.state_moved is None  # the pairing cancels a state both sides slow alike in
    # the baseline is judged on its throughput, which is the state's
    assert identity.state_moved == pytest.approx(65 / 100 - 1, abs=0.03)


def test_without_a_probe_the_figures_say_nothing_of_the_host():
    host = StateHost(slow=set(range(12, 28)))
    figures = _rounds(host, None, **ENGINES)
    assert figures["onnxruntime"].state_rounds == 0
    assert figures["onnxruntime"].state_moved is None


def test_a_state_is_named_only_against_a_fast_speed_the_process_has_seen():
    # a first group wholly in the slow state: no faster reading yet, so no round is slow
    host = StateHost(slow=set(range(100)))
    probe = ScriptedProbe(host)
    first = _rounds(host, probe, **ENGINES)["onnxruntime"]
    assert (first.state_slow_rounds, first.state_moved) == (0, None)
    # once the process has read the fast state, the same group's rounds are all slow: one
    # state met, so the figure is not split
    probe.readings = [FAST_GBS] * 200
    host.round, probe.reads = 0, 0
    again = _rounds(host, probe, **ENGINES)["onnxruntime"]
    assert again.state_slow_rounds == again.state_rounds >= 40
    assert again.state_moved is None


def test_each_side_needs_the_rounds_of_an_interval():
    fast = [Window(100, 100, 1.0)] * 30
    base = [Window(50, 50, 1.0)] * 30
    few = [True] * 5 + [False] * 25  # 5 slow rounds: no signed-rank interval on that side
    assert moved_with_state(fast, base, few) is None
    assert states([10.0, 30.0, None], None) == [None, None, None]
    assert states([10.0, 30.0, None], 30.0) == [10.0 < SLOW * 30.0, False, None]


def test_a_figure_that_parted_between_the_states_is_unstable_for_the_host_and_says_why():
    verdict = assess(0.01, None, what="speedup", state=(-0.19, 17, 40, "join"))
    assert not verdict.stable and verdict.retry and not verdict.own_only
    assert "host ran in two states" in verdict.reason and "17 of 40 rounds" in verdict.reason
    assert "the two threads' meeting read under 75%" in verdict.reason
    assert short_reason(verdict.reason) == "host slow state -19.0%"
    memory = assess(0.01, None, what="speedup", state=(-0.19, 17, 40, "memory")).reason
    assert "the memory's speed read under 75%" in memory
    assert assess(0.01, None, what="speedup", state=None).stable


def test_the_real_probe_reads_a_speed_and_names_the_fast_one_after_enough_readings(monkeypatch):
    probe = MemoryProbe(mb=1)
    first = probe.read()
    assert first is not None and first > 0
    assert probe.reference() is None
    for _ in range(hostprobe.REFERENCE_MIN):
        probe.read()
    assert probe.reference() >= min(probe.readings)
    monkeypatch.setenv(hostprobe.ENV, "off")
    assert coordinator_probe() is None
    monkeypatch.setenv(hostprobe.ENV, "memory")
    assert isinstance(coordinator_probe(), MemoryProbe)
    monkeypatch.delenv(hostprobe.ENV)
    assert isinstance(coordinator_probe(), JoinProbe)  # the default


def test_a_probe_setting_that_is_not_one_is_said_once_and_read_as_the_default(monkeypatch, caplog):
    monkeypatch.setattr(hostprobe, "_said", set())
    monkeypatch.setenv(hostprobe.ENV, "1")  # as the memory probe's old switch was set
    with caplog.at_level("WARNING", logger=hostprobe.__name__):
        assert hostprobe.kind() == "join" and hostprobe.kind() == "join"
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "MLFLOW_NGRAPH_HOST_PROBE=1 is not one of" in said[0]


def test_the_host_state_figures_are_logged_with_the_measurement():
    import dataclasses

    from mlflow_ngraph.measure.harness import Measurement

    required = [f.name for f in dataclasses.fields(Measurement) if f.default is dataclasses.MISSING]
    result = Measurement(**{k: 0.0 for k in required if k != "gpu"}, gpu={})
    result.host_join_rate, result.host_state_rounds = 95_000.0, 40
    result.host_slow_rounds, result.host_state_moved = 17, -0.19
    metrics = measurement_metrics(result)
    assert metrics["host_slow_rounds"] == 17 and metrics["host_state_moved"] == -0.19
    assert metrics["host_join_rate"] == 95_000.0


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
    assert moved_with_state(engine, base, slow) == pytest.approx(95 / 65 / 1.8 - 1, abs=0.03)
    # the throughput of an engine measured alone, with holes in its slow stretch
    alone = [window(100.0) for _ in range(20)] + [None] * 5 + [window(65.0) for _ in range(15)]
    assert moved_with_state(alone, None, slow) == pytest.approx(-0.35, abs=0.03)


def test_the_measurement_carries_the_figures_host_state_and_none_without_a_reading():
    from mlflow_ngraph.measure.harness import _state_of
    from mlflow_ngraph.measure.rounds import Figures

    figures = Figures(100.0, None, None, 0.0, "precision", 0.1)
    assert _state_of(figures) == {}
    figures.state_reading, figures.state_rounds, figures.state_kind = 30.0, 40, "memory"
    figures.state_slow_rounds, figures.state_moved = 17, -0.19
    assert _state_of(figures) == {
        "memory_speed_gbs": 30.0,
        "host_state_rounds": 40,
        "host_slow_rounds": 17,
        "host_state_moved": -0.19,
    }


def test_the_join_is_read_through_pytorchs_pool_and_not_where_nothing_meets():
    """The join rate reads PyTorch's intra-op pool where the process has one (a worker);
    a pool of one thread has nothing to meet, and a process without PyTorch (the
    coordinator) reads nothing rather than importing it."""
    import sys

    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        rate = hostprobe.join_rate(adds=20)
        assert rate is not None and rate > 100  # adds per second: each is microseconds
        torch.set_num_threads(1)
        assert hostprobe.join_rate(adds=20) is None
    finally:
        torch.set_num_threads(threads)
    saved = sys.modules.pop("torch")
    try:
        assert hostprobe.join_rate(adds=20) is None
        assert "torch" not in sys.modules
    finally:
        sys.modules["torch"] = saved
    probe = JoinProbe().through(lambda: 120_000.0)
    assert probe.read() == 120_000.0 and probe.readings == [120_000.0]
    assert JoinProbe().through(lambda: None).read() is None
