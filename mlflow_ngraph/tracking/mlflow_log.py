"""Everything that talks to MLflow while benchmarking: runs, params, metrics, artifacts.

One parent run per benchmark invocation on a device; one nested child run per device x model
x compiler x flags. Child runs are found again by their cell key, so re-running a spec reuses
them instead of creating duplicates. All metrics of a batch size go in one ``log_batch``.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.tracking import schema as S

log = logging.getLogger(__name__)

#: (key, value, step)
MetricValue = tuple[str, float, int]

#: MLflow truncates param values at 6000 characters; longer ones go to a JSON artifact.
MAX_PARAM_CHARS = 6000


def redact(uri: str) -> str:
    """``http://alice:secret@host:5000`` -> ``http://alice:***@host:5000``: the tracking URI
    as it may be printed (a password in a URI must never reach a terminal or a log)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    if parts.password is None:
        return uri
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def resolve_tracking_uri(given: str | None) -> str:
    """The URI given, else ``MLFLOW_TRACKING_URI``, else MLflow's own default."""
    if given:
        return given
    import mlflow

    return os.environ.get("MLFLOW_TRACKING_URI") or mlflow.get_tracking_uri()


def connect(tracking_uri: str):
    """An ``MlflowClient`` for ``tracking_uri``, after checking the store answers.

    Raises:
        NgraphError: the server is unreachable or the store cannot be opened.
    """
    from mlflow.tracking import MlflowClient

    if tracking_uri.startswith(("http://", "https://")):
        _check_http(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        client.search_experiments(max_results=1)
    except Exception as exc:  # MLflow raises many types for a bad store
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise NgraphError(
            f"tracking store {redact(tracking_uri)!r} cannot be opened: {reason} "
            "(check --tracking-uri / MLFLOW_TRACKING_URI)"
        ) from None
    return client


def _check_http(uri: str) -> None:
    import requests

    try:
        requests.get(uri.rstrip("/") + "/health", timeout=5)
    except requests.RequestException as exc:
        raise NgraphError(
            f"tracking server {redact(uri)} is unreachable ({type(exc).__name__}); start it or "
            "point --tracking-uri / MLFLOW_TRACKING_URI at a running server"
        ) from None


def is_store_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from the tracking store (server down, database gone)."""
    import requests
    from mlflow.exceptions import MlflowException

    return isinstance(exc, (MlflowException, requests.RequestException, ConnectionError))


#: MLflow 3's UI opens an experiment on its GenAI overview unless this experiment tag says
#: the experiment is for model development; then it opens on the runs table.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def ensure_experiment(client, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        experiment_id = client.create_experiment(
            name, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
        )
        return experiment_id
    if experiment.lifecycle_stage == "deleted":
        client.restore_experiment(experiment.experiment_id)
    _mark_runs_view(client, experiment)
    return experiment.experiment_id


def _mark_runs_view(client, experiment) -> None:
    """Open an experiment that has no kind yet on the runs table in MLflow's UI."""
    if EXPERIMENT_KIND_TAG not in (experiment.tags or {}):
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)


def run_experiment(client, name: str, explicit: bool = False) -> tuple[str, str]:
    """The experiment to log into, as (id, name): the one of the ``mlflow run`` run when
    inside one (the project run becomes the parent), else ``name``.

    Raises:
        NgraphError: inside ``mlflow run``, ``name`` was given explicitly (``-P
            experiment=``) and is not the project run's experiment.
    """
    active = os.environ.get("MLFLOW_RUN_ID")
    if not active:
        return ensure_experiment(client, name), name
    experiment = client.get_experiment(client.get_run(active).info.experiment_id)
    if explicit and experiment.name != name:
        raise NgraphError(
            f"experiment {name!r} (-P experiment / --experiment) is not the experiment of this "
            f"mlflow run ({experiment.name!r}): choose it with "
            f"'mlflow run . --experiment-name {name} ...' and leave -P experiment out"
        )
    _mark_runs_view(client, experiment)
    return experiment.experiment_id, experiment.name


def _find_run(client, experiment_id: str, tags: dict[str, str]) -> str | None:
    clauses = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    runs = client.search_runs(
        [experiment_id],
        filter_string=clauses,
        max_results=1,
        order_by=["attributes.start_time ASC"],
    )
    return runs[0].info.run_id if runs else None


def parent_run(client, experiment_id: str, spec, profile, environment: dict, tags: dict) -> str:
    """The benchmark's parent run: the ``mlflow run`` run when inside one, else the run of
    an earlier invocation of the same spec on this device, else a new one."""
    role_tags = {S.T_ROLE: "benchmark", S.T_SPEC_HASH: spec.spec_hash, S.T_DEVICE: profile.name}
    run_id = os.environ.get("MLFLOW_RUN_ID") or _find_run(client, experiment_id, role_tags)
    if run_id is None:
        run = client.create_run(
            experiment_id, tags=role_tags, run_name=f"{profile.name}-{spec.spec_hash[:8]}"
        )
        run_id = run.info.run_id
    else:
        client.update_run(run_id, status="RUNNING")
    params = {
        "device": profile.name,
        "device_kind": profile.kind,
        "spec_hash": spec.spec_hash,
        "scenario": spec.measure.scenario,
        "batch_sizes": ",".join(str(b) for b in spec.batch_sizes),
        "models": ",".join(m.label for m in spec.models),
        "compilers": ",".join(c.name for c in spec.compilers),
    }
    log_params_once(client, run_id, params)
    all_tags = {**role_tags, **tags, **{f"env.{k}": str(v)[:5000] for k, v in environment.items()}}
    log_batch(client, run_id, tags=all_tags)
    _log_json(client, run_id, "spec.json", spec.to_dict())
    _log_json(client, run_id, "environment.json", environment)
    return run_id


def cell_run(
    client, experiment_id: str, parent_id: str, cell_key: str, name: str, known: str | None
) -> str:
    """The child run of a cell: the one the journal knows, else one tagged with the cell
    key (a run started by a killed invocation), else a new nested run."""
    if known:
        try:
            run = client.get_run(known)
            if run.info.lifecycle_stage == "active":
                client.update_run(known, status="RUNNING")
                return known
        except Exception:  # deleted or from another store: look it up by tag instead
            log.info("journal run %s not found; searching by cell key", known)
    run_id = _find_run(client, experiment_id, {S.T_CELL_KEY: cell_key})
    if run_id:
        client.update_run(run_id, status="RUNNING")
        return run_id
    tags = {S.T_PARENT: parent_id, S.T_CELL_KEY: cell_key, S.T_ROLE: "cell"}
    return client.create_run(experiment_id, tags=tags, run_name=name).info.run_id


def run_is_active(client, run_id: str) -> bool:
    """Whether ``run_id`` exists in the store and is not deleted."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id).info.lifecycle_stage == "active"
    except MlflowException:
        return False


def log_params_once(client, run_id: str, params: dict[str, Any]) -> None:
    """Log params that the run does not have yet (MLflow rejects changing a param)."""
    existing = client.get_run(run_id).data.params
    fresh = {k: _param_value(v) for k, v in params.items() if k not in existing}
    log_batch(client, run_id, params=fresh)


def _param_value(value: Any) -> str:
    text = "default" if value is None else str(value)
    return text[:MAX_PARAM_CHARS]


def log_batch(
    client,
    run_id: str,
    metrics: list[MetricValue] | None = None,
    params: dict[str, str] | None = None,
    tags: dict[str, str] | None = None,
) -> None:
    """One batched call for metrics (``(key, value, step)``), params and tags; the client
    splits it at the REST limits (1000 metrics, 100 params/tags)."""
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    client.log_batch(
        run_id,
        metrics=[Metric(k, float(v), now, int(step)) for k, v, step in metrics or []],
        params=[Param(k, str(v)) for k, v in (params or {}).items()],
        tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()],
    )


def batch_metrics(values: dict[str, float | None], batch_size: int) -> list[MetricValue]:
    """Each value stepped at the batch size, and flat under ``<name>.bs<batch>`` when it is
    one of ``schema.FLAT_METRICS``; missing values (``None``, NaN) are left out, never logged
    as a number."""
    out: list[MetricValue] = []
    for name, value in values.items():
        if value is None or value != value:
            continue
        out.append((name, value, batch_size))
        if name in S.FLAT_METRICS:
            out.append((S.flat_key(name, batch_size), value, batch_size))
    return out


def log_engine(client, run_id: str, directory: Path, batch_size: int) -> None:
    client.log_artifacts(run_id, str(directory), artifact_path=f"engines/bs{batch_size}")


def _log_json(client, run_id: str, name: str, data: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
        client.log_artifact(run_id, str(path))


def log_json(client, run_id: str, name: str, data: Any) -> None:
    _log_json(client, run_id, name, data)


#: MLflow prints a link to every run terminated on a tracking server (and reads the run back
#: to build it); the runner announces only the parent, not one line per cell
_QUIET = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"


def finish(client, run_id: str, status: str = "FINISHED", announce: bool = False) -> None:
    """Terminate a run; with ``announce``, MLflow prints its link (on a tracking server)."""
    if announce or os.environ.get(_QUIET):
        client.set_terminated(run_id, status=status)
        return
    os.environ[_QUIET] = "true"
    try:
        client.set_terminated(run_id, status=status)
    finally:
        del os.environ[_QUIET]
