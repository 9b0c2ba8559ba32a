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

Anyone who can write the experiment can replace an index, so a reader trusts nothing in it:
the file is decompressed as a stream, at most :data:`MAX_BYTES` (the setting
:data:`MAX_BYTES_ENV`), its text may hold at most one JSON value per
:data:`MIN_BYTES_PER_VALUE` bytes (what parsing it costs in memory is then a small multiple of
its size, whatever it holds), at most :data:`MAX_RECORDS` records, each of a run's shape.
An index that fails any of this is :class:`BadIndex`, and its parent's cells are searched live.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import tempfile
import threading
import time
import zlib
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.tracking import schema as S

log = logging.getLogger(__name__)

INDEX_DIR = "ngraph"
INDEX_FILE = "cells.json.gz"
INDEX_ARTIFACT = f"{INDEX_DIR}/{INDEX_FILE}"
INDEX_VERSION = 1
#: parallel ``get_run`` calls while snapshotting, and parallel index downloads (I/O bound)
THREADS = 8
#: the setting that caps an index's size once decompressed: bytes, or ``512M``, ``1G``
MAX_BYTES_ENV = "MLFLOW_NGRAPH_INDEX_MAX_BYTES"
#: its default: a cell's record is ~7 KB, so ~35,000 cells under one parent
MAX_BYTES = 256 * 2**20
#: the most records one index may hold
MAX_RECORDS = 100_000
#: the fewest bytes of text per JSON value (a record's ~170 values average ~35 bytes; text of
#: empty lists or short strings, 2-5 bytes a value, would cost ~20 times its size to parse)
MIN_BYTES_PER_VALUE = 16
#: the size from which that is checked (below it, parsing costs a few MB whatever it holds)
DENSE_FROM = 2**20
#: one index decompressed and parsed at a time (the downloads go on in parallel): the memory
#: a reader needs is one index's, however many parents are read
_PARSING = threading.Lock()


class BadIndex(NgraphError):
    """A results index that cannot be used: not gzip, not JSON, too big, or not an index of
    this version (the message says which)."""


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
    the run and list the folder first (three requests, ~4x the time on a busy server).

    Raises:
        BadIndex: the file is not an index this reader can use (:func:`parse`).
        NgraphError: :data:`MAX_BYTES_ENV` is not a size.
    """
    limit = max_bytes()
    # one small file per benchmark: MLflow's per-download progress bar would flood stderr
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / INDEX_FILE
        if artifact_uri is None or not _download_file(client, artifact_uri, path):
            path = Path(client.download_artifacts(parent_id, INDEX_ARTIFACT, tmp))
        with _PARSING:
            return parse(path, limit)


def max_bytes() -> int:
    """The cap on an index's decompressed size: the setting :data:`MAX_BYTES_ENV`, else
    :data:`MAX_BYTES`.

    Raises:
        NgraphError: the setting is not a size."""
    from mlflow_ngraph.cache import parse_size

    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not text:
        return MAX_BYTES
    try:
        return parse_size(text)
    except NgraphError:
        raise NgraphError(
            f"{MAX_BYTES_ENV}={text!r} is not a size: expected e.g. 256M or 1G"
        ) from None


def parse(path: Path, limit: int = MAX_BYTES) -> list[dict[str, Any]]:
    """The records of the index file ``path``, read in bounded memory: at most ``limit``
    bytes decompressed, at most one JSON value per :data:`MIN_BYTES_PER_VALUE` bytes (from
    :data:`DENSE_FROM` bytes on), at most :data:`MAX_RECORDS` records, each of a run's shape.

    Raises:
        BadIndex: naming what is wrong."""
    data = _decompressed(path, limit)
    values = data.count(b",") + data.count(b"[") + data.count(b"{")
    if len(data) > DENSE_FROM and values * MIN_BYTES_PER_VALUE > len(data):
        raise BadIndex(
            f"{values:,} JSON values in {len(data):,} bytes: not the text of run records"
        )
    try:
        text = data.decode("utf-8")
        del data  # the text alone while it is parsed
        payload = json.loads(text)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BadIndex(f"not JSON ({str(exc)[:100]})") from None
    except MemoryError:
        raise BadIndex("too big to parse in this machine's memory") from None
    if not isinstance(payload, dict) or payload.get("version") != INDEX_VERSION:
        found = payload.get("version") if isinstance(payload, dict) else None
        raise BadIndex(f"index version {found!r} is not {INDEX_VERSION}")
    return _checked_records(payload.get("runs"))


def _decompressed(path: Path, limit: int) -> bytearray:
    """The gzip file ``path`` decompressed, at most ``limit`` bytes of it.

    Raises:
        BadIndex: not gzip, damaged, or more than ``limit`` bytes."""
    data = bytearray()
    try:
        with gzip.open(path, "rb") as handle:
            while chunk := handle.read(min(2**20, limit + 1 - len(data))):
                data += chunk
                if len(data) > limit:
                    raise BadIndex(
                        f"more than {limit:,} bytes once decompressed (the cap; "
                        f"{MAX_BYTES_ENV} raises it)"
                    )
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise BadIndex(f"not a gzip file, or a damaged one ({str(exc)[:100]})") from None
    return data


def _checked_records(runs: Any) -> list[dict[str, Any]]:
    """``runs`` when it is a list of at most :data:`MAX_RECORDS` run records.

    Raises:
        BadIndex: another shape."""
    if not isinstance(runs, list):
        raise BadIndex("it holds no list of runs")
    if len(runs) > MAX_RECORDS:
        raise BadIndex(f"{len(runs):,} records, more than the {MAX_RECORDS:,} an index holds")
    for record in runs:
        if not _is_record(record):
            shown = record.get("run_id") if isinstance(record, dict) else None
            raise BadIndex(f"record {shown!r} is not a run's (run_id, params, tags, metrics)")
    return runs


def _is_record(record: Any) -> bool:
    """Whether ``record`` has the shape :func:`run_record` writes."""
    if not isinstance(record, dict) or not isinstance(record.get("run_id"), str):
        return False
    if not isinstance(record.get("experiment_id"), str | int):
        return False
    if not isinstance(record.get("start_time", 0), int | None):
        return False
    params, tags, metrics = (record.get(k) for k in ("params", "tags", "metrics"))
    if not all(isinstance(d, dict) for d in (params, tags, metrics)):
        return False
    if not all(type(v) is str for d in (params, tags) for v in d.values()):
        return False
    return all(type(v) is float or (type(v) is int and abs(v) < 2**1000) for v in metrics.values())


def _download_file(client, artifact_uri: str, path: Path) -> bool:
    """Fetch the index file of the run whose artifacts live at ``artifact_uri`` into
    ``path``; ``False`` where MLflow has no single-file download, so the caller takes the
    public route."""
    from mlflow_ngraph.tracking.mlflow_private import download_artifact_file

    return download_artifact_file(client.tracking_uri, artifact_uri, INDEX_ARTIFACT, str(path))


def index_hint(text: str) -> str:
    """What to do when a store error's ``text`` is about a results index (the store would
    not give it: deleted by a writer of the experiment, or its folder gone); "" for any
    other error."""
    if INDEX_ARTIFACT not in text:
        return ""
    return (
        f"a benchmark's results index ({INDEX_ARTIFACT}) could not be fetched: pass --live "
        "to read its cell runs instead, or run that benchmark again to write it anew"
    )


def is_current(status: str, tags: Mapping[str, str]) -> bool:
    """Whether a parent run (its MLflow ``status`` and ``tags``) has an index holding every
    cell of its last invocation: the runner writes the index just before it marks the parent
    FINISHED, and marks it RUNNING again when an invocation resumes it, so a killed or
    running invocation never looks indexed (nor does one whose time tag is not a time)."""
    written = str(tags.get(S.T_INDEX_TIME, ""))
    return status == "FINISHED" and written.isascii() and written.isdigit()
