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
from pathlib import Path

from mlflow_ngraph.deploy.engine import read_manifest, verify_files
from mlflow_ngraph.deploy.select import Candidate, creator
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
    client, candidate: Candidate, holder: Path, sha256: str | None = None, run=None
) -> Path:
    """The candidate's engine in ``holder/engine``, verified (``holder``: the caller's work
    folder, :func:`mlflow_ngraph.scratch.work_folder`, removed with what is in it however
    the command ends).

    The manifest is fetched first and checked against the sha256 its cell run recorded when
    it logged the engine (a write-once param) or ``sha256`` pinned by hand, then against the
    run's compiler and flags, confined (:func:`~mlflow_ngraph.deploy.trust.check_manifest`);
    only the files it lists are downloaded, each checked for size and sha256.

    Raises:
        NgraphError: no engine logged, no engine files (an in-process engine), a manifest
            not the one logged or pinned, not its run's, not confined, a file missing,
            truncated or altered.
    """
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    run = run if run is not None else client.get_run(candidate.run_id)
    local, digest = _fetch_manifest(client, candidate, Path(holder))
    try:
        _check_pinned(digest, candidate, run, sha256)
        _check_signed(digest, candidate)
        manifest = _checked_manifest(local, candidate, run)
        _check_stored(client, candidate, manifest)
        for entry in manifest["files"]:  # only what the manifest lists, confined
            _fetch_file(client, candidate, local, entry["path"])
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
            "signed_by": candidate.signer or None,
            "manifest_sha256": digest,
        }
        if candidate.signed is not None:
            candidate.signed.write(local)
        (local / SOURCE_FILE).write_text(json.dumps(source, indent=2, sort_keys=True))
        return local
    except BaseException:  # nothing that looks usable is left behind
        shutil.rmtree(local, ignore_errors=True)
        raise


def _where(candidate: Candidate) -> str:
    return f"{candidate.label} (run {candidate.run_id})"


def _fetch_manifest(client, candidate: Candidate, tmp: Path) -> tuple[Path, str]:
    """The engine's manifest alone, in ``tmp/engine``: (that folder, the manifest's sha256).

    Raises:
        NgraphError: the run logged no engine at this batch size."""
    from mlflow.exceptions import MlflowException

    from mlflow_ngraph.deploy import trust

    trust.check_manifest_size(_stored_sizes(client, candidate).get(trust.MANIFEST))
    try:
        name = f"engines/bs{candidate.batch_size}/{trust.MANIFEST}"
        fetched = Path(client.download_artifacts(candidate.run_id, name, str(tmp)))
    except MlflowException:
        fetched = None
    if fetched is None or not fetched.is_file():
        raise NgraphError(
            f"{_where(candidate)} has no engine logged (benchmarked with --no-engine-artifacts?)"
            ": benchmark it again with engines, or choose another with --compiler / --run"
        )
    local = tmp / "engine"
    local.mkdir()
    os.replace(fetched, local / trust.MANIFEST)
    return local, trust.file_sha256(local / trust.MANIFEST)


def _check_pinned(digest: str, candidate: Candidate, run, sha256: str | None) -> None:
    """The manifest is the one pinned with ``--sha256`` and the one its run recorded.

    Raises:
        NgraphError: another manifest, or none recorded and none pinned."""
    from mlflow_ngraph.deploy import trust

    param = trust.engine_param(candidate.batch_size)
    recorded = run.data.params.get(param)
    if sha256:
        trust.check_pin(digest, sha256, "the sha256 pinned with --sha256")
    if recorded:
        trust.check_pin(digest, recorded, f"the one its run recorded ({param})")
    elif not sha256:
        raise NgraphError(
            f"{_where(candidate)} records no sha256 of its engine's manifest (logged before "
            "this check existed): check the engine with whoever logged it and pin its "
            "manifest with --sha256"
        )


def _check_signed(digest: str, candidate: Candidate) -> None:
    """The manifest is the one its producer signed (a signed candidate's).

    Raises:
        NgraphError: another manifest, or a signed record of no engine."""
    if candidate.signed is None:
        return
    signed = candidate.signed.record.get("engine_manifest_sha256")
    if not signed:
        raise NgraphError(
            f"{_where(candidate)}: {candidate.signer} signed no engine for it (measured with "
            "--no-engine-artifacts, or in-process only): nothing to deploy"
        )
    if digest != signed:
        raise NgraphError(
            f"{_where(candidate)}: the engine's manifest has sha256 {digest[:16]}..., "
            f"{candidate.signer} signed {signed[:16]}...: the engine was replaced: refusing it"
        )


def _checked_manifest(local: Path, candidate: Candidate, run) -> dict:
    """The manifest in ``local``, confined and its run's, at the candidate's batch size.

    Raises:
        NgraphError: an in-process engine (no files), or a manifest refused."""
    from mlflow_ngraph.deploy import trust

    manifest = read_manifest(local)
    if not manifest["files"]:
        raise NgraphError(
            f"{candidate.label}: the {candidate.compiler} engine runs in-process only "
            "(nothing serialized): nothing to deploy"
        )
    trust.check_manifest(manifest)
    trust.check_against_run(manifest, run.data.params, _where(candidate))
    if int(manifest["batch_size"]) != candidate.batch_size:
        raise NgraphError(
            f"{_where(candidate)}: the manifest is for batch size {manifest['batch_size']}, "
            f"not {candidate.batch_size}: refusing it"
        )
    return manifest


def _stored_sizes(client, candidate: Candidate, paths=()) -> dict[str, int | None]:
    """What the store lists in the engine's folder, path (in the folder) -> bytes (None
    where it gives none): the folder's own files and those of the folders of ``paths``; one
    listing a folder, nothing downloaded."""
    import posixpath

    root = f"engines/bs{candidate.batch_size}"
    sizes: dict[str, int | None] = {}
    for folder in sorted({""} | {posixpath.dirname(p) for p in paths}):
        for info in client.list_artifacts(candidate.run_id, f"{root}/{folder}".rstrip("/")):
            if not info.is_dir:
                sizes[posixpath.relpath(info.path, root)] = info.file_size
    return sizes


def _check_stored(client, candidate: Candidate, manifest: dict) -> None:
    """Every file the manifest lists is in the store at its size, before any is copied.

    Raises:
        NgraphError: a file missing, or of another size."""
    from mlflow_ngraph.deploy import trust

    paths = [entry["path"] for entry in manifest["files"]]
    trust.check_stored(manifest, _stored_sizes(client, candidate, paths))


def _fetch_file(client, candidate: Candidate, local: Path, path: str) -> None:
    """One file the manifest lists, into its place under ``local``."""
    rel = Path(path)
    (local / rel.parent).mkdir(parents=True, exist_ok=True)
    artifact = f"engines/bs{candidate.batch_size}/{path}"
    got = Path(client.download_artifacts(candidate.run_id, artifact, str(local / rel.parent)))
    if got != local / rel:
        os.replace(got, local / rel)


def pull(
    client,
    candidate: Candidate,
    directory: Path,
    force: bool = False,
    sha256: str | None = None,
    run=None,
) -> Path:
    """Download, verify and move the candidate's engine into ``directory``."""
    from mlflow_ngraph.scratch import work_folder

    directory = Path(directory).resolve()
    check_target(directory, force)
    directory.parent.mkdir(parents=True, exist_ok=True)
    # beside the target (a rename moves it into place); one a killed pull left goes here
    with work_folder(directory.parent, ".pull-") as holder:
        local = download_verified(client, candidate, holder, sha256, run)
        if directory.exists():  # --force: the old engine goes with the work folder
            os.replace(directory, holder / "replaced")
        os.replace(local, directory)
    return directory
