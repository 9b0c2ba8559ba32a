"""A gate in MLflow: one run (role ``gate``) with both sides as params, the verdict, the
ratio and its interval as metrics, links to both sides as tags and the result as
``gate.json``; the verdict tagged on a registered challenger's version; ``--promote``."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.gate.sides import Side
from mlflow_ngraph.gate.verdict import FASTER, SAME, VERDICT_VALUE
from mlflow_ngraph.tracking import schema as S

ROLE = "gate"
T_VERDICT = "ngraph.gate.verdict"
T_RUN = "ngraph.gate.run"
T_RATIO = "ngraph.gate.ratio"
#: the experiment a gate logs to unless told
EXPERIMENT = "ngraph-gate"


def _side_params(side: Side, info: dict[str, Any]) -> dict[str, str]:
    task = side.task
    versions = info.get("versions") or {}
    out = {
        side.role: side.text,
        f"{side.role}.kind": side.kind,
        f"{side.role}.model": task.get("model", ""),
        f"{side.role}.compiler": task.get("compiler", ""),
        f"{side.role}.flags": json.dumps(task.get("flags") or {}, sort_keys=True, default=str),
        f"{side.role}.batch_size": str(task.get("batch_size")),
        f"{side.role}.python": versions.get("python", ""),
        f"{side.role}.runtime": versions.get("runtime", ""),
        f"{side.role}.executable": versions.get("executable", ""),
    }
    return {k: str(v)[:500] for k, v in out.items()}


def _link(side: Side) -> str:
    if side.kind == "registered":
        return f"models:/{side.name}/{side.version}"
    if side.run_id:
        return f"runs:/{side.run_id}"
    return side.text


def metrics_of(result: dict[str, Any]) -> dict[str, float]:
    """The gate's numbers, under one prefix (NaN where a figure was not measured)."""

    def number(value) -> float:
        return float(value) if isinstance(value, (int, float)) else math.nan

    outputs = result.get("outputs") or {}
    return {
        "gate.verdict": VERDICT_VALUE.get(result["verdict"], -1.0),
        "gate.ratio": number(result.get("ratio")),
        "gate.ratio_low": number(result.get("low")),
        "gate.ratio_high": number(result.get("high")),
        "gate.ratio_sitting_low": number(result.get("sitting_low")),
        "gate.ratio_sitting_high": number(result.get("sitting_high")),
        "gate.rounds": number(result.get("rounds")),
        "gate.seconds": number(result.get("seconds")),
        "gate.champion_throughput": number(result["champion"].get("throughput")),
        "gate.challenger_throughput": number(result["challenger"].get("throughput")),
        "gate.outputs_valid": float(bool(outputs.get("valid"))),
        "gate.max_abs_error": number(outputs.get("max_abs_error")),
        "gate.cosine": number(outputs.get("cosine")),
    }


RECORD = "gate.json"
SIGNATURE = "gate.sig"
T_SIGNED_BY = "ngraph.gate.signed_by"


def log_signed(client, run_id: str, result: dict, home) -> str | None:
    """The result as the run's :data:`RECORD`, naming its run (a record copied onto another
    run is refused) and signed with this home's key as the benchmark signs its results
    (:class:`~mlflow_ngraph.tracking.provenance.Producer`; :data:`SIGNATURE`, a
    model-signing bundle; ``verify_files(record, signature, trusted, None, None)`` checks
    it); returns the signer's fingerprint, None where no key could be had (unsigned)."""
    import tempfile
    from pathlib import Path

    from mlflow_ngraph.tracking.provenance import producer

    signer = producer(home)
    record = {**result, "run_id": run_id, "batch_size": result["champion"].get("batch_size")}
    if signer is not None:
        record["signer"] = {"name": signer.public.name, "fingerprint": signer.public.fingerprint}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / RECORD
        path.write_text(json.dumps(record, indent=2, sort_keys=True, default=str))
        if signer is not None:
            signer.sign_file(path, Path(tmp) / SIGNATURE)
        client.log_artifacts(run_id, tmp)
    return signer.public.fingerprint if signer is not None else None


def log_gate(
    client, experiment: str, sides: dict[str, Side], infos: dict, result: dict, home=None
) -> str:
    """The gate's run, its record signed where ``home`` has a key; returns its id."""
    from mlflow.entities import Metric, Param, RunTag

    from mlflow_ngraph.tracking.mlflow_log import ensure_experiment

    experiment_id = ensure_experiment(client, experiment)
    run = client.create_run(experiment_id, run_name=f"gate {result['verdict']}")
    params = {"tolerance": str(result["tolerance"]), "budget_s": str(result["budget_s"])}
    for role, side in sides.items():
        params.update(_side_params(side, infos.get(role) or {}))
    tags = {
        S.T_ROLE: ROLE,
        T_VERDICT: result["verdict"],
        "ngraph.gate.champion": _link(sides["champion"]),
        "ngraph.gate.challenger": _link(sides["challenger"]),
        "ngraph.gate.interval": str(result.get("interval_kind")),
    }
    if result.get("planted_delay"):
        tags["ngraph.gate.planted_delay"] = str(result["planted_delay"])
    now = int(time.time() * 1000)
    client.log_batch(
        run.info.run_id,
        metrics=[Metric(k, v, now, 0) for k, v in metrics_of(result).items()],
        params=[Param(k, v) for k, v in params.items()],
        tags=[RunTag(k, v) for k, v in tags.items()],
    )
    if home is None:
        client.log_text(run.info.run_id, json.dumps(result, indent=2, default=str), RECORD)
    else:
        signed_by = log_signed(client, run.info.run_id, result, home)
        client.set_tag(run.info.run_id, T_SIGNED_BY, signed_by or "unsigned")
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def tag_version(client, side: Side, result: dict, run_id: str) -> None:
    """The verdict on a registered challenger's version."""
    if side.kind != "registered":
        return
    for key, value in (
        (T_VERDICT, result["verdict"]),
        (T_RUN, run_id),
        (T_RATIO, f"{result['ratio']:.4f}" if result.get("ratio") else "n/a"),
    ):
        client.set_model_version_tag(side.name, side.version, key, value)


def check_promotable(champion: Side, challenger: Side) -> None:
    """``--promote`` needs the champion named by an alias and the challenger a version of
    the same registered model (said before anything is measured).

    Raises:
        NgraphError: otherwise."""
    if champion.kind != "registered" or not champion.alias:
        raise NgraphError(
            "--promote moves the champion's alias: give the champion as models:/NAME@ALIAS"
        )
    if challenger.kind != "registered" or challenger.name != champion.name:
        raise NgraphError(
            f"--promote moves {champion.name}@{champion.alias} to the challenger: give the "
            f"challenger as a version of {champion.name} (models:/{champion.name}/VERSION)"
        )


def promote(client, champion: Side, challenger: Side, verdict: str) -> str:
    """Move the champion's alias to the challenger's version on ``faster`` or ``same``;
    returns the line that says what happened."""
    alias, name = champion.alias, champion.name
    if verdict not in (FASTER, SAME):
        stays = f"{name}@{alias} stays on version {champion.version}"
        return f"not promoted: the verdict is {verdict}; {stays}"
    if challenger.version == champion.version:
        return f"not promoted: {name}@{alias} is already version {challenger.version}"
    client.set_registered_model_alias(name, alias, challenger.version)
    return (
        f"promoted: {name}@{alias} moved to version {challenger.version} "
        f"(it left version {champion.version})"
    )
