"""The resume journal never stands in for results it does not hold: a store or experiment
made again, a deleted run, a damaged record."""

from __future__ import annotations

import json
import os
import subprocess

import mlflow
import pytest

from mlflow_ngraph.tracking.journal import Journal
from tests._support import PYTHON, TINY

ARGS = [*TINY, "--compiler", "identity", "--experiment", "stale"]


@pytest.fixture
def run_cli(home, tmp_path):
    """The benchmark in its own process each time, as a user runs it (MLflow keeps a
    store's connection open for the life of a process)."""

    def run(*args: str) -> tuple[int, str, str]:
        env = {**os.environ, "MLFLOW_NGRAPH_HOME": str(home)}
        result = subprocess.run(
            [PYTHON, "-m", "mlflow_ngraph", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        return result.returncode, result.stdout, result.stderr

    return run


def _cells(uri: str, experiment: str = "stale"):
    client = mlflow.tracking.MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], "tags.`ngraph.role` = 'cell'")


def test_recreated_sqlite_store_is_filled_again(run_cli, tmp_path):
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    assert run_cli("benchmark", *ARGS, "--tracking-uri", uri)[0] == 0
    db.unlink()  # `rm mlflow.db; make run`
    code, out, err = run_cli("benchmark", *ARGS, "--tracking-uri", uri)
    assert code == 0, err
    assert "(resumed)" not in out
    (cell,) = _cells(uri)
    assert cell.data.metrics["throughput.bs1"] > 0 and cell.data.metrics["throughput.bs2"] > 0


def test_recreated_experiment_is_filled_again(run_cli, tracking_uri):
    assert run_cli("benchmark", *ARGS, "--tracking-uri", tracking_uri)[0] == 0
    client = mlflow.tracking.MlflowClient(tracking_uri)
    old = client.get_experiment_by_name("stale")
    client.rename_experiment(old.experiment_id, "stale-old")  # 'stale' is made anew
    code, out, err = run_cli("benchmark", *ARGS, "--tracking-uri", tracking_uri)
    assert code == 0, err
    assert "starting afresh" in err
    (cell,) = _cells(tracking_uri)
    assert cell.info.experiment_id != old.experiment_id
    assert cell.data.metrics["throughput.bs2"] > 0


def test_deleted_cell_run_is_measured_again(run_cli, tracking_uri):
    assert run_cli("benchmark", *ARGS, "--tracking-uri", tracking_uri)[0] == 0
    (first,) = _cells(tracking_uri)
    mlflow.tracking.MlflowClient(tracking_uri).delete_run(first.info.run_id)
    code, out, err = run_cli("benchmark", *ARGS, "--tracking-uri", tracking_uri)
    assert code == 0, err
    assert "was deleted; measuring it again" in err
    (second,) = _cells(tracking_uri)
    assert second.info.run_id != first.info.run_id
    assert second.data.metrics["throughput.bs1"] > 0


def test_damaged_records_are_skipped_without_taking_neighbours(tmp_path, caplog):
    path = tmp_path / "j.jsonl"
    journal = Journal(path)
    record = {"status": "OK", "metrics": {"throughput": 1.0}}
    journal.set_run("a", "run-a")
    journal.measured("a", 1, record)
    journal.logged("a", 1)
    with open(path, "a") as handle:
        handle.write('{"kind": "logged", "cell": "a", "batch_size": 2}\n')  # valid
        handle.write('{"kind": "logged", "cell": "a"}\n')  # missing its batch size
        handle.write("\x00\x00garbage\n")
        handle.write('{"kind": "measured", "cell": "a", "batch_')  # torn by a kill
    reread = Journal(path)
    assert "skipped 3 damaged record(s)" in caplog.text
    assert reread.done("a", 1) and reread.done("a", 2)
    # the next record is not glued to the torn line (which would lose both)
    reread.logged("a", 4)
    assert Journal(path).done("a", 4)
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1])["batch_size"] == 4
