"""An engine as an MLflow model: a logged model of its cell run, a registered model version
and an alias per device.

The logged model holds data only: the pulled, verified engine files, loaded by the installed
``mlflow_ngraph.deploy.pyfunc_model`` (MLflow's ``loader_module``), with the sha256 of the
engine's manifest in its ``model_config`` and on the registered version
(``manifest_sha256``); its source run is the cell run and the cell's metrics at that batch
size are linked to it, so the experiment's Models view lists engines with their throughput
and latency. The registered model (``<model>-<compiler>`` by
default) gets a version per registration, tagged with what it is and how fast it ran, and the
alias named after the device moves to it when it beats the version the alias points at.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlflow_ngraph import faultpoint
from mlflow_ngraph.deploy.engine import load_engine
from mlflow_ngraph.deploy.mlmodel import T_MLMODEL
from mlflow_ngraph.deploy.pyfunc_model import LOADER_MODULE
from mlflow_ngraph.deploy.registered import T_MANIFEST, registered_mlmodel
from mlflow_ngraph.deploy.select import METRICS, Candidate
from mlflow_ngraph.tracking import schema as S

log = logging.getLogger(__name__)

MODEL_TYPE = "ngraph-engine"
T_METRIC = "ngraph.metric."  # version tags of the metric values


@dataclass
class Registered:
    name: str
    version: str
    model_uri: str  # the logged model (models:/m-...)
    alias: str
    alias_moved: bool
    alias_version: str  # the version the alias points at afterwards
    reused: bool = False  # the same engine from the same run was registered before


def default_name(candidate: Candidate) -> str:
    """``conv_block-depth-3-width-64-openvino``: a registered-model name from the model's
    label and the compiler (letters, digits, ``-``, ``_`` and ``.``)."""
    text = f"{candidate.model}-{candidate.compiler}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def logged_model_name(candidate: Candidate) -> str:
    """``conv_block-w64-d2-openvino-bs8``: a logged model's name, after the model (its short
    name, as the cell run's), the compiler (its flags set away from the defaults) and the
    batch size (letters, digits, ``-`` and ``_``, as MLflow allows)."""
    from mlflow_ngraph.plan.cells import cell_run_name

    rest = candidate.label[len(candidate.model) :]  # " openvino[FLAG=V] bs8"
    text = cell_run_name(candidate.model, "", {}, ()) + rest
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")


def fixed_signature(x: np.ndarray, y: Any):
    """The signature of an engine: its one input shape, batch size included (an engine
    takes no other), and its outputs' shapes."""
    from mlflow.models import ModelSignature, infer_signature
    from mlflow.types.schema import Schema, TensorSpec

    inferred = infer_signature(x, y)
    inputs = Schema([TensorSpec(np.dtype(x.dtype), tuple(x.shape))])
    outputs = inferred.outputs
    if isinstance(y, np.ndarray):
        outputs = Schema([TensorSpec(np.dtype(y.dtype), tuple(y.shape))])
    return ModelSignature(inputs=inputs, outputs=outputs)


#: significant digits of a figure shown in a logged model's params or a version's tags
#: (the exact values are the model's metrics)
DISPLAY_DIGITS = 4


def display_value(value: Any) -> str:
    """A param's text: floats rounded to :data:`DISPLAY_DIGITS` significant digits, whole
    from 1000 up (``66304``, ``124.1``, ``0.1811``)."""
    if isinstance(value, float) and math.isfinite(value):
        if abs(value) >= 1000:
            return f"{value:.0f}"
        return f"{value:.{DISPLAY_DIGITS}g}"
    return str(value)


def _requirements(manifest: dict[str, Any]) -> list[str]:
    """The engine's runtime pinned as it was built (no requirement inference: MLflow would
    load the model in a subprocess to guess them)."""
    import mlflow

    from mlflow_ngraph.compilers.registry import get_compiler

    compiler = get_compiler(manifest["compiler"])
    out = [f"mlflow=={mlflow.__version__}", "numpy"]
    if manifest.get("compiler_version") and compiler.distribution:
        out.append(f"{compiler.distribution}=={manifest['compiler_version']}")
    return out


#: run params a logged model repeats (the model's init params, the runtime's choices at its
#: batch size are added by prefix): what tells engines apart in the experiment's Models list
RUN_PARAMS = ("scenario", "compiler_version", "parameter_count", "family")
#: figures a logged model shows as params, rounded (its metrics hold the exact values)
SHOWN_FIGURES = (S.M_THROUGHPUT, S.M_LATENCY_P50, S.M_SPEEDUP)


def model_params(
    candidate: Candidate, manifest: dict[str, Any], digest: str, run_params: dict[str, str]
) -> dict[str, str]:
    """A logged model's params: what the engine is (device, model, compiler, batch size,
    flags, the runtime's choices at its batch size), its manifest's hash (``digest``) and
    its headline figures, floats rounded for display (the exact figures are the model's
    metrics)."""
    b = candidate.batch_size
    runtime = f"runtime.bs{b}."
    params: dict[str, Any] = {
        "device": candidate.device,
        "model": candidate.model,
        "compiler": candidate.compiler,
        "batch_size": b,
        **{k: v for k, v in run_params.items() if k in RUN_PARAMS or k.startswith("model.")},
        **{f"flag.{k}": v for k, v in sorted(manifest["flags"].items())},
        **{
            f"runtime.{k[len(runtime) :]}": v
            for k, v in run_params.items()
            if k.startswith(runtime)
        },
        "manifest_sha256": digest,
        **{k: candidate.metrics[k] for k in SHOWN_FIGURES if k in candidate.metrics},
    }
    return {k: display_value(_number(v)) for k, v in params.items() if v != ""}


def _number(value: Any) -> Any:
    """A param's text that holds a float, as the float (so it is rounded for display)."""
    if isinstance(value, str) and re.fullmatch(r"-?\d+\.\d+(e-?\d+)?", value):
        return float(value)
    return value


def log_engine_model(
    engine_dir: Path, candidate: Candidate, tracking_uri: str, trust_code: bool | None = True
):
    """Log ``engine_dir`` (verified) as a logged model of the candidate's cell run, with the
    cell's metrics at its batch size linked to it. ``trust_code``: whether an engine that runs
    code may be loaded (to take its signature); the benchmark's own engines are trusted.
    Returns MLflow's ModelInfo.

    The model is created first (``initialize_logged_model``) and filled outside any active
    run: logged inside the cell run, MLflow would copy all of the run's params onto it
    (unrounded, the manifest hash of another batch size among them) and log its config as
    the run's params (a warning once a second batch size is logged)."""
    import mlflow

    from mlflow_ngraph.deploy.pyfunc_model import CONFIG_KEY
    from mlflow_ngraph.deploy.registered import trust_setting
    from mlflow_ngraph.deploy.signed import ALLOW_UNSIGNED_ENV
    from mlflow_ngraph.deploy.trust import MANIFEST, file_sha256
    from mlflow_ngraph.variables import environment

    # verified by the caller: pulled from a signed record, or the benchmark's own engine
    engine = load_engine(engine_dir, trust_code=trust_code, check_signature=False)
    try:
        x = np.random.default_rng(0).standard_normal(engine.input_shape).astype(engine.dtype)
        y = engine.predict(x)
    finally:
        engine.close()
    manifest = engine.manifest
    mlflow.set_tracking_uri(tracking_uri)
    client = mlflow.MlflowClient(tracking_uri)
    run_params = client.get_run(candidate.run_id).data.params
    digest = file_sha256(Path(engine_dir) / MANIFEST)
    model = _initialize_model(candidate, manifest, digest, run_params)
    faultpoint.point("register_model_initialized")
    # data only: the engine folder, loaded by the installed loader module, never code
    engine_dir = Path(engine_dir)
    # MLflow loads the model to check its input example: as trusted as the load above
    with trust_setting(trust_code), environment({ALLOW_UNSIGNED_ENV: "1"}):
        info = mlflow.pyfunc.log_model(
            model_id=model.model_id,
            loader_module=LOADER_MODULE,
            data_path=str(engine_dir),
            model_config={CONFIG_KEY: digest},
            signature=fixed_signature(x, y),
            input_example=x,
            pip_requirements=_requirements(manifest),
        )
    faultpoint.point("register_model_logged")
    _link(client, model.model_id, candidate)
    return info


def _initialize_model(
    candidate: Candidate, manifest: dict[str, Any], digest: str, run_params: dict[str, str]
):
    """The candidate's logged model, created empty (:func:`log_engine_model` fills it): its
    name, params (:func:`model_params`), tags (its writer among them) and source run."""
    import mlflow

    return mlflow.initialize_logged_model(
        name=logged_model_name(candidate),
        source_run_id=candidate.run_id,
        params=model_params(candidate, manifest, digest, run_params),
        model_type=MODEL_TYPE,
        tags={
            "ngraph.compiler": candidate.compiler,
            "ngraph.device": candidate.device,
            T_WRITER: _writer(),
        },
        experiment_id=candidate.experiment_id,
    )


def log_cell_engine(
    record: dict[str, Any],
    *,
    run_id: str,
    experiment_id: str,
    device: str,
    model: str,
    compiler: str,
    batch_size: int,
    tracking_uri: str,
) -> None:
    """A benchmark result's engine as a logged model of its cell run (``--log-models``):
    what the recording layer calls for each result (``tracking.catchup.ModelLogger``). An
    engine that runs in-process only (eager, a torch.compile JIT) has no files: nothing to
    deploy, nothing logged.

    Raises:
        NgraphError: the engine could not be logged (the result stands).
    """
    engine_dir = Path(record["engine_dir"])
    manifest = json.loads((engine_dir / "manifest.json").read_text())
    if not manifest.get("files"):
        return
    metrics = {
        k: float(v)
        for k, v in record["metrics"].items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    candidate = Candidate(
        run_id=run_id,
        experiment_id=experiment_id,
        device=device,
        model=model,
        compiler=compiler,
        flags="",
        batch_size=batch_size,
        metrics=metrics,
    )
    log_engine_model(engine_dir, candidate, tracking_uri)


def _link(client, model_id: str, candidate: Candidate) -> None:
    """The logged model as an output of its cell run, the cell's metrics on it."""
    import mlflow
    from mlflow.entities import LoggedModelOutput

    step = candidate.batch_size
    client.log_outputs(candidate.run_id, models=[LoggedModelOutput(model_id, step=step)])
    metrics = {k: v for k, v in candidate.metrics.items() if not math.isnan(v)}
    mlflow.log_metrics(metrics, model_id=model_id, step=step, run_id=candidate.run_id)


#: a logged model's tag: who is logging it (``host:pid``), so that a later register can
#: tell a model a killed register left half-logged from one being logged now
T_WRITER = "ngraph.writer"
#: seconds after which a half-logged model of another host is taken as left by a kill
STALE_ELSEWHERE_S = 3600.0


def _writer() -> str:
    import os
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def _abandoned(model) -> bool:
    """Whether a logged model that is not READY was left by a register that died: its
    writer was a process of this host that is gone, or (another host's) it is an hour old."""
    import os
    import socket
    import time

    host, _, pid = (model.tags.get(T_WRITER) or "").rpartition(":")
    if host == socket.gethostname() and pid.isdigit():
        return not os.path.exists(f"/proc/{pid}")
    return time.time() - (model.creation_timestamp or 0) / 1000 > STALE_ELSEWHERE_S


def registered_before(client, name: str, digest: str, run_id: str):
    """The version of ``name`` that holds this engine (its manifest's sha256) from this run,
    if one was registered before (the earliest), else None."""
    found = client.search_model_versions(f"tags.{T_MANIFEST} = '{digest}'")
    mine = [
        v
        for v in found
        if v.name == name and v.tags.get("source_run") == run_id and v.status == "READY"
    ]
    return min(mine, key=lambda v: int(v.version)) if mine else None


def logged_before(client, candidate: Candidate, digest: str) -> str | None:
    """The uri of a finished logged model of this engine on its cell run (its metrics linked
    again when a kill cut that short), or None. Half-logged ones a killed register left are
    removed (one being logged now by a live register is left alone)."""
    from mlflow.entities import LoggedModelStatus

    found = client.search_logged_models(
        [candidate.experiment_id],
        filter_string=f"source_run_id = '{candidate.run_id}' AND params.{T_MANIFEST} = '{digest}'",
    )
    ready = None
    for model in found:
        if model.model_type != MODEL_TYPE:
            continue
        if model.status == LoggedModelStatus.READY:
            ready = ready or model
        elif _abandoned(model):
            log.info("removing logged model %s, left half-logged by a killed register",
                     model.model_id)  # fmt: skip
            client.delete_logged_model(model.model_id)
    if ready is None:
        return None
    if not ready.metrics:  # killed after the model was written, before its metrics
        _link(client, ready.model_id, candidate)
    return ready.model_uri


def register(
    client,
    engine_dir: Path,
    candidate: Candidate,
    tracking_uri: str,
    metric: str = S.M_THROUGHPUT,
    name: str | None = None,
    trust_code: bool | None = None,
) -> Registered:
    """Log, register and alias the engine in ``engine_dir`` (pulled and verified)."""
    import mlflow

    from mlflow_ngraph.deploy.trust import MANIFEST, file_sha256

    mlflow.set_tracking_uri(tracking_uri)  # mlflow.register_model's store, and the links'
    name = name or default_name(candidate)
    manifest = json.loads((Path(engine_dir) / MANIFEST).read_text())
    digest = file_sha256(Path(engine_dir) / MANIFEST)
    alias = re.sub(r"[^A-Za-z0-9_-]+", "-", candidate.device).lower()
    before = registered_before(client, name, digest, candidate.run_id)
    if before is not None:  # the same engine of the same run: its version, not another
        moved, holder = _move_alias(client, name, alias, before.version, candidate, metric)
        uri = logged_before(client, candidate, digest) or str(before.source)
        return Registered(name, str(before.version), uri, alias, moved, holder, reused=True)
    model_uri = logged_before(client, candidate, digest)
    if model_uri is None:
        model_uri = log_engine_model(engine_dir, candidate, tracking_uri, trust_code).model_uri
    tags = {
        "device": candidate.device,
        "device_fingerprint": manifest.get("host_cpu", ""),
        "compiler": candidate.compiler,
        "compiler_version": manifest.get("compiler_version", ""),
        "flags": json.dumps(manifest["flags"], sort_keys=True),
        "batch_size": str(candidate.batch_size),
        "model": candidate.model,
        "source_run": candidate.run_id,
        "engine_sha256": ",".join(f["sha256"] for f in manifest["files"]),
        T_MANIFEST: digest,
        T_MLMODEL: registered_mlmodel(client, model_uri, digest, candidate.run_id),
        **{f"{T_METRIC}{k}": repr(v) for k, v in candidate.metrics.items()},
        **(candidate.server.tags() if candidate.server is not None else {}),
    }
    version = mlflow.register_model(model_uri, name, tags=tags)
    faultpoint.point("register_version_created")
    moved, holder = _move_alias(client, name, alias, version.version, candidate, metric)
    return Registered(name, str(version.version), model_uri, alias, moved, holder)


def _move_alias(client, name, alias, version, candidate: Candidate, metric: str):
    """Point ``alias`` at ``version`` unless the version it points at is better by
    ``metric``; returns (moved, the version it points at)."""
    from mlflow.exceptions import MlflowException

    try:
        current = client.get_model_version_by_alias(name, alias)
    except MlflowException:
        current = None
    new_value = candidate.value(metric)
    if current is not None and str(current.version) != str(version):
        try:
            old_value = float(current.tags.get(f"{T_METRIC}{metric}", "nan"))
        except ValueError:
            old_value = math.nan
        higher = METRICS[metric]
        better = (new_value > old_value) if higher else (new_value < old_value)
        if not math.isnan(old_value) and not better:
            log.info(
                "alias %s stays on version %s (%s %.4g, this one %.4g)",
                alias,
                current.version,
                metric,
                old_value,
                new_value,
            )
            return False, str(current.version)
    client.set_registered_model_alias(name, alias, str(version))
    return True, str(version)
