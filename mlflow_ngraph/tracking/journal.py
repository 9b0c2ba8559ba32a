"""The resume journal: every measured cell is on disk before MLflow hears of it.

One append-only JSON-lines file per (tracking URI, experiment, device profile). A record is
written (and fsynced) the moment a batch size is measured, then marked logged once MLflow has
it. On a re-run, logged records are skipped, measured-but-unlogged ones are sent to MLflow
from the journal (a tracking server that was down loses nothing) and the rest is measured.
An ``indexed`` record closes an invocation whose results index was written: a re-run that
finds it last, with every cell done, has nothing to tell MLflow and never opens the store.
The cluster sweep reads the same journal to resume a task on another attempt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

JOURNAL_VERSION = 1

#: the fields each kind of record needs, with their types; a record without them is damaged
_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "run": {"cell": str, "run_id": str},
    "measured": {"cell": str, "batch_size": int, "status": str, "metrics": dict},
    "logged": {"cell": str, "batch_size": int},
    "failed": {"cell": str, "batch_size": int, "reason": str},
    "indexed": {"spec_hash": str},
    "store": {"experiment_id": str},
    "reset": {"cell": str},
}


def _valid(record: Any) -> bool:
    if not isinstance(record, dict) or record.get("kind") not in _FIELDS:
        return False
    fields = _FIELDS[record["kind"]]
    return all(
        isinstance(record.get(name), kind) and not isinstance(record.get(name), bool)
        for name, kind in fields.items()
    )


def store_mtime(tracking_uri: str) -> int | None:
    """When a local sqlite store last changed (ns; its write-ahead log included), or None."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return None
    path = Path(store_identity(tracking_uri)[len(prefix) :])
    times = []
    for candidate in (path, path.with_name(path.name + "-wal")):
        try:
            times.append(candidate.stat().st_mtime_ns)
        except OSError:
            continue
    return max(times) if times else None


def store_file_id(tracking_uri: str) -> str | None:
    """``device:inode`` of a local sqlite store's file (None for other stores, or no file):
    a store deleted and made again at the same path is another file."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return None
    try:
        stat = Path(store_identity(tracking_uri)[len(prefix) :]).stat()
    except OSError:
        return None
    return f"{stat.st_dev}:{stat.st_ino}"


def store_identity(tracking_uri: str) -> str:
    """The store a tracking URI names, wherever it is used from: a relative sqlite path
    (MLflow's default ``sqlite:///mlflow.db``) or file-store path is made absolute, so the
    same words in two directories are two stores with two journals."""
    prefix = "sqlite:///"
    if tracking_uri.startswith(prefix) and not tracking_uri.startswith(prefix + "/"):
        return prefix + str(Path(tracking_uri[len(prefix) :]).resolve())
    if "://" not in tracking_uri:
        return str(Path(tracking_uri).resolve())
    return tracking_uri


@dataclass
class CellState:
    """What the journal knows about one cell (device x model x compiler x flags)."""

    run_id: str | None = None
    measured: dict[int, dict[str, Any]] = field(default_factory=dict)  # batch -> record
    logged: set[int] = field(default_factory=set)
    failed: dict[int, str] = field(default_factory=dict)  # batch -> reason


class Journal:
    """Append-only record of finished work, keyed by cell key and batch size."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.cells: dict[str, CellState] = {}
        self.last: dict[str, Any] | None = None  # the latest record
        self._replay()

    @classmethod
    def for_target(cls, home: Path, tracking_uri: str, experiment: str, device: str) -> Journal:
        store = store_identity(tracking_uri)
        digest = hashlib.sha256(f"{store}|{experiment}|{device}".encode()).hexdigest()
        return cls(Path(home) / "journals" / f"{device}-{digest[:16]}.jsonl")

    def _replay(self) -> None:
        """Read every record back, checking each: a damaged one (a line torn by a kill
        mid-write, garbage a disk left, a record missing its fields) is skipped and counted,
        never allowed to take its neighbours with it; the work it described is done again."""
        self.store: dict[str, Any] | None = None
        self._torn_tail = False
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        skipped = 0
        for raw in data.split(b"\n"):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                record = None
            if not _valid(record):
                skipped += 1
                continue
            self._apply(record)
        self._torn_tail = bool(data) and not data.endswith(b"\n")
        if skipped:
            log.warning(
                "journal %s: skipped %d damaged record(s); the work they recorded is done again",
                self.path,
                skipped,
            )

    def _apply(self, record: dict[str, Any]) -> None:
        self.last = record
        kind = record["kind"]
        if kind == "indexed":
            return
        if kind == "store":
            self.store = record
            return
        if kind == "reset":
            self.cells.pop(record["cell"], None)
            return
        cell = self.cells.setdefault(record["cell"], CellState())
        if kind == "run":
            cell.run_id = record["run_id"]
        elif kind == "measured":
            cell.measured[record["batch_size"]] = record
        elif kind == "logged":
            cell.logged.add(record["batch_size"])
        elif kind == "failed":
            cell.failed[record["batch_size"]] = record["reason"]

    def _append(self, record: dict[str, Any]) -> None:
        record = {"v": JOURNAL_VERSION, "time": time.time(), **record}
        line = json.dumps(record, default=float) + "\n"
        if self._torn_tail:  # end the torn line first, or this record would be lost with it
            line = "\n" + line
            self._torn_tail = False
        with open(self.path, "a") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        self._apply(record)

    def bind_store(self, experiment_id: str, created: int | None, file_id: str | None) -> bool:
        """Tie the journal to the experiment (id and creation time) and the store file it
        records results for. When those are not the ones it recorded (the store was deleted
        or made again at the same URI, the experiment deleted and created again), what it
        holds describes another store: it is set aside (``*.stale-<time>``) and a fresh one
        started, so the cells are measured and logged into this store. Returns whether it
        was set aside."""
        current = {"experiment_id": str(experiment_id), "created": created, "file": file_id}
        known = self.store
        if known is not None and all(
            known.get(k) == v for k, v in current.items() if v is not None
        ):
            return False
        # a journal with results but no store recorded predates this check: it cannot be
        # tied to this store either, so it is set aside too
        stale = known is not None or bool(self.cells)
        if stale:
            self.path.rename(self.path.with_name(f"{self.path.name}.stale-{int(time.time())}"))
            self.cells, self.last, self.store, self._torn_tail = {}, None, None, False
        self._append({"kind": "store", **current})
        return stale

    def reset(self, key: str) -> None:
        """Forget a cell (its MLflow run was deleted): it is measured and logged again."""
        self._append({"kind": "reset", "cell": key})

    def cell(self, key: str) -> CellState:
        return self.cells.get(key, CellState())

    def set_run(self, key: str, run_id: str) -> None:
        if self.cell(key).run_id != run_id:
            self._append({"kind": "run", "cell": key, "run_id": run_id})

    def measured(self, key: str, batch_size: int, result: dict[str, Any]) -> None:
        self._append({"kind": "measured", "cell": key, "batch_size": batch_size, **result})

    def logged(self, key: str, batch_size: int) -> None:
        self._append({"kind": "logged", "cell": key, "batch_size": batch_size})

    def failed(self, key: str, batch_size: int, reason: str) -> None:
        self._append({"kind": "failed", "cell": key, "batch_size": batch_size, "reason": reason})

    def indexed(self, spec_hash: str, parent_id: str, mtime: int | None = None) -> None:
        """The parent's results index holds every cell of ``spec_hash`` as logged (and a
        local store's file was last changed at ``mtime``)."""
        record = {"kind": "indexed", "spec_hash": spec_hash, "parent_id": parent_id}
        self._append({**record, "store_mtime": mtime})

    def same_store(self, tracking_uri: str) -> bool:
        """Whether ``tracking_uri`` is a local sqlite store whose file is the one this
        journal recorded and unchanged since its last results index (checked without
        opening it: a run deleted or an experiment renamed since changed the file). Other
        stores cannot be checked without asking them, so they answer False."""
        file_id = store_file_id(tracking_uri)
        return (
            file_id is not None
            and (self.store or {}).get("file") == file_id
            and (self.last or {}).get("store_mtime") == store_mtime(tracking_uri)
        )

    def up_to_date(self, spec_hash: str) -> bool:
        """Whether nothing was recorded since ``spec_hash``'s index was written: no cell
        measured or logged since (by this spec or another that shares cells or baselines)."""
        last = self.last or {}
        return last.get("kind") == "indexed" and last.get("spec_hash") == spec_hash

    def done(self, key: str, batch_size: int, retry_failed: bool = False) -> bool:
        """Whether ``(key, batch_size)`` needs no more work."""
        cell = self.cell(key)
        if batch_size in cell.logged:
            return True
        return batch_size in cell.failed and not retry_failed
