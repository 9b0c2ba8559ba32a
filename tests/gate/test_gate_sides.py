"""``mlflow-ngraph gate`` on the sides a team deploys from, end to end on a copy of the
suite's tiny store (its ONNX Runtime engine of a conv block at batch size 2): two registered
versions gated ``@alias`` against ``/VERSION`` with ``--promote`` (the alias moves, the line
says which version it left, the version carries the verdict), and a cell
run (``runs:/ID`` with ``--batch-size``) against an engine folder from ``pull`` with the
planted slowdown (``slower``, exit status 1). Two short gates: wide tolerances make each
verdict certain whatever the host does, so the test checks the paths, not the host."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests._support import (
    PYTHON,
    TINY_STORE_EXPERIMENT,
    cell_runs,
    clone_store,
    process_tracking_uri,
)

NAME = "tiny-gated"
SAFE = {"MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false"}
SELECT = ["-e", TINY_STORE_EXPERIMENT, "--device", "cpu", "--model", "conv_block"]


def cli(root: Path, *args: str, env: dict | None = None):
    env = {**os.environ, **SAFE, "MLFLOW_NGRAPH_HOME": str(root / "home"), **(env or {})}
    return subprocess.run(
        [PYTHON, "-m", "mlflow_ngraph", *args, "--tracking-uri", f"sqlite:///{root}/mlflow.db"],
        capture_output=True, text=True, env=env, cwd=root, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def store(tiny_store, tmp_path_factory):
    """(folder, client) of a copy of the tiny store where NAME has two versions of its ONNX
    Runtime engine at batch size 2: ``register``'s (alias ``cpu``), and the same logged
    model registered again (a rebuild that changed nothing: one engine, so the A/A gate
    between them is "same" whatever the host does, at a wide tolerance)."""
    root = tmp_path_factory.mktemp("gate-sides") / "store"
    clone_store(tiny_store, root, skip_home=True)
    args = ["register", *SELECT, "--compiler", "onnxruntime", "--batch-size", "2"]
    done = cli(root, *args, "--name", NAME)
    assert done.returncode == 0, done.stderr[-3000:]
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(uri)
    first = client.get_model_version(NAME, "1")
    with process_tracking_uri(uri):  # MLflow resolves the models:/ source through it
        again = client.create_model_version(
            NAME, first.source, first.run_id, tags=first.tags, model_id=first.model_id
        )
    assert str(again.version) == "2"
    return root, client


def test_promote_moves_the_alias_and_says_which_version_it_left(store):
    root, client = store
    before, other = "1", "2"
    assert str(client.get_model_version_by_alias(NAME, "cpu").version) == before
    done = cli(root, "gate", "--champion", f"models:/{NAME}@cpu", "--challenger",
               f"models:/{NAME}/{other}", "--promote", "--tolerance", "0.5", "--budget", "8s",
               "--format", "json")  # fmt: skip
    report = json.loads(done.stdout or "{}")
    # one engine on both sides, +-50%: "same" (or "faster"), never "slower" or "unsure"
    assert done.returncode == 0 and report["verdict"] in ("same", "faster"), (
        done.stdout[-3000:] + done.stderr[-3000:]
    )
    assert f"(it left version {before})" in report["notes"][-1]
    assert str(client.get_model_version_by_alias(NAME, "cpu").version) == other
    tags = client.get_model_version(NAME, other).tags
    assert tags["ngraph.gate.verdict"] == report["verdict"]
    assert tags["ngraph.gate.run"] == report["run_id"]
    run = client.get_run(report["run_id"])
    assert run.data.tags["ngraph.gate.champion"] == f"models:/{NAME}/{before}"
    assert run.data.tags["ngraph.gate.challenger"] == f"models:/{NAME}/{other}"
    assert run.data.params["challenger.kind"] == "registered"
    assert run.data.params["challenger.compiler"] == "onnxruntime"


def test_a_cell_run_against_a_pulled_folder_with_the_planted_slowdown(store, tmp_path):
    root, client = store
    (run,) = [r for r in cell_runs(f"sqlite:///{root}/mlflow.db", TINY_STORE_EXPERIMENT)
              if r.data.params.get("compiler") == "onnxruntime"]  # fmt: skip
    folder = tmp_path / "pulled"
    pulled = cli(root, "pull", *SELECT, "--compiler", "onnxruntime", "--batch-size", "2",
                 "-o", str(folder))  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    # bad input: one line, status 3, before anything is built
    bad = cli(root, "gate", "--champion", str(folder), "--challenger", str(folder),
              "--batch-size", "4")  # fmt: skip
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode == 3 and len(errors) == 1, bad.stderr
    assert "takes batch size 2 only, not 4: give --batch-size 2" in errors[0]
    assert "Traceback" not in bad.stderr
    done = cli(root, "gate", "--champion", f"runs:/{run.info.run_id}", "--batch-size", "2",
               "--challenger", str(folder), "--tolerance", "0.2", "--budget", "8s",
               env={"MLFLOW_NGRAPH_GATE_PLANTED_DELAY": "1.0"})  # fmt: skip
    # twice as slow by construction: "slower" beyond a +-20% band, exit status 1
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "\nslower:" in done.stdout and "TEST ONLY" in done.stdout, done.stdout
    (gate,) = client.search_runs(
        [client.get_experiment_by_name("ngraph-gate").experiment_id],
        f"tags.`ngraph.gate.champion` = 'runs:/{run.info.run_id}'",
    )
    assert gate.data.tags["ngraph.gate.verdict"] == "slower"
    assert gate.data.tags["ngraph.gate.challenger"] == str(folder)
    assert gate.data.params["champion.kind"] == "run" and gate.data.params["challenger.kind"] == (
        "folder"
    )
    assert 0.35 < gate.data.metrics["gate.ratio"] < 0.7  # 1 / (1 + 1.0), within a busy host's noise
