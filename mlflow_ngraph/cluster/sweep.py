"""The sweep: one Ray task per device runs the benchmark there, results meet in MLflow.

Each device of the spec is a Ray custom resource, ``ngraph_device_<name>: 1``, offered by
the node that hosts it; a task asks for one unit, so a device runs one benchmark at a time.
The task runs ``python -m mlflow_ngraph benchmark`` (the code path of ``mlflow run . -e
benchmark``) with the device name, the sweep id, the tracking URI and the credentials in the
subprocess's environment, never on its command line. Ray retries a task whose process or
node died (:data:`MAX_RETRIES`, set on purpose); the retry resumes from the node's journal,
or from the tracking server when it lands on a node without one.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mlflow_ngraph.cluster import ENV_DEVICE_NAME, ENV_SWEEP_ID
from mlflow_ngraph.cluster.spec import SweepDevice, SweepSpec
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.tracking.mlflow_log import redact_uri

log = logging.getLogger(__name__)

#: a device's task is run again this many times after its process, its node or the
#: benchmark itself died (Ray's default of 3 is not assumed)
MAX_RETRIES = 2
#: environment variables a device task passes on to the benchmark
PASSED_ENV = (
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_INSECURE_TLS",
    "PYTHONPATH",
)


#: with "0", Ray resolves 127.0.0.1 to itself rather than to the host's network address
LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class DeviceFailed(Exception):
    """The benchmark of a device exited abnormally (Ray retries the task)."""


@dataclass
class DeviceState:
    device: SweepDevice
    state: str = "waiting"  # waiting, running, done, failed, missing
    started: float | None = None
    finished: float | None = None
    reason: str = ""
    output: str = ""


@dataclass
class SweepOutcome:
    sweep_id: str
    states: dict[str, DeviceState] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(s.state == "done" for s in self.states.values())


def run_device(device: dict[str, Any], env: dict[str, str], node_homes: str | None) -> dict:
    """Body of a device's Ray task: benchmark the device on this node."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    full_env = {**os.environ, **env}
    full_env.pop("MLFLOW_RUN_ID", None)  # a sweep under `mlflow run`: each device has its own
    if node_homes:  # a local cluster: every node keeps its own journal and caches
        full_env["MLFLOW_NGRAPH_HOME"] = str(Path(node_homes) / node[:12])
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp) / "spec.yaml"
        spec_path.write_text(yaml.safe_dump(device["spec"]))
        command = [sys.executable, "-m", "mlflow_ngraph", "benchmark", "--spec", str(spec_path)]
        done = subprocess.run(command, env=full_env, capture_output=True, text=True)
    tail = redact_uri(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "")
    if done.returncode not in (0, 2):  # 2 is a user error: retrying cannot help
        raise DeviceFailed(f"benchmark exited with {done.returncode}: {tail}")
    return {
        "returncode": done.returncode,
        "reason": tail if done.returncode else "",
        "output": redact_uri(done.stdout),
        "node": node,
    }


def device_env(device: SweepDevice, sweep_id: str, tracking_uri: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env.update(
        {ENV_DEVICE_NAME: device.name, ENV_SWEEP_ID: sweep_id, "MLFLOW_TRACKING_URI": tracking_uri}
    )
    return env


def start_local_cluster(devices: list[SweepDevice]):
    """A Ray cluster of one head and one node per device on this machine, every process
    on 127.0.0.1, no dashboard."""
    # Ray turns 127.0.0.1 into the host's own address when it connects, unless told that
    # this is not a cluster of hosts; every node and worker it starts inherits the setting
    os.environ[LOOPBACK_ONLY] = "0"
    import ray._private.ray_constants as constants
    from ray.cluster_utils import Cluster

    constants.ENABLE_RAY_CLUSTER = False  # when ray was imported before the variable was set
    common = {"node_ip_address": "127.0.0.1", "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, **common})
    for device in devices:
        cluster.add_node(num_cpus=1, resources={device.resource: 1}, **common)
    return cluster


def offered_devices(sweep: SweepSpec) -> set[str]:
    import ray

    resources = ray.cluster_resources()
    return {d.name for d in sweep.devices if resources.get(d.resource, 0) >= 1}


def run_sweep(
    sweep: SweepSpec,
    tracking_uri: str,
    *,
    local: bool = False,
    address: str | None = None,
    wait_s: float = 0.0,
    node_homes: Path | None = None,
    echo=print,
    refresh_s: float = 2.0,
) -> SweepOutcome:
    """Run every device's benchmark on the Ray cluster; returns each device's end state.
    Everything started on Ray (tasks, and with ``local`` the cluster) is released."""
    import ray

    sweep_id = uuid.uuid4().hex[:12]
    outcome = SweepOutcome(sweep_id, {d.name: DeviceState(d) for d in sweep.devices})
    cluster = start_local_cluster(sweep.devices) if local else None
    try:
        ray.init(
            address=cluster.address if cluster else (address or "auto"),
            log_to_driver=False,
            include_dashboard=False if cluster else None,
            _node_ip_address="127.0.0.1" if cluster else None,
        )
        echo(f"sweep {sweep_id}: {len(sweep.devices)} device(s) -> {redact_uri(tracking_uri)}")
        present = _await_devices(sweep, wait_s, echo)
        for name, state in outcome.states.items():
            if name not in present:
                state.state, state.reason = "missing", f"not in the cluster after {wait_s:g} s"
        task = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=[DeviceFailed])(run_device)
        pending = {}
        for device in sweep.devices:
            if device.name not in present:
                continue
            ref = task.options(resources={device.resource: 1}, num_cpus=0).remote(
                {"name": device.name, "spec": device.spec},
                device_env(device, sweep_id, tracking_uri),
                str(node_homes) if node_homes else None,
            )
            pending[ref] = device.name
            outcome.states[device.name].state = "running"
            outcome.states[device.name].started = time.time()
        _watch(pending, outcome, tracking_uri, sweep, echo, refresh_s)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    return outcome


def _await_devices(sweep: SweepSpec, wait_s: float, echo) -> set[str]:
    present = offered_devices(sweep)
    absent = [d.name for d in sweep.devices if d.name not in present]
    if absent:
        echo(f"device(s) not in the cluster: {', '.join(absent)}; waiting up to {wait_s:g} s")
    deadline = time.time() + wait_s
    while absent and time.time() < deadline:
        time.sleep(min(1.0, max(deadline - time.time(), 0)))
        present = offered_devices(sweep)
        absent = [d.name for d in sweep.devices if d.name not in present]
    for name in absent:
        echo(f"device {name} is missing: its node never joined (start it with `ray start`)")
    return present


def _watch(pending: dict, outcome: SweepOutcome, uri: str, sweep: SweepSpec, echo, refresh_s):
    import ray

    last, shown = 0.0, None
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=refresh_s)
        for ref in ready:
            state = outcome.states[pending.pop(ref)]
            state.finished = time.time()
            try:
                result = ray.get(ref)
            except Exception as exc:  # the task failed after its retries
                state.state = "failed"
                state.reason = redact_uri(str(getattr(exc, "cause", None) or exc).splitlines()[-1])
                continue
            state.output = result["output"]
            state.state = "done" if result["returncode"] == 0 else "failed"
            state.reason = result["reason"]
        cells = progress(uri, sweep)
        changed = (cells, [s.state for s in outcome.states.values()]) != shown
        if changed or time.time() - last >= 15 * refresh_s or not pending:
            echo(live_view(outcome, cells))  # on a change, and every half minute or so
            last, shown = time.time(), (cells, [s.state for s in outcome.states.values()])


def progress(tracking_uri: str, sweep: SweepSpec) -> dict[str, dict[str, int]]:
    """Per device, the cell runs the tracking server holds: done, running, failed, and the
    current cell's name."""
    from mlflow.tracking import MlflowClient

    from mlflow_ngraph.tracking.mlflow_log import local_sqlite

    out: dict[str, dict[str, Any]] = {}
    store = local_sqlite(tracking_uri)
    if store is not None and not store.exists():
        # not created yet: opening it here would create it in place, half-made for a moment
        # under the device tasks that create it whole (mlflow_log.connect)
        return {
            d.name: {"done": 0, "running": 0, "failed": 0, "current": ""} for d in sweep.devices
        }
    try:
        client = MlflowClient(tracking_uri)
        exp = client.get_experiment_by_name(sweep.experiment)
        for device in sweep.devices:
            counts: dict[str, Any] = {"done": 0, "running": 0, "failed": 0, "current": ""}
            if exp is not None:
                runs = client.search_runs(
                    [exp.experiment_id],
                    f"tags.`ngraph.role` = 'cell' and tags.`ngraph.device` = '{device.name}'",
                    max_results=1000,
                ) or client.search_runs(
                    [exp.experiment_id],
                    f"tags.`ngraph.role` = 'cell' and tags.`ngraph.device` = '{device.profile}'",
                    max_results=1000,
                )
                for run in runs:
                    status = run.info.status
                    key = {"FINISHED": "done", "RUNNING": "running"}.get(status, "failed")
                    counts[key] += 1
                    if status == "RUNNING":
                        counts["current"] = run.info.run_name
            out[device.name] = counts
    except Exception as exc:  # the view is best effort: the server may be down meanwhile
        log.debug("progress unavailable: %s", exc)
    return out


def live_view(outcome: SweepOutcome, cells: dict[str, dict[str, Any]]) -> str:
    from mlflow_ngraph.table import format_table

    now = time.time()
    rows = []
    for name, s in outcome.states.items():
        c = cells.get(name, {})
        elapsed = ((s.finished or now) - s.started) if s.started else 0.0
        done = c.get("done", 0)
        total = _cells_of(s.device)
        left = (elapsed / done) * max(total - done, 0) if done and s.state == "running" else None
        rows.append(
            (
                name,
                s.device.profile,
                s.state,
                f"{done}/{total}",
                c.get("running", 0),
                c.get("failed", 0),
                (c.get("current", "") or "-")[:48],
                f"{elapsed:.0f}s",
                f"~{left:.0f}s" if left is not None else "-",
                s.reason[:60],
            )
        )
    header = ["device", "profile", "state", "cells", "running", "failed", "current",
              "elapsed", "left", "note"]  # fmt: skip
    return format_table(header, rows)


def _cells_of(device: SweepDevice) -> int:
    from mlflow_ngraph.config import build_spec

    spec = build_spec(device.spec)
    return len(spec.models) * len(spec.compilers)


def check_outcome(outcome: SweepOutcome) -> None:
    bad = [f"{n} {s.state}: {s.reason}" for n, s in outcome.states.items() if s.state != "done"]
    if bad:
        raise NgraphError("sweep " + outcome.sweep_id + ": " + "; ".join(bad))
