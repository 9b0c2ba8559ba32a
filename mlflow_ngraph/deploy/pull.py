"""Fetch a cell's engine, verified, into a directory.

The ``engines/bs<b>`` artifact is downloaded into a temporary directory beside the target,
every file is checked against the manifest (size and sha256), and only then is the directory
moved into place (a rename): a tampered, truncated or missing file is refused and nothing
that looks usable is left behind.
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


def download_verified(client, candidate: Candidate, parent: Path) -> Path:
    """The candidate's engine in a fresh temporary directory under ``parent``, verified.

    Raises:
        NgraphError: no engine logged, no engine files (an in-process engine), a manifest
            that does not parse, a file missing, truncated or altered.
    """
    from mlflow.exceptions import MlflowException

    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".pull-", dir=parent))
    artifact = f"engines/bs{candidate.batch_size}"
    try:
        try:
            listed = client.list_artifacts(candidate.run_id, artifact)
        except MlflowException:
            listed = []
        if not listed:
            raise NgraphError(
                f"{candidate.label} (run {candidate.run_id}) has no engine logged (benchmarked "
                "with --no-engine-artifacts?): benchmark it again with engines, or choose "
                "another with --compiler / --run"
            )
        local = Path(client.download_artifacts(candidate.run_id, artifact, str(tmp)))
        manifest = read_manifest(local)
        if not manifest["files"]:
            raise NgraphError(
                f"{candidate.label}: the {candidate.compiler} engine runs in-process only "
                "(nothing serialized): nothing to deploy"
            )
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
        }
        (local / SOURCE_FILE).write_text(json.dumps(source, indent=2, sort_keys=True))
        return local
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def pull(client, candidate: Candidate, directory: Path, force: bool = False) -> Path:
    """Download, verify and move the candidate's engine into ``directory``."""
    directory = Path(directory).resolve()
    check_target(directory, force)
    local = download_verified(client, candidate, directory.parent)
    holder = local.parent.parent if local.parent.name == "engines" else local.parent
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
