"""``calibrate``: the host's spread between sittings measured into the home, and the re-run
intervals a later benchmark on this host then carries."""

from __future__ import annotations

import re

import pytest
from mlflow.tracking import MlflowClient

from mlflow_ngraph.measure import history
from mlflow_ngraph.tracking import schema as S

SPEC = """
experiment: tiny-calibrate
models:
  - {name: conv_block, params: {width: 8, depth: 1, image_size: 16}}
compilers: [identity]
batch_sizes: [1, 2, 4, 8]
warmup: 1
repetitions: 1
min_duration: 0
"""


def test_calibrate_needs_two_sittings(run_cli):
    code, _, err = run_cli("calibrate", "--sittings", "1")
    assert code == 2 and "sittings must be at least 2 (a spread needs two), got 1" in err


@pytest.mark.e2e
@pytest.mark.serial  # a sitting beside other tests is contended: it would not count
def test_calibrate_measures_the_spread_and_a_later_benchmark_carries_re_run_intervals(
    run_cli, tmp_path, home, tracking_uri
):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC)
    # a tiny model's figures in 0.3 s are wide: not left out of the spread for that
    loose = ("--max-interval", "0.95", "--max-other-cpu", "100")
    code, out, err = run_cli(
        "calibrate",
        "--spec",
        str(spec),
        "--sittings",
        "2",
        "--max-duration",
        "0.3",
        *loose,
        "-q",
    )
    assert code == 0, err
    spread = history.spread(home, "throughput")
    # each sitting a run of its own: the whole spread is between runs. 4 engines in 2
    # sittings: 4 degrees of freedom, 3 (the fewest it takes) where a noisy host made one
    # sitting UNSTABLE (it stays out of the spread)
    assert spread is not None and spread.between_df >= 3 and spread.df == 0, spread
    df = spread.between_df
    assert f"throughput: sd {100 * spread.between:.2f}% ({df} df) between runs from" in out
    assert "speedup: not yet" in out  # identity alone has no speedup
    # a later benchmark of the same engines on this host: each figure has a re-run interval
    code, out, err = run_cli(
        "benchmark", "--spec", str(spec), "--tracking-uri", tracking_uri,
        "--max-duration", "0.3", *loose,
    )  # fmt: skip
    assert code == 0, err
    assert "re-run CI" in out and "(none yet" not in out
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("tiny-calibrate")
    runs = client.search_runs([exp.experiment_id], "params.compiler = 'identity'")
    metrics, tags = runs[0].data.metrics, runs[0].data.tags
    low, high = (
        metrics[S.flat_key(S.M_THROUGHPUT_RERUN_LOW, 1)],
        metrics["throughput_rerun_high.bs1"],
    )
    ci_low, ci_high = metrics["throughput_ci_low.bs1"], metrics["throughput_ci_high.bs1"]
    assert low < ci_low and ci_high < high  # wider than the sitting's own interval
    assert (
        tags[f"{S.T_RERUN}.bs1"].startswith("sd ")
        and "this host's history" in tags[f"{S.T_RERUN}.bs1"]
    )
    # settled at the run's end on the history with this run in it: every batch size's
    # interval on the same spread, the one the history holds now (bs1, measured first, was
    # built on calibrate's alone)
    said = {tags[f"{S.T_RERUN}.bs{b}"] for b in (1, 2, 4, 8)}
    (text,) = said
    between = re.search(r"\((\d+) df\) between runs", text)
    after = history.spread(home, "throughput")
    if "this run's moves against it" in text:  # moved past calibrate's spread: said
        assert between and "a state its history has not measured" in err, (text, err[-2000:])
    else:
        assert between and int(between.group(1)) == after.between_df, (text, after)
    history_of_low = client.get_metric_history(runs[0].info.run_id, "throughput_rerun_low.bs1")
    assert history_of_low[-1].value == low
    if after.between_df > df or "this run's moves" in text:  # bs1's was logged again
        assert len(history_of_low) == 2, history_of_low
    else:  # a noisy host marked all of this run's figures UNSTABLE: they stay out of it
        assert len(history_of_low) == 1, history_of_low


def test_the_report_says_how_many_figures_a_noisy_host_left_out_of_the_spread(tmp_path):
    """A calibrate on a noisy host gave a spread from 11 of 24 speedups without a word: the
    user saw 'sd 4.34% (4 df)' and could not tell that half of what it measured was left
    out. Now the report counts what the spread rests on, and the rest by cause; a run of
    another command into the same home meanwhile (another occasion) is not counted."""
    from mlflow_ngraph.commands.calibrate import report

    def entry(t, occasion="c1", stable=True, contended=False, speedup=1.5):
        return history.Entry(t, "conv", 100.0 + t, 0.01, speedup + t / 100 if speedup else None,
                             0.01, contended, stable, occasion=occasion, group=f"g{t}")  # fmt: skip

    for t, occasion in ((1.0, "c1"), (2.0, "c2")):  # engine a: two STABLE sittings
        history.append(tmp_path, "a", entry(t, occasion))
    history.append(tmp_path, "b", entry(3.0, "c1"))  # engine b: its other sitting UNSTABLE
    history.append(tmp_path, "b", entry(4.0, "c2", stable=False))
    history.append(tmp_path, "c", entry(5.0, "c2", contended=True, speedup=None))
    history.append(tmp_path, "d", entry(6.0, "other", stable=False))  # another command's
    text = report(tmp_path, {"c1", "c2"})
    # one engine in two sittings: too few degrees of freedom for a spread yet
    assert "speedup: not yet" in text
    assert (
        "2 of the 4 speedup figures this calibrate measured could enter one, too few for a "
        "spread; left out: 1 UNSTABLE (wider than --max-interval, or the host moved), 1 "
        "without a second STABLE sitting of their engine." in text
    )
    assert "2 of the 5 throughput figures" in text and "1 measured on a contended host" in text
    assert "left out" not in report(tmp_path)  # no calibrate ran: nothing is said
    assert "left out" not in report(tmp_path, {"none"})  # it measured nothing
    for i in range(3):  # three engines more in two sittings: a spread, and what is in it
        for t, occasion in ((10.0 + 2 * i, "c1"), (11.0 + 2 * i, "c2")):
            history.append(tmp_path, f"e{i}", entry(t, occasion))
    text = report(tmp_path, {"c1", "c2"})
    assert "speedup: not yet" not in text, text
    assert "8 of the 10 speedup figures this calibrate measured are in it; left out" in text
