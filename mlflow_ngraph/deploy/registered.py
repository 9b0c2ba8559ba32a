"""A registered engine, checked against its registered version before MLflow loads it.

The registered version records the sha256 of the engine's manifest (tag
``manifest_sha256``, set by ``mlflow-ngraph register``). The logged model's files live with
the experiment's artifacts, which every writer of the experiment can change, so before
anything is loaded:

- its ``MLmodel`` must hold exactly the keys ``register`` writes, each with the value it
  writes or the registry records (:mod:`mlflow_ngraph.deploy.mlmodel`): the installed
  loader module (``mlflow_ngraph.deploy.pyfunc_model``), no code folder, no Python model,
  no ``predict_fn``, the same manifest hash as the version, and (versions registered since
  it is recorded) the same ``MLmodel`` as registered (tag ``mlmodel_sha256``);
- its engine's manifest must have that hash, be confined, and every file it lists match;
- only those files are downloaded.

:func:`load_registered` then loads the checked local copy with MLflow, and
``mlflow-ngraph serve`` serves it with MLflow's scoring server (``deploy/serving.py``).
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mlflow_ngraph.deploy.mlmodel import (
    T_MLMODEL,
    Recorded,
    check_mlmodel,
    check_signature,
    mlmodel_digest,
)
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.redaction import first_line

T_MANIFEST = "manifest_sha256"  # version tag: the sha256 of the engine's manifest

_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))/?$")


def registered_name(model_uri: str) -> str:
    """The registered model a ``models:/`` URI names (the URI itself where it names none)."""
    match = _URI.match(model_uri)
    return match["name"] if match else model_uri


def resolve_version(client, model_uri: str):
    """The registered version a ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` names."""
    from mlflow.exceptions import MlflowException

    match = _URI.match(model_uri)
    if not match:
        raise NgraphError(
            f"{model_uri!r} is not a registered model URI: use models:/NAME@ALIAS or "
            "models:/NAME/VERSION (a registered version holds the engine's hash)"
        )
    try:
        if match["alias"]:
            return client.get_model_version_by_alias(match["name"], match["alias"])
        return client.get_model_version(match["name"], match["version"])
    except MlflowException as exc:
        from mlflow_ngraph.tracking.mlflow_log import refused

        if refused(exc):
            raise  # a refused login or permission: the caller's store_errors names it
        first = first_line(exc, 200)
        raise NgraphError(f"{model_uri} is not a registered version here: {first}") from None


def _download(client, uri: str, directory: Path) -> Path:
    import mlflow

    # one bar per file of the model would flood the terminal (pull sets the same)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    directory.mkdir(parents=True, exist_ok=True)
    return Path(
        mlflow.artifacts.download_artifacts(
            artifact_uri=uri, dst_path=str(directory), tracking_uri=client.tracking_uri
        )
    )


def registered_mlmodel(client, model_uri: str, manifest_sha256: str, run_id: str) -> str:
    """The :data:`T_MLMODEL` a new version of the logged model ``model_uri`` records: the
    hash of its ``MLmodel``, after checking it as :func:`fetch_registered` will.

    Raises:
        NgraphError: an ``MLmodel`` that is not the one ``register`` writes."""
    import tempfile

    import yaml

    model_id = model_uri.removeprefix("models:/").strip("/")
    location = client.get_logged_model(model_id).artifact_location.rstrip("/")
    with tempfile.TemporaryDirectory(prefix="ngraph-mlmodel-") as tmp:
        conf = yaml.safe_load(_download(client, f"{location}/MLmodel", Path(tmp)).read_text())
    record = Recorded(manifest_sha256, model_id, location, run_id)
    check_mlmodel(conf, record, f"the logged model {model_id}")
    return mlmodel_digest(conf)


def _recorded(client, version, expected: str, label: str) -> Recorded:
    """What the registry holds of ``version``'s logged model (its id, location, source run
    and the hashes the version pins).

    Raises:
        NgraphError: the version names no logged model."""
    model_id = getattr(version, "model_id", None)
    if not model_id and str(version.source).startswith("models:/m-"):
        model_id = str(version.source).removeprefix("models:/").strip("/")
    if not model_id:
        raise NgraphError(f"{label} has no logged model: register the engine again")
    location = client.get_logged_model(model_id).artifact_location.rstrip("/")
    run_id = getattr(version, "run_id", None) or None
    return Recorded(expected, model_id, location, run_id, (version.tags or {}).get(T_MLMODEL))


def fetch_registered(
    client,
    model_uri: str,
    directory: Path,
    trusted_keys: str | None = None,
    allow_unsigned: bool | None = None,
) -> tuple[Path, Any]:
    """The registered engine model of ``model_uri`` in ``directory``, checked (see the
    module's docstring) and signed by a trusted producer (its signed record travels in the
    model's data, as ``pull`` wrote it); returns (local model folder, the model version).

    Raises:
        NgraphError: not a registered version, no hash recorded, or any change found.
    """
    import yaml

    from mlflow_ngraph.deploy import trust
    from mlflow_ngraph.deploy.engine import check_provenance, read_manifest, verify_files

    version = resolve_version(client, model_uri)
    label = f"{version.name} version {version.version}"
    expected = (version.tags or {}).get(T_MANIFEST)
    if not expected:
        raise NgraphError(
            f"{label} records no {T_MANIFEST} (registered before engines were pinned): "
            "register the engine again with mlflow-ngraph register"
        )
    record = _recorded(client, version, expected, label)
    location = record.artifact_location
    local = Path(directory) / "model"
    conf = yaml.safe_load(_download(client, f"{location}/MLmodel", local).read_text())
    data = check_mlmodel(conf, record, label)
    engine = local / data
    got = _download(client, f"{location}/{data}/{trust.MANIFEST}", engine)
    trust.check_pin(trust.file_sha256(got), expected, f"{label}'s manifest_sha256")
    manifest = read_manifest(engine)
    trust.check_manifest(manifest)
    check_signature(conf, manifest, label)
    for entry in manifest["files"]:
        rel = Path(entry["path"])
        _download(client, f"{location}/{data}/{entry['path']}", engine / rel.parent)
    verify_files(engine, manifest)
    _fetch_provenance(client, f"{location}/{data}", engine)
    check_provenance(engine, manifest, trusted_keys, allow_unsigned)
    return local, version


def _fetch_provenance(client, location: str, engine: Path) -> None:
    """The signed record and signature the model's data holds, if any (a model without
    them is refused, or allowed unsigned, by ``check_provenance``)."""
    from mlflow.exceptions import MlflowException

    from mlflow_ngraph.tracking.provenance import LOCAL_RECORD, LOCAL_SIGNATURE

    for name in (LOCAL_RECORD, LOCAL_SIGNATURE):
        try:
            _download(client, f"{location}/{name}", engine)
        except (MlflowException, OSError):
            continue


@contextmanager
def trust_setting(trust_code: bool | None):
    """Inside the block, MLflow's loads of an engine trust code as ``trust_code`` says
    (``None``: as the environment says)."""
    from mlflow_ngraph.deploy.trust import TRUST_ENV

    before = os.environ.get(TRUST_ENV)
    if trust_code is not None:
        os.environ[TRUST_ENV] = "1" if trust_code else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TRUST_ENV, None)
        else:
            os.environ[TRUST_ENV] = before


def load_registered(
    model_uri: str, trust_code: bool | None = None, tracking_uri: str | None = None
):
    """``mlflow.pyfunc.load_model`` of a registered engine, after checking it against its
    registered version (:func:`fetch_registered`): what runs is the installed loader.

    Raises:
        NgraphError: see :func:`fetch_registered` and ``load_engine``.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    from mlflow_ngraph.scratch import work_folder
    from mlflow_ngraph.tracking.mlflow_log import resolve_tracking_uri

    client = MlflowClient(resolve_tracking_uri(tracking_uri))
    with work_folder(None, "ngraph-registered-") as tmp:
        local, _ = fetch_registered(client, model_uri, tmp)
        with trust_setting(trust_code):
            return mlflow.pyfunc.load_model(str(local))
