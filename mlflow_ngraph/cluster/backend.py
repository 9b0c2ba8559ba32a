"""``mlflow run . -e benchmark --backend ngraph-ray --backend-config cluster.json``: MLflow's
own command, fanned out over a Ray cluster by the sweep's machinery.

MLflow finds :class:`RayBackend` through the ``mlflow.project_backend`` entry point and calls
its ``run`` (``mlflow.projects._run``) with the project, the entry point, the ``-P`` params,
the backend config (with keys of MLflow's own added: :data:`MLFLOW_KEYS`), the tracking URI
and the experiment. The backend turns the entry point's command (MLflow computes it from
the MLproject) into the benchmark spec it runs, makes it a sweep over the config's devices,
creates the project's run (as MLflow's local backend does) and starts the sweep's driver as
a process of its own (:mod:`mlflow_ngraph.cluster.driver`): every device's benchmark run is
nested under the project's run, its cells under it, as ``sweep`` logs them.

The driver outlives the ``mlflow run`` that started it: a client killed with ``kill -9``
loses nothing, and the same command run again follows the running driver, or starts a new
one that resumes from the nodes' journals and the store (the same spec into the same store
is the same sweep, hence the same project run). ``mlflow run`` waits for a plug-in backend's
run only when it is synchronous, which its command line never asks (``synchronous`` is
``backend in ("local", "kubernetes")``): the backend follows the driver itself unless the
config says ``"synchronous": false``.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.entities import RunStatus
from mlflow.exceptions import ExecutionException
from mlflow.projects.backend.abstract_backend import AbstractBackend
from mlflow.projects.submitted_run import SubmittedRun
from mlflow.projects.utils import (
    MLFLOW_LOCAL_BACKEND_RUN_ID_CONFIG,
    PROJECT_BUILD_IMAGE,
    PROJECT_DOCKER_ARGS,
    PROJECT_DOCKER_AUTH,
    PROJECT_ENV_MANAGER,
    PROJECT_STORAGE_DIR,
    PROJECT_SYNCHRONOUS,
)

from mlflow_ngraph.cluster.driver import Driver
from mlflow_ngraph.cluster.sweep import check_answers
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.redaction import redact_text

log = logging.getLogger(__name__)

#: the backend's name (``--backend``) as the entry point registers it
NAME = "ngraph-ray"
#: what a backend config may hold
CONFIG_KEYS = ("address", "devices", "local", "synchronous", "wait")
#: the keys MLflow adds to every backend config before a backend sees it
MLFLOW_KEYS = {
    PROJECT_ENV_MANAGER,
    PROJECT_SYNCHRONOUS,
    PROJECT_DOCKER_ARGS,
    PROJECT_STORAGE_DIR,
    PROJECT_BUILD_IMAGE,
    PROJECT_DOCKER_AUTH,
    MLFLOW_LOCAL_BACKEND_RUN_ID_CONFIG,
}
#: the entry points that measure on a device, by the script their command runs
RUNNABLE = ("benchmark", "blocks")
#: the extra that installs Ray
RAY_EXTRA = "pip install 'mlflow-ngraph[cluster]'"


@dataclass
class BackendConfig:
    """A ``--backend-config``: where the cluster is and which devices to run on."""

    devices: list[dict[str, str]]  #: sweep spec device entries, {name, profile}
    address: str | None = None
    local: bool = False
    synchronous: bool = True
    wait_s: float | None = None


def parse_config(raw: Any) -> BackendConfig:
    """Validate a backend config as MLflow hands it over (a dict, MLflow's keys included).

    Raises:
        NgraphError: an unknown key, a value of the wrong type, no devices.
    """
    if not isinstance(raw, dict):
        raise NgraphError('backend config must be a JSON object, e.g. {"devices": ["xeon"]}')
    data = {k: v for k, v in raw.items() if k not in MLFLOW_KEYS}
    unknown = sorted(set(data) - set(CONFIG_KEYS))
    if unknown:
        raise NgraphError(
            f"backend config: unknown key {unknown[0]!r} (keys: {', '.join(CONFIG_KEYS)})"
        )
    devices = data.get("devices")
    if not isinstance(devices, list) or not devices:
        raise NgraphError(
            "backend config: 'devices' must list the devices, e.g. [\"xeon\", "
            '{"name": "orin-1", "profile": "orin"}]'
        )
    for key, kind in (("local", bool), ("synchronous", bool), ("address", str)):
        if key in data and not isinstance(data[key], kind):
            raise NgraphError(f"backend config: {key!r} must be a {kind.__name__}")
    wait = data.get("wait")
    if wait is not None and (isinstance(wait, bool) or not isinstance(wait, (int, float))):
        raise NgraphError("backend config: 'wait' must be a number of seconds")
    if data.get("local") and data.get("address"):
        raise NgraphError("backend config: give 'address' or 'local': true, not both")
    return BackendConfig(
        [_device_entry(d) for d in devices],
        data.get("address"),
        bool(data.get("local")),
        data.get("synchronous", True),
        None if wait is None else float(wait),
    )


def _device_entry(entry: Any) -> dict[str, str]:
    """A device as a name (which is also its profile) or as {name, profile}."""
    if isinstance(entry, str):
        return {"name": entry, "profile": entry}
    if isinstance(entry, dict):
        return entry
    raise NgraphError(
        f'backend config: device {entry!r} must be a profile name or {{"name", "profile"}}'
    )


def require_ray() -> None:
    """Raises: NgraphError naming the extra to install when Ray does not import."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise NgraphError(
            f"the {NAME} backend needs Ray, which is not installed: {RAY_EXTRA}"
        ) from None


def entry_command(project, entry_point: str, params: dict[str, str]) -> list[str]:
    """The ``mlflow-ngraph`` arguments the entry point would run (MLflow computes its
    command from the MLproject; the package's entry point scripts map it).

    Raises:
        NgraphError: an entry point that does not measure on a device, or ``-P device``.
    """
    from mlflow_ngraph.commands.entrypoints import command_line

    if "device" in params:
        raise NgraphError(
            f"-P device={params['device']}: under --backend {NAME} each device of the backend "
            "config runs the entry point with its own profile; leave -P device out"
        )
    command = project.get_entry_point(entry_point).compute_command(params, None)
    words = shlex.split(command)
    script = next((w for w in words if w.startswith("entrypoints/") and w.endswith(".py")), "")
    name = Path(script).stem
    if name == "compare":
        raise NgraphError(
            f"entry point {entry_point!r} runs locally (it reads the store and measures "
            f"nothing): run it without --backend {NAME}"
        )
    if name not in RUNNABLE:
        raise NgraphError(
            f"entry point {entry_point!r} cannot run under --backend {NAME}: it runs the "
            f"entry points {', '.join(RUNNABLE)} on each device (`sweep` is a sweep already)"
        )
    return command_line(name, words[words.index(script) + 1 :])


class RayBackend(AbstractBackend):
    """The ``ngraph-ray`` project backend (see the module's docstring)."""

    def run(
        self, project_uri, entry_point, params, version, backend_config, tracking_uri,
        experiment_id,
    ) -> SubmittedRun:  # fmt: skip
        from mlflow_ngraph.console import default_home

        try:
            config = parse_config(backend_config)
            require_ray()
            check_answers(config.address)
            job = plan_job(project_uri, entry_point, dict(params or {}), version, config,
                           tracking_uri, experiment_id)  # fmt: skip
            driver = Driver(default_home() / "projects" / job["sweep_id"])
            submitted = RaySubmittedRun(driver.launch(job), driver)
            if not config.synchronous:
                _say(driver.how_to_follow())
                return submitted
            if not submitted.follow():
                if driver.died():  # not the last table row of its output: what happened
                    raise NgraphError(driver.death_line())
                raise NgraphError(f"run {submitted.run_id} failed: {driver.last_line()}")
            return submitted
        except NgraphError as exc:  # MLflow's command prints it as one line, exit status 1
            raise ExecutionException(redact_text(exc)) from None


def plan_job(
    project_uri, entry_point, params, version, config: BackendConfig, tracking_uri,
    experiment_id,
) -> dict[str, Any]:  # fmt: skip
    """What the driver runs: the sweep (as a sweep spec), the store, the cluster, and how
    to create the project's run. Validated whole before anything starts."""
    from mlflow.projects.utils import fetch_and_validate_project, load_project
    from mlflow.tracking import MlflowClient

    from mlflow_ngraph.cluster.spec import parse_sweep
    from mlflow_ngraph.cluster.sweep import sweep_key, sweep_store
    from mlflow_ngraph.commands.cli import spec_of
    from mlflow_ngraph.tracking.mlflow_log import experiment_mismatch

    work_dir = fetch_and_validate_project(project_uri, version, entry_point, params)
    args = entry_command(load_project(work_dir), entry_point, params)
    data = spec_of(args)
    experiment = MlflowClient(tracking_uri).get_experiment(experiment_id).name
    if params.get("experiment") and params["experiment"] != experiment:
        raise experiment_mismatch(params["experiment"], experiment)
    data = {k: v for k, v in data.items() if k not in ("device", "tracking_uri")}
    sweep_data = {**data, "experiment": experiment, "devices": config.devices}
    sweep = parse_sweep(sweep_data, "backend config")
    uri = sweep_store(tracking_uri, config.local, config.address)
    return {
        "sweep": sweep_data,
        "sweep_id": sweep_key(sweep, uri),
        "tracking_uri": uri,
        "local": config.local,
        "address": config.address,
        "wait_s": config.wait_s,
        "project": {
            "uri": project_uri,
            "work_dir": work_dir,
            "version": version,
            "entry_point": entry_point,
            "params": params,
            "experiment_id": str(experiment_id),
        },
    }


def _say(text: str) -> None:
    import click

    click.echo(text)


#: a driver's phase as MLflow's run status
STATUS = {
    "starting": RunStatus.SCHEDULED,
    "running": RunStatus.RUNNING,
    "done": RunStatus.FINISHED,
    "failed": RunStatus.FAILED,
    "refused": RunStatus.FAILED,
    "cancelled": RunStatus.KILLED,
}


class RaySubmittedRun(SubmittedRun):
    """The project's run on the cluster, followed through its driver."""

    def __init__(self, run_id: str, driver: Driver) -> None:
        super().__init__()
        self._run_id = run_id
        self.driver = driver

    @property
    def run_id(self) -> str:
        return self._run_id

    def wait(self) -> bool:
        """Block until every device is done; whether all succeeded."""
        self.driver.wait()
        return self.driver.phase() == "done"

    def get_status(self) -> str:
        """MLflow's run status: SCHEDULED while the cluster starts, RUNNING, then FINISHED,
        FAILED or KILLED (cancelled); FAILED for a driver that died without saying."""
        phase = self.driver.phase()
        if phase in ("starting", "running") and not self.driver.alive():
            return RunStatus.to_string(RunStatus.FAILED)
        return RunStatus.to_string(STATUS.get(phase, RunStatus.FAILED))

    def cancel(self) -> None:
        """Stop every device's work (its runs end KILLED) and wait for it; the same command
        run again resumes it."""
        self.driver.cancel()

    def follow(self) -> bool:
        """Print the driver's output until it ends (Ctrl-C cancels); ``wait()``'s answer."""
        try:
            self.driver.follow(_say)
        except KeyboardInterrupt:
            _say(f"cancelling run {self.run_id}")
            self.cancel()
            raise NgraphError(
                f"run {self.run_id} cancelled: run the same command to resume it"
            ) from None
        return self.wait()
