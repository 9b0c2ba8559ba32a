"""Noise in compare: throughput and speedup intervals, UNSTABLE marks, ranking flips beyond
or within noise, and Kendall's tau with an interval, from runs with hand-made intervals."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner
from report_data import Cell, log_benchmark, new_store, one, records_of

from mlflow_ngraph.commands.report import compare
from mlflow_ngraph.report.tables import tau_interval
from mlflow_ngraph.tracking import schema as S

A, B, C, D = "resnet18", "resnet50", "efficientnet_b3", "convnext_tiny"
MOVED = "the throughput moved 3.18x lower against this engine measured at 06:24\x1b[31m"


REASON = "the host ran in two states: the speedup was -19.0% in the 17 of 40 rounds"


@pytest.fixture(scope="module")
def noisy_store(tmp_path_factory):
    uri, client, exp = new_store(tmp_path_factory.mktemp("noise-store"), "noise")
    cells = [
        # identity: A 100 [95, 105], B 90 [70, 110] (overlaps A), C 50 [49, 51]
        Cell("cpu", A, "resnet", "identity", {1: 100}, ci={1: (95, 105)}),
        Cell("cpu", B, "resnet", "identity", {1: 90}, ci={1: (70, 110)}),
        Cell("cpu", C, "efficientnet", "identity", {1: 50}, ci={1: (49, 51)}),
        # openvino flips A/B (within noise: B's identity interval overlaps A's) and A/C
        # (beyond noise: both rankings' intervals separate); C is UNSTABLE
        Cell("cpu", A, "resnet", "openvino", {1: 200}, ci={1: (190, 210)}),
        Cell("cpu", B, "resnet", "openvino", {1: 300}, ci={1: (280, 320)}),
        Cell(
            "cpu",
            C,
            "efficientnet",
            "openvino",
            {1: 400},
            ci={1: (380, 420)},
            stability={1: "UNSTABLE"},
            tags={
                f"{S.T_MOVED}.bs1": "moved 2x: said in its UNSTABLE reason",
                f"{S.T_STABILITY_REASON}.bs1": REASON,
            },
        ),  # fmt: skip
        # onnxruntime: the same figures as openvino's, every one STABLE; the guard said A's
        # moved against an earlier run (store text: a terminal escape in it stays inert)
        Cell(
            "cpu",
            A,
            "resnet",
            "onnxruntime",
            {1: 200},
            ci={1: (190, 210)},
            stability={1: "STABLE"},
            tags={f"{S.T_MOVED}.bs1": MOVED},
        ),  # fmt: skip
        Cell("cpu", B, "resnet", "onnxruntime", {1: 300}, ci={1: (280, 320)}),
        Cell("cpu", C, "efficientnet", "onnxruntime", {1: 400}, ci={1: (380, 420)}),
    ]
    log_benchmark(client, exp, "cpu", cells)
    return uri


def _json(uri: str, *args: str):
    result = CliRunner().invoke(compare, ["--tracking-uri", uri, "--format", "json", *args])
    return records_of(result)


def test_speedup_interval_adds_the_log_half_widths_in_quadrature(noisy_store):
    row = one(_json(noisy_store), model=A, compiler="openvino", batch_size=1)
    assert (row["throughput_ci_low"], row["throughput_ci_high"]) == (190, 210)
    assert row["speedup"] == pytest.approx(2.0)
    down = math.hypot(math.log(200 / 190), math.log(105 / 100))
    up = math.hypot(math.log(210 / 200), math.log(100 / 95))
    assert row["speedup_ci_low"] == pytest.approx(2.0 * math.exp(-down), rel=1e-12)
    assert row["speedup_ci_high"] == pytest.approx(2.0 * math.exp(up), rel=1e-12)
    # narrower than interval arithmetic, wider than either side alone
    assert 190 / 105 < row["speedup_ci_low"] < 190 / 100
    ident = one(_json(noisy_store), model=A, compiler="identity", batch_size=1)
    assert ident["speedup"] == 1.0 and ident["speedup_ci_low"] is None


def test_unstable_rows_are_marked_and_counted(noisy_store):
    row = one(_json(noisy_store), model=C, compiler="openvino", batch_size=1)
    assert row["stability"] == "UNSTABLE"
    assert row["stability_reason"] == REASON  # why, for a script as for the HTML report
    assert one(_json(noisy_store), model=A, compiler="openvino", batch_size=1)[
        "stability_reason"
    ] in ("", None)
    assert one(_json(noisy_store), model=A, compiler="openvino", batch_size=1)["stability"] == ""
    result = CliRunner().invoke(compare, ["--tracking-uri", noisy_store])
    assert result.exit_code == 0, result.output
    assert "1 UNSTABLE measurement(s)" in result.output
    # it names the command that measures it again in place, with the experiment and device
    said = " ".join(result.output.split())
    assert "mlflow-ngraph benchmark --experiment" in said and "--remeasure unstable" in said
    line = next(x for x in result.output.splitlines() if C in x and "openvino" in x)
    assert "UNSTABLE" in line and "[380-420]" in line  # the interval beside the throughput


def test_compare_says_the_figures_the_guard_said_moved(noisy_store):
    """The guard's word (``ngraph.moved.bs<b>``) reached only the benchmark's terminal: a
    colleague reading ``compare`` saw a STABLE figure 3x off an earlier run unremarked."""
    result = CliRunner().invoke(compare, ["--tracking-uri", noisy_store])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "1 figure(s) moved against the same engine measured earlier" in said
    assert f"{A} onnxruntime bs1: the throughput moved 3.18x lower" in said
    assert "said in its UNSTABLE reason" not in said  # an UNSTABLE one says it in its reason
    assert "\x1b" not in result.output  # store text is data, never a terminal's command
    row = one(_json(noisy_store), model=A, compiler="onnxruntime", batch_size=1)
    assert row["moved"].startswith("the throughput moved 3.18x lower")


def test_compare_says_why_no_re_run_interval_is_shown(noisy_store):
    """The store holds no re-run interval (no spread measured on the host): compare leaves
    the column out and says why in one line, on the terminal and in markdown."""
    for fmt, line in (("terminal", "re-run: none yet"), ("markdown", "`re-run`: none yet")):
        shown = CliRunner().invoke(compare, ["--tracking-uri", noisy_store, "--format", fmt])
        text = " ".join(shown.output.split())
        assert shown.exit_code == 0 and f"{line}: this host's spread needs measuring" in text
        assert "throughput re-run" not in text


def test_flips_say_which_are_beyond_noise(noisy_store):
    flips = _json(noisy_store, "--table", "flips")
    row = one(flips, compiler="onnxruntime", level="model")
    assert row["swapped"] == 3 and row["beyond_noise"] == 2
    pairs = dict(p.rsplit(" (", 1) for p in row["swapped_pairs"].split("; "))
    assert pairs[f"{A} > {B}"] == "within noise)"  # identity intervals overlap
    # no re-run intervals (no spread measured): judged on this run's, and said so
    assert pairs[f"{A} > {C}"] == "beyond this run's noise)"
    assert pairs[f"{B} > {C}"] == "beyond this run's noise)"
    # the same figures with C's openvino figure UNSTABLE: no order built on it is judged
    row = one(flips, compiler="openvino", level="model")
    assert row["swapped"] == 3 and row["beyond_noise"] == 0
    pairs = dict(p.rsplit(" (", 1) for p in row["swapped_pairs"].split("; "))
    assert pairs[f"{A} > {B}"] == "within noise)"
    assert pairs[f"{A} > {C}"] == f"not judged: {C} UNSTABLE)"
    assert pairs[f"{B} > {C}"] == f"not judged: {C} UNSTABLE)"
    assert row["kendall_tau"] == pytest.approx(-1.0)
    assert row["tau_ci_low"] <= row["kendall_tau"] <= row["tau_ci_high"]
    assert row["tau_ci_high"] > -1.0  # the A/B flip could be noise: tau is not surely -1


def test_tau_interval_collapses_without_noise_and_needs_a_spread():
    assert tau_interval([3, 2, 1], [0.0, 0.0, 0.0], [1, 2, 3], [0.0, 0.0, 0.0]) == (-1.0, -1.0)
    nan = float("nan")
    assert tau_interval([3, 2, 1], [nan] * 3, [1, 2, 3], [nan] * 3) is None
    low, high = tau_interval([3, 2, 1], [5.0] * 3, [1, 2, 3], [5.0] * 3)  # noise >> gaps
    assert low < 0 < high


# --- the fallback interval where a run logged none: the mean's, from the repetition count ---
@pytest.fixture(scope="module")
def fallback_store(tmp_path_factory):
    """No logged intervals: throughput_std (one repetition's spread) and the repetition
    count are all compare has. resnet18: 100 repetitions, CV 0.19 (the issue's example);
    resnet50: one repetition (std 0); efficientnet: a run from before repetitions were
    logged."""
    uri, client, exp = new_store(tmp_path_factory.mktemp("fallback-store"), "fallback")
    cells = [
        Cell("cpu", A, "resnet", "identity", {1: 100}, rep_cv=0.19),
        Cell("cpu", A, "resnet", "openvino", {1: 110}, rep_cv=0.19),
        Cell("cpu", B, "resnet", "identity", {1: 50}, repetitions=1, rep_cv=0.0),
        Cell("cpu", B, "resnet", "openvino", {1: 55}, repetitions=1, rep_cv=0.0),
        Cell("cpu", C, "efficientnet", "identity", {1: 80}, repetitions=None),
        Cell("cpu", C, "efficientnet", "openvino", {1: 90}, repetitions=None),
        # two 100 ms windows of 200 requests each: std is a window's spread, n is 2
        Cell("cpu", D, "convnext", "identity", {1: 80}, repetitions=400, windows=2, rep_cv=0.1),
        Cell("cpu", D, "convnext", "openvino", {1: 90}, repetitions=400, windows=2, rep_cv=0.1),
    ]
    log_benchmark(client, exp, "cpu", cells)
    return uri


def test_fallback_interval_is_the_means_not_one_repetitions(fallback_store):
    from scipy import stats

    row = one(_json(fallback_store), model=A, compiler="openvino", batch_size=1)
    half = stats.t.ppf(0.975, 99) * 0.19 / math.sqrt(100)  # relative: t x CV / sqrt(n)
    # each side +-3.8% (not +-1.96 std = +-37%); their log half-widths add in quadrature
    width = math.hypot(math.log(1 / (1 - half)), math.log(1 + half))
    assert row["speedup_ci_low"] == pytest.approx(1.1 * math.exp(-width), rel=1e-9)
    assert row["speedup_ci_high"] == pytest.approx(1.1 * math.exp(width), rel=1e-9)
    assert 1.03 < row["speedup_ci_low"] and row["speedup_ci_high"] < 1.17


def test_too_few_repetitions_give_no_interval_anywhere(fallback_store):
    rows = _json(fallback_store)
    single = one(rows, model=B, compiler="openvino", batch_size=1)
    assert single["speedup"] == pytest.approx(1.1)
    # no zero-width "speedup_ci 1.1-1.1", no "± 0"
    assert single["speedup_ci_low"] is None and single["speedup_ci_high"] is None
    assert single["throughput_std"] is None
    # a run that did not log its repetition count: no interval can be made from its std
    old = one(rows, model=C, compiler="openvino", batch_size=1)
    assert old["speedup_ci_low"] is None and old["speedup_ci_high"] is None
    assert old["throughput_std"] == pytest.approx(0.9)  # its spread is still shown
    # a window's spread over the windows' count, never over the requests': two windows
    # give no interval (it was t(399) x 0.1 / sqrt(400): +-1%, 20x too narrow)
    windowed = one(rows, model=D, compiler="openvino", batch_size=1)
    assert windowed["speedup_ci_low"] is None and windowed["speedup_ci_high"] is None
    result = CliRunner().invoke(compare, ["--tracking-uri", fallback_store])
    assert result.exit_code == 0, result.output
    assert "± 0 " not in result.output and "1.1-1.1" not in result.output


def test_kendall_interval_needs_every_items_spread(fallback_store):
    flips = one(_json(fallback_store, "--table", "flips"), compiler="openvino", level="model")
    assert flips["n"] == 4
    # resnet50, efficientnet and convnext have no interval: the draws would take them as exact
    assert flips["tau_ci_low"] is None and flips["tau_ci_high"] is None
    nan = float("nan")
    assert tau_interval([3, 2, 1], [1.0, nan, 1.0], [1, 2, 3], [1.0] * 3) is None


def test_a_paired_speedup_interval_is_read_and_judges_the_flips(tmp_path):
    """Speedups measured interleaved log their own interval (paired rounds): compare shows
    it instead of combining the two throughput intervals, and a flip is beyond noise only
    when the speedups' intervals separate too."""
    uri, client, exp = new_store(tmp_path, "paired")
    cells = [
        # identity: A 100 [98, 102] is clearly ahead of B 50 [49, 51]
        Cell("cpu", A, "resnet", "identity", {1: 100}, ci={1: (98, 102)}),
        Cell("cpu", B, "resnet", "identity", {1: 50}, ci={1: (49, 51)}),
        # openvino: B overtakes A; the throughputs' intervals separate (a drifting host can
        # do that between two models measured minutes apart), A's paired speedup is known
        # to +-1%, B's only to within [1.9, 5.0]: the speedups overlap, the flip is noise
        Cell("cpu", A, "resnet", "openvino", {1: 200}, ci={1: (195, 202)},
             speedup_ci={1: (1.98, 2.02)}),
        Cell("cpu", B, "resnet", "openvino", {1: 210}, ci={1: (205, 215)},
             speedup_ci={1: (1.9, 5.0)}),
    ]  # fmt: skip
    log_benchmark(client, exp, "cpu", cells)
    row = one(_json(uri), model=A, compiler="openvino", batch_size=1)
    assert (row["speedup_ci_low"], row["speedup_ci_high"]) == (1.98, 2.02)
    flips = _json(uri, "--table", "flips")
    flip = next(f for f in flips if f["compiler"] == "openvino" and f["level"] == "model")
    assert flip["swapped"] == 1 and flip["beyond_noise"] == 0
    assert "within noise" in flip["swapped_pairs"]


def test_a_flip_is_beyond_noise_only_where_the_re_run_intervals_separate(tmp_path):
    """Where the host measured its spread between sittings, each speedup has a re-run
    interval: compare shows it beside this run's, and judges a flip on it. Here the
    sittings' intervals separate (2.4 [2.35-2.45] against 2.1 [2.05-2.15]) but a re-run
    could land either way (their re-run intervals overlap): the flip is noise."""
    uri, client, exp = new_store(tmp_path, "rerun")
    cells = [
        Cell("cpu", A, "resnet", "identity", {1: 100}, ci={1: (98, 102)}),
        Cell("cpu", B, "resnet", "identity", {1: 90}, ci={1: (88, 92)}),
        Cell("cpu", A, "resnet", "openvino", {1: 210}, ci={1: (205, 215)},
             speedup_ci={1: (2.05, 2.15)}, speedup_rerun={1: (1.9, 2.3)}),
        Cell("cpu", B, "resnet", "openvino", {1: 216}, ci={1: (212, 220)},
             speedup_ci={1: (2.35, 2.45)}, speedup_rerun={1: (2.2, 2.6)}),
    ]  # fmt: skip
    log_benchmark(client, exp, "cpu", cells)
    row = one(_json(uri), model=B, compiler="openvino", batch_size=1)
    assert (row["speedup_rerun_low"], row["speedup_rerun_high"]) == (2.2, 2.6)
    flips = _json(uri, "--table", "flips")
    flip = next(f for f in flips if f["compiler"] == "openvino" and f["level"] == "model")
    assert flip["swapped"] == 1 and flip["beyond_noise"] == 0, flip
    shown = CliRunner().invoke(compare, ["--tracking-uri", uri, "--model", B])
    assert shown.exit_code == 0, shown.output
    assert "re-run" in shown.output and "[2.2-2.6]" in shown.output, shown.output
    assert "re-run: none yet" not in shown.output  # the why-line only where none has one


def test_the_moves_within_a_run_are_counted_apart():
    """A first run's second sitting set against its first (no other run measured the
    engine) is the host drifting during the run: counted apart from moves against other
    runs, so that 22 such words on a first run do not read as 22 changes since last time."""
    import pandas as pd

    from mlflow_ngraph.commands.report import moved_note
    from mlflow_ngraph.measure.history import OTHER_RUN, WITHIN_RUN

    frame = pd.DataFrame(
        {
            "model_label": ["m", "m", "m", "m"],
            "compiler_label": ["a", "b", "c", "d"],
            "batch_size": [1, 1, 1, 1],
            "stability": ["", "", "", "UNSTABLE"],
            "moved": [
                f"sitting 2: the throughput moved -12.0% against {WITHIN_RUN} at 12:00 (10/s)",
                f"the throughput moved -30.0% against {OTHER_RUN} at 11:00 (10/s)",
                f"sitting 1: the speedup moved +9.0% against {OTHER_RUN} at 11:00 (2x); "
                f"sitting 2: the speedup moved +8.0% against {WITHIN_RUN} at 12:00 (2x)",
                f"the throughput moved -50.0% against {WITHIN_RUN} at 12:00 (10/s)",
            ],
        }
    )
    said = moved_note(frame)
    assert said.startswith("3 figure(s) moved")  # the UNSTABLE one says it in its reason
    assert said.endswith("1 of them moved only between their own run's sittings (the host "
                         "drifted during that run; no other run had measured them)")  # fmt: skip
    assert "moved only between" not in moved_note(frame.iloc[1:3])


def test_a_flip_beyond_noise_is_one_both_rankings_re_run_intervals_keep(tmp_path):
    """A flip is "beyond noise" only where eager's order and the speedups' both separate on
    their re-run intervals; where eager's figures have none, its order was judged on this
    run's intervals alone, and the words say so."""
    uri, client, _ = new_store(tmp_path, "both")
    compiled = [
        Cell("cpu", A, "resnet", "openvino", {1: 150}, ci={1: (147, 153)},
             speedup_ci={1: (1.48, 1.52)}, speedup_rerun={1: (1.4, 1.6)}),
        Cell("cpu", B, "resnet", "openvino", {1: 200}, ci={1: (196, 204)},
             speedup_ci={1: (3.9, 4.1)}, speedup_rerun={1: (3.7, 4.3)}),
    ]  # fmt: skip
    eager = {  # experiment: B's eager figure and its re-run interval (A's: 100, 94-106)
        "both": (50, (47, 53)),  # eager's re-run intervals separate: beyond noise
        "eager-overlaps": (90, (80, 101)),  # a re-run of eager may order them the other way
        "sitting": (50, None),  # no re-run interval for eager: this run's judge its order
    }
    for name, (value, rerun) in eager.items():
        cells = [
            Cell("cpu", A, "resnet", "identity", {1: 100}, ci={1: (98, 102)},
                 rerun={1: (94, 106)} if rerun else {}),
            Cell("cpu", B, "resnet", "identity", {1: value}, ci={1: (value - 1, value + 1)},
                 rerun={1: rerun} if rerun else {}),
        ]  # fmt: skip
        exp = client.get_experiment_by_name(name) or client.create_experiment(name)
        log_benchmark(client, getattr(exp, "experiment_id", exp), "cpu", [*cells, *compiled])
    said = {}
    for name in eager:
        flip = one(_json(uri, "-e", name, "--table", "flips"), compiler="openvino", level="model")
        said[name] = (flip["swapped_pairs"], flip["beyond_noise"])
    assert said == {
        "both": (f"{A} > {B} (beyond noise)", 1),
        "eager-overlaps": (f"{A} > {B} (within noise)", 0),
        "sitting": (f"{A} > {B} (beyond this run's noise)", 1),
    }
