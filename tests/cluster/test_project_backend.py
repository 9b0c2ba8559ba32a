"""``mlflow run . -e benchmark --backend ngraph-ray``: MLflow's own command on a Ray cluster
of this machine (two fake devices, every socket on 127.0.0.1), a real sqlite store.

The backend is found through its entry point; both devices' cells land under the project's
run as ``sweep`` logs them; the submitted run waits, reports and cancels as MLflow expects;
a client killed with ``kill -9`` is picked up by the same command; every bad input is one
line and a non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from mlflow_ngraph import faultpoint
from tests._support import PYTHON, REPO, copy_empty_store, process_tracking_uri
from tests.cluster.test_sweep_local import watch

MLFLOW = str(Path(PYTHON).parent / "mlflow")
DEVICES = [{"name": "xeon-a", "profile": "xeon"}, {"name": "cpu-b", "profile": "cpu"}]
TINY = {
    "models": "conv_block:width=8,depth=1,image_size=32",
    "compilers": "identity",
    "batch_sizes": "1",
    "warmup": "1",
    "repetitions": "3",
    "min_duration": "0.05",
}
# a run with work left after its first result: three cells, two batch sizes, held (a fault
# point) just after its first result is logged until the test has cancelled or killed it
LONGER = {**TINY, "compilers": "identity torchscript onnxruntime", "batch_sizes": "1,2"}
LOOPBACK = ("127.0.0.1:", "[::1]:", "[::ffff:127.0.0.1]:")


def _env(tmp: Path, held: bool = False) -> dict[str, str]:
    """The commands' environment; ``held``: the benchmark waits after its first result is
    logged while ``tmp/gate`` exists (:func:`_release` lets it go on)."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}",
           "MLFLOW_NGRAPH_HOME": str(tmp / "home"), "PYTHONPATH": str(REPO)}  # fmt: skip
    env.pop(faultpoint.ENV, None)
    if held:
        (tmp / "gate").touch()
        env[faultpoint.ENV] = f"record_logged:hold={tmp / 'gate'}"
    return env


def _release(tmp: Path) -> None:
    (tmp / "gate").unlink(missing_ok=True)


def _command(config: dict | str, params: dict, entry: str = "benchmark") -> list[str]:
    config_text = config if isinstance(config, str) else json.dumps(config)
    args = [MLFLOW, "run", str(REPO), "-e", entry, "--experiment-name", "backend-test",
            "--backend", "ngraph-ray", "--backend-config", config_text]  # fmt: skip
    for key, value in params.items():
        args += ["-P", f"{key}={value}"]
    return args


def _client(tmp: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")


def _runs(tmp: Path, role: str) -> list:
    client = _client(tmp)
    exp = client.get_experiment_by_name("backend-test")
    return client.search_runs([exp.experiment_id], f"tags.`ngraph.role` = '{role}'")


def _assert_nested_once(tmp: Path, cells_per_device: dict[str, int]) -> None:
    """One project run, FINISHED; under it one benchmark run per device; under each, its
    cells, each once, FINISHED, every metric once per step."""
    (project,) = _runs(tmp, "project")
    assert project.info.status == "FINISHED", project.info.status
    assert project.data.tags["mlflow.project.backend"] == "ngraph-ray"
    devices = _runs(tmp, "benchmark")
    assert sorted(r.data.tags["ngraph.device"] for r in devices) == sorted(cells_per_device)
    assert {r.data.tags["mlflow.parentRunId"] for r in devices} == {project.info.run_id}
    parent_of = {r.info.run_id: r.data.tags["ngraph.device"] for r in devices}
    cells = _runs(tmp, "cell")
    keys = Counter(r.data.tags["ngraph.cell_key"] for r in cells)
    assert all(n == 1 for n in keys.values()), keys
    per_device = Counter(parent_of[r.data.tags["mlflow.parentRunId"]] for r in cells)
    assert per_device == Counter(cells_per_device), per_device
    sweep = project.data.tags["ngraph.sweep"]
    client = _client(tmp)
    for run in (*devices, *cells):
        assert run.data.tags["ngraph.sweep"] == sweep
    for run in cells:
        assert run.info.status == "FINISHED", (run.info.run_name, run.info.status)
        for key in run.data.metrics:
            steps = Counter(m.step for m in client.get_metric_history(run.info.run_id, key))
            assert all(n == 1 for n in steps.values()), (run.info.run_name, key)


# --- found through the entry point -----------------------------------------------------------
def test_the_backend_is_found_through_its_entry_point():
    import importlib.metadata

    from mlflow.projects.backend import loader

    from mlflow_ngraph.cluster.backend import RayBackend

    names = [e.name for e in importlib.metadata.entry_points(group="mlflow.project_backend")]
    assert "ngraph-ray" in names
    assert isinstance(loader.load_backend("ngraph-ray"), RayBackend)


# --- a local two-device run ------------------------------------------------------------------
@pytest.fixture(scope="module")
def local_run(tmp_path_factory, empty_store):
    tmp = tmp_path_factory.mktemp("backend")
    copy_empty_store(empty_store, tmp / "mlflow.db")
    command = _command({"local": True, "devices": DEVICES}, TINY)
    with open(tmp / "out", "w") as out, open(tmp / "err", "w") as err:  # no pipe fills up
        proc = subprocess.Popen(command, cwd=tmp, env=_env(tmp), stdout=out, stderr=err)
        sockets, pids = watch(proc, "-atnpH")  # every socket, listening or connected
    out, err = (tmp / "out").read_text(), (tmp / "err").read_text()
    return tmp, proc.returncode, out, err, sockets, pids


def test_both_devices_cells_land_under_the_project_run(local_run):
    tmp, code, out, err, _, _ = local_run
    assert code == 0, (out + err)[-3000:]
    assert "xeon-a" in out and "cpu-b" in out and "every device done" in out, out[-3000:]
    _assert_nested_once(tmp, {"xeon-a": 1, "cpu-b": 1})
    cells = _runs(tmp, "cell")
    assert sorted(r.data.params["device"] for r in cells) == ["cpu-b", "xeon-a"]
    assert all("throughput.bs1" in r.data.metrics for r in cells)


def test_the_local_run_talks_on_loopback_only_and_releases_everything(local_run):
    *_, sockets, pids = local_run
    assert sockets, "no socket was seen: the check saw nothing"
    assert all(s.startswith(LOOPBACK) for s in sockets), sockets
    time.sleep(2)
    alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
    assert not alive, alive


# --- a store of the test's own, MLflow's config keys -------------------------------------
def _backend_config(**more) -> dict:
    from mlflow.projects.utils import PROJECT_ENV_MANAGER, PROJECT_SYNCHRONOUS

    # what mlflow run adds to every backend config
    return {"local": True, "devices": DEVICES[:1], PROJECT_SYNCHRONOUS: False,
            PROJECT_ENV_MANAGER: None, **more}  # fmt: skip


@pytest.fixture
def in_store(tmp_path, monkeypatch, tracking_uri):
    import mlflow

    for key, value in _env(tmp_path).items():
        monkeypatch.setenv(key, value)
    uri = tracking_uri
    with process_tracking_uri(uri):
        experiment_id = mlflow.tracking.MlflowClient(uri).create_experiment("backend-test")
        yield uri, experiment_id


# --- every entry point -------------------------------------------------------------------------
@pytest.mark.usefixtures("tracking_uri")  # the store _env names, made
def test_the_blocks_entry_point_runs_on_each_device(tmp_path):
    params = {"kinds": "conv_block", "widths": "8", "depths": "1", "batch_sizes": "1",
              "compilers": "identity"}  # fmt: skip
    done = subprocess.run(_command({"local": True, "devices": DEVICES}, params, "blocks"),
                          cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    _assert_nested_once(tmp_path, {"xeon-a": 1, "cpu-b": 1})


# --- bad input: one line, a non-zero exit ------------------------------------------------------
def _one_error_line(done: subprocess.CompletedProcess, fragment: str) -> None:
    text = done.stdout + done.stderr
    assert done.returncode != 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if " ERROR " in line or "Error:" in line]
    assert len(errors) == 1 and fragment in errors[0], text[-3000:]


def test_a_bad_backend_config_is_one_line_from_mlflow_run(tmp_path):
    """What the user meets: ``mlflow run`` prints the backend's error as one line and exits
    non-zero (the other bad inputs raise the same exception: tested on the backend below)."""
    config = {"local": True, "devices": ["tpu"]}
    done = subprocess.run(_command(config, TINY), cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    _one_error_line(done, "unknown profile 'tpu'")


def test_backend_config_json_is_checked_by_mlflow(tmp_path):
    """MLflow parses the backend config (inline or a ``.json`` file) before any backend is
    loaded: its error, not ours (a plug-in cannot reach it), and a non-zero exit."""
    done = subprocess.run(_command('{"devices": ["xeon"]', TINY), cwd=tmp_path,
                          env=_env(tmp_path), capture_output=True, text=True)  # fmt: skip
    _one_error_line(done, "Invalid backend config JSON")
    (tmp_path / "cluster.json").write_text("{devices: [xeon]")
    done = subprocess.run(_command(str(tmp_path / "cluster.json"), TINY), cwd=tmp_path,
                          env=_env(tmp_path), capture_output=True, text=True)  # fmt: skip
    assert done.returncode != 0
    assert "parse JSON cluster spec from file" in done.stderr, done.stderr[-3000:]


def _backend_refuses(in_store, config, fragment, entry="benchmark", params=None) -> None:
    """The backend refuses before anything starts: MLflow's ExecutionException (which
    ``mlflow run`` prints as one line, exit status 1), naming the problem, one line, and no
    run made."""
    from mlflow.exceptions import ExecutionException

    from mlflow_ngraph.cluster.backend import RayBackend

    uri, experiment_id = in_store
    with pytest.raises(ExecutionException) as raised:
        RayBackend().run(str(REPO), entry, dict(TINY if params is None else params), None,
                         config, uri, experiment_id)  # fmt: skip
    message = raised.value.message
    assert fragment in message and "\n" not in message, message
    assert not _client_of(uri).search_runs([experiment_id]), "a run was made"


def _client_of(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


@pytest.mark.parametrize(
    "config,fragment",
    [
        ({"local": True, "devices": ["cpu"], "nodes": 2}, "unknown key 'nodes'"),
        ({"local": True}, "'devices' must list the devices"),
        ({"local": True, "devices": ["tpu"]}, "unknown profile 'tpu'"),
        ({"address": "127.0.0.1:9", "devices": ["cpu"]},
         "Ray cluster at 127.0.0.1:9 does not answer"),
    ],
)  # fmt: skip
def test_a_bad_backend_config_is_refused_in_one_line(in_store, config, fragment):
    _backend_refuses(in_store, config, fragment)


@pytest.mark.parametrize(
    "entry,params,fragment",
    [
        ("compare", {}, "entry point 'compare' runs locally"),
        ("sweep", {"spec": "x.yaml"}, "entry point 'sweep' cannot run under --backend ngraph-ray"),
        ("benchmark", {"device": "cpu"}, "-P device=cpu: under --backend ngraph-ray"),
        ("benchmark", {"batch_sizes": "x"}, "batch size 'x' is not an integer"),
    ],
)
def test_an_entry_point_the_backend_cannot_run_is_one_line(in_store, entry, params, fragment):
    config = {"local": True, "devices": ["cpu"]}
    _backend_refuses(in_store, config, fragment, entry, params)


def test_no_ray_installed_names_the_extra(in_store, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    config = {"local": True, "devices": ["cpu"]}
    _backend_refuses(in_store, config, "pip install 'mlflow-ngraph[cluster]'")


@pytest.fixture
def one_device_cluster(tmp_path, monkeypatch):
    from mlflow_ngraph.cluster.spec import parse_sweep
    from mlflow_ngraph.cluster.sweep import LOOPBACK_ONLY, start_local_cluster

    monkeypatch.setenv(LOOPBACK_ONLY, "0")
    sweep = parse_sweep({"devices": [{"name": "cpu", "profile": "cpu"}], "models": ["resnet18"]})
    cluster = start_local_cluster(sweep.devices, tmp_path / "nodes")
    yield cluster
    cluster.shutdown()


def test_a_device_with_no_node_is_one_line(tmp_path, one_device_cluster):
    config = {"address": one_device_cluster.address, "devices": ["cpu", "orin"]}
    done = subprocess.run(_command(config, TINY), cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    _one_error_line(done, "device 'orin' has no node in the Ray cluster")
    assert not _runs(tmp_path, "cell"), "a device ran although another has no node"
