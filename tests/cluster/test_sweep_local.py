"""A ``--local`` sweep: two devices on a Ray cluster of this machine, results in one store,
every socket it opens on 127.0.0.1, everything released at the end."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests._support import PYTHON, REPO, copy_empty_store

SPEC = {
    "experiment": "sweep-test",
    # two profiles, and two devices of one profile (each its own node, its own cells)
    "devices": [
        {"name": "xeon-a", "profile": "xeon"},
        {"name": "cpu-b", "profile": "cpu"},
        {"name": "cpu-c", "profile": "cpu"},
    ],
    "models": [{"name": "conv_block", "params": {"width": 8, "depth": 1, "image_size": 32}}],
    "compilers": ["identity"],
    "batch_sizes": [1],
    "warmup": 1,
    "repetitions": 3,
    "min_duration": 0.05,
    # after its benchmark each device runs LoadGen's Offline on its engine (docs/sweep.md)
    "loadgen": {"scenarios": ["offline"], "min_duration_s": 0.2, "min_queries": 8},
}


def _descendants(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        child, parent = map(int, line.split())
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found | {pid}


def _listening(pids: set[int], states: str = "-ltnpH") -> list[str]:
    """``address:port`` of every listening TCP socket of ``pids`` (with ``states``
    "-atnpH": of every TCP socket, and the peer's of a connected one)."""
    out = subprocess.run(["ss", states], capture_output=True, text=True).stdout
    sockets = []
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            sockets += [a for a in line.split()[3:5] if not a.endswith(":*")]
    return sockets


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, empty_store):
    tmp = tmp_path_factory.mktemp("sweep")
    (tmp / "sweep.yaml").write_text(yaml.safe_dump(SPEC))
    uri = copy_empty_store(empty_store, tmp / "mlflow.db")
    env = {**os.environ, "MLFLOW_NGRAPH_HOME": str(tmp / "home"), "MLFLOW_TRACKING_URI": uri,
           "PYTHONPATH": str(REPO)}  # fmt: skip
    command = [PYTHON, "-m", "mlflow_ngraph", "sweep", str(tmp / "sweep.yaml"), "--local"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    sockets, pids = watch(proc)
    out, err = proc.communicate()
    return proc.returncode, out, err, uri, sockets, pids


def watch(proc: subprocess.Popen, states: str = "-ltnpH") -> tuple[set[str], set[int]]:
    """Until ``proc`` ends: the sockets of it and its descendants (listening ones, or those
    ``states`` selects, see :func:`_listening`), and their pids."""
    sockets: set[str] = set()
    pids: set[int] = set()
    while proc.poll() is None:
        pids |= _descendants(proc.pid)
        sockets.update(_listening(pids, states))
        time.sleep(1)
    return sockets, pids


def test_the_sweep_measures_every_device_and_compares_them(sweep):
    from mlflow.tracking import MlflowClient

    code, out, err, uri, _, _ = sweep
    assert code == 0, err[-3000:]
    assert all(d in out for d in ("xeon-a", "cpu-b", "cpu-c")), out[-3000:]
    assert "comparison across devices" in out
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("sweep-test")
    cells = client.search_runs([exp.experiment_id], "tags.`ngraph.role` = 'cell'")
    devices = sorted(r.data.params["device"] for r in cells)
    # one cell per device, by its name: the two devices of the cpu profile stay apart
    assert devices == ["cpu-b", "cpu-c", "xeon-a"]
    assert all("throughput.bs1" in r.data.metrics for r in cells)
    sweep_id = re.search(r"sweep (\w+) finished", out).group(1)
    assert {r.data.tags["ngraph.sweep"] for r in cells} == {sweep_id}
    # each device ran the spec's LoadGen scenario on the same cell, under its own name
    driven = client.search_runs([exp.experiment_id], "tags.`ngraph.role` = 'loadgen'")
    assert sorted(r.data.tags["ngraph.device"] for r in driven) == ["cpu-b", "cpu-c", "xeon-a"]
    assert {r.data.tags["ngraph.sweep"] for r in driven} == {sweep_id}
    assert all(r.data.tags["ngraph.loadgen.offline.validity"] == "VALID" for r in driven)
    assert all(r.data.metrics["offline.samples_per_s"] > 0 for r in driven)
    comparison = out.split("comparison across devices")[1]  # `compare --sweep ID`
    assert all(d in comparison for d in ("xeon-a", "cpu-b", "cpu-c"))


def test_every_socket_the_sweep_opened_is_on_loopback(sweep):
    _, _, _, _, sockets, _ = sweep
    assert sockets, "no listening socket was seen: the check saw nothing"
    loopback = ("127.0.0.1:", "[::1]:", "[::ffff:127.0.0.1]:")
    others = [s for s in sockets if not s.startswith(loopback)]
    assert not others, others


def test_everything_started_on_ray_is_released(sweep):
    *_, pids = sweep
    time.sleep(2)
    alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
    assert not alive, alive


def test_two_local_clusters_run_side_by_side(tmp_path, monkeypatch):
    """Two local clusters on this host at once (two sweeps, or two test workers): each has
    its own ports (none of Ray's fixed ones) and its own short temp folder, removed at its
    end, and starting one changes nothing of this process's environment."""
    from mlflow_ngraph.cluster.spec import parse_sweep
    from mlflow_ngraph.cluster.sweep import LOOPBACK_ONLY, start_local_cluster

    monkeypatch.setenv(LOOPBACK_ONLY, "0")
    sweep = parse_sweep({"devices": [{"name": "cpu", "profile": "cpu"}], "models": ["resnet18"]})
    home = os.environ.get("HOME")
    first = start_local_cluster(sweep.devices, tmp_path / "a")
    try:
        second = start_local_cluster(sweep.devices, tmp_path / "b")
        try:
            assert os.environ.get("HOME") == home
            assert first.address != second.address
            folders = [Path(first.temp_folder), Path(second.temp_folder)]
            assert folders[0] != folders[1] and all(f.is_dir() for f in folders)
            assert all(len(str(f).encode()) <= 40 for f in folders), folders
            sockets = _listening(_descendants(os.getpid()))
            assert sockets, "no listening socket was seen: the check saw nothing"
            fixed = [s for s in sockets if s.rsplit(":", 1)[-1] in ("52365", "8265", "6379")]
            assert not fixed, fixed
        finally:
            second.shutdown()
    finally:
        first.shutdown()
    assert not any(f.exists() for f in folders), folders
