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

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mlflow_ngraph.cluster.spec import SweepDevice, SweepSpec
from mlflow_ngraph.errors import NgraphError, StoreAway
from mlflow_ngraph.run.live import duration
from mlflow_ngraph.tracking.mlflow_log import redact_uri
from mlflow_ngraph.variables import ENV_DEVICE_NAME, ENV_PARENT_RUN, ENV_SWEEP_ID

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
#: seconds a device task waits before Ray tries it again when its benchmark found the
#: tracking server away (exit status of :class:`~mlflow_ngraph.errors.StoreAway`)
STORE_AWAY_PAUSE_S = 10.0


#: with "0", Ray resolves 127.0.0.1 to itself rather than to the host's network address
LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: a local cluster's head declares a node dead ~3 s after its raylet stops answering
#: (Ray's default takes ~15 s): a removed node's device is seen gone, its task retried
FAST_HEALTH_CHECK = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
#: seconds a device whose node left mid-sweep is waited for (unless ``--wait`` says)
REJOIN_WAIT_S = 120.0
#: the settings of every node of a cluster on this machine
LOCAL_NODE = {"node_ip_address": "127.0.0.1", "include_dashboard": False}
#: ports a local cluster's head would otherwise take fixed: its dashboard agent's HTTP port
#: (52365, though the dashboard is off) and the dashboard's (8265, tried even so); 0: one
#: the OS hands out. Ray leaves every other port of a node of the cluster to the OS already.
FREE_PORTS = {"dashboard_agent_listen_port": 0, "dashboard_port": 0}
#: a local cluster's temp folder (``ngr-XXXXXXXX``, Ray's sessions, sockets and logs in its
#: ``ray/``) goes under the system's temp folder when that is at most this long, else under
#: /tmp: Ray's Unix sockets lie ~71 bytes below it, and an AF_UNIX path is 107 bytes at most
TEMP_BASE_MAX = 20
#: seconds a local cluster's head is given to start, and to stop
HEAD_START_S = 180.0
HEAD_STOP_S = 60.0


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


def sweep_key(sweep: SweepSpec, tracking_uri: str) -> str:
    """The sweep's id: the same spec into the same store is the same sweep, so a sweep run
    again after a crash resumes under its id (and ``compare --sweep ID`` shows every cell
    of it, those measured before the crash too)."""
    specs = [{"name": d.name, "profile": d.profile, "spec": d.spec} for d in sweep.devices]
    if sweep.loadgen:  # a spec without scenarios keeps the id it had before they existed
        specs.append({"loadgen": sweep.loadgen})
    text = json.dumps([specs, redact_uri(tracking_uri)], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def require_ray() -> None:
    """Raises:
    NgraphError: Ray is not installed (one line naming the extra that brings it)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise NgraphError(
            "the sweep runs on Ray, which is not installed: pip install 'mlflow-ngraph[cluster]'"
        ) from None


@contextmanager
def sigterm_interrupts():
    """A SIGTERM to the sweep ends it as Ctrl-C does (``KeyboardInterrupt``: Ray and the
    local cluster are released, the command says how to resume). Set after Ray's own
    start-up: ``ray.init`` installs handlers of its own, one of which prints a C++ stack
    dump on SIGTERM."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def sweep_store(tracking_uri: str | None, local: bool, address: str | None) -> str:
    """The tracking URI every device of a sweep logs to: ``tracking_uri`` or the default,
    a local sqlite file by its absolute path (a node's worker runs elsewhere).

    Raises:
        NgraphError: a local store for devices that are not all on this machine.
    """
    from mlflow_ngraph.tracking.mlflow_log import resolve_tracking_uri
    from mlflow_ngraph.tracking.uri import check_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    check_tracking_uri(uri)
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(Path(uri[len("sqlite:///") :]).resolve())
    if not local and uri.startswith(("sqlite:", "file:")) and not address:
        raise NgraphError(
            f"a sweep over remote devices needs a tracking server every device reaches, not "
            f"{redact_uri(uri)}: set MLFLOW_TRACKING_URI=http://... (or run on this machine: "
            f'sweep --local, or "local": true in the backend config)'
        )
    return uri


def run_device(device: dict[str, Any]) -> dict:
    """Body of a device's Ray task: benchmark the device on this node (its home, journal
    and caches are the node's: ``MLFLOW_NGRAPH_HOME`` as the node was started with), then,
    when the spec has a ``loadgen:`` section, run its LoadGen scenarios on the same models x
    compilers (:func:`loadgen_command`). The tracking URI, credentials, device name and sweep
    id are in the task's environment (Ray's ``runtime_env``), never in its arguments. A retry
    resumes both: the benchmark from its journal, LoadGen skipping journaled scenarios."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    full_env = dict(os.environ)
    full_env.pop("MLFLOW_RUN_ID", None)  # a sweep under `mlflow run`: each device has its own
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp) / "spec.yaml"
        spec_path.write_text(yaml.safe_dump(device["spec"]))
        # a device task measures at once on a busy node (said in its log): nobody is there to
        # wait for it, and beside another device's task on the same node it would never be quiet
        command = [sys.executable, "-m", "mlflow_ngraph", "benchmark", "--spec", str(spec_path),
                   "--busy-ok"]  # fmt: skip
        done = _benchmark(command, full_env)
    tail = _ended(done, "benchmark")
    output = done.stdout
    if done.returncode == 0 and device.get("loadgen"):
        command = loadgen_command(device["spec"], device["loadgen"], device.get("experiment"))
        done = _benchmark(command, full_env)
        tail = _ended(done, "loadgen")
        output += done.stdout
    return {
        "returncode": done.returncode,
        "reason": tail if done.returncode else "",
        "output": redact_uri(output),
        "node": node,
    }


def _ended(done: subprocess.CompletedProcess, what: str) -> str:
    """The last line ``what`` wrote to stderr (redacted).

    Raises:
        DeviceFailed: it crashed or found the tracking server away (Ray tries the task
            again, which resumes); a user error (status 2) is not retried.
    """
    tail = redact_uri(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "")
    if done.returncode == StoreAway.exit_code:  # measured into the journal: later, resume
        time.sleep(STORE_AWAY_PAUSE_S)
        raise DeviceFailed(f"tracking server away: {tail}")
    if done.returncode not in (0, 2):  # 2 is a user error: retrying cannot help
        raise DeviceFailed(f"{what} exited with {done.returncode}: {tail}")
    return tail


def loadgen_command(
    spec: dict[str, Any], loadgen: dict[str, Any], experiment: str | None = None
) -> list[str]:
    """The ``mlflow-ngraph loadgen`` command a device runs after its benchmark: the device
    spec's models and compilers (every compiler of its profile when it names none, as the
    benchmark does) on its profile, the ``loadgen:`` section's settings, into the sweep's
    experiment. The store and the device's name come from the task's environment."""
    from mlflow_ngraph.cluster.spec import LOADGEN_KEYS
    from mlflow_ngraph.plan.config import build_spec

    built = build_spec(spec)
    command = [sys.executable, "-m", "mlflow_ngraph", "loadgen", "--device", built.device,
               "--experiment", experiment or built.experiment]  # fmt: skip
    for model in built.models:
        command += ["--model", model.label]
    for compiler in built.compilers:
        flags = ",".join(f"{k}={v}" for k, v in sorted(compiler.flags.items()))
        command += ["--compiler", compiler.name + (f":{flags}" if flags else "")]
    for key, option in LOADGEN_KEYS.items():
        values = loadgen.get(key)
        for value in values if isinstance(values, list) else [] if values is None else [values]:
            command += [option, f"{value:g}" if isinstance(value, float) else str(value)]
    return command


#: seconds a cancelled device's benchmark has to mark its open runs KILLED (as Ctrl-C does)
#: before it is killed
STOP_S = 20.0


def _benchmark(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run a device's benchmark to its end. A cancelled task (``ray.cancel``, which raises
    KeyboardInterrupt here) stops it as Ctrl-C does, so its runs end KILLED and the next
    run resumes them; it is polled each second so the interrupt is seen while it runs."""
    _interruptible()
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_die_with_task(),
    )  # fmt: skip
    try:
        while True:
            try:
                out, err = proc.communicate(timeout=1.0)
                return subprocess.CompletedProcess(command, proc.returncode, out, err)
            except subprocess.TimeoutExpired:
                continue
    except KeyboardInterrupt:
        proc.terminate()  # the benchmark takes SIGTERM as Ctrl-C
        try:
            proc.communicate(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise


def _interruptible() -> None:
    """Let ``ray.cancel`` reach this task. Ray raises its KeyboardInterrupt with
    ``_thread.interrupt_main``, which does nothing where Python does not handle SIGINT, and
    a worker of a cluster started from a background job or under ``nohup`` inherits SIGINT
    ignored: the cancel was lost there, and the benchmark ran to its end. Only the task's
    main thread may set a handler; elsewhere nothing is changed."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _die_with_task():
    """Linux: a ``preexec_fn`` that has the kernel kill the benchmark when the task's worker
    dies (its node was removed, or Ray killed it): no orphan keeps measuring and logging
    beside the retry. libc is loaded here, before the fork."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None
    return lambda: libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def device_env(
    device: SweepDevice, sweep_id: str, tracking_uri: str, parent_run: str | None = None
) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env.update(
        {ENV_DEVICE_NAME: device.name, ENV_SWEEP_ID: sweep_id, "MLFLOW_TRACKING_URI": tracking_uri}
    )
    if parent_run:
        env[ENV_PARENT_RUN] = parent_run
    return env


#: Ray's usage statistics: off, and the word that they are off, which Ray's dashboard
#: head sends to usage-stats.ray.io even so, sent to a closed loopback port instead
NO_USAGE_STATS = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",
}


def loopback_only() -> None:
    """Keep Ray on 127.0.0.1: it turns 127.0.0.1 into the host's own address when it
    connects, unless told that this is not a cluster of hosts, and it sends usage
    statistics unless told not to; every node and worker started from this process
    inherits the settings."""
    os.environ[LOOPBACK_ONLY] = "0"
    os.environ.update(NO_USAGE_STATS)
    import ray._private.ray_constants as constants

    constants.ENABLE_RAY_CLUSTER = False  # when ray was imported before the variable was set


def start_local_cluster(devices: list[SweepDevice], homes: Path | None = None):
    """A Ray cluster of one head and one node per device on this machine, every process
    on 127.0.0.1, no dashboard, its own ports and its own temp folder (removed at
    ``shutdown()``), so that two run side by side. With ``homes``, a device's node keeps its
    journal and caches in ``homes/<device>`` (a re-run of the sweep resumes from it).

    The head runs in a process of its own (:mod:`mlflow_ngraph.cluster.head`); the device
    nodes run here, as ``ray.cluster_utils.Cluster`` nodes (``add_node``, ``remove_node``).
    """
    loopback_only()
    temp = Path(tempfile.mkdtemp(prefix="ngr-", dir=_temp_base()))
    head = cluster = None
    try:
        head = _start_head(temp)
        cluster = _local_cluster(head, temp)
        for device in devices:
            add_device_node(cluster, device, homes / device.name if homes else None)
    except BaseException:
        if cluster is not None:
            cluster.shutdown()
        elif head is not None:
            head.stop()
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return cluster


def _temp_base() -> str:
    base = tempfile.gettempdir()
    return base if len(base.encode()) <= TEMP_BASE_MAX else "/tmp"


class _Head:
    """``Cluster.head_node`` of a local cluster: the process running the head, and what
    ``Cluster`` asks of a head node (its GCS address)."""

    def __init__(self, proc: subprocess.Popen, gcs_address: str) -> None:
        self.proc = proc
        self.gcs_address = gcs_address

    def stop(self, wait_s: float = HEAD_STOP_S) -> None:
        """The end of its stdin stops the head (its processes, then the temp folder); one
        that has not stopped after ``wait_s`` seconds is terminated."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()  # Ray's own SIGTERM handler stops the head's processes
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _start_head(temp: Path) -> _Head:
    """Start a local cluster's head in a process of its own, with its own environment: the
    head's dashboard process, which runs even without a dashboard, asks the cloud metadata
    address (169.254.169.254) which cloud it runs on unless ``$HOME/ray_bootstrap_config.yaml``
    (an autoscaler's config) is there; its ``HOME`` is the temp folder, which holds an empty
    one. Its ``RAY_TMPDIR`` is the temp folder too, so that Ray's address file of the "current
    cluster" (``$RAY_TMPDIR/ray/ray_current_cluster``, which ``Cluster`` writes and deletes) is
    this cluster's, not the host's (``/tmp/ray/``, where ``ray start`` writes it).

    Raises:
        NgraphError: the head did not start (the end of what it wrote).
    """
    from mlflow_ngraph.cluster.head import ADDRESS_FILE

    (temp / "ray_bootstrap_config.yaml").write_text("{}\n")
    (temp / "ray").mkdir()  # Ray's temp_dir: what RAY_TMPDIR implies, written explicitly
    args = {"num_cpus": 0, "_system_config": FAST_HEALTH_CHECK, "temp_dir": str(temp / "ray"),
            **FREE_PORTS, **LOCAL_NODE}  # fmt: skip
    env = {**os.environ, "HOME": str(temp), "RAY_TMPDIR": str(temp)}
    log = temp / "head.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow_ngraph.cluster.head", json.dumps(args), str(temp)],
            stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,  # Ctrl-C reaches the sweep, which stops the head itself
        )  # fmt: skip
    address = temp / ADDRESS_FILE
    deadline = time.time() + HEAD_START_S
    while not address.exists():
        if proc.poll() is not None or time.time() > deadline:
            _Head(proc, "").stop(wait_s=0)
            said = log.read_text(errors="replace").strip().splitlines() or [
                f"no word from it in {HEAD_START_S:g} s" if proc.returncode is None
                else f"exit status {proc.returncode}"]  # fmt: skip
            raise NgraphError(f"the local Ray cluster's head did not start: {said[-1]}")
        time.sleep(0.1)
    return _Head(proc, address.read_text().strip())


def _local_cluster(head: _Head, temp: Path):
    """A ``ray.cluster_utils.Cluster`` whose head is ``head`` (a process of its own): its
    nodes are added and removed as any cluster's; ``shutdown()`` removes them, stops the
    head and removes the temp folder."""
    from ray.cluster_utils import Cluster

    class LocalCluster(Cluster):
        def __init__(self) -> None:
            super().__init__(initialize_head=False)
            self.head_node = head  # Cluster.gcs_address, and add_node adds device nodes
            self.temp_folder = temp

        def shutdown(self) -> None:
            # not Cluster.shutdown: that also deletes the host's ray_current_cluster file,
            # which may be another cluster's (ray start writes it)
            if self.head_node is None:
                return
            try:
                for node in list(self.worker_nodes):
                    self.remove_node(node)
            finally:
                self.head_node.stop()
                self.head_node = None
                shutil.rmtree(self.temp_folder, ignore_errors=True)
                import ray.experimental.internal_kv as kv

                kv._internal_kv_reset()  # as Cluster.shutdown: the GCS is gone

    return LocalCluster()


def add_device_node(cluster, device: SweepDevice, home: Path | None = None):
    """A node of ``cluster`` (on this machine) offering ``device``; its benchmark keeps its
    journal and caches in ``home`` (the node's ``MLFLOW_NGRAPH_HOME``)."""
    env = {"MLFLOW_NGRAPH_HOME": str(home)} if home else None
    return cluster.add_node(num_cpus=1, resources={device.resource: 1}, env_vars=env, **LOCAL_NODE)


def offered_devices(sweep: SweepSpec) -> set[str]:
    import ray

    # the node table, not ray.cluster_resources(): that one still counts a node for a
    # while after it was declared dead
    offered: set[str] = set()
    for node in ray.nodes():
        if node.get("Alive"):
            offered.update(r for r, n in node.get("Resources", {}).items() if n >= 1)
    return {d.name for d in sweep.devices if d.resource in offered}


def run_sweep(
    sweep: SweepSpec,
    tracking_uri: str,
    *,
    local: bool = False,
    address: str | None = None,
    wait_s: float | None = None,
    node_homes: Path | None = None,
    echo=print,
    refresh_s: float = 2.0,
    tty: bool = True,
    parent_run: str | None = None,
    every_device: bool = False,
    on_started=None,
) -> SweepOutcome:
    """Run every device's benchmark on the Ray cluster; returns each device's end state.
    Everything started on Ray (tasks, and with ``local`` the cluster) is released; on
    KeyboardInterrupt (a cancel) every device's benchmark is first stopped as Ctrl-C stops
    it, its runs KILLED.

    ``wait_s``: how long a device absent from the cluster is waited for, at the start (0
    when not given) and when its node left mid-sweep (:data:`REJOIN_WAIT_S` when not
    given). ``address``: a cluster's; one on 127.0.0.1 (a cluster of this machine) keeps
    this driver on 127.0.0.1 too. ``node_homes`` (with ``local``): each device's node keeps
    its journal and caches in ``node_homes/<device>``. ``tty``: the progress is a table
    redrawn on a terminal, one line per finished cell in a log. ``parent_run``: the run
    each device's benchmark run is nested under. ``every_device``: a device still absent
    after ``wait_s`` is an error, raised before anything runs. ``on_started()`` is called
    once every device's task is submitted.

    Raises:
        NgraphError: the cluster does not answer, or (``every_device``) a device has no node.
    """
    sweep_id = sweep_key(sweep, tracking_uri)
    outcome = SweepOutcome(sweep_id, {d.name: DeviceState(d) for d in sweep.devices})
    pending: dict = {}

    def cancel() -> None:  # the tasks submitted by the time of the Ctrl-C
        _stop(pending, outcome, echo)

    with _joined(sweep.devices, local, address, node_homes, on_interrupt=cancel):
        echo(f"sweep {sweep_id}: {len(sweep.devices)} device(s) -> {redact_uri(tracking_uri)}")
        present = _present_devices(sweep, outcome, wait_s, every_device, address, echo)
        pending = _submit(sweep, present, outcome, tracking_uri, parent_run)
        if on_started is not None:
            on_started(outcome)
        rejoin_s = REJOIN_WAIT_S if wait_s is None else wait_s
        _watch(pending, outcome, tracking_uri, sweep, echo, refresh_s, rejoin_s, tty)
    return outcome


@contextmanager
def _joined(
    devices: list[SweepDevice],
    local: bool,
    address: str | None,
    homes: Path | None,
    on_interrupt: Callable[[], None],
):
    """The block runs on the sweep's Ray cluster: with ``local`` one of this machine, started
    first (its nodes' ``homes``, see :func:`start_local_cluster`), else the one at
    ``address``; a SIGTERM is a KeyboardInterrupt there, on which ``on_interrupt()`` is
    called first. However the block ends, the driver then leaves Ray and a local cluster is
    shut down."""
    import ray

    loopback = local or _is_loopback(address)
    if loopback:
        loopback_only()
    cluster = start_local_cluster(devices, homes) if local else None
    try:
        _connect(cluster.address if cluster else address, loopback)
        with sigterm_interrupts():  # after ray.init, which installs handlers of its own
            yield
    except KeyboardInterrupt:
        on_interrupt()
        raise
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()


def _present_devices(
    sweep: SweepSpec,
    outcome: SweepOutcome,
    wait_s: float | None,
    every_device: bool,
    address: str | None,
    echo,
) -> set[str]:
    """The devices the cluster offers once the absent ones were waited for ``wait_s`` (None:
    not at all); those still absent are marked missing in ``outcome``.

    Raises:
        NgraphError: ``every_device`` and a device is still absent (at ``address``).
    """
    present = _await_devices(sweep, wait_s or 0.0, echo)
    absent = [d for d in sweep.devices if d.name not in present]
    if every_device and absent:
        raise NgraphError(no_node(absent[0], address))
    for device in absent:
        outcome.states[device.name].state = "missing"
        outcome.states[device.name].reason = f"not in the cluster after {wait_s or 0:g} s"
    return present


def no_node(device: SweepDevice, address: str | None) -> str:
    return (
        f"device {device.name!r} has no node in the Ray cluster at {address or 'auto'}: start "
        f"one on the device with ray start --address=<head>:6379 "
        f"--resources='{{\"{device.resource}\": 1}}'"
    )


def _connect(address: str | None, loopback: bool) -> None:
    """Join the cluster at ``address`` (the running one for None or 'auto').

    Raises:
        NgraphError: nothing answers there (one line).
    """
    import ray

    check_answers(address)
    try:
        ray.init(
            address=address or "auto",
            log_to_driver=False,
            include_dashboard=False if loopback else None,
            _node_ip_address="127.0.0.1" if loopback else None,
        )
    except ConnectionError as exc:
        raise NgraphError(f"Ray cluster at {address or 'auto'} does not answer: {exc}") from None


#: seconds a Ray address is given to accept a connection before it is said not to answer
CONNECT_TIMEOUT_S = 5.0


def check_answers(address: str | None) -> None:
    """One line, at once, for a HOST:PORT address where nothing listens (``ray.init``
    would retry for a minute); 'auto' and ``ray://`` addresses are left to Ray."""
    import socket

    if not address or address.startswith(("ray://", "auto")):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise NgraphError(f"Ray address {address!r} is not HOST:PORT (nor 'auto')")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise NgraphError(
            f"Ray cluster at {address} does not answer ({exc.strerror or exc}): start its "
            f"head with ray start --head, or give the address it printed"
        ) from None


def _submit(sweep, present, outcome, tracking_uri, parent_run) -> dict:
    """One task per present device, asking for its resource: {its ref: its name}."""
    import ray

    task = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=[DeviceFailed])(run_device)
    pending = {}
    for device in sweep.devices:
        if device.name not in present:
            continue
        env = device_env(device, outcome.sweep_id, tracking_uri, parent_run)
        ref = task.options(
            resources={device.resource: 1}, num_cpus=0, runtime_env={"env_vars": env}
        ).remote({"name": device.name, "spec": device.spec, "loadgen": device.loadgen,
                  "experiment": sweep.experiment})  # fmt: skip
        pending[ref] = device.name
        outcome.states[device.name].state = "running"
        outcome.states[device.name].started = time.time()
    return pending


def _stop(pending: dict, outcome: SweepOutcome, echo) -> None:
    """Cancel every running device's task: its benchmark stops as Ctrl-C stops it
    (:func:`_benchmark`); waited for :data:`STOP_S` and a little more."""
    import ray

    if not pending or not ray.is_initialized():
        return
    echo(f"cancelling {len(pending)} device(s): their benchmarks stop, their runs end KILLED")
    for ref in pending:
        ray.cancel(ref)
    ray.wait(list(pending), num_returns=len(pending), timeout=STOP_S + 10)
    for name in pending.values():
        outcome.states[name].state, outcome.states[name].reason = "cancelled", "cancelled"


def _is_loopback(address: str | None) -> bool:
    host = (address or "").rsplit(":", 1)[0].removeprefix("ray://")
    return host in ("127.0.0.1", "localhost")


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


def _watch(
    pending: dict, outcome: SweepOutcome, uri: str, sweep: SweepSpec, echo, refresh_s, rejoin_s,
    tty: bool = True,
):  # fmt: skip
    """Until every task has ended: collect the ended ones, follow the nodes, and show the
    progress: on a terminal the table (on a change, and every half minute or so), else one
    line per finished cell and per change of a device's state."""
    import ray

    last, shown = 0.0, None
    left: dict[str, float] = {}  # device -> when its node was seen gone
    cells: dict[str, dict[str, Any]] = {}
    unreachable = False
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=refresh_s)
        for ref in ready:
            _collect(ref, outcome.states[pending.pop(ref)])
        _check_nodes(pending, outcome, sweep, left, rejoin_s, echo)
        latest = progress(uri, sweep)
        if (latest is None) != unreachable:  # said once per outage, with the last counts
            unreachable = latest is None
            echo(f"tracking server {redact_uri(uri)} " + (
                "does not answer: the view keeps the last counts it had; the devices go on "
                "measuring into their journals" if unreachable else "answers again"))  # fmt: skip
        before, cells = cells, cells if latest is None else latest
        now_shown = (cells, [(s.state, s.reason) for s in outcome.states.values()])
        if not tty:
            for line in progress_lines(outcome, before, cells, shown):
                echo(line)
            shown = now_shown
        elif now_shown != shown or time.time() - last >= 15 * refresh_s or not pending:
            echo(live_view(outcome, cells))
            last, shown = time.time(), now_shown


def _collect(ref, state: DeviceState) -> None:
    """The end of a device's task: its output, its state and why."""
    import ray

    state.finished = time.time()
    try:
        result = ray.get(ref)
    except Exception as exc:  # the task failed after its retries, or was cancelled
        if state.state != "missing":
            state.state = "failed"
            state.reason = _reason(exc)
        return
    state.output = result["output"]
    state.state = "done" if result["returncode"] == 0 else "failed"
    state.reason = result["reason"]


def progress_lines(outcome: SweepOutcome, before: dict, cells: dict, shown) -> list[str]:
    """What changed since the last look, one line each: a cell a device finished (``[cpu-b
    2/8] conv_block/onnxruntime finished``, its elapsed time and what is left), a device's
    new state. ``shown``: the (cells, states) of the last look (None at the first)."""
    lines = []
    states = dict(zip(outcome.states, shown[1])) if shown else {}
    now = time.time()
    for name, s in outcome.states.items():
        old, new = before.get(name, {}), cells.get(name, {})
        total = _cells_of(s.device)
        finished = [c for c in new.get("finished", []) if c not in old.get("finished", [])]
        done = new.get("done", 0) - len(finished)
        if shown is None and finished:  # before this sweep started (it resumes)
            lines.append(f"[{name} {len(finished)}/{total}] finished before: "
                         + ", ".join(finished))  # fmt: skip
            finished = []
        for cell in finished:
            done += 1
            elapsed = now - s.started if s.started else 0.0
            left = elapsed / done * max(total - done, 0)
            lines.append(f"[{name} {done}/{total}] {cell} finished ({duration(elapsed)} "
                         f"elapsed, about {duration(left)} left)")  # fmt: skip
        if states.get(name) != (s.state, s.reason) and s.state != "waiting":
            lines.append(f"{name}: {s.state}" + (f" ({s.reason})" if s.reason else ""))
    return lines


def _check_nodes(pending: dict, outcome: SweepOutcome, sweep, left: dict, rejoin_s, echo):
    """A running device whose node left the cluster: its task waits for a node offering the
    device (Ray retries it there); after ``rejoin_s`` seconds without one it is cancelled
    and the device reported missing."""
    import ray

    present = offered_devices(sweep)
    for ref, name in list(pending.items()):
        state = outcome.states[name]
        if name in present:
            if name in left:
                del left[name]
                state.state, state.reason = "running", "its node was replaced; resumed"
                echo(f"device {name}: a node offering it joined; its benchmark resumes there")
            continue
        if name not in left:
            left[name] = time.time()
            state.state = "waiting"
            state.reason = f"its node left; waiting up to {rejoin_s:g} s for another"
            echo(f"device {name}: its node left the cluster; waiting up to {rejoin_s:g} s "
                 "for a node offering it")  # fmt: skip
        elif time.time() - left[name] >= rejoin_s:
            ray.cancel(ref, force=True)
            state.state = "missing"
            state.reason = f"its node left mid-sweep and none joined within {rejoin_s:g} s"
            echo(f"device {name} is missing: {state.reason}")


def _reason(exc: Exception) -> str:
    return redact_uri(str(getattr(exc, "cause", None) or exc).strip().splitlines()[-1])


#: the live view asks the tracking server once, for this long at most: a server that is
#: down costs the view a few seconds, not MLflow's minutes of retries
VIEW_TIMEOUT_S = 5


def progress(tracking_uri: str, sweep: SweepSpec) -> dict[str, dict[str, Any]] | None:
    """Per device, the cell runs the tracking server holds: done, running, failed, and the
    current cell's name; None when the server does not answer."""
    from mlflow.tracking import MlflowClient

    from mlflow_ngraph.tracking.mlflow_log import local_sqlite

    empty = {"done": 0, "running": 0, "failed": 0, "current": "", "finished": []}
    store = local_sqlite(tracking_uri)
    if store is not None and not store.exists():
        # not created yet: opening it here would create it in place, half-made for a moment
        # under the device tasks that create it whole (mlflow_log.connect)
        return {d.name: {**empty, "finished": []} for d in sweep.devices}
    out: dict[str, dict[str, Any]] = {}
    try:
        with _bounded_requests():
            client = MlflowClient(tracking_uri)
            exp = client.get_experiment_by_name(sweep.experiment)
            for device in sweep.devices:
                counts: dict[str, Any] = {**empty, "finished": []}
                out[device.name] = counts
                if exp is None:
                    continue
                # by the device's name only: runs of its profile are other hosts' (or a
                # benchmark outside the sweep), not this device's
                runs = client.search_runs(
                    [exp.experiment_id],
                    f"tags.`ngraph.role` = 'cell' and tags.`ngraph.device` = '{device.name}'",
                    max_results=1000,
                    order_by=["attributes.end_time ASC"],
                )
                for run in runs:
                    status = run.info.status
                    key = {"FINISHED": "done", "RUNNING": "running"}.get(status, "failed")
                    counts[key] += 1
                    if status == "RUNNING":
                        counts["current"] = run.info.run_name
                    elif status == "FINISHED":
                        counts["finished"].append(run.info.run_name)
    except Exception as exc:  # the view is best effort: the server may be down meanwhile
        log.debug("progress unavailable: %s", exc)
        return None
    return out


@contextmanager
def _bounded_requests():
    """MLflow's HTTP requests of this process: one try, :data:`VIEW_TIMEOUT_S` long."""
    from mlflow_ngraph.variables import environment

    bounds = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
              "MLFLOW_HTTP_REQUEST_TIMEOUT": str(VIEW_TIMEOUT_S)}  # fmt: skip
    with environment(bounds):
        yield


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
    from mlflow_ngraph.plan.config import build_spec

    spec = build_spec(device.spec)
    return len(spec.models) * len(spec.compilers)


def check_outcome(outcome: SweepOutcome) -> None:
    bad = [f"{n} {s.state}: {s.reason}" for n, s in outcome.states.items() if s.state != "done"]
    if bad:
        raise NgraphError("sweep " + outcome.sweep_id + ": " + "; ".join(bad))
