"""A sweep under faults, on a real Ray cluster of this machine and a real sqlite store:
a device's node removed mid-sweep (the retry lands on a fresh node with an empty home) and
a device's benchmark killed mid-sweep (the retry resumes from the node's journal). Either
way every cell is in the store exactly once, with every metric once, and the device done.

The test holds the cluster (to remove and add nodes) and runs ``mlflow-ngraph sweep
--address`` against it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import Counter

import pytest
import yaml

from mlflow_ngraph import faultpoint
from tests._support import PYTHON, REPO
from tests.cluster.test_sweep_local import _descendants, _listening

TINY = {"name": "conv_block", "params": {"width": 8, "depth": 1, "image_size": 32}}
VICTIM = "xeon-a"
SPEC = {
    "experiment": "sweep-faults",
    "devices": [
        # two cells: the fault comes after the first result is logged (the benchmark waits
        # there, see `cluster`), before either cell has finished
        {"name": VICTIM, "profile": "xeon", "compilers": ["identity", "torchscript"]},
        {"name": "cpu-b", "profile": "cpu", "batch_sizes": [1]},
    ],
    "models": [TINY],
    "compilers": ["identity"],
    "batch_sizes": [1, 2],
    "warmup": 1,
    "repetitions": 3,
    "min_duration": 0.05,
}  # fmt: skip
EXPECTED = {VICTIM: (2, [1, 2]), "cpu-b": (1, [1])}  # cells and batch sizes per device
LOOPBACK = ("127.0.0.1:", "[::1]:", "[::ffff:127.0.0.1]:")


@pytest.fixture(scope="module")
def _cluster(tmp_path_factory):
    """One cluster for the file: the kill leaves it whole, the replaced node leaves a fresh
    one for the device, the node that leaves for good comes last (tests run in file order).
    Its nodes' benchmarks wait after their first result is logged while the gate exists."""
    from mlflow_ngraph.cluster.spec import parse_sweep
    from mlflow_ngraph.cluster.sweep import LOOPBACK_ONLY, start_local_cluster

    tmp = tmp_path_factory.mktemp("sweep-faults")
    gate = tmp / "gate"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(LOOPBACK_ONLY, "0")
        patch.setenv("PYTHONPATH", str(REPO))  # the nodes' workers run this checkout
        patch.setenv(faultpoint.ENV, f"record_logged:hold={gate}")
        sweep = parse_sweep(SPEC)
        cluster = start_local_cluster(sweep.devices, tmp / "nodes")
        try:
            yield cluster, sweep, tmp / "nodes", gate
        finally:
            gate.unlink(missing_ok=True)
            cluster.shutdown()


@pytest.fixture
def cluster(_cluster):
    """The file's cluster, its gate closed: each device's benchmark holds after its first
    result until the test has done its damage and opens it (:func:`_release`)."""
    _cluster[3].touch()
    yield _cluster
    _cluster[3].unlink(missing_ok=True)


def _release(cluster) -> None:
    cluster[3].unlink(missing_ok=True)


class Sweep:
    """``mlflow-ngraph sweep --address`` running against the test's cluster; its output is
    read as it comes."""

    def __init__(self, tmp_path, uri: str, address: str, *options: str) -> None:
        (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(SPEC))
        self.uri = uri
        env = {**os.environ, "MLFLOW_NGRAPH_HOME": str(tmp_path / "driver-home"),
               "MLFLOW_TRACKING_URI": self.uri, "PYTHONPATH": str(REPO)}  # fmt: skip
        command = [PYTHON, "-m", "mlflow_ngraph", "sweep", str(tmp_path / "sweep.yaml"),
                   "--address", address, *options]  # fmt: skip
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)  # fmt: skip
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout))
        self.reader.start()
        self.sockets: set[str] = set()

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def look(self) -> None:
        """Note the listening sockets of every process of this test (cluster and sweep)."""
        assert self.proc.poll() is None, self.out[-3000:]
        self.sockets.update(_listening(_descendants(os.getpid())))

    def await_line(self, text: str, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while not any(text in line for line in self.lines):
            assert time.time() < deadline, f"no {text!r} in {timeout} s: {self.out[-3000:]}"
            self.look()
            time.sleep(0.3)

    def finish(self) -> str:
        deadline = time.time() + 600
        while self.proc.poll() is None:
            assert time.time() < deadline, f"the sweep did not finish in 600 s: {self.out[-3000:]}"
            self.sockets.update(_listening(_descendants(os.getpid())))
            time.sleep(1)
        self.reader.join()
        return self.out


def _finished_cells(uri: str, device: str, clause: str = "attributes.status = 'FINISHED'") -> int:
    from mlflow.tracking import MlflowClient

    from mlflow_ngraph.tracking.mlflow_log import local_sqlite

    if not local_sqlite(uri).exists():
        return 0
    try:
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(SPEC["experiment"])
        if exp is None:
            return 0
        runs = client.search_runs(
            [exp.experiment_id],
            f"tags.`ngraph.role` = 'cell' and tags.`ngraph.device` = '{device}' and {clause}",
        )
    except Exception:  # the store is being created by a device task
        return 0
    return len(runs)


def _await_first_cell(sweep: Sweep) -> None:
    """Wait until the victim device has logged a result (and not finished every cell): the
    cells of a model are measured together, so their batch-1 results land before any of
    them finishes."""
    deadline = time.time() + 480  # a busy 2-core host takes minutes to start a benchmark
    logged = "metrics.`throughput.bs1` > 0"
    while _finished_cells(sweep.uri, VICTIM, logged) < 1:
        assert time.time() < deadline, f"the victim logged nothing in 480 s: {sweep.out[-3000:]}"
        sweep.look()
        time.sleep(0.3)
    done = _finished_cells(sweep.uri, VICTIM)
    assert done < EXPECTED[VICTIM][0], "the victim finished before the fault: nothing tested"


def _assert_every_cell_once(uri: str) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(SPEC["experiment"])
    runs = client.search_runs([exp.experiment_id], "tags.`ngraph.cell_key` != ''")
    keys = Counter(r.data.tags["ngraph.cell_key"] for r in runs)
    assert all(n == 1 for n in keys.values()), f"a cell has several runs: {keys}"
    for device, (cells, batch_sizes) in EXPECTED.items():
        mine = [r for r in runs if r.data.params.get("device") == device]
        assert len(mine) == cells, (device, [r.info.run_name for r in mine])
        for run in mine:
            assert run.info.status == "FINISHED", (device, run.info.run_name, run.info.status)
            for b in batch_sizes:
                assert f"throughput.bs{b}" in run.data.metrics, (device, run.info.run_name, b)
            for key in run.data.metrics:  # every metric: one value at each step
                steps = Counter(m.step for m in client.get_metric_history(run.info.run_id, key))
                assert all(n == 1 for n in steps.values()), (device, run.info.run_name, key)


def _final_state(out: str, device: str) -> str:
    """The device's last state the sweep printed: without a terminal, its lines
    ``<device>: <state> (<reason>)`` (a table only on a terminal)."""
    states = [line.split()[1] for line in out.splitlines() if line.startswith(f"{device}: ")]
    assert states, out[-3000:]
    return states[-1]


def _benchmark_of(device: str) -> int | None:
    """The pid of the sweep's benchmark process of ``device`` on this machine."""
    for pid in _descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if b"benchmark" in cmdline and f"MLFLOW_NGRAPH_DEVICE_NAME={device}".encode() in environ:
            return pid
    return None


def test_a_device_whose_benchmark_is_killed_mid_sweep_resumes_from_its_journal(
    cluster, tmp_path, tracking_uri
):
    cluster_, _, nodes, _ = cluster
    sweep = Sweep(tmp_path, tracking_uri, cluster_.address)
    _await_first_cell(sweep)
    pid = _benchmark_of(VICTIM)
    assert pid is not None, "no benchmark process of the victim device"
    for p in _descendants(pid):  # the benchmark and its cell worker, at once
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    _release(cluster)
    out = sweep.finish()
    assert sweep.proc.returncode == 0, out[-3000:]
    assert _final_state(out, VICTIM) == "done" and _final_state(out, "cpu-b") == "done"
    # the retry ran on the same node and went on from its journal
    journals = list((nodes / VICTIM / "journals").glob("*.jsonl"))
    assert len(journals) == 1, journals
    _assert_every_cell_once(sweep.uri)
    assert sweep.sockets and all(s.startswith(LOOPBACK) for s in sweep.sockets), sweep.sockets


def test_a_device_whose_node_is_replaced_mid_sweep_is_done_once(cluster, tmp_path, tracking_uri):
    from mlflow_ngraph.cluster.sweep import add_device_node

    cluster_, spec, _, _ = cluster
    victim = next(d for d in spec.devices if d.name == VICTIM)
    sweep = Sweep(tmp_path, tracking_uri, cluster_.address)
    _await_first_cell(sweep)
    node = next(n for n in cluster_.worker_nodes if victim.resource in n._ray_params.resources)
    cluster_.remove_node(node, allow_graceful=False)
    _release(cluster)
    sweep.await_line(f"device {VICTIM}: its node left the cluster")
    fresh = tmp_path / "fresh-home"
    add_device_node(cluster_, victim, fresh)
    out = sweep.finish()
    assert sweep.proc.returncode == 0, out[-3000:]
    assert f"device {VICTIM}: a node offering it joined" in out, out[-3000:]
    assert _final_state(out, VICTIM) == "done" and _final_state(out, "cpu-b") == "done"
    assert list((fresh / "journals").glob("*.jsonl")), "the retry did not run on the new node"
    _assert_every_cell_once(sweep.uri)
    assert sweep.sockets and all(s.startswith(LOOPBACK) for s in sweep.sockets), sweep.sockets


def test_a_device_whose_node_leaves_for_good_is_reported_missing(cluster, tmp_path, tracking_uri):
    cluster_, spec, _, _ = cluster
    victim = next(d for d in spec.devices if d.name == VICTIM)
    sweep = Sweep(tmp_path, tracking_uri, cluster_.address, "--wait", "5")
    _await_first_cell(sweep)
    node = next(n for n in cluster_.worker_nodes if victim.resource in n._ray_params.resources)
    cluster_.remove_node(node, allow_graceful=False)
    _release(cluster)
    out = sweep.finish()
    assert sweep.proc.returncode == 2, out[-3000:]  # reported as one error line
    assert f"device {VICTIM} is missing: its node left mid-sweep" in out, out[-3000:]
    assert _final_state(out, VICTIM) == "missing" and _final_state(out, "cpu-b") == "done"
    assert out.strip().splitlines()[-1].startswith("error: sweep "), out[-1000:]
    assert _finished_cells(sweep.uri, "cpu-b") == EXPECTED["cpu-b"][0]  # its results stand
