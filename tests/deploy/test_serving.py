"""A registered engine as a user meets it: its logged model named after the model, the
compiler and the batch size, its params rounded, its signature stating the one batch size
the engine takes, and ``mlflow-ngraph serve`` refusing another batch with HTTP 400 and a
one-line message naming the expected shape (a real server on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.error
import urllib.request

import mlflow
import numpy as np
import pytest
from deploy_support import cli

from tests._support import (
    PYTHON,
    TINY_STORE_EXPERIMENT,
    TINY_STORE_MODEL,
    clone_store,
    free_port,
    process_tracking_uri,
    wait_http,
)

EXPERIMENT = TINY_STORE_EXPERIMENT
NAME = "tiny-served"
SAFE = {"MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false"}
SHAPE = (2, 3, 32, 32)  # the engine registered below: batch size 2


def server_held(uri: str, home, qps: float) -> None:
    """A `loadgen` Server result of the engine registered below (ONNX Runtime, batch 2), as
    loadgen's own record writes it: `register --min-qps` chooses by it and tags the version."""
    from mlflow_ngraph.loadgen.drive import LoadgenCell, LoadgenRun
    from mlflow_ngraph.loadgen.settings import LoadgenSettings
    from mlflow_ngraph.loadgen.summary import ScenarioResult
    from mlflow_ngraph.plan.config import ModelSpec, split_name_args

    settings = LoadgenSettings(("server",), latency_bound_ms=50.0, max_batch=2)
    cell = LoadgenCell(ModelSpec(*split_name_args(TINY_STORE_MODEL, "model")), "onnxruntime",
                       {}, "cpu", settings)  # fmt: skip
    record = LoadgenRun(settings, home, uri, "lg", True, print).open(cell)
    figures = {"server.qps": qps, "server.p99_ms": 7.5}
    record.result("server", ScenarioResult("server", True, "", figures))
    record.finish()


@pytest.fixture(scope="module")
def registered(tiny_store, tmp_path_factory):
    """(tracking URI, client, model version) of an ONNX Runtime engine at batch size 2, the
    only one with a loadgen Server result (183 QPS at p99 <= 50 ms) and so the one
    ``register --min-qps 100`` can choose."""
    root = tmp_path_factory.mktemp("serving")
    uri = clone_store(tiny_store, root / "store", skip_home=True)
    server_held(uri, root / "home", 183.0)
    args = ["register", "-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block"]
    args += ["--batch-size", "2", "--name", NAME, "--min-qps", "100"]
    done = cli(*args, "--tracking-uri", uri, env=SAFE)
    assert done.returncode == 0, done.stderr[-3000:]
    client = mlflow.tracking.MlflowClient(uri)
    return uri, client, client.get_model_version_by_alias(NAME, "cpu")


def test_the_logged_model_is_named_after_model_compiler_and_batch(registered):
    _, client, version = registered
    assert version.tags["ngraph.server"].startswith("server: 183 QPS at p99 <= 50 ms on cpu, ")
    assert version.tags["ngraph.server.qps"] == "183"
    logged = client.get_logged_model(version.model_id or version.source.split("/")[-1])
    assert logged.name == "conv_block-d1-image_size-32-w8-onnxruntime-bs2"
    assert logged.params["batch_size"] == "2" and logged.params["compiler"] == "onnxruntime"
    for key, value in logged.params.items():  # figures rounded for display
        if re.fullmatch(r"-?\d+\.\d+", value):
            assert len(value.lstrip("-0.").replace(".", "")) <= 4, (key, value)
    # the exact figures are the logged model's metrics, its params show them rounded
    throughput = {m.key: m.value for m in logged.metrics}["throughput"]
    run = client.get_run(logged.source_run_id)
    assert throughput == run.data.metrics["throughput.bs2"]
    assert logged.params["throughput"] == f"{throughput:.0f}"
    assert logged.params["manifest_sha256"] == version.tags["manifest_sha256"]
    # only this engine's params: not every param of its run (other batch sizes' included)
    assert "engine.bs1.manifest_sha256" not in logged.params
    assert "runtime.bs1.intra_op_num_threads" not in logged.params


def test_the_signature_states_the_batch_the_engine_takes(registered):
    uri, _, version = registered
    with process_tracking_uri(uri):  # put back: it would be every later client's registry
        info = mlflow.models.get_model_info(f"models:/{NAME}/{version.version}")
    (spec,) = info.signature.inputs.inputs
    assert tuple(spec.shape) == SHAPE
    (out,) = info.signature.outputs.inputs
    assert out.shape[0] == 2


def _post(port: int, x: np.ndarray):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations",
        data=json.dumps({"inputs": x.tolist()}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_serve_refuses_another_batch_in_one_line(registered, tmp_path):
    uri, _, _ = registered
    port = free_port()
    serve = subprocess.Popen(
        [PYTHON, "-m", "mlflow_ngraph", "serve", f"models:/{NAME}@cpu", "-p", str(port),
         "--tracking-uri", uri],
        env={**os.environ, **SAFE}, cwd=tmp_path, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/ping", serve, 180)
        rng = np.random.default_rng(0)
        status, answer = _post(port, rng.standard_normal((1, *SHAPE[1:])).astype(np.float32))
        assert status == 400
        assert answer == {
            "error_code": "INVALID_PARAMETER_VALUE",
            "message": "input shape (1, 3, 32, 32) is not the engine's (2, 3, 32, 32): it "
            "takes batches of exactly 2 (send 2 samples per request)",
        }
        status, answer = _post(port, rng.standard_normal(SHAPE).astype(np.float32))
        assert status == 200
        assert np.asarray(answer["predictions"]).shape == (2, 8, 32, 32)
        driven = cli("loadgen", "--url", f"http://127.0.0.1:{port}", "--model", TINY_STORE_MODEL,
                     "--max-batch", "2", "--scenario", "offline", "--min-duration", "1",
                     "--experiment", "lg-served", "--tracking-uri", uri,
                     env={**SAFE, "MLFLOW_NGRAPH_HOME": str(tmp_path / "home")})  # fmt: skip
    finally:
        serve.terminate()
        serve.wait(60)
    # LoadGen drove the served engine over HTTP: a VALID Offline figure, the run says served
    assert driven.returncode == 0, driven.stderr[-3000:]
    assert "served offline: " in driven.stdout and "samples/s (VALID)" in driven.stdout
    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("lg-served").experiment_id])
    assert run.data.params["loadgen.driven"] == "served"
    assert run.data.metrics["offline.samples_per_s"] > 0
