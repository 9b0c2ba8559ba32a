"""The results index: a snapshot of a benchmark's cell runs, kept with its parent run.

A tracking server answers a run search at a cost per returned run that grows with the run's
number of metrics, params and tags (a cell run holds ~150: every per-batch metric stepped and
flat). Reading 10,000 cell runs that way takes a minute; reading them from one artifact per
benchmark takes about a second. So at the end of every invocation the runner reads its cell
runs back from the store (``get_run``: exactly what MLflow holds, relative metrics included)
and logs them as one gzipped JSON artifact on the parent run, with tags saying when and how
many. ``compare`` reads the indexes of finished parents and searches live only the cells of
parents without a current index (an invocation that was killed or is still running, or runs
logged before indexes existed).

The record of a run is what :class:`mlflow_ngraph.report.runsource.RunData` holds: run id,
experiment id, start time, params, tags and the latest value of every metric.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mlflow_ngraph.tracking import schema as S

log = logging.getLogger(__name__)

INDEX_DIR = "ngraph"
INDEX_FILE = "cells.json.gz"
INDEX_ARTIFACT = f"{INDEX_DIR}/{INDEX_FILE}"
INDEX_VERSION = 1
#: parallel ``get_run`` calls while snapshotting, and parallel index downloads (I/O bound)
THREADS = 8


def run_record(run) -> dict[str, Any]:
    """The index record of an MLflow ``Run``."""
    info, data = run.info, run.data
    return {
        "run_id": info.run_id,
        "experiment_id": str(info.experiment_id),
        "start_time": int(info.start_time or 0),
        "params": dict(data.params),
        "tags": dict(data.tags),
        "metrics": dict(data.metrics),
    }


def snapshot(client, run_ids: Iterable[str]) -> list[dict[str, Any]]:
    """Records of the active runs among ``run_ids``, read back from the store."""

    def one(run_id: str) -> dict[str, Any] | None:
        run = client.get_run(run_id)
        return run_record(run) if run.info.lifecycle_stage == "active" else None

    ids = sorted(set(run_ids))
    with ThreadPoolExecutor(THREADS) as pool:
        return [record for record in pool.map(one, ids) if record is not None]


def write(client, parent_id: str, records: list[dict[str, Any]]) -> None:
    """Log ``records`` as the parent's index (replacing an earlier one) and tag the parent
    with the index's time and size. The tags go last: an index is used only once they say it
    is there."""
    from mlflow_ngraph.tracking.mlflow_log import log_batch

    payload = {"version": INDEX_VERSION, "parent_run_id": parent_id, "runs": records}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / INDEX_FILE
        with gzip.open(path, "wt", encoding="utf-8", compresslevel=5) as handle:
            json.dump(payload, handle, separators=(",", ":"), allow_nan=True)
        client.log_artifact(parent_id, str(path), artifact_path=INDEX_DIR)
    tags = {S.T_INDEX_TIME: str(int(time.time() * 1000)), S.T_INDEX_RUNS: str(len(records))}
    log_batch(client, parent_id, tags=tags)


def read(client, parent_id: str, artifact_uri: str | None = None) -> list[dict[str, Any]]:
    """The records of a parent's index. With the parent's ``artifact_uri`` (a run search
    returns it) the file is fetched in one request; ``client.download_artifacts`` would read
    the run and list the folder first (three requests, ~4x the time on a busy server)."""
    # one small file per benchmark: MLflow's per-download progress bar would flood stderr
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / INDEX_FILE
        if artifact_uri is None or not _download_file(client, artifact_uri, path):
            path = Path(client.download_artifacts(parent_id, INDEX_ARTIFACT, tmp))
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            payload = json.load(handle)
    if payload.get("version") != INDEX_VERSION:
        raise ValueError(f"index version {payload.get('version')!r} is not {INDEX_VERSION}")
    return payload["runs"]


def _download_file(client, artifact_uri: str, path: Path) -> bool:
    """Fetch the index file of the run whose artifacts live at ``artifact_uri`` into
    ``path``; ``False`` where MLflow has no single-file download, so the caller takes the
    public route."""
    from mlflow_ngraph.tracking.mlflow_private import download_artifact_file

    return download_artifact_file(client.tracking_uri, artifact_uri, INDEX_ARTIFACT, str(path))


def is_current(status: str, tags: Mapping[str, str]) -> bool:
    """Whether a parent run (its MLflow ``status`` and ``tags``) has an index holding every
    cell of its last invocation: the runner writes the index just before it marks the parent
    FINISHED, and marks it RUNNING again when an invocation resumes it, so a killed or
    running invocation never looks indexed."""
    return status == "FINISHED" and S.T_INDEX_TIME in tags
