"""The settle of a one-sitting run's re-run intervals at its end."""

from __future__ import annotations

import time

from mlflow_ngraph.measure import history
from mlflow_ngraph.measure.history import Entry
from mlflow_ngraph.plan.config import RunPolicy
from mlflow_ngraph.run.combine import SittingsCombiner


def test_a_paired_rows_throughput_is_settled_where_only_the_throughput_has_a_spread(tmp_path):
    """A tiny model's engines in three runs: the throughputs' spread has its degrees of
    freedom, the speedups' (UNSTABLE in all but one run) none. The row's throughput
    interval is settled on the throughput's spread; its speedup has none, and says so."""
    t = time.time()
    for g, level in enumerate((100.0, 200.0, 400.0)):
        for r, move in enumerate((1.0, 1.05, 0.97)):
            speedup = None if r else 2.0  # a speedup in one run only: no spread of its own
            entry = Entry(t + r, "conv_block", level * move, 0.01, speedup, 0.01,
                          occasion=f"r{r}", group=f"g{g}")  # fmt: skip
            history.append(tmp_path, f"e{g}", entry)
    record = {
        "status": "ok",
        "metrics": {
            "throughput": 210.0, "throughput_ci_low": 208.0, "throughput_ci_high": 212.0,
            "speedup_paired": 2.0, "speedup_ci_low": 1.98, "speedup_ci_high": 2.02,
        },
        "rerun": "none: this host has no spread between sittings yet",
    }  # fmt: skip
    settled = SittingsCombiner(tmp_path, RunPolicy()).single_settled(record, "conv_block")
    spread = history.spread(tmp_path, "throughput", "conv_block")
    assert spread is not None and history.spread(tmp_path, "speedup", "conv_block") is None
    low, high, _ = history.rerun_interval(210.0, settled_h(record), spread)
    assert settled["metrics"]["throughput_rerun_low"] == low
    assert settled["metrics"]["throughput_rerun_high"] == high
    assert "speedup_rerun_low" not in settled["metrics"]
    assert settled["rerun"] == record["rerun"]  # the speedup's word: none yet
    assert "throughput_rerun_low" not in record["metrics"]  # the journal's record untouched
    # a GPU profile's run reads its own engines' spread: none of these CPU engines
    gpu = SittingsCombiner(tmp_path, RunPolicy(), kind="cuda").single_settled(record, "conv_block")
    assert "throughput_rerun_low" not in gpu["metrics"]
    # --rerun-sd fixes the spread: nothing to settle
    fixed = SittingsCombiner(tmp_path, RunPolicy(rerun_sd=0.01)).single_settled(record, "x")
    assert fixed is record


def settled_h(record) -> float:
    from mlflow_ngraph.measure.sittings import figure

    return figure(record, "throughput")[1]


def test_a_run_in_another_state_of_the_host_is_said_and_settled_on_its_own_moves(tmp_path, caplog):
    """Three quiet runs (0.4% between runs), then this one, whose groups moved 4%: the
    settle says in one line that the host is in a state its history has not measured, and
    a figure's re-run interval rests on the spread between runs this run's moves give,
    wider than the history's with this run in it."""
    import numpy as np

    from tests._support import history_of_runs

    history_of_runs(tmp_path, np.random.default_rng(3), [0.004, 0.004, 0.004, 0.04])
    record = {
        "status": "ok",
        "metrics": {"throughput": 900.0, "throughput_ci_low": 897.0, "throughput_ci_high": 903.0},
        "rerun": "sd 0.40% (6 df) between runs from this host's history",
    }
    plain = SittingsCombiner(tmp_path, RunPolicy()).single_settled(record, "conv_block")
    combiner = SittingsCombiner(tmp_path, RunPolicy(), occasion="run3")
    with caplog.at_level("WARNING", logger="mlflow_ngraph.run.runner"):
        settled = combiner.single_settled(record, "conv_block")
        combiner.single_settled(record, "conv_block")  # looked at once a run
    (said,) = [r.getMessage() for r in caplog.records]
    assert "throughputs moved" in said and "a state its history has not measured" in said
    shift = combiner.shifts["throughput"]
    assert combiner.shifts["speedup"] is None  # none measured
    spread = history.with_shift(
        history.spread(tmp_path, "throughput", "conv_block"), shift, "conv_block"
    )
    low, high, _ = history.rerun_interval(900.0, settled_h(record), spread)
    assert settled["metrics"]["throughput_rerun_low"] == low
    assert settled["metrics"]["throughput_rerun_high"] == high
    assert high - low > 1.5 * (
        plain["metrics"]["throughput_rerun_high"] - plain["metrics"]["throughput_rerun_low"]
    )
    assert "this run's moves against it" in settled["rerun"]
    # --rerun-sd fixes the spread: the run is not judged against its history
    fixed = SittingsCombiner(tmp_path, RunPolicy(rerun_sd=0.01), occasion="run3")
    assert fixed.single_settled(record, "conv_block") is record and fixed.shifts == {}
    # a run measured alike: nothing said, the history's spread
    quiet = tmp_path / "quiet"
    history_of_runs(quiet, np.random.default_rng(4), [0.004] * 4)
    caplog.clear()
    calm = SittingsCombiner(quiet, RunPolicy(), occasion="run3")
    with caplog.at_level("WARNING", logger="mlflow_ngraph.run.runner"):
        calm.single_settled(record, "conv_block")
    assert not caplog.records and calm.shifts == {"speedup": None, "throughput": None}
