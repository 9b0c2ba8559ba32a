"""``--remeasure``: the measurements a store holds measured again in their own cell runs."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from mlflow_ngraph.tracking import schema as S
from tests._support import TINY


def _cells(uri: str) -> list:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("again")
    runs = client.search_runs([experiment.experiment_id])
    return [r for r in runs if r.data.tags.get(S.T_ROLE) == "cell"]


def test_remeasure_unstable_replaces_figures_in_their_own_runs(
    run_cli, tmp_path, home, tracking_uri
):
    """Measured to an impossible interval (every result UNSTABLE), then ``--remeasure
    unstable`` with a loose one: the model's whole group, baseline included, measured again
    into the same runs (figures, marks and signed records replaced, the history kept), no
    second cell run; a plain re-run then has nothing to do."""
    from mlflow_ngraph import keys
    from mlflow_ngraph.tracking.provenance import fetch_signed

    uri = tracking_uri
    base = ["benchmark", *TINY, "--compiler", "identity", "--compiler", "torchscript",
            "--experiment", "again", "--tracking-uri", uri]  # fmt: skip
    code, out, err = run_cli(*base, "--max-interval", "1e-9")
    assert code == 0, err
    # the summary names the command that measures them again, from this invocation's options
    said = out.replace("\n", " ")
    assert "with: mlflow-ngraph benchmark --model" in said and "--max-interval 1e-09" in said
    assert "--experiment again" in said and "--remeasure unstable" in said
    code, out, err = run_cli(*base, "--max-interval", "1e-9")  # a plain re-run: says how
    assert "nothing to do" in err and "4 of 4 measurements in the store are UNSTABLE" in err
    before = {r.info.run_id: r for r in _cells(uri)}
    assert len(before) == 2

    loose = [*base, "--max-interval", "0.99", "--max-other-cpu", "100"]
    code, out, err = run_cli(*loose, "--remeasure", "unstable")
    assert code == 0, err
    after = {r.info.run_id: r for r in _cells(uri)}
    assert set(after) == set(before)  # the same runs, no second cell run
    client, trusted = MlflowClient(uri), keys.trusted_keys(home)
    for run_id, run in after.items():
        for b in (1, 2):
            assert len(client.get_metric_history(run_id, f"throughput.bs{b}")) == 2
            figure = run.data.metrics[f"throughput.bs{b}"]
            assert figure != before[run_id].data.metrics[f"throughput.bs{b}"]
            signed = fetch_signed(client, run_id, b, trusted, tmp_path / f"{run_id}{b}")
            assert signed.metrics["throughput"] == figure
            assert signed.record["stability"] == run.data.tags[f"{S.T_STABILITY}.bs{b}"]
            if run.data.tags[f"{S.T_STABILITY}.bs{b}"] == S.STABILITY_STABLE:
                assert f"{S.T_STABILITY_REASON}.bs{b}" not in run.data.tags  # the old reason
        assert run.info.status == "FINISHED"

    code, out, err = run_cli(*loose)
    assert code == 0 and "nothing to do" in err
    assert len(_cells(uri)) == 2


def test_a_bad_remeasure_is_one_line(run_cli):
    code, out, err = run_cli("benchmark", "--spec", "smoke", "--remeasure", "sometimes")
    assert code == 2
    assert err.strip().count("\n") == 0 and "--remeasure unstable" in err
