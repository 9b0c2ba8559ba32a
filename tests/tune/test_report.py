"""What a tune's end says, on hand-made trials: the batch sizes it did not reach and why, the
runner-up on the winner's own ranking, a finalist's row marked as one, the Pareto front by
dominance, and no lead judged between UNSTABLE figures."""

from __future__ import annotations

import math

import pytest

from mlflow_ngraph.plan.config import ModelSpec
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tune.choose import pareto_front, verdict
from mlflow_ngraph.tune.report import (
    best_table,
    description,
    front,
    front_table,
    stop_lines,
    unreached,
)
from mlflow_ngraph.tune.search import Tune
from mlflow_ngraph.tune.settings import TuneSettings
from mlflow_ngraph.tune.trials import Trial


def trial(n, compiler, speedup, throughput, p99, *, b=1, stage="final", group=1,
          stable=True, status="OK", low=None, high=None):  # fmt: skip
    """A measured trial of ``compiler``'s defaults (its interval +-0.05 unless given)."""
    t = Trial(n, b, compiler, {}, None, group, stage)
    t.status, t.stable = status, stable
    if status == S.STATUS_OK:
        t.metrics = {
            S.M_SPEEDUP_PAIRED: speedup,
            S.M_SPEEDUP_CI_LOW: speedup - 0.05 if low is None else low,
            S.M_SPEEDUP_CI_HIGH: speedup + 0.05 if high is None else high,
            S.M_THROUGHPUT: throughput,
            S.M_LATENCY_P99: p99,
        }
        t.values = [speedup]
    t.feasible = status == S.STATUS_OK
    return t


def make_tune(tmp_path, trials, stop_reason="budget", batch_sizes=(1, 8)) -> Tune:
    """A tune of the conv block over ``trials`` (its search ended by ``stop_reason``)."""
    settings = TuneSettings(ModelSpec("conv_block", {}), "cpu", [], list(batch_sizes),
                            budget_s=300.0)  # fmt: skip
    tune = Tune(settings, tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")
    tune.trials = list(trials)
    tune.stop_reason = stop_reason
    tune.payback = lambda t: None  # no identity references in a hand-made tune
    return tune


def seen(tmp_path) -> Tune:
    """The tune of the README's example with a 5-minute budget, as it was seen: one group at
    batch 1, its three defaults the finalists, batch 8 never searched."""
    search = [
        trial(0, "onnxruntime", 2.0, 12.0, 220.0, stage="search", group=0),
        trial(1, "openvino", 2.08, 15.2, 246.0, stage="search", group=0),
        trial(2, "torchscript", 1.5, 9.0, 300.0, stage="search", group=0),
    ]
    finals = [
        trial(3, "onnxruntime", 2.08, 12.6, 217.0),
        trial(4, "openvino", 2.07, 15.2, 246.0),
        trial(5, "torchscript", 1.6, 9.1, 290.0),
    ]
    return make_tune(tmp_path, search + finals)


def row(table: str, text: str) -> list[str]:
    [line] = [line for line in table.splitlines() if text in line]
    return line.split()


def test_a_batch_size_never_searched_is_named_with_why(tmp_path):
    tune = seen(tmp_path)
    assert list(unreached(tune)) == [8]
    lines = stop_lines(tune)
    assert lines[0] == "stopped by the budget"
    assert lines[1].startswith("bs8 not reached: never searched: the budget (5 min) was spent")
    assert "after 1 group(s)" in lines[1] and "--budget" in lines[1]
    text = description(tune, None, "no winner")
    assert "bs8 not reached: never searched" in text


@pytest.mark.parametrize(
    ("status", "feasible", "final", "why"),
    [
        (None, False, False, "asked but not measured"),
        (S.STATUS_FAILED, False, False, "FAILED or was INVALID"),
        (S.STATUS_OK, False, False, "met the constraints"),
        (S.STATUS_OK, True, False, "no finalist was measured valid"),
        (S.STATUS_OK, True, True, None),
    ],
)
def test_a_batch_size_searched_without_an_answer_says_why(tmp_path, status, feasible, final, why):
    at8 = trial(3, "onnxruntime", 1.2, 80.0, 90.0, b=8, stage="search", group=1)
    at8.status, at8.feasible = status, feasible
    trials = [*seen(tmp_path).trials, at8]
    if final:
        trials.append(trial(9, "onnxruntime", 1.2, 80.0, 90.0, b=8, group=3))
    tune = make_tune(tmp_path, trials, stop_reason="trials")
    if why is None:
        assert unreached(tune) == {} and stop_lines(tune) == ["stopped by --trials"]
    else:
        assert why in unreached(tune)[8] and why in stop_lines(tune)[1]


def test_the_runner_up_is_the_next_finalist_on_the_winners_ranking():
    """The throughputs rank a, b, c; the paired speedups a, c, b: the winner is chosen on
    the speedups, so its runner-up is c, the next on them."""
    a = trial(1, "onnxruntime", 2.5, 30.0, 10.0)
    b = trial(2, "torchscript", 1.6, 29.0, 10.0)
    c = trial(3, "openvino", 2.45, 28.0, 10.0)
    other_b = trial(4, "openvino", 3.0, 20.0, 10.0, b=8)
    result = verdict([b, other_b, c, a], throughput, higher=True, paired=True)
    assert result.winner is a and result.runner_up is c
    assert "openvino" in result.sentence() and "next finalist on the paired speedups" in (
        result.sentence()
    )
    # ranked on the throughputs (no pairing), the next on them
    result = verdict([b, other_b, c, a], throughput, higher=True)
    assert result.winner is a and result.runner_up is b
    assert "next finalist on the throughput" in result.sentence()


def throughput(t):
    return t.metrics.get(S.M_THROUGHPUT)


def test_a_finalists_row_says_finalist_with_its_final_figures(tmp_path):
    tune = seen(tmp_path)
    table = best_table(tune, width=400)
    assert "phase" in table and "stability" in table
    for name in ("onnxruntime", "openvino", "torchscript"):
        assert row(table, name)[-1] == "finalist"
    assert "2.07x" in row(table, "openvino")  # the final round's figure, not the search's
    # a compiler searched but not a finalist is a search row
    extra = trial(6, "tvm", 1.1, 5.0, 400.0, stage="search", group=0)
    assert row(best_table(make_tune(tmp_path, [*tune.trials, extra]), 400), "tvm")[-1] == "search"


def test_a_finalist_whose_final_round_failed_is_still_a_finalist_shown_by_its_search(tmp_path):
    tune = seen(tmp_path)
    failed = trial(4, "openvino", 0, 0, 0, status=S.STATUS_FAILED)
    tune.trials = [t if t.number != 4 else failed for t in tune.trials]
    line = " ".join(row(best_table(tune, width=400), "openvino"))
    assert "2.08x" in line and "finalist" in line and "final round FAILED" in line


def test_a_finalist_without_a_paired_figure_shows_its_final_figures(tmp_path):
    tune = seen(tmp_path)
    final_ov = next(t for t in tune.trials if t.number == 4)
    final_ov.values, final_ov.feasible = None, False
    del final_ov.metrics[S.M_SPEEDUP_PAIRED]
    line = " ".join(row(best_table(tune, width=400), "openvino"))
    assert "finalist" in line and "no paired figure" in line and "2.08x" not in line


def test_the_pareto_front_is_every_point_no_other_dominates():
    points = [
        (12.6, 217.0, "ort"),  # the pair seen: neither dominates the other
        (15.2, 246.0, "ov"),
        (12.6, 217.0, "ort twin"),  # equal on both axes: neither dominates, both stand
        (15.2, 250.0, "ov slower"),  # ov's throughput, a worse p99: dominated
        (11.0, 217.0, "ort lower"),  # ort's p99, a lower throughput: dominated
        (10.0, 300.0, "worse on both"),
        (9.0, 100.0, "fastest request"),
        (math.nan, 50.0, "no throughput"),
        (20.0, math.inf, "no p99"),
    ]
    got = [p[2] for p in pareto_front(points)]
    assert got == ["ov", "ort", "ort twin", "fastest request"]
    assert [p[2] for p in pareto_front(points[:2])] == ["ov", "ort"]
    assert pareto_front([(1.0, 1.0, "alone")]) == [(1.0, 1.0, "alone")]


def test_the_tunes_front_holds_both_of_the_seen_pair_with_their_stability(tmp_path):
    tune = seen(tmp_path)
    next(t for t in tune.trials if t.number == 3).stable = False
    labels = [(t.compiler, t.stage) for _, _, t in front(tune)]
    assert labels == [("openvino", "final"), ("onnxruntime", "final")]
    table = front_table(tune)
    assert row(table, "openvino")[-1] == "STABLE" and row(table, "onnxruntime")[-1] == "UNSTABLE"


def test_no_lead_is_judged_between_unstable_figures(tmp_path):
    """Intervals that separate, but the winner's figures are UNSTABLE: not "beyond noise"."""
    tune = seen(tmp_path)
    ort, ov = (next(t for t in tune.trials if t.number == n) for n in (3, 4))
    ov.metrics.update({S.M_SPEEDUP_CI_LOW: 1.9, S.M_SPEEDUP_CI_HIGH: 1.95})
    # no re-run intervals (the host has no spread yet): this run's intervals judged it
    assert verdict([ort, ov], throughput, True, paired=True).lead() == "beyond this run's noise"
    ort.stable = False
    result = verdict([ort, ov], throughput, True, paired=True)
    assert result.winner is ort and not result.beyond_noise
    assert result.lead() == "not judged: winner UNSTABLE"
    line = result.sentence()
    assert "beyond noise" not in line and "tie within noise" not in line
    assert "2.08x [2.03-2.13] UNSTABLE over eager" in line
    assert "the winner's figures are UNSTABLE" in line and "measure again" in line
    text = description(tune, result, None)
    assert "beyond noise" not in text and "UNSTABLE" in text.splitlines()[2]
    table = best_table(tune, width=400)
    assert row(table, "onnxruntime")[5:7] == ["-", "UNSTABLE"]
    assert "re-run: none yet: this host's spread needs measuring" in table  # and why
    # the re-run interval where the host has measured its spread, beside this run's
    ort.metrics.update({S.M_SPEEDUP_RERUN_LOW: 1.91, S.M_SPEEDUP_RERUN_HIGH: 2.26})
    table = best_table(tune, width=400)
    assert row(table, "onnxruntime")[3:6] == ["2.08x", "[2.03-2.13]", "[1.91-2.26]"]
    assert "re-run: none yet" not in table
    # a runner-up's UNSTABLE figures leave the lead unjudged too, and no tie is called
    ort.stable, ov.stable = True, False
    ov.metrics.update({S.M_SPEEDUP_CI_LOW: 2.0, S.M_SPEEDUP_CI_HIGH: 2.2})
    result = verdict([ort, ov], throughput, True, paired=True)
    assert result.lead() == "not judged: next UNSTABLE" and not result.surer
    assert "the runner-up's figures are UNSTABLE" in result.sentence()
