"""TVM through the runner: tuning numbers reach MLflow and an untuned build says so."""

from mlflow.tracking import MlflowClient

from tests._support import TINY


def test_untuned_tvm_is_labelled_and_logged(run_cli, tracking_uri):
    code, out, err = run_cli(
        "benchmark",
        *TINY,
        "--compiler",
        "tvm:trials=0",
        "--experiment",
        "tvm",
        "--tracking-uri",
        tracking_uri,
    )
    assert code == 0, err
    rows = [line for line in out.splitlines() if " tvm " in line]
    assert len(rows) == 2 and all("untuned" in row and " OK " in row for row in rows)
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("tvm")
    run = next(
        r for r in client.search_runs([exp.experiment_id]) if r.data.params.get("compiler") == "tvm"
    )
    assert run.data.metrics["trials.bs1"] == 0.0
    assert run.data.metrics["tuned.bs2"] == 0.0
    assert run.data.params["flag.trials"] == "0"
