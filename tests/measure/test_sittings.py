"""Figures combined from several sittings (measure/sittings.py): the geometric mean and its
sitting interval, the re-run interval from the run's own spread between sittings, and the
combined stability. Pure arithmetic on records."""

from __future__ import annotations

import math

import pytest

from mlflow_ngraph.measure.history import Z95, Spread, rerun_interval, variance_components
from mlflow_ngraph.measure.settings import MeasureSettings
from mlflow_ngraph.measure.sittings import combine, engine_sittings, run_spread, with_runs
from mlflow_ngraph.plan.config import RunPolicy
from mlflow_ngraph.plan.estimate import cost_of


def record(throughput, h, speedup=None, hs=None, stable=True, reason="", attempts=1, **more):
    metrics = {
        "throughput": throughput,
        "throughput_ci_low": throughput * math.exp(-h),
        "throughput_ci_high": throughput * math.exp(h),
        "throughput_halfwidth": math.expm1(h),
        "throughput_rerun_low": 1.0,  # the worker's, from the history: replaced
        "cpu_percent": 97.0,
        **more,
    }
    if speedup is not None:
        metrics.update(
            speedup_paired=speedup,
            speedup_ci_low=speedup * math.exp(-hs),
            speedup_ci_high=speedup * math.exp(hs),
        )
    return {
        "metrics": metrics,
        "status": "OK",
        "stability": {"stable": stable, "reason": reason, "attempts": attempts},
    }


def test_the_figure_is_the_geometric_mean_and_its_interval_the_sittings_own():
    a, b = record(100.0, 0.02, 2.0, 0.01), record(121.0, 0.04, 2.2, 0.03)
    out = combine([a, b], {"throughput": None, "speedup": None}, 0.05)
    m = out["metrics"]
    assert m["throughput"] == pytest.approx(110.0)
    h = math.sqrt(0.02**2 + 0.04**2) / 2
    assert m["throughput_ci_low"] == pytest.approx(110.0 * math.exp(-h))
    assert m["throughput_ci_high"] == pytest.approx(110.0 * math.exp(h))
    assert m["throughput_halfwidth"] == pytest.approx(math.expm1(h))
    assert m["speedup_paired"] == pytest.approx(math.sqrt(2.0 * 2.2))
    assert m["sittings"] == 2.0
    assert m["cpu_percent"] == 97.0  # the last sitting's other figures
    assert out["sittings_text"] == "throughput 100/s, 121/s; speedup 2x, 2.2x"
    # no spread: no re-run interval, not even the worker's from the history
    assert "throughput_rerun_low" not in m and "speedup_rerun_low" not in m
    assert out["rerun"].startswith("none: fewer than 3 degrees of freedom")
    assert a["metrics"]["throughput"] == 100.0  # the sittings' records are left as they were


def test_the_combined_record_carries_the_guards_word_on_every_sitting():
    """The combined record was the last sitting's: a move the guard said of the first
    sitting was lost (and the run's figure logged without it)."""
    a, b = record(100.0, 0.02), record(101.0, 0.02)
    a["moved"] = "the throughput moved -17.8% against this engine measured at 09:20"
    out = combine([a, b], {"throughput": None, "speedup": None}, 0.05)
    assert out["moved"] == f"sitting 1: {a['moved']}"
    b["moved"] = "the throughput moved -21.2% against this engine measured at 09:20"
    assert combine([a, b], {}, 0.05)["moved"].endswith(f"; sitting 2: {b['moved']}")
    assert "moved" not in combine([record(1.0, 0.02), b | {"moved": ""}], {}, 0.05)


def test_the_combined_figure_says_every_sittings_rounds_it_rests_on():
    """The rounds and paired rounds behind a combined interval are all its sittings' (the
    last sitting's alone undercounted what the interval rests on); what describes windows
    stays the last sitting's, consistent with its spread (compare's fallback interval reads
    throughput_std beside windows), and the estimate prices one sitting's attempts."""
    counts = ("rounds", "speedup_rounds", "repetitions", "windows", "throughput_std")
    a = record(100.0, 0.02, 2.0, 0.01, **dict(zip(counts, (9.0, 7.0, 90.0, 9.0, 3.0))))
    b = record(121.0, 0.04, 2.2, 0.03, **dict(zip(counts, (6.0, 6.0, 70.0, 7.0, 4.0))))
    a["metrics"]["duration_s"], b["metrics"]["duration_s"] = 1.5, 1.25
    a["stability"]["attempts"], b["stability"]["attempts"] = 2, 1
    out = combine([a, b], {"throughput": None, "speedup": None}, 0.05)
    m = out["metrics"]
    assert [m[k] for k in counts] == [15.0, 13.0, 70.0, 7.0, 4.0]
    assert out["stability"]["attempts"] == 3  # the run's: every sitting's
    cost = cost_of(out)  # one sitting's: its seconds, its share of the attempts
    assert (cost["measured_s"], cost["attempts"]) == (1.25, 1.5)
    assert cost["request_s"] == pytest.approx(1.25 / 70, abs=1e-4)


def test_the_combined_interval_says_the_largest_autocorrelation_and_an_unchecked_drift():
    """The combined record said the last sitting's autocorrelation and drift check: a first
    sitting whose rounds were autocorrelated, or too few to judge its drift, was hidden
    behind a last one that was neither."""
    a = record(100.0, 0.02, 2.0, 0.01, throughput_autocorr=0.45, speedup_autocorr=0.3)
    b = record(101.0, 0.02, 2.1, 0.01, throughput_autocorr=0.05, speedup_autocorr=0.4)
    a["metrics"]["drift_checked"], b["metrics"]["drift_checked"] = 0.0, 1.0
    m = combine([a, b], {"throughput": None, "speedup": None}, 0.05)["metrics"]
    assert (m["throughput_autocorr"], m["speedup_autocorr"]) == (0.45, 0.4)
    assert m["drift_checked"] == 0.0
    a["metrics"]["drift_checked"] = 1.0
    assert combine([a, b], {}, 0.05)["metrics"]["drift_checked"] == 1.0
    del a["metrics"]["drift_checked"]  # a sitting that did not say was not checked
    assert combine([a, b], {}, 0.05)["metrics"]["drift_checked"] == 0.0


def test_the_combined_record_says_what_the_host_did_in_every_sitting():
    """The host probe's rounds are all its sittings' and its reading their weighted mean;
    a first sitting that parted between the host's two states keeps its change in the
    combined record, where the last sitting's alone lost it."""
    a = record(100.0, 0.02, host_join_rate=60e3, host_state_rounds=10.0, host_slow_rounds=8.0)
    b = record(101.0, 0.02, host_join_rate=90e3, host_state_rounds=30.0, host_slow_rounds=0.0)
    a["metrics"]["host_state_moved"] = -0.19
    m = combine([a, b], {}, 0.05)["metrics"]
    assert (m["host_state_rounds"], m["host_slow_rounds"]) == (40.0, 8.0)
    assert m["host_join_rate"] == pytest.approx((60e3 * 10 + 90e3 * 30) / 40)
    assert "memory_speed_gbs" not in m
    assert m["host_state_moved"] == -0.19
    del a["metrics"]["host_state_moved"]
    b["metrics"]["host_state_moved"] = 0.05
    assert combine([a, b], {}, 0.05)["metrics"]["host_state_moved"] == 0.05
    del b["metrics"]["host_state_moved"]
    assert "host_state_moved" not in combine([a, b], {}, 0.05)["metrics"]


def test_the_rerun_interval_is_a_prediction_for_another_mean_of_n_sittings():
    sittings = [record(100.0, 0.02, 1.5, 0.02), record(104.0, 0.02, 1.55, 0.02)]
    spread = Spread(0.03, 12, "this run's 2 sittings (every engine: 12 measured in 24 sittings)")
    out = combine(sittings, {"throughput": spread, "speedup": spread}, 0.05)
    m = out["metrics"]
    h = math.sqrt(2 * 0.02**2) / 2
    low, high, _ = rerun_interval(m["throughput"], h, Spread(0.03, 12, ""), 2)
    assert (m["throughput_rerun_low"], m["throughput_rerun_high"]) == pytest.approx((low, high))
    # the variance of the difference of two means of 2 sittings: 2 (sd^2 + own^2) / 2
    from scipy import stats

    width = stats.t.ppf(0.975, 12) * math.sqrt(2 * (0.03**2 + (0.02 / Z95) ** 2) / 2)
    assert math.log(m["throughput_rerun_high"] / m["throughput"]) == pytest.approx(width)
    # the spread of the mean of 2 sittings is logged, the sitting's in the words
    assert m["rerun_sd"] == pytest.approx(0.03 / math.sqrt(2)) and m["rerun_df"] == 12
    assert out["rerun"] == f"sd 3.00% (12 df) from {spread.source}"


def test_stable_only_when_every_sitting_was_and_the_mean_is_known_well_enough():
    ok = [record(100.0, 0.02, 2.0, 0.02), record(101.0, 0.02, 2.0, 0.02, attempts=2)]
    got = combine(ok, {}, 0.05)["stability"]
    assert got == {"stable": True, "reason": "", "attempts": 3}
    shaky = [record(100.0, 0.02, 2.0, 0.02), record(101.0, 0.02, 2.0, 0.02, False, "busy")]
    got = combine(shaky, {}, 0.05)["stability"]
    assert not got["stable"] and got["reason"] == "sitting 2: busy"
    # a sitting only too wide on its own: the mean of the two is what is judged
    wide_one = [record(100.0, 0.02, 2.0, 0.02), record(101.0, 0.02, 2.0, 0.06, False, "wide")]
    wide_one[1]["stability"]["own_only"] = True
    assert combine(wide_one, {}, 0.05)["stability"]["stable"]
    # each sitting passed its looser limit; their mean is still wider than --max-interval
    wide = [record(100.0, 0.02, 2.0, 0.09), record(101.0, 0.02, 2.0, 0.09)]
    got = combine(wide, {}, 0.05)["stability"]
    assert not got["stable"] and "2 sittings' speedup interval +-6.6%" in got["reason"]


def test_a_figure_one_sitting_lacks_is_not_combined():
    paired, alone = record(100.0, 0.02, 2.0, 0.02), record(110.0, 0.02)
    out = combine([paired, alone], {}, 0.05)
    assert "speedup" not in out["sittings_text"]
    assert out["metrics"]["throughput"] == pytest.approx(math.sqrt(100.0 * 110.0))


def test_the_run_spread_pools_its_engines_as_the_history_does():
    engines = [
        [record(100.0, 0.01), record(105.0, 0.01)],
        [record(50.0, 0.01), record(48.0, 0.01), record(49.0, 0.01)],
        [record(10.0, 0.01), record(10.3, 0.01, stable=False)],  # one stable sitting: out
    ]
    sittings = [engine_sittings(e, "throughput") for e in engines]
    assert sittings[2] is None
    wide = record(10.3, 0.09, stable=False)
    wide["stability"]["own_only"] = True  # only too wide: still out (docs/measurement.md)
    assert engine_sittings([engines[2][0], wide], "throughput") is None
    by_family = {"cnn": [s for s in sittings if s is not None]}
    var, df = variance_components(by_family["cnn"])
    assert df == 1 + 2
    got = run_spread(by_family, "cnn", 2)
    assert got.sd == pytest.approx(math.sqrt(var)) and got.df == 3
    assert got.source == "this run's 2 sittings (every engine: 2 measured in 5 sittings)"
    assert run_spread({"cnn": by_family["cnn"][:1]}, "cnn", 2) is None  # 1 df: too few


def test_each_sitting_may_be_root_n_looser():
    one = RunPolicy(precision=0.02, max_interval=0.05)
    assert one.per_sitting() == one
    four = RunPolicy(precision=0.02, max_interval=0.05, sittings=4).per_sitting()
    assert (four.precision, four.max_interval, four.sittings) == pytest.approx((0.04, 0.1, 4))


def test_each_sitting_takes_its_share_of_the_floors():
    """The run's figure rests on all its sittings' windows: N sittings that each met the
    whole ``--repetitions`` and ``--min-duration`` floor took N times the floor (DeiT and the
    conv block at batch size 8 of the default experiment stop there)."""
    settings = MeasureSettings(warmup=3, repetitions=10, min_duration_s=0.5, max_duration_s=2.0)
    assert settings.per_sitting(1) == settings
    three = settings.per_sitting(3)
    assert (three.repetitions, three.min_duration_s) == (4, pytest.approx(0.5 / 3))
    assert 3 * three.repetitions >= settings.repetitions  # the run still meets its floor
    assert (three.warmup, three.max_duration_s) == (3, 2.0)  # a fresh process warms up whole
    three.validate()


def test_each_sitting_of_a_group_is_measured_to_its_share_of_the_floors(monkeypatch):
    """The groups hand each sitting's rounds the shared floors (a run of one sitting, the
    whole floors)."""
    from types import SimpleNamespace

    from mlflow_ngraph.run import groups, isolation

    given = []
    monkeypatch.setattr(isolation, "run_group", lambda *args: given.append(args[3]))
    measure = MeasureSettings(warmup=3, repetitions=10, min_duration_s=0.5)
    cell = SimpleNamespace(key="k", compiler=SimpleNamespace(name="identity"))
    task = SimpleNamespace(policy=lambda: None)
    for sittings in (1, 2):
        dispatch = groups.GroupDispatch.__new__(groups.GroupDispatch)
        dispatch.spec = SimpleNamespace(measure=measure, batch_sizes=[1])
        dispatch.policy = RunPolicy(sittings=sittings)
        dispatch.work = SimpleNamespace(events=lambda *args: None)
        dispatch.reference, dispatch.cell_timeout_s = False, 60.0
        dispatch._sitting([(cell, [1], None, task)], {"k": {}}, True, [])
    assert given == [measure, measure.per_sitting(2)] and given[1].repetitions == 5


def test_a_rerun_interval_on_a_runs_own_sittings_says_it_leaves_the_runs_spread_out():
    """A run's sittings share its occasion's offset: where the host has not measured two
    runs of these engines, the words say the spread between runs is not in the interval;
    once it has, they name it."""
    run = Spread(0.01, 8, "this run's 2 sittings (every engine: 80 measured in 160 sittings)")
    alone = with_runs(run, None).words()
    assert "between runs is not in it" in alone and "mlflow-ngraph calibrate" in alone
    host = Spread(0.0, 0, "this host's history", between=0.024, between_df=8)
    both = with_runs(run, host)
    assert both.between == 0.024 and "2.40% (8 df) between runs" in both.words()
    assert "not in it" not in both.words()


def test_the_last_sitting_is_measured_again_only_where_that_can_change_the_mean():
    """The last of two sittings, too wide alone (against the run's +-5%, +-7.07% a
    sitting): its retry is spent only where the mean's verdict can turn on it."""
    from mlflow_ngraph.measure.sittings import Sitting, mean_settles

    def settles(earlier, now, to_come=0):
        return mean_settles(
            [Sitting(h) for h in earlier], Sitting(now), to_come, 0.05, 0.0283, "speedup"
        )

    log = math.log1p
    # +-7.7% alone, but the mean with a +-3% first sitting is +-4.1%: STABLE as it is
    assert not settles([log(0.03)], log(0.077))
    # the first sitting +-12%: even this one at its +-2.83% target leaves the mean +-6.0%
    assert not settles([log(0.12)], log(0.09))
    # +-8% and +-8.5%: the mean +-5.8%; this one at +-2.83% would give +-4.2%
    assert settles([log(0.08)], log(0.085))
    # an earlier sitting without an interval: the mean has none whatever this one gives
    assert not settles([None], log(0.09))
    # this sitting without one: measure again, as before
    assert settles([log(0.03)], None)
    # the first of two: the sitting to come, at its target, can still make the mean
    assert not settles([], log(0.09), to_come=1)  # the mean +-4.5% with one at +-2.83%
    assert settles([], log(0.11), to_come=1)  # +-5.7%; this one at its target: +-2.0%
    # the only sitting there will be (its earlier one failed): judged on its own
    assert settles([], log(0.09))


def test_the_screens_move_is_judged_on_the_mean_of_the_sittings():
    """A sitting whose screen moved its figure past its own interval counts through the
    mean: the mean carries the sittings' unscreened figures, and it is UNSTABLE where the
    screen moved the mean past the mean's interval, not where one sitting's move is
    diluted within it."""
    from mlflow_ngraph.measure.sittings import Sitting, mean_settles

    def sat(speedup, unscreened, disturbed, moved=False):
        got = record(100.0, 0.02, speedup, 0.02, speedup_unscreened=unscreened,
                     windows=12, windows_disturbed=disturbed)  # fmt: skip
        if moved:
            got["stability"] = {"stable": False, "reason": "screen", "own_only": True}
        return got

    clean, moved = sat(2.0, None, 0), sat(2.1, 2.0, 5, moved=True)  # +5%, 5 of 12 out
    out = combine([clean, moved], {}, 0.05)
    # nothing left out of the first: its figure is its unscreened one
    assert out["metrics"]["speedup_unscreened"] == pytest.approx(2.0)
    assert "speedup_unscreened" not in combine([clean, clean], {}, 0.05)["metrics"]
    # the mean moved +2.5% against its +-1.4%, but on 5 of 24 windows: it does not rest on
    # the screen
    assert out["stability"]["stable"]
    both = combine([moved, sat(2.1, 2.0, 4, moved=True)], {}, 0.05)
    assert not both["stability"]["stable"]
    assert (
        "disturbed windows moved the speedup +5.0% over the 2 sittings"
        in (both["stability"]["reason"])
    )
    # the first sitting's screen moved it +5% (5 of 12 out): the sitting to come, as long
    # and clean, leaves the mean's move +2.5% on 5 of 24 windows: not a mark, no retry
    first = Sitting.of(moved, "speedup")
    assert first.screened == pytest.approx(math.log(1.05)) and first.windows == 12
    assert not mean_settles([], first, 1, 0.05, 0.0283, "speedup")
    # the last sitting moved the same way as a first that did too: measure it again
    earlier = [Sitting.of(sat(2.1, 2.0, 4), "speedup")]
    assert mean_settles(earlier, first, 0, 0.05, 0.0283, "speedup")


def _sitting_of(sittings: int, hs: float):
    """(task, result) of a worker's sitting of ``sittings``: a speedup of 2.0x at +-``hs``
    (relative) paired at batch size 4, the throughput 50/s [49-51]."""
    from types import SimpleNamespace

    task = SimpleNamespace(name="cell", run=RunPolicy(sittings=sittings).per_sitting())
    result = SimpleNamespace(
        batch_size=4, speedup_paired=2.0, speedup_halfwidth=hs,
        speedup_ci_low=2.0 / (1 + hs), speedup_ci_high=2.0 * (1 + hs),
        throughput=50.0, throughput_ci_low=49.0, throughput_ci_high=51.0,
    )  # fmt: skip
    return task, result


def test_the_last_sittings_verdict_keeps_its_retry_only_where_it_can_settle(caplog):
    """The worker's verdict on a sitting of several: the retry of a figure UNSTABLE only on
    its own is dropped where the sittings' mean is known well enough already (said in the
    log), and kept where a re-measure can settle it, for any other cause, and in a single
    sitting."""
    import logging
    from types import SimpleNamespace

    from mlflow_ngraph.measure.sittings import earlier_sittings
    from mlflow_ngraph.measure.stability import Stability
    from mlflow_ngraph.run.worker import remeasure_if_it_settles

    task, result = _sitting_of(2, 0.077)
    reason = "speedup interval +-7.7% is wider than +-7.07%: measure on a quiet host"
    wide = Stability(False, reason, True, True)
    narrow = earlier_sittings([record(48.0, 0.01, speedup=2.1, hs=0.03)], 0)
    assert narrow.figures["speedup"][0].h == pytest.approx(0.03)
    with caplog.at_level(logging.DEBUG, logger="mlflow_ngraph"):
        kept = remeasure_if_it_settles(task, result, True, wide, narrow)
    assert kept.retry is False and kept.stable is False and kept.reason == wide.reason
    assert "cannot change the verdict on the 2 sittings' mean" in caplog.text
    assert "(speedup interval +-7.7% is wider than +-7.07%)" in caplog.text
    as_wide = earlier_sittings([record(48.0, 0.01, speedup=2.1, hs=0.08)], 0)
    assert remeasure_if_it_settles(task, result, True, wide, as_wide).retry is True
    host = Stability(False, "the host was contended: ...", True, False)
    assert remeasure_if_it_settles(task, result, True, host, narrow).retry is True
    assert remeasure_if_it_settles(task, result, True, wide, None).retry is True
    # the first of two sittings, +-7.7%: the one to come at its target makes the mean
    first = remeasure_if_it_settles(task, result, True, wide, earlier_sittings([], 1))
    assert first.retry is False
    # a speedup without an interval (too few paired rounds) leaves the mean without one: a
    # re-measure may give it, however narrow the throughputs are together
    bare = SimpleNamespace(**{**vars(result), "speedup_halfwidth": None,
                              "speedup_ci_low": None, "speedup_ci_high": None})  # fmt: skip
    too_wide = Stability(False, "throughput interval +-15% is wider than +-14.1%", True, True)
    assert remeasure_if_it_settles(task, bare, True, too_wide, narrow).retry is True


def test_no_sitting_is_measured_again_after_an_earlier_one_was_unstable_for_the_host(caplog):
    """An earlier sitting UNSTABLE for what the host did (a gross move against the history,
    contention) makes the combined verdict UNSTABLE whatever a later one gives: a later
    sitting UNSTABLE for any cause is not measured again (said in the log); an earlier one
    UNSTABLE only for its own interval leaves the retry to the rules of the mean."""
    import logging

    from mlflow_ngraph.measure.sittings import earlier_sittings
    from mlflow_ngraph.measure.stability import Stability
    from mlflow_ngraph.run.worker import remeasure_if_it_settles

    task, result = _sitting_of(3, 0.02)
    moved = "the throughput moved +38.3% against this engine measured on this host at 03:40"
    gross = record(48.0, 0.01, speedup=2.1, hs=0.03, stable=False, reason=moved)
    own = record(48.0, 0.01, speedup=2.1, hs=0.09, stable=False, reason="wide")
    gross["stability"]["own_only"] = False
    own["stability"]["own_only"] = True
    host = Stability(False, "the host was contended: 40% other CPU", True, False)
    after_gross = earlier_sittings([record(48.0, 0.01, speedup=2.1, hs=0.03), gross], 0)
    assert after_gross.host_unstable == f"sitting 2: {moved}"
    with caplog.at_level(logging.DEBUG, logger="mlflow_ngraph"):
        kept = remeasure_if_it_settles(task, result, True, host, after_gross)
    assert kept.retry is False and kept.stable is False and kept.reason == host.reason
    assert f"cannot change the sittings' combined verdict, UNSTABLE for sitting 2: {moved}" in (
        caplog.text
    )
    # the same sitting after one UNSTABLE only for its own interval: measured again
    after_own = earlier_sittings([own], 1)
    assert after_own.host_unstable == ""
    assert remeasure_if_it_settles(task, result, True, host, after_own).retry is True
    # and the combined verdict says the earlier sitting's cause as the retry's rule read it
    out = combine([gross, record(50.0, 0.01, 2.0, 0.02)], {}, 0.0707)
    assert out["stability"]["stable"] is False
    assert out["stability"]["reason"].startswith(f"sitting 1: {moved}")


def test_each_sitting_is_judged_with_the_earlier_ones_and_those_to_come(monkeypatch):
    """The groups hand each sitting's members the earlier sittings' records and the number
    of sittings still to come, and the coordinator asks each worker's verdict with their
    figures at the batch size (a member of a single sitting is asked without)."""
    from types import SimpleNamespace

    from mlflow_ngraph.run import groups, isolation

    members = []
    monkeypatch.setattr(isolation, "run_group", lambda cells, *args: members.append(cells))
    cell = SimpleNamespace(key="k", compiler=SimpleNamespace(name="identity"))
    task = SimpleNamespace(policy=lambda: None)
    kept = {4: [record(48.0, 0.01, speedup=2.1, hs=0.03)]}
    dispatch = groups.GroupDispatch.__new__(groups.GroupDispatch)
    dispatch.spec = SimpleNamespace(measure=MeasureSettings(), batch_sizes=[4])
    dispatch.policy = RunPolicy(sittings=2)
    dispatch.work = SimpleNamespace(events=lambda *args: None)
    dispatch.reference, dispatch.cell_timeout_s = False, 60.0
    for to_come in (1, 0):
        dispatch._sitting([(cell, [4], None, task)], {"k": kept}, to_come, [])
    assert [(m[0].earlier, m[0].to_come) for m in members] == [(kept, 1), (kept, 0)]
    dispatch.policy = RunPolicy()
    dispatch._sitting([(cell, [4], None, task)], {}, 0, [])
    assert members[-1][0].earlier is None

    asked = {}

    class Group:
        def ask(self, member, command, kinds):
            asked[member.name] = command[1]
            return "judged", (True, "", True, None)

    first = isolation.GroupCell("id", task, None)
    last = isolation.GroupCell("ts", task, None, earlier=kept, to_come=1)
    figures = {"id": "id's rounds", "ts": "ts's rounds"}
    isolation._judge(Group(), {"id": first, "ts": last}, figures, "id", 4)
    assert asked["id"] == ("id's rounds", False, None, None)
    said = asked["ts"][3]
    assert asked["ts"][:2] == ("ts's rounds", True) and said.to_come == 1
    assert [s.h for s in said.figures["speedup"]] == [pytest.approx(0.03)]
    assert [s.h for s in said.figures["throughput"]] == [pytest.approx(0.01)]
