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
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JOURNAL_VERSION = 1


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
        if not self.path.exists():
            return
        with open(self.path) as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line torn by a kill mid-write: the cell is measured again
                self._apply(record)

    def _apply(self, record: dict[str, Any]) -> None:
        self.last = record
        kind = record["kind"]
        if kind == "indexed":
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
        with open(self.path, "a") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        self._apply(record)

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

    def indexed(self, spec_hash: str, parent_id: str) -> None:
        """The parent's results index holds every cell of ``spec_hash`` as logged."""
        self._append({"kind": "indexed", "spec_hash": spec_hash, "parent_id": parent_id})

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
