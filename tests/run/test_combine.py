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
    # --rerun-sd fixes the spread: nothing to settle
    fixed = SittingsCombiner(tmp_path, RunPolicy(rerun_sd=0.01)).single_settled(record, "x")
    assert fixed is record


def settled_h(record) -> float:
    from mlflow_ngraph.measure.sittings import figure

    return figure(record, "throughput")[1]
