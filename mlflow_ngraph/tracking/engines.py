"""Engine manifests and the local engine cache.

An engine directory holds the runtime's files plus ``manifest.json``: input shape and dtype,
compiler, flags, versions, device, and the sha256 of every file. The cache keys directories by
(model hash, compiler, compiler version, flags, batch size, device fingerprint); the same
directory is logged as the run's ``engines/bs<b>`` artifact, which is what ``pull`` fetches.

Where the run's artifacts are a local folder on the same file system as the cache (MLflow's
default ``./mlruns`` beside ``mlflow.db``), the engine's files are hard-linked into it
(:func:`link_into`), not copied: the bytes are on disk once, deleting either name keeps the
other, and a cache entry whose files were edited through the store fails :func:`verify` at
its next lookup and is built again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from mlflow_ngraph.models.base import file_hash
from mlflow_ngraph.scratch import put_in_place

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1


def cache_key(parts: dict[str, Any]) -> str:
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def write_manifest(directory: Path, files: list[str], info: dict[str, Any]) -> dict[str, Any]:
    """Write ``manifest.json`` describing the engine files in ``directory``."""
    entries = []
    for name in files:
        path = directory / name
        entries.append({"path": name, "bytes": path.stat().st_size, "sha256": file_hash(path)})
    manifest = {"manifest_version": MANIFEST_VERSION, **info, "files": entries}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
    return manifest


def read_manifest(directory: Path) -> dict[str, Any] | None:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def verify(directory: Path) -> bool:
    """True when every file the manifest lists is present with its recorded sha256."""
    manifest = read_manifest(directory)
    if manifest is None or not manifest.get("files"):
        return False
    for entry in manifest["files"]:
        path = Path(directory) / entry["path"]
        if not path.is_file() or file_hash(path) != entry["sha256"]:
            return False
    return True


def engine_bytes(manifest: dict[str, Any]) -> int:
    return sum(entry["bytes"] for entry in manifest.get("files", []))


class EngineCache:
    """Compiled engines on local disk, so a re-run with the same key skips compilation."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root) / "engines"

    def lookup(self, key: str) -> Path | None:
        directory = self.root / key
        if directory.is_dir() and verify(directory):
            with contextlib.suppress(OSError):  # its last use: `cache --prune` keeps it longer
                os.utime(directory)
            return directory
        return None

    def store(self, key: str, source: Path, replace: bool = False) -> Path:
        """Copy a written engine directory into the cache whole and return its path.

        The copy is made in a ``.tmp-*`` folder beside the entries and renamed into place.
        Two workers that built the same engine at once (two runs into one home, an A/A pair)
        both store it: where a whole entry is already there the second keeps it (the same
        engine, and the first may be reading it), unless ``replace`` (the entry there did not
        load: a plan of another TensorRT); an entry that fails :func:`verify` is set aside
        into the ``.tmp-*`` folder and replaced. Removing the old entry and renaming
        the new one over it let the second meet the first's files (``OSError``: directory
        not empty, the engine's measurement lost). What a kill leaves in ``.tmp-*``,
        ``mlflow-ngraph cache --prune`` removes."""
        target = self.root / key
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=".tmp-"))
        try:
            shutil.copytree(source, tmp / "new")
            return put_in_place(tmp / "new", target, tmp, keep=None if replace else verify)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def local_artifact_dir(artifact_uri: str) -> Path | None:
    """The folder of a run's artifact URI when it is a local path (``file://`` or bare);
    ``None`` for a tracking server's or a cloud store's."""
    parsed = urllib.parse.urlparse(artifact_uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(urllib.request.url2pathname(parsed.path))
    if parsed.scheme == "" and artifact_uri.startswith("/"):
        return Path(artifact_uri)
    return None


def link_into(directory: Path, target: Path) -> bool:
    """Hard-link every file of ``directory`` into ``target`` (made if missing), each link
    made under a temporary name and moved into place, so a file already there is replaced
    whole. ``False``, with nothing half-linked left, where the two lie on different file
    systems or links are refused: the caller copies instead."""
    made: list[Path] = []
    try:
        for path in sorted(Path(directory).rglob("*")):
            if path.is_dir():
                continue
            dest = target / path.relative_to(directory)
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".link-{os.getpid()}-{dest.name}")
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            os.link(path, tmp)
            os.replace(tmp, dest)
            made.append(dest)
    except OSError as exc:
        log.debug("linking %s into %s: %s; copying instead", directory, target, exc)
        for dest in made:
            with contextlib.suppress(OSError):
                dest.unlink()
        return False
    return True


def engine_param(batch_size: int) -> str:
    """The cell run's param holding the sha256 of the engine's manifest at a batch size."""
    return f"engine.bs{batch_size}.manifest_sha256"


#: the sha256 of a file, by the name deploy's checks and the store's pin use
file_sha256 = file_hash
