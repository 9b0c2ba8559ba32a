"""A gate's champion and challenger as given on the command line, each resolved to what its
worker loads: a registered model version (``models:/NAME@ALIAS``, ``models:/NAME/VERSION``),
a cell run (``runs:/ID`` with ``--batch-size``), an engine folder from ``pull``, or a model
x compiler spec built here (``MODEL[:k=v,...]@COMPILER[:flag=v,...]``).

Registered and run engines are fetched here, through ``pull``'s and the registry's checks
(manifests, hashes, signatures of producers the user trusts); a folder is checked by
``load_engine`` in its worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow_ngraph.errors import NgraphError

FORMS = (
    "a registered model (models:/NAME@ALIAS or models:/NAME/VERSION), a cell run (runs:/ID "
    "with --batch-size), an engine folder from pull, or MODEL@COMPILER[:flag=value,...]"
)


@dataclass
class Side:
    """One side of the gate."""

    role: str
    text: str
    kind: str = ""  # registered, run, folder, spec
    task: dict[str, Any] = field(default_factory=dict)
    #: the registered version (registered sides): its name, version and the alias given
    name: str | None = None
    version: str | None = None
    alias: str | None = None
    run_id: str | None = None

    @property
    def label(self) -> str:
        return self.task.get("label") or self.text


@dataclass(frozen=True)
class Context:
    """What resolving a side needs: the store, the trust settings, the batch size asked
    for, the home and a work folder for fetched engines."""

    tracking_uri: str
    home: Path
    work: Path
    batch_size: int | None = None
    device: str = "cpu"
    scenario: str = "throughput"
    trusted_keys: str | None = None
    allow_unsigned: bool | None = None
    trust_code: bool | None = None


def parse_kind(text: str) -> str:
    """Which of the forms ``text`` is (without touching the store).

    Raises:
        NgraphError: none of them."""
    if text.startswith("models:/"):
        return "registered"
    if text.startswith("runs:/"):
        return "run"
    if Path(text).is_dir():
        return "folder"
    if "@" in text and "/" not in text.rpartition("@")[2]:
        return "spec"
    raise NgraphError(f"{text!r} is not {FORMS}")


def resolve(role: str, text: str, ctx: Context, client=None) -> Side:
    """The side ``text`` as its worker's task.

    Raises:
        NgraphError: not one of the forms, not in the store, not trusted, or not at the
            batch size asked for."""
    side = Side(role, text, parse_kind(text))
    if side.kind == "spec":
        side.task = _spec_task(text, ctx)
        return side
    if side.kind == "registered":
        folder = _registered(side, ctx, client)
    elif side.kind == "run":
        folder = _run_engine(side, ctx, client)
    else:
        folder = Path(text).resolve()
    side.task = _folder_task(side, folder, ctx)
    return side


def _base(ctx: Context) -> dict[str, Any]:
    from mlflow_ngraph.devices import get_profile

    return {
        "home": str(ctx.home),
        "device": ctx.device,
        "device_kind": get_profile(ctx.device).kind,
        "scenario": ctx.scenario,
        "warmup": 10,
        "trusted_keys": ctx.trusted_keys,
        "allow_unsigned": ctx.allow_unsigned,
        "trust_code": ctx.trust_code,
    }


def _spec_task(text: str, ctx: Context) -> dict[str, Any]:
    from mlflow_ngraph.compilers.registry import get_compiler
    from mlflow_ngraph.models.registry import registered_models
    from mlflow_ngraph.plan.config import split_name_args

    model_text, _, compiler_text = text.rpartition("@")
    model, params = split_name_args(model_text, "model")
    compiler, flags = split_name_args(compiler_text, "compiler")
    if model not in registered_models() and not Path(model).is_file() and "." not in model:
        raise NgraphError(f"{text!r}: no model {model!r} (mlflow-ngraph models lists them)")
    get_compiler(compiler).resolve_flags(flags)  # an unknown flag is said here, in one line
    b = ctx.batch_size or 1
    return {
        **_base(ctx),
        "kind": "spec",
        "label": text,
        "model": model,
        "model_params": params,
        "compiler": compiler,
        "flags": flags,
        "batch_size": b,
    }


def _folder_task(side: Side, folder: Path, ctx: Context) -> dict[str, Any]:
    from mlflow_ngraph.deploy.engine import read_manifest

    manifest = read_manifest(folder)
    b = int(manifest["batch_size"])
    if ctx.batch_size is not None and ctx.batch_size != b:
        raise NgraphError(
            f"the {side.role} {side.text} takes batch size {b} only, not {ctx.batch_size}: "
            f"give --batch-size {b}, or an engine built for {ctx.batch_size}"
        )
    return {
        **_base(ctx),
        "kind": "folder",
        "label": f"{side.text} ({manifest['compiler']}, bs{b})",
        "folder": str(folder),
        "model": str(manifest.get("model", "")),
        "compiler": manifest["compiler"],
        "flags": manifest.get("flags") or {},
        "batch_size": b,
        # a registered or run engine was verified as it was fetched
        "check_signature": side.kind == "folder",
    }


def _registered(side: Side, ctx: Context, client) -> Path:
    from mlflow_ngraph.deploy.registered import fetch_registered

    local, version = fetch_registered(
        client, side.text, ctx.work / side.role, ctx.trusted_keys, ctx.allow_unsigned
    )
    side.name, side.version = version.name, str(version.version)
    side.alias = side.text.partition("@")[2] or None
    side.run_id = getattr(version, "run_id", None)
    return next(local.rglob("manifest.json")).parent


def _run_engine(side: Side, ctx: Context, client) -> Path:
    """The engine a cell run logged at ``--batch-size``, pulled as ``pull --run`` would."""
    from mlflow.exceptions import MlflowException

    from mlflow_ngraph.deploy.pull import pull
    from mlflow_ngraph.deploy.select import candidates
    from mlflow_ngraph.deploy.signed import Trust, verify_candidates
    from mlflow_ngraph.redaction import first_line
    from mlflow_ngraph.tracking import schema as S

    run_id = side.text.removeprefix("runs:/").strip("/")
    if ctx.batch_size is None:
        raise NgraphError(f"the {side.role} {side.text} is a cell run: give --batch-size")
    try:
        run = client.get_run(run_id)
        experiment = client.get_experiment(run.info.experiment_id).name
    except MlflowException as exc:
        raise NgraphError(f"{side.text} is not a run here: {first_line(exc, 200)}") from None
    params = run.data.params
    if S.P_MODEL not in params or S.P_DEVICE not in params:
        raise NgraphError(f"{side.text} is not a benchmark's cell run (no model or device)")
    found = candidates(client, ctx.tracking_uri, experiment, params[S.P_DEVICE],
                       params[S.P_MODEL], None, ctx.batch_size, run_id)  # fmt: skip
    verify_candidates(client, found, Trust.of(ctx.trusted_keys, ctx.allow_unsigned), lambda _: 0)
    chosen = found[0]
    if chosen.trust_problem:
        raise NgraphError(f"{side.text} is not trusted: {chosen.trust_problem}")
    side.run_id = run_id
    return pull(client, chosen, ctx.work / side.role, run=run)
