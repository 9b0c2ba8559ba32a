"""register: an MLflow logged model and a registered version with a device alias, loaded by
alias without unpickling anything, served by a real `mlflow models serve`; on the embedded
sqlite store and on a tracking server backed by PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import uuid
from pathlib import Path

import mlflow
import numpy as np
import pytest
from deploy_support import EXPERIMENT, benchmark, cli

from tests._support import POSTGRES, POSTGRES_URL, PYTHON, free_port, postgres_missing, wait_http

NAME = "tiny-openvino"
SAFE = {"MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false"}


def register(uri, *extra):
    args = ["register", "-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block"]
    return cli(*args, *extra, "--tracking-uri", uri, env=SAFE)


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


def _input(shape=(2, 3, 32, 32)):
    return np.random.default_rng(5).standard_normal(shape).astype(np.float32)


def test_register_alias_load_by_alias_and_serve(store, tmp_path, monkeypatch):
    uri, _ = store
    first = register(uri, "--compiler", "openvino", "--batch-size", "2", "--name", NAME)
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"alias 'cpu' now points at it: models:/{NAME}@cpu" in first.stdout
    client = mlflow.tracking.MlflowClient(uri)
    version = client.get_model_version_by_alias(NAME, "cpu")
    assert str(version.version) == "1"
    tags = version.tags
    assert tags["device"] == "cpu" and tags["compiler"] == "openvino" and tags["batch_size"] == "2"
    assert tags["engine_sha256"] and json.loads(tags["flags"])
    assert float(tags["ngraph.metric.throughput"]) > 0
    # the logged model belongs to the cell run, with the cell's metrics linked to it
    experiment = client.get_experiment_by_name(EXPERIMENT)
    models = client.search_logged_models(experiment_ids=[experiment.experiment_id])
    (logged,) = [m for m in models if m.model_id in (version.model_id or version.source)]
    assert logged.source_run_id == tags["source_run"]
    assert {m.key for m in logged.metrics} >= {"throughput", "latency_p50_ms"}

    # a slower engine registers as version 2 and leaves the alias where it is
    slower = register(uri, "--compiler", "tvm", "--batch-size", "2", "--name", NAME, "--trust-code")
    assert slower.returncode == 0, slower.stderr[-3000:]
    assert "stays on version 1" in slower.stdout
    assert str(client.get_model_version_by_alias(NAME, "cpu").version) == "1"

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "false")
    x = _input()
    loaded = mlflow.pyfunc.load_model(f"models:/{NAME}@cpu")
    expected = loaded.predict(x)
    assert expected.shape == (2, 8, 32, 32)
    with pytest.raises(mlflow.exceptions.MlflowException):
        mlflow.pyfunc.load_model(f"models:/{NAME}@nosuchalias")

    port = free_port()
    env = {**os.environ, **SAFE, "MLFLOW_TRACKING_URI": uri}
    env["PATH"] = f"{Path(PYTHON).parent}:{env['PATH']}"
    serve = subprocess.Popen(
        [str(Path(PYTHON).parent / "mlflow"), "models", "serve", "-m", f"models:/{NAME}@cpu",
         "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/ping", serve)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations",
            data=json.dumps({"inputs": x.tolist()}).encode(),
            headers={"Content-Type": "application/json"},
        )
        answer = json.loads(urllib.request.urlopen(request, timeout=60).read())
        served = np.asarray(answer["predictions"], dtype=np.float32)
        np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
    finally:
        _stop(serve)


@pytest.mark.skipif(bool(postgres_missing()), reason=str(postgres_missing()))
def test_register_on_a_postgresql_backed_server(tmp_path):
    import psycopg2

    database = f"ngraph_deploy_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(**POSTGRES)
    admin.autocommit = True
    admin.cursor().execute(f"CREATE DATABASE {database}")
    port = free_port()
    server = subprocess.Popen(
        [str(Path(PYTHON).parent / "mlflow"), "server", "--backend-store-uri",
         f"{POSTGRES_URL.replace('postgresql:', 'postgresql+psycopg2:')}/{database}",
         "--artifacts-destination",
         str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],  # as the suite's other servers: one client at a time
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        uri = f"http://127.0.0.1:{port}"
        wait_http(f"{uri}/health", server)
        benchmark(uri, tmp_path / "home", compilers=["identity", "onnxruntime"])
        done = register(uri, "--batch-size", "1", "--name", "pg-engine")
        assert done.returncode == 0, done.stderr[-3000:]
        assert "models:/pg-engine@cpu" in done.stdout
        env = {**os.environ, **SAFE, "MLFLOW_TRACKING_URI": uri}
        check = subprocess.run(
            [PYTHON, "-c", "import mlflow, numpy as np; m = mlflow.pyfunc.load_model("
             "'models:/pg-engine@cpu'); x = np.zeros((1, 3, 32, 32), np.float32);"
             "print(m.predict(x).shape)"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert check.returncode == 0, check.stderr[-2000:]
        assert "(1, 8, 32, 32)" in check.stdout
    finally:
        _stop(server)
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        admin.close()


def test_log_models_while_benchmarking(tmp_path, tracking_uri):
    """``--log-models``: every valid engine is a logged model of its cell run, and MLflow's
    own search ranks them by throughput."""
    uri = tracking_uri
    benchmark(
        uri,
        tmp_path / "home",
        "--log-models",
        compilers=["identity", "torchscript", "onnxruntime"],
        experiment="logged",
    )
    client = mlflow.tracking.MlflowClient(uri)
    experiment = client.get_experiment_by_name("logged")
    models = client.search_logged_models(
        experiment_ids=[experiment.experiment_id],
        order_by=[{"field_name": "metrics.throughput", "ascending": False}],
    )
    assert len(models) == 4  # two compilers with engines x two batch sizes; identity has none
    compilers = {m.params["compiler"] for m in models}
    assert compilers == {"torchscript", "onnxruntime"}
    throughputs = [next(x.value for x in m.metrics if x.key == "throughput") for m in models]
    assert throughputs == sorted(throughputs, reverse=True)
    best = models[0]
    run = client.get_run(best.source_run_id)
    assert run.data.tags["ngraph.role"] == "cell"
    batch = int(best.params["batch_size"])
    assert run.data.metrics[f"throughput.bs{batch}"] == throughputs[0]
