"""``mlflow-ngraph sync`` sends journaled-but-unlogged results exactly once."""

from __future__ import annotations

from mlflow_ngraph.tracking import mlflow_log as ml
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tracking.journal import Journal

RESULT = {"metrics": {"throughput": 12.5, "latency_p50_ms": 3.0}, "status": "OK"}


def _measured_offline(tmp_path, home):
    """A cell whose batches 1 and 2 were measured while the store could not be written."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = ml.connect(uri)
    exp = ml.ensure_experiment(client, "e")
    run_id = client.create_run(exp).info.run_id
    journal = Journal.for_target(home, uri, "e", "cpu")
    journal.set_run("cell", run_id)
    journal.measured("cell", 1, RESULT)
    journal.measured("cell", 2, RESULT)
    return uri, client, run_id


def test_sync_sends_each_result_once(tmp_path, home, run_cli):
    uri, client, run_id = _measured_offline(tmp_path, home)
    code, out, err = run_cli("sync", "--tracking-uri", uri, "--home", str(home))
    assert code == 0, err
    assert "2 result(s) sent" in out
    assert client.get_run(run_id).data.metrics["throughput.bs2"] == 12.5
    code, out, _ = run_cli("sync", "--tracking-uri", uri, "--home", str(home))
    assert "0 result(s) sent" in out
    assert len(client.get_metric_history(run_id, "throughput.bs1")) == 1
    assert Journal.for_target(home, uri, "e", "cpu").done("cell", 1)


def test_sync_after_a_kill_between_send_and_mark_sends_nothing_twice(tmp_path, home, run_cli):
    uri, client, run_id = _measured_offline(tmp_path, home)
    ml.log_batch(client, run_id, metrics=ml.batch_metrics(RESULT["metrics"], 1))  # sent, unmarked
    code, out, _ = run_cli("sync", "--tracking-uri", uri, "--home", str(home))
    assert "1 result(s) sent, 1 already in the store" in out
    assert len(client.get_metric_history(run_id, "throughput.bs1")) == 1


def test_sync_ignores_journals_of_other_stores(tmp_path, home, run_cli):
    _measured_offline(tmp_path, home)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    code, out, _ = run_cli("sync", "--tracking-uri", other, "--home", str(home))
    assert code == 0 and "0 result(s) sent" in out and "from 0 journal(s)" in out


def test_sync_creates_the_run_of_a_cell_that_started_offline(tmp_path, home, run_cli, tracking_uri):
    """A cell that started while the server was down has no run: its journal description
    makes one (name, parent, params, tags), filled and ended as the benchmark would."""
    uri = tracking_uri
    client = ml.connect(uri)
    exp = ml.ensure_experiment(client, "e")
    parent = client.create_run(exp).info.run_id
    journal = Journal.for_target(home, uri, "e", "cpu")
    journal.ensure_store_recorded()
    for key, throughput in (("base", 10.0), ("cell", 20.0)):
        journal.describe(
            key,
            f"run-{key}",
            {"model": "m", "compiler": key},
            {S.T_DEVICE: "cpu"},
            parent,
            batch_sizes=[1, 2],
            baseline="base",
            log_engines=False,
        )
        for b in (1, 2):
            journal.measured(key, b, {"metrics": {"throughput": throughput * b}, "status": "OK"})
    code, out, err = run_cli("sync", "--tracking-uri", uri, "--home", str(home))
    assert code == 0, err
    assert "4 result(s) sent, 0 already in the store" in out
    runs = {r.info.run_name: r for r in client.search_runs([exp], "tags.`ngraph.role` = 'cell'")}
    assert set(runs) == {"run-base", "run-cell"}
    run = runs["run-cell"]
    assert run.info.status == "FINISHED" and run.data.tags[S.T_STATUS] == "OK"
    assert run.data.tags[S.T_PARENT] == parent and run.data.tags[S.T_DEVICE] == "cpu"
    assert run.data.params["compiler"] == "cell"
    assert run.data.metrics["speedup.bs2"] == 2.0 and run.data.metrics["rtr.bs2"] == 2.0
    code, out, _ = run_cli("sync", "--tracking-uri", uri, "--home", str(home))
    assert "0 result(s) sent" in out
    for key in ("throughput.bs1", "throughput.bs2", "speedup.bs2"):
        assert len(client.get_metric_history(run.info.run_id, key)) == 1
    history = client.get_metric_history(run.info.run_id, "throughput")
    assert sorted(m.step for m in history) == [1, 2]
