"""Fetch a cell's engine, verified, into a directory.

The ``engines/bs<b>/manifest.json`` artifact is downloaded first into a temporary directory
beside the target and checked against the sha256 the cell run recorded when it logged the
engine (or one pinned with ``--sha256``), against the run's compiler and flags, and for
confinement (:mod:`mlflow_ngraph.deploy.trust`); only the files it lists are downloaded,
each checked for size and sha256, and only then is the directory moved into place (a
rename): a tampered, truncated or missing file is refused and nothing that looks usable is
left behind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from mlflow_ngraph.deploy.engine import read_manifest, verify_files
from mlflow_ngraph.deploy.select import Candidate
from mlflow_ngraph.errors import NgraphError

log = logging.getLogger(__name__)

SOURCE_FILE = "source.json"


def check_target(directory: Path, force: bool) -> None:
    """Refuse a non-empty target unless ``force`` (before anything is downloaded)."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise NgraphError(f"{directory} exists and is not a directory")
    if directory.is_dir() and any(directory.iterdir()) and not force:
        raise NgraphError(f"{directory} is not empty: choose another -o or pass --force")


def download_verified(
    client, candidate: Candidate, parent: Path, sha256: str | None = None, run=None
) -> Path:
    """The candidate's engine in a fresh temporary directory under ``parent``, verified.

    The manifest is fetched first and checked against the sha256 its cell run recorded when
    it logged the engine (a write-once param) or ``sha256`` pinned by hand, then against the
    run's compiler and flags, confined (:func:`~mlflow_ngraph.deploy.trust.check_manifest`);
    only the files it lists are downloaded, each checked for size and sha256.

    Raises:
        NgraphError: no engine logged, no engine files (an in-process engine), a manifest
            not the one logged or pinned, not its run's, not confined, a file missing,
            truncated or altered.
    """
    from mlflow.exceptions import MlflowException

    from mlflow_ngraph.deploy import trust

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    run = run if run is not None else client.get_run(candidate.run_id)
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".pull-", dir=parent))
    artifact = f"engines/bs{candidate.batch_size}"
    where = f"{candidate.label} (run {candidate.run_id})"
    try:
        try:
            name = f"{artifact}/{trust.MANIFEST}"
            fetched = Path(client.download_artifacts(candidate.run_id, name, str(tmp)))
        except MlflowException:
            fetched = None
        if fetched is None or not fetched.is_file():
            raise NgraphError(
                f"{where} has no engine logged (benchmarked with --no-engine-artifacts?): "
                "benchmark it again with engines, or choose another with --compiler / --run"
            )
        local = tmp / "engine"
        local.mkdir()
        os.replace(fetched, local / trust.MANIFEST)
        digest = trust.file_sha256(local / trust.MANIFEST)
        recorded = run.data.params.get(trust.engine_param(candidate.batch_size))
        if sha256:
            trust.check_pin(digest, sha256, "the sha256 pinned with --sha256")
        if recorded:
            param = trust.engine_param(candidate.batch_size)
            trust.check_pin(digest, recorded, f"the one its run recorded ({param})")
        elif not sha256:
            raise NgraphError(
                f"{where} records no sha256 of its engine's manifest (logged before this "
                "check existed): check the engine with whoever logged it and pin its manifest "
                "with --sha256"
            )
        manifest = read_manifest(local)
        if not manifest["files"]:
            raise NgraphError(
                f"{candidate.label}: the {candidate.compiler} engine runs in-process only "
                "(nothing serialized): nothing to deploy"
            )
        trust.check_manifest(manifest)
        trust.check_against_run(manifest, run.data.params, where)
        if int(manifest["batch_size"]) != candidate.batch_size:
            raise NgraphError(
                f"{where}: the manifest is for batch size {manifest['batch_size']}, not "
                f"{candidate.batch_size}: refusing it"
            )
        for entry in manifest["files"]:  # only what the manifest lists, confined
            rel = Path(entry["path"])
            (local / rel.parent).mkdir(parents=True, exist_ok=True)
            got = Path(
                client.download_artifacts(
                    candidate.run_id, f"{artifact}/{entry['path']}", str(local / rel.parent)
                )
            )
            if got != local / rel:
                os.replace(got, local / rel)
        verify_files(local, manifest)
        source = {
            "run_id": candidate.run_id,
            "experiment_id": candidate.experiment_id,
            "device": candidate.device,
            "model": candidate.model,
            "compiler": candidate.compiler,
            "flags": candidate.flags,
            "batch_size": candidate.batch_size,
            "metrics": candidate.metrics,
            "created_by": creator(run),
            "manifest_sha256": digest,
        }
        (local / SOURCE_FILE).write_text(json.dumps(source, indent=2, sort_keys=True))
        return local
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def creator(run) -> str:
    """Who created a run, as its client said (``mlflow.user``; a claim, not a proof)."""
    user = run.data.tags.get("mlflow.user") or run.info.user_id
    return user if user and user != "unknown" else "an unknown user"


def pull(
    client,
    candidate: Candidate,
    directory: Path,
    force: bool = False,
    sha256: str | None = None,
    run=None,
) -> Path:
    """Download, verify and move the candidate's engine into ``directory``."""
    directory = Path(directory).resolve()
    check_target(directory, force)
    local = download_verified(client, candidate, directory.parent, sha256, run)
    holder = local.parent
    try:
        if directory.exists():
            old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
            os.replace(directory, old)
            os.replace(local, directory)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(local, directory)
    finally:
        shutil.rmtree(holder, ignore_errors=True)
    return directory
