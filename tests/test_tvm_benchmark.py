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
    table = out.split("\n\n")[0]  # the rows, not the winners after them
    rows = [r for r in table.splitlines() if r.startswith("conv_block") and " tvm " in r]
    assert len(rows) == 2 and all("untuned" in row and " OK " in row for row in rows)
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("tvm")
    run = next(
        r for r in client.search_runs([exp.experiment_id]) if r.data.params.get("compiler") == "tvm"
    )

    def at(name, b):  # compile-side figures are stepped by batch size
        return {m.step: m.value for m in client.get_metric_history(run.info.run_id, name)}[b]

    assert at("trials", 1) == 0.0
    assert at("tuned", 2) == 0.0
    assert run.data.params["flag.trials"] == "0"
