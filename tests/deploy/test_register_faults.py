"""``register`` killed at each of its steps, then run again: one version of the engine, the
device's alias on it, no logged model left PENDING, no copy left in the temp folder; and a
finished ``register`` run again adds no version."""

from __future__ import annotations

import mlflow
import pytest
from deploy_support import EXPERIMENT, cli

from mlflow_ngraph import faultpoint


def _register(uri, name, tmp, point=None):
    env = {"MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false", "TMPDIR": str(tmp)}
    env[faultpoint.ENV] = point or ""
    args = ["register", "-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block",
            "--compiler", "onnxruntime", "--batch-size", "1", "--name", name,
            "--allow-unstable"]  # fmt: skip
    return cli(*args, "--tracking-uri", uri, env=env)


def _versions(client, name):
    return client.search_model_versions(f"name = '{name}'")


def _logged(client, run_id):
    experiment = client.get_experiment_by_name(EXPERIMENT)
    found = client.search_logged_models([experiment.experiment_id])
    return [m for m in found if m.source_run_id == run_id and m.model_type == "ngraph-engine"]


@pytest.mark.parametrize("point", sorted(faultpoint.REGISTER_POINTS))
def test_a_register_killed_at_each_step_then_run_again_leaves_one_version(
    fresh_store, tmp_path, point
):
    uri, temp = fresh_store, tmp_path / "temp"
    temp.mkdir()
    client = mlflow.tracking.MlflowClient(uri)
    name = f"faults-{point.replace('_', '-')}"
    killed = _register(uri, name, temp, f"{point}:kill")
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert list(temp.glob("ngraph-register-*")), "the kill left no copy: nothing to test"

    again = _register(uri, name, temp)
    assert again.returncode == 0, again.stderr[-3000:]
    versions = _versions(client, name)
    assert len(versions) == 1, [v.version for v in versions]
    (version,) = versions
    assert str(client.get_model_version_by_alias(name, "cpu").version) == str(version.version)
    logged = _logged(client, version.tags["source_run"])
    assert not [m.model_id for m in logged if str(m.status) != "READY"], "a model left PENDING"
    (mine,) = [m for m in logged if m.model_id in (version.model_id or version.source)]
    assert {m.key for m in mine.metrics} >= {"throughput", "latency_p50_ms"}
    # the copy the killed register left in the temp folder went with the next register
    assert not list(temp.glob("ngraph-register-*"))

    if point == "register_version_created":  # once (each register costs seconds of a core)
        # a finished register, run again: the same version, no new one
        third = _register(uri, name, temp)
        assert third.returncode == 0, third.stderr[-3000:]
        assert "holds this engine of this run already: no new version" in third.stdout
        assert len(_versions(client, name)) == 1
        assert not list(temp.glob("ngraph-register-*"))
