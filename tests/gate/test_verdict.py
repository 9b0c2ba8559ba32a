"""The gate's verdict, interval and reports: pure logic, no process."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

import pytest

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.gate.gate import GateSettings, planted_delay
from mlflow_ngraph.gate.report import headline, render
from mlflow_ngraph.gate.sides import parse_kind
from mlflow_ngraph.gate.verdict import EXIT_STATUS, decide, percent, widened
from mlflow_ngraph.variables import ENV_GATE_PLANTED_DELAY


@pytest.mark.parametrize(
    ("low", "high", "verdict"),
    [
        (0.98, 1.02, "same"),
        (0.97, 1.03, "same"),
        (0.88, 0.95, "slower"),
        (0.94, 0.99, "unsure"),  # may be a regression beyond 3%, or not
        (1.05, 1.09, "faster"),
        (1.01, 1.06, "faster"),  # beyond noise faster, cannot be slower at all
        (0.99, 1.06, "unsure"),  # straddles 1 and leaves the band
        (0.80, 1.20, "unsure"),
        (None, None, "unsure"),
    ],
)
def test_the_verdict_of_an_interval(low, high, verdict):
    assert decide(low, high, 0.03) == verdict


def test_exit_statuses_are_what_ci_reads():
    assert EXIT_STATUS == {"faster": 0, "same": 0, "slower": 1, "unsure": 2}


def test_the_host_spread_widens_the_interval_and_none_leaves_it():
    assert widened(1.0, (0.98, 1.02), None) == (0.98, 1.02)
    low, high = widened(1.0, (0.98, 1.02), 0.02, 30)
    assert low < 0.98 and high > 1.02
    assert math.isclose(math.log(high), -math.log(low), rel_tol=1e-9)


def _result(verdict="slower", **extra):
    side = {"label": "a@onnxruntime", "throughput": 100.0, "runtime": "ort 1", "python": "3.11"}
    return {
        "verdict": verdict, "ratio": 0.9, "low": 0.88, "high": 0.92, "tolerance": 0.03,
        "rounds": 40, "seconds": 9.0, "champion": side, "challenger": dict(side),
        "outputs": {"valid": True, "reason": ""}, "interval_kind": "sitting", **extra,
    }  # fmt: skip


def test_every_format_says_the_verdict():
    result = _result()
    assert headline(result).startswith("slower: the challenger's throughput -10.0%")
    assert json.loads(render(result, "json"))["verdict"] == "slower"
    assert "**slower**" in render(result, "markdown")
    suite = ET.fromstring(render(result, "junit"))
    assert suite.get("failures") == "1" and suite.find("testcase/failure") is not None
    unsure = ET.fromstring(render(_result("unsure"), "junit"))
    assert unsure.get("skipped") == "1" and unsure.get("failures") == "0"
    assert "TEST ONLY" in render(_result(planted_delay=0.1), "text")
    assert percent(None) == "n/a"


def test_a_side_of_no_known_form_is_one_line():
    with pytest.raises(NgraphError, match="is not a registered model"):
        parse_kind("resnet18")
    assert parse_kind("models:/m@cpu") == "registered"
    assert parse_kind("runs:/abc") == "run"
    assert parse_kind("conv_block:width=8@onnxruntime") == "spec"


def test_settings_and_the_planted_delay_are_checked(tmp_path, monkeypatch):
    with pytest.raises(NgraphError, match="--tolerance"):
        GateSettings("a@b", "a@b", "sqlite://", tmp_path, tolerance=3)
    with pytest.raises(NgraphError, match="--budget"):
        GateSettings("a@b", "a@b", "sqlite://", tmp_path, budget_s=0)
    monkeypatch.delenv(ENV_GATE_PLANTED_DELAY, raising=False)
    assert planted_delay() == 0.0
    monkeypatch.setenv(ENV_GATE_PLANTED_DELAY, "x")
    with pytest.raises(NgraphError, match=ENV_GATE_PLANTED_DELAY):
        planted_delay()


def test_promote_needs_an_alias_and_a_version_of_the_same_model():
    from mlflow_ngraph.gate.record import check_promotable
    from mlflow_ngraph.gate.sides import Side

    champion = Side("champion", "models:/m@cpu", "registered", name="m", version="1", alias="cpu")
    check_promotable(champion, Side("challenger", "models:/m/2", "registered", name="m"))
    with pytest.raises(NgraphError, match="--promote"):
        check_promotable(champion, Side("challenger", "x@onnxruntime", "spec"))
    with pytest.raises(NgraphError, match="models:/NAME@ALIAS"):
        check_promotable(Side("champion", "x@onnxruntime", "spec"), champion)


class _Clock:
    """A clock that advances only when read (1 us a read) or when the fake engine runs."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1e-6
        return self.now


class _Engine:
    def __init__(self, clock: _Clock, call_s: float) -> None:
        self.clock, self.call_s, self.synced = clock, call_s, 0

    def run_many(self, k: int) -> None:
        self.clock.now += k * self.call_s

    def synchronize(self) -> None:
        self.clock.now += 0.002  # requests in flight: the window's too
        self.synced += 1


def test_the_planted_delay_stretches_each_window_by_its_fraction():
    from mlflow_ngraph.gate.worker import Delayed

    clock = _Clock()
    inner = _Engine(clock, 1e-3)
    engine = Delayed(inner, 0.1, clock)
    for window in range(3):
        began = clock.now
        for _ in range(100):  # a window of 100 calls of 1 ms, then the harness's sync
            engine.run_many(1)
        own = clock.now + 0.002 - began
        engine.synchronize()
        assert clock.now - began == pytest.approx(1.1 * own, abs=5e-6), window
    assert inner.synced == 3 and engine.began is None
    before = clock.now
    engine.synchronize()  # no call since the last: nothing to stretch
    assert inner.synced == 4 and clock.now - before == pytest.approx(0.002, abs=5e-6)


def test_a_busy_host_is_no_verdict_unless_busy_ok():
    from mlflow_ngraph.gate.gate import HostBusy, look_at_host
    from mlflow_ngraph.measure.quiet import HostCheck, HostLoad

    def busy(seconds: float) -> HostLoad:
        return HostLoad(90.0, 2, 3.5, (("make", 41, 88.0),))

    with pytest.raises(HostBusy) as caught:
        look_at_host(HostCheck(25.0, wait_s=0, sampler=busy, sample_s=0.01))
    assert caught.value.exit_code == EXIT_STATUS["unsure"]
    message = str(caught.value)
    assert "\n" not in message and "make (pid 41)" in message and "--busy-ok" in message
    import logging

    from mlflow_ngraph.commands.gate import gate_host_check

    # the gate's own check, as its command builds it: --busy-ok says what a gate should expect
    check = gate_host_check({"wait_quiet": 0, "busy_ok": True})
    check.sampler, check.sample_s = busy, 0.01
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    quiet_log = logging.getLogger("mlflow_ngraph.measure.quiet")
    quiet_log.addHandler(handler)
    try:
        look_at_host(check)
    finally:
        quiet_log.removeHandler(handler)
    assert len(said) == 1 and "--busy-ok" in said[0] and "unsure" in said[0]
    assert "UNSTABLE" not in said[0]
    assert look_at_host(None) is None
    # busy, measured anyway: the look's words come back, for the verdict to weigh
    check.sampler = busy
    assert "other processes 90% of the CPU" in look_at_host(check)
    check.sampler = lambda seconds: HostLoad(5.0, 2, 0.3, ())
    assert look_at_host(check) is None  # quiet


def test_a_busy_host_costs_a_verdict_not_a_false_alarm():
    """Measured on a busy host, an A/A gate once read 0.789 [0.707, 0.899]: slower beyond
    any tolerance, from two processes of one engine. There a slower verdict stands only
    where the whole interval lies below 1 - BUSY_MARGIN; the note says why it did not."""
    from mlflow_ngraph.gate.verdict import BUSY_MARGIN, on_a_busy_host

    said = "load 5.2, other processes 54% of the CPU"
    verdict, note = on_a_busy_host("slower", 0.899, said)
    assert verdict == "unsure" and said in note and "quieter runner" in note
    assert "\n" not in note
    # twice as slow by construction (the planted delay): still slower
    assert on_a_busy_host("slower", 0.55, said) == ("slower", None)
    assert on_a_busy_host("slower", 1 - BUSY_MARGIN, said)[0] == "unsure"
    for other in ("same", "faster", "unsure", "invalid"):  # nothing to retract
        assert on_a_busy_host(other, 0.9, said) == (other, None)


def test_promote_moves_the_alias_on_faster_or_same_only():
    from mlflow_ngraph.gate.record import promote
    from mlflow_ngraph.gate.sides import Side

    class Registry:
        def __init__(self) -> None:
            self.moves: list = []

        def set_registered_model_alias(self, name, alias, version):
            self.moves.append((name, alias, version))

    champion = Side("champion", "models:/m@cpu", "registered", name="m", version="1", alias="cpu")
    challenger = Side("challenger", "models:/m/2", "registered", name="m", version="2")
    registry = Registry()
    for verdict in ("slower", "unsure", "invalid"):
        line = promote(registry, champion, challenger, verdict)
        assert line == f"not promoted: the verdict is {verdict}; m@cpu stays on version 1"
    assert registry.moves == []
    line = promote(registry, champion, challenger, "same")
    assert registry.moves == [("m", "cpu", "2")] and "(it left version 1)" in line


def test_a_side_still_loading_is_said_every_30_s():
    import time

    from mlflow_ngraph.gate.rounds import PROGRESS_S, Progress

    said: list[str] = []
    progress = Progress(said.append, "champion", {"kind": "spec"}, time.monotonic() - 65)
    for _ in range(3):
        progress(0.0)
    assert said == ["gate: still building or loading the champion's engine (65 s)"] * 2
    assert progress.next == 3 * PROGRESS_S
