"""What a tune concludes from its trials: constraints, the tie rule, the Pareto front,
payback, the budget and early stopping, and its bad inputs."""

from __future__ import annotations

import math
import sys

import pytest

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.measure import metrics as M
from mlflow_ngraph.plan.config import ModelSpec
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tune.choose import closest_miss, pareto_front, spec_fragment, verdict
from mlflow_ngraph.tune.settings import MIN_TRIAL_S, Constraints, TuneSettings, parse_budget
from mlflow_ngraph.tune.trials import Trial


def trial(n, speedup, low, high, *, b=1, status="OK", compiler="onnxruntime", p99=1.0,
          throughput=100.0, feasible=True, stage="final", flags=None):  # fmt: skip
    t = Trial(n, b, compiler, flags or {"intra_op_num_threads": n}, None, 0, stage)
    t.status = status
    t.metrics = {
        S.M_SPEEDUP_PAIRED: speedup,
        S.M_SPEEDUP_CI_LOW: low,
        S.M_SPEEDUP_CI_HIGH: high,
        S.M_LATENCY_P99: p99,
        S.M_THROUGHPUT: throughput,
    }
    t.values = [speedup] if status == "OK" else None
    t.feasible = feasible and status == "OK"
    return t


def by_throughput(t):
    return t.metrics[S.M_THROUGHPUT]


def test_a_lead_beyond_both_intervals_is_called_and_an_overlap_is_a_tie():
    a = trial(1, 2.0, 1.9, 2.1, throughput=200)
    b = trial(2, 1.5, 1.45, 1.55, throughput=150)
    result = verdict([a, b], by_throughput, higher=True)
    assert result.winner is a and result.runner_up is b and result.beyond_noise
    # no re-run intervals (the host has no spread yet): this run's intervals said it
    assert "is beyond this run's noise" in result.sentence()
    c = trial(3, 1.95, 1.85, 2.05, throughput=195)
    tie = verdict([a, c], by_throughput, higher=True)
    assert tie.winner is a and not tie.beyond_noise
    assert "tie within noise with" in tie.sentence()
    assert "their intervals overlap" in tie.sentence()  # this run's, shown beside each


def test_a_lead_is_judged_on_the_re_run_intervals_where_the_host_has_them():
    """The sittings' intervals separate, but a re-run on this host may land either way:
    no lead beyond noise is claimed."""
    a = trial(1, 2.0, 1.95, 2.05, throughput=200)
    b = trial(2, 1.85, 1.8, 1.9, throughput=185)
    sitting = verdict([a, b], by_throughput, higher=True)
    assert sitting.beyond_noise and sitting.lead() == "beyond this run's noise"
    a.metrics.update({S.M_SPEEDUP_RERUN_LOW: 1.8, S.M_SPEEDUP_RERUN_HIGH: 2.2})
    b.metrics.update({S.M_SPEEDUP_RERUN_LOW: 1.65, S.M_SPEEDUP_RERUN_HIGH: 2.05})
    rerun = verdict([a, b], by_throughput, higher=True)
    assert not rerun.beyond_noise and rerun.lead() == "tie within noise"
    # the sentence names the intervals that judged it: the sitting intervals beside each
    # figure ([1.95-2.05], [1.80-1.90]) do not overlap
    assert "their re-run intervals ([1.80-2.20] and [1.65-2.05]" in rerun.sentence()
    b.metrics.update({S.M_SPEEDUP_RERUN_LOW: 1.6, S.M_SPEEDUP_RERUN_HIGH: 1.75})
    rerun = verdict([a, b], by_throughput, higher=True)  # a lead a re-run keeps
    assert rerun.beyond_noise and rerun.lead() == "beyond noise"
    assert "is beyond noise" in rerun.sentence()


def test_the_batch_size_is_chosen_on_throughput_and_its_winner_on_the_paired_speedups():
    # seen: the throughputs (windows of different lengths) and the speedups (the same
    # rounds) disagree; the winner must not read lower than the runner-up it "ties" with
    ort = trial(1, 2.46, 2.42, 2.62, b=8, throughput=18.1)
    ov = trial(2, 2.68, 2.25, 3.32, b=8, throughput=17.0, compiler="openvino")
    small = trial(3, 1.55, 1.49, 1.62, b=1, throughput=17.7)
    narrow_ov = trial(4, 2.68, 2.63, 2.75, b=8, throughput=17.0, compiler="openvino")
    result = verdict([small, ort, narrow_ov], by_throughput, higher=True, paired=True)
    assert result.winner is narrow_ov and result.runner_up is ort and result.beyond_noise
    assert "2.68x" in result.sentence().split(";")[0]
    # a tie: the higher estimate with the wider interval gives way to the surer figure
    result = verdict([small, ort, ov], by_throughput, higher=True, paired=True)
    assert result.winner is ort and result.runner_up is ov and not result.beyond_noise
    assert result.surer and "surer figure" in result.sentence()
    ov.metrics[S.M_SPEEDUP_CI_LOW] = 2.44  # now the surer too: the higher estimate stands
    result = verdict([small, ort, ov], by_throughput, higher=True, paired=True)
    assert result.winner is ov and not result.surer
    ov.metrics[S.M_SPEEDUP_CI_LOW] = 2.25
    # without pairing (a latency objective), the objective's own order stands
    assert verdict([small, ort, ov], by_throughput, higher=True).winner is ort
    # a finalist with no paired speedup: every one is ranked on the objective
    ov.metrics.pop(S.M_SPEEDUP_PAIRED)
    assert verdict([small, ort, ov], by_throughput, higher=True, paired=True).winner is ort


def test_an_invalid_candidate_is_never_chosen_however_fast():
    fast_but_wrong = trial(1, 5.0, 4.9, 5.1, status=S.STATUS_INVALID, throughput=500)
    honest = trial(2, 1.2, 1.1, 1.3, throughput=120)
    assert verdict([fast_but_wrong, honest], by_throughput, higher=True).winner is honest
    assert verdict([fast_but_wrong], by_throughput, higher=True) is None


def test_a_candidate_missing_a_constraint_is_not_chosen_and_the_closest_miss_is_named():
    limits = Constraints(max_latency_ms=2.0)
    slow = trial(1, 3.0, 2.9, 3.1, p99=3.0, throughput=300)
    closer = trial(2, 2.0, 1.9, 2.1, p99=2.5, throughput=200)
    for t in (slow, closer):
        t.feasible = limits.miss(t.metrics) is None
    assert verdict([slow, closer], by_throughput, higher=True) is None
    line = closest_miss([slow, closer], limits)
    assert "intra_op_num_threads=2" in line and "25% over" in line and "\n" not in line
    met = trial(3, 1.5, 1.4, 1.6, p99=1.5, throughput=150)
    met.feasible = limits.miss(met.metrics) is None
    assert verdict([slow, closer, met], by_throughput, higher=True).winner is met


def test_constraint_violations_follow_optunas_sign():
    limits = Constraints(max_latency_ms=2.0, min_throughput=100.0, max_compile_s=10.0)
    ok = {S.M_LATENCY_P99: 1.0, S.M_THROUGHPUT: 150.0, S.M_COMPILE: 5.0}
    assert all(v <= 0 for v in limits.violations(ok, valid=True))
    assert limits.violations(ok, valid=False)[0] > 0
    bad = {S.M_LATENCY_P99: 3.0, S.M_THROUGHPUT: 50.0, S.M_COMPILE: 20.0}
    assert all(v > 0 for v in limits.violations(bad, valid=True)[1:])


def test_pareto_front_on_hand_made_trials():
    points = [(100, 5.0, "a"), (80, 2.0, "b"), (90, 6.0, "c"), (50, 1.0, "d"), (80, 3.0, "e")]
    assert [p[2] for p in pareto_front(points)] == ["a", "b", "d"]
    assert pareto_front([]) == []


def test_payback_counts_the_inferences_that_pay_for_the_compile():
    # identity 100/s, compiled 200/s: 10 ms -> 5 ms per sample, 5 ms saved each; 10 s of
    # compile is paid back after 2,000 samples
    assert M.payback(10.0, 100.0, 2.0) == pytest.approx(2000.0)
    assert M.payback(10.0, 100.0, 1.0) == math.inf  # never faster: never paid back
    assert M.payback(10.0, 100.0, 0.8) == math.inf
    assert M.payback(None, 100.0, 2.0) is None
    # counted in inferences, the metric's unit: 2000 samples are 250 requests of batch 8
    assert M.payback(10.0, 100.0, 2.0, 8) == pytest.approx(250.0)
    rel = M.relative_metrics({1: 200.0}, {1: 100.0}, None, {1: 10.0})
    assert rel[1]["payback_inferences"] == pytest.approx(2000.0)
    assert "payback_inferences" not in M.relative_metrics({1: 200.0}, {1: 100.0})[1]


def test_an_infinite_payback_is_stored_as_the_largest_float():
    from mlflow_ngraph.tracking import mlflow_log as ml

    [(name, value, step), (flat, _, _)] = ml.batch_metrics({S.M_PAYBACK: math.inf}, 4)
    assert (name, flat, step) == (S.M_PAYBACK, "payback_inferences.bs4", 4)
    assert value == ml.STORED_INF == sys.float_info.max


@pytest.mark.parametrize(
    ("text", "seconds"), [("20m", 1200), ("90s", 90), ("1h30m", 5400), ("600", 600)]
)
def test_budget_durations(text, seconds):
    assert parse_budget(text) == seconds


def test_a_budget_that_is_not_a_duration_is_one_line():
    with pytest.raises(NgraphError, match="not a duration"):
        parse_budget("soon")


def settings(**kw):
    return TuneSettings(ModelSpec("conv_block", {}), "cpu", [], [1], **kw)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"budget_s": MIN_TRIAL_S - 1}, "shorter than one trial"),
        ({"objectives": ["gpu_mem_mb"]}, "not measured on device"),
        ({"objectives": ["energy_j_per_sample"]}, "not measured on device"),
        ({"objectives": ["speed"]}, "is not one of"),
        ({"constraints": Constraints(max_gpu_mem_mb=100)}, "gpu_mem_mb is not measured"),
        ({"constraints": Constraints(max_latency_ms=-1)}, "must be a number > 0"),
        ({"budget_s": None}, "needs an end"),
    ],
)
def test_bad_settings_are_one_line(kw, message):
    with pytest.raises(NgraphError, match=message):
        settings(**kw).validate("cpu")


def test_the_tune_key_ignores_how_long_it_may_run():
    assert settings(budget_s=600).key() == settings(budget_s=1200, max_trials=9).key()
    assert settings().key() != settings(objectives=["latency_p99_ms"]).key()


def test_the_winner_as_a_spec_fragment_is_a_spec_the_benchmark_accepts(tmp_path):
    from mlflow_ngraph.plan.config import build_spec, load_spec_file

    winner = trial(1, 2.0, 1.9, 2.1, b=8, flags={"execution_mode": "parallel", "x": None})
    text = spec_fragment(winner, "conv_block(width=8)", "conv_block", {"width": 8})
    path = tmp_path / "winner.yaml"
    path.write_text(text)
    spec = build_spec(load_spec_file(path))
    assert spec.batch_sizes == [8]
    assert spec.compilers[0].name == "onnxruntime"
    assert spec.compilers[0].flags == {"execution_mode": "parallel"}
    assert spec.models[0].params == {"width": 8}


class GroupsOf30s:
    """A tune journal whose groups took 30 s each."""

    def group_seconds(self):
        return {0: 30.0}


def stop_rules(trials, spent=0.0, **kw) -> str:
    """Why a search stops with ``trials`` measured and ``spent`` seconds gone ("": it goes
    on)."""
    from mlflow_ngraph.tune.stop import Budget, reason_to_stop

    s = settings(**kw)
    budget = Budget(s.budget_s)
    budget.spent_before = spent
    return reason_to_stop(s, trials, set(), budget, GroupsOf30s())


def test_patience_counts_trials_in_a_row_that_improved_nothing():
    from mlflow_ngraph.tune.stop import stale

    rising = [trial(i, 1.0 + i / 10, 0, 0, stage="search") for i in range(5)]
    assert stale(rising, higher=True) == 0 and stop_rules(rising, patience=3) == ""
    flat = rising + [trial(9 + i, 1.3, 0, 0, stage="search") for i in range(3)]
    assert stale(flat, higher=True) == 3 and stop_rules(flat, patience=3) == "no_improvement"
    # within 1% of the best is no improvement either; a failed trial counts as stale
    tiny = rising + [
        trial(20, 1.404, 0, 0, stage="search"),
        trial(21, 9, 0, 0, status="FAILED", stage="search"),
    ]
    assert stale(tiny, higher=True) == 2


def test_the_budget_stops_the_search_before_the_finalists_would_overrun_it():
    assert stop_rules([], budget_s=600) == ""
    # a group costs 30 s here, and the finalists one more
    assert stop_rules([], spent=545.0, budget_s=600) == "budget"
    searched = [trial(i, 1, 0, 0, stage="search") for i in range(4)]
    assert stop_rules(searched, max_trials=4) == "trials"


def finalists(pool, space):
    """The finalists at batch size 1 of a search that measured ``pool`` in ``space``."""
    from mlflow_ngraph.tune.book import TrialBook
    from mlflow_ngraph.tune.trials import flags_key

    book = TrialBook(settings(finalists=1))
    book.trials = pool
    return book.top(1, {(name, flags_key(flags)) for name, flags, _ in space.defaults()})


def test_every_compilers_defaults_join_the_finalists_however_low_their_search_figure():
    # a search figure is paired with its own group's identity: a default that read low
    # there must still be beaten head to head
    from mlflow_ngraph.compilers.base import HostLimits
    from mlflow_ngraph.compilers.registry import get_compiler
    from mlflow_ngraph.tune.space import build_space

    space = build_space(
        [(get_compiler(n), {}, {}) for n in ("onnxruntime", "torchscript")], HostLimits.here()
    )
    ort = space.spaces["onnxruntime"]
    default = ort.flags(ort.fixed)
    tuned = [ort.flags({**ort.fixed, "execution_mode": m}) for m in ("parallel",)]
    tuned.append(ort.flags({**ort.fixed, "graph_optimization_level": "basic"}))
    pool = [
        trial(1, 1.27, 1.2, 1.3, stage="search", flags=default),
        trial(2, 1.69, 1.6, 1.7, stage="search", flags=tuned[0]),
        trial(3, 1.50, 1.4, 1.6, stage="search", flags=tuned[1]),
    ]
    chosen = finalists(pool, space)
    assert [t.number for t in chosen] == [2, 1]  # the best, then the default it must beat
    # a default not measured is not invented
    assert [t.number for t in finalists(pool[1:], space)] == [2]


def test_a_lead_over_or_of_an_unstable_figure_is_not_judged():
    """Separate intervals, but one of the two figures is noise on this host: the tune calls
    no lead beyond noise, and says which side is UNSTABLE."""
    a = trial(1, 2.0, 1.9, 2.1, throughput=200)
    b = trial(2, 1.5, 1.45, 1.55, throughput=150)
    b.stable = False
    result = verdict([a, b], by_throughput, higher=True)
    assert result.winner is a and not result.beyond_noise
    assert result.noise == "not judged: next UNSTABLE"
    assert "not judged: next UNSTABLE" in result.sentence() and "beyond" not in result.sentence()
    a.stable, b.stable = False, True
    result = verdict([a, b], by_throughput, higher=True)
    assert result.noise == "not judged: winner UNSTABLE"
    a.stable = True
    assert verdict([a, b], by_throughput, higher=True).noise == "beyond this run's noise"
