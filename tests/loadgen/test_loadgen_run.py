"""The real LoadGen on a tiny engine, in one invocation killed after its second result and
run again: every scenario runs and logs, the killed run resumes without running what its
journal holds, and a bound no engine can meet is INVALID, said, and never a metric."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests._support import PYTHON, REPO, copy_empty_store

MODEL = "conv_block:width=8,depth=1,image_size=32"
SCENARIOS = "singlestream,offline,multistream,server"


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, empty_store):
    """(the killed run, the resumed run, the store URI)."""
    root = tmp_path_factory.mktemp("loadgen")
    uri = copy_empty_store(empty_store, root / "mlflow.db")
    args = [PYTHON, "-m", "mlflow_ngraph", "loadgen", "--model", MODEL,
            "--compiler", "onnxruntime", "--scenario", SCENARIOS, "--min-duration", "1",
            "--latency-bound", "0.001", "--server-steps", "2", "--experiment", "lg",
            "--tracking-uri", uri]  # fmt: skip
    env = {**os.environ, "MLFLOW_NGRAPH_HOME": str(root / "home"), "PYTHONPATH": str(REPO)}
    kill = {**env, "MLFLOW_NGRAPH_FAULT_POINT": "loadgen_journaled@2"}
    killed = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=root, env=kill)
    again = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=root, env=env)
    return killed, again, uri


def test_every_scenario_runs_logs_and_a_killed_run_resumes(resumed):
    import mlflow

    killed, again, uri = resumed
    assert killed.returncode == -9, killed.stderr[-2000:]
    # killed as the second result (offline) was journaled, before MLflow or the terminal had it
    assert "singlestream: p90" in killed.stdout and "offline:" not in killed.stdout
    assert again.returncode == 0, again.stderr[-2000:]
    out = again.stdout
    assert out.count("(journaled earlier)") == 2  # the two results the killed run journaled
    assert "offline: " in out and "samples/s (VALID) (journaled earlier)" in out
    assert "multistream: p99" in out and "(VALID)" in out
    server = next(line for line in out.splitlines() if " server:" in line)
    assert "INVALID (no target rate held (the latency bound was not held" in server
    assert "QPS at p99" not in server  # the figure line of a VALID result
    # the runtime's own warnings go to the worker's log, the view's address to the terminal
    assert "onnxruntime:" not in again.stdout + again.stderr
    assert "answer: http://127.0.0.1:5000/#/experiments/" in out
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("lg")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1  # the resumed run found the killed one's
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert {"singlestream.p90_ms", "offline.samples_per_s", "multistream.p99_ms"} <= set(
        run.data.metrics
    )
    assert not [k for k in run.data.metrics if k.startswith("server.")]  # INVALID: no figure
    tags = run.data.tags
    assert tags["ngraph.loadgen.server.validity"] == "INVALID"
    assert tags["ngraph.loadgen.offline.validity"] == "VALID"
    assert run.data.params["loadgen.latency_bound_ms"] == "0.001"
    files = {f.path for f in client.list_artifacts(run.info.run_id, "loadgen/server")}
    assert {"loadgen/server/mlperf_log_summary.txt", "loadgen/server/mlperf_log_detail.txt",
            "loadgen/server/search.json"} <= files  # fmt: skip
