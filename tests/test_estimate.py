"""The time estimate printed before a run: rough from allowances at first, then from what
each batch size took on this host."""

from __future__ import annotations

from mlflow_ngraph.config import MeasureSettings
from mlflow_ngraph.estimate import Timings, describe, estimate, timing_key
from tests._support import TINY


def test_estimate_uses_recorded_times_and_says_how_much_is_known(tmp_path):
    measure = MeasureSettings(warmup=0, repetitions=10, min_duration_s=1.0)
    items = [("m", "identity", {}, 1), ("m", "inductor", {}, 1)]
    timings = Timings(tmp_path)
    rough, known, count = estimate(items, measure, timings)
    assert (known, count) == (0, 2)
    assert rough > 45  # inductor's compile allowance dominates
    timings.record(timing_key("m", "inductor", {}, 1), 3.0)
    again = Timings(tmp_path)  # read back from the home
    seconds, known, _ = estimate(items, measure, again)
    assert known == 1
    assert seconds < rough
    assert "1 of them timed on this host" in describe(seconds, known, count)


def test_run_prints_an_estimate_and_records_timings(run_cli, tracking_uri, home):
    code, out, err = run_cli(
        "benchmark", *TINY, "--compiler", "identity", "--tracking-uri", tracking_uri
    )
    assert code == 0, err
    assert "estimated time: about" in err
    recorded = Timings(home).data
    assert len(recorded) == 2 and all(v > 0 for v in recorded.values())
