"""The resume journal: every measured cell is on disk before MLflow hears of it.

One append-only JSON-lines file per (tracking URI, experiment, device profile). A record is
written (and fsynced) the moment a batch size is measured, then marked logged once MLflow has
it. On a re-run, logged records are skipped, measured-but-unlogged ones are sent to MLflow
from the journal (a tracking server that was down loses nothing) and the rest is measured.
An ``indexed`` record closes an invocation whose results index was written: a re-run that
finds it last, with every cell done, has nothing to tell MLflow and never opens the store.
The cluster sweep reads the same journal to resume a task on another attempt. A
``remeasure`` record (``--remeasure``) makes a logged batch size of a cell pending again: it
is measured anew into the run the cell already has. A ``settled`` record (the run-end settle of
a result's re-run interval) is the latest word on a logged batch size that the store may not
have yet: the catch-up sends its interval and signs it again before it counts as logged.

A journal never stands in for a store it was not written against: it records the
experiment's id and creation time, and when it is opened again the store is probed (the
sqlite file directly, a tracking server over one REST call). A store or experiment that was
deleted and created again archives the journal and starts afresh; a cell run deleted from
the store makes its cell pending again. Every record carries a checksum; a damaged line
(torn by a kill, garbled by a disk) is skipped with a warning, and a record glued to a torn
one is recovered, so damage never hides work that was not done.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow_ngraph import faultpoint
from mlflow_ngraph.errors import host_fault
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tracking.mlflow_log import local_sqlite

log = logging.getLogger(__name__)

JOURNAL_VERSION = 1

#: record kinds and the fields each must carry (with their types) to be applied
_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "store": {"experiment_id": str, "experiment_created": int},
    "run": {"cell": str, "run_id": str},
    "cell": {"cell": str, "run_name": str, "params": dict, "tags": dict, "parent_id": str},
    "closed": {"cell": str},
    "measured": {"cell": str, "batch_size": int, "metrics": dict, "status": str},
    "settled": {"cell": str, "batch_size": int, "metrics": dict, "status": str},
    "logged": {"cell": str, "batch_size": int},
    "failed": {"cell": str, "batch_size": int, "reason": str},
    "reset": {"cell": str},
    "remeasure": {"cell": str, "batch_size": int},
    "indexed": {"spec_hash": str, "parent_id": str},
}


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
    #: logged batch sizes whose settled re-run interval the store may not hold yet
    settling: set[int] = field(default_factory=set)
    #: what creating and filling its run needs (the latest ``cell`` record); None before
    description: dict[str, Any] | None = None
    #: the store holds the cell's final status (no ``cell`` record since)
    closed: bool = False

    def unstable(self) -> list[int]:
        """Batch sizes whose logged result was judged UNSTABLE."""
        return sorted(
            b
            for b, r in self.measured.items()
            if b in self.logged and (r.get("stability") or {}).get("stable") is False
        )

    def unlogged(self) -> list[int]:
        """Batch sizes measured but not (known to be) in the store."""
        return sorted(b for b in self.measured if b not in self.logged)

    def unsent(self) -> bool:
        """Whether the store lacks part of this cell: a result, its run or its status."""
        if self.unlogged() or self.settling:
            return True
        return self.description is not None and not self.closed

    def complete(self) -> bool:
        """Whether every batch size of the cell's description was measured or failed."""
        sizes = (self.description or {}).get("batch_sizes") or []
        return bool(sizes) and all(b in self.measured or b in self.failed for b in sizes)

    def paired_speedups(self) -> dict[int, float]:
        """The speedup of every usable batch size measured in rounds with its baseline."""
        return {
            b: r["metrics"][S.M_SPEEDUP_PAIRED]
            for b, r in self.measured.items()
            if S.is_usable(r["status"]) and r["metrics"].get(S.M_SPEEDUP_PAIRED) is not None
        }

    def throughputs(self) -> dict[int, float]:
        """The throughput of every batch size measured OK (``S.is_usable``): what relative
        metrics are made of (an INVALID one is neither a result nor a baseline)."""
        return {
            b: r["metrics"][S.M_THROUGHPUT]
            for b, r in self.measured.items()
            if S.is_usable(r["status"]) and r["metrics"].get(S.M_THROUGHPUT) is not None
        }

    def compile_times(self) -> dict[int, float]:
        """The compile seconds of every usable batch size whose engine was built in its run
        (an engine loaded from a cache paid no compile: it has no payback)."""
        return {
            b: r["metrics"][S.M_COMPILE]
            for b, r in self.measured.items()
            if S.is_usable(r["status"])
            and r["metrics"].get(S.M_COMPILE) is not None
            and not r["metrics"].get(S.M_CACHE_HIT)
        }


class Journal:
    """Append-only record of finished work, keyed by cell key and batch size."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _write_error(exc, self.path.parent) from None
        self.cells: dict[str, CellState] = {}
        self.last: dict[str, Any] | None = None  # the latest record
        self.store: dict[str, Any] | None = None  # the latest ``store`` record
        #: (line number, why) of every line that could not be applied
        self.skipped: list[tuple[int, str]] = []
        self._torn_tail = False  # the file does not end with a newline
        self._target: tuple[str, str] | None = None  # (tracking URI, experiment name)
        self._replay()

    @classmethod
    def for_target(cls, home: Path, tracking_uri: str, experiment: str, device: str) -> Journal:
        """The journal of ``device``'s results in ``experiment`` of the store ``tracking_uri``
        names, checked against that store: a journal of a store or experiment that no longer
        exists is archived and a fresh one started; cells whose run was deleted are pending."""
        journal = cls(cls.path_for(home, tracking_uri, experiment, device))
        journal._target = (tracking_uri, experiment)
        journal.check_store()
        return journal

    @staticmethod
    def path_for(home: Path, tracking_uri: str, experiment: str, device: str) -> Path:
        """Where the journal of ``device`` in ``experiment`` of that store is kept."""
        store = store_identity(tracking_uri)
        digest = hashlib.sha256(f"{store}|{experiment}|{device}".encode()).hexdigest()
        return Path(home) / "journals" / f"{device}-{digest[:16]}.jsonl"

    # --- reading --------------------------------------------------------------------------
    def _replay(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        self._torn_tail = bool(data) and not data.endswith(b"\n")
        for number, raw in enumerate(data.split(b"\n"), start=1):
            if not raw.strip():
                continue
            for record, problem in _parse_line(raw):
                if problem:
                    self.skipped.append((number, problem))
                else:
                    self._apply(record)
        if self.skipped:
            lines = ", ".join(str(n) for n, _ in self.skipped[:10])
            log.warning(
                "journal %s: skipped %d damaged record(s) (line %s: %s); the cells they "
                "describe are measured or sent again",
                self.path,
                len(self.skipped),
                lines,
                self.skipped[0][1],
            )

    def _apply(self, record: dict[str, Any]) -> None:
        self.last = record
        kind = record["kind"]
        if kind == "indexed":
            return
        if kind == "store":
            self.store = record
            return
        cell = self.cells.setdefault(record["cell"], CellState())
        if kind == "run":
            cell.run_id = record["run_id"]
        elif kind == "measured":  # the latest word on a batch size wins
            cell.measured[record["batch_size"]] = record
            cell.failed.pop(record["batch_size"], None)
        elif kind == "settled":  # a logged result's re-run interval, settled at the run's end
            cell.measured[record["batch_size"]] = record
            if record["batch_size"] in cell.logged:
                cell.settling.add(record["batch_size"])
        elif kind == "logged":
            cell.logged.add(record["batch_size"])
            cell.settling.discard(record["batch_size"])
        elif kind == "failed":
            cell.failed[record["batch_size"]] = record["reason"]
            cell.measured.pop(record["batch_size"], None)
            cell.logged.discard(record["batch_size"])
            cell.settling.discard(record["batch_size"])
        elif kind == "cell":
            cell.description, cell.closed = record, False
        elif kind == "closed":
            cell.closed = True
        elif kind == "remeasure":  # ``--remeasure``: measured again, into the same run
            cell.measured.pop(record["batch_size"], None)
            cell.logged.discard(record["batch_size"])
            cell.settling.discard(record["batch_size"])
            cell.closed = False
        elif kind == "reset":  # its run is gone from the store: the cell starts over
            self.cells[record["cell"]] = CellState()

    def _append(self, record: dict[str, Any]) -> None:
        # a record built from one read back carries its version, time and checksum: new ones
        record = {"v": JOURNAL_VERSION, **record}
        record.update(v=JOURNAL_VERSION, time=time.time())
        record["crc"] = checksum(record)
        line = json.dumps(record, default=float) + "\n"
        if self._torn_tail:  # never glue a record to a line torn by a kill
            line = "\n" + line
            self._torn_tail = False
        try:
            faultpoint.point("journal_append")
            with open(self.path, "a") as handle:
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:  # a torn line is skipped when read again
            self._torn_tail = True
            raise _write_error(exc, self.path) from None
        self._apply(json.loads(line))

    # --- the store it belongs to ----------------------------------------------------------
    def check_store(self) -> str | None:
        """Compare the store with what this journal recorded; returns what was done (also
        logged), or None. An unreachable store decides nothing: the journal is kept."""
        if self._target is None:
            return None
        uri, experiment = self._target
        try:
            found = probe_experiment(uri, experiment)
        except StoreUnreachable as exc:
            log.debug("journal %s not checked: %s", self.path, exc)
            return None
        if self.store is not None:
            recorded = (self.store["experiment_id"], self.store["experiment_created"])
            if found is None or (found[0], found[1]) != recorded:
                what = "no longer exists" if found is None else "was deleted and created again"
                return self._archive(f"experiment {experiment!r} of that store {what}")
        elif found is None and self.cells:
            return self._archive(f"experiment {experiment!r} is not in that store")
        if found is not None and self.store is None and self.cells:
            # a journal from before stores were recorded: trust it no further than its runs
            self._record_store(found)
        if found is not None:
            return self._reset_missing_runs(uri, found[0])
        return None

    def _record_store(self, found: tuple[str, int, str]) -> None:
        from mlflow_ngraph.tracking.mlflow_log import redact_uri

        uri, experiment = self._target or ("", "")
        self._append(
            {
                "kind": "store",
                "experiment_id": found[0],
                "experiment_created": found[1],
                "experiment": experiment,
                "store": redact_uri(store_identity(uri)),
            }
        )

    def _archive(self, why: str) -> str:
        stale = self.path.with_name(f"{self.path.stem}.stale-{int(time.time())}.jsonl")
        os.replace(self.path, stale)
        self.cells, self.last, self.store, self._torn_tail = {}, None, None, False
        message = (
            f"the journal of this store does not match it ({why}): starting afresh; "
            f"the old journal is kept as {stale}"
        )
        log.warning(message)
        return message

    def _reset_missing_runs(self, uri: str, experiment_id: str) -> str | None:
        known = {key: c.run_id for key, c in self.cells.items() if c.run_id}
        if not known:
            return None
        try:
            alive = probe_runs(uri, experiment_id, list(known.values()))
        except StoreUnreachable as exc:
            log.debug("journal runs not checked: %s", exc)
            return None
        gone = [key for key, run_id in known.items() if run_id not in alive]
        for key in gone:
            self._append({"kind": "reset", "cell": key})
        if not gone:
            return None
        message = (
            f"{len(gone)} cell run(s) of the journal were deleted from the store: "
            "measuring them again"
        )
        log.warning(message)
        return message

    def ensure_store_recorded(self) -> None:
        """Record the store's experiment once it exists (``sync`` finds journals by it)."""
        self._ensure_store_recorded()

    def _ensure_store_recorded(self) -> None:
        if self.store is not None or self._target is None:
            return
        try:
            found = probe_experiment(*self._target)
        except StoreUnreachable:
            return
        if found is not None:
            self._record_store(found)

    # --- writing --------------------------------------------------------------------------
    def cell(self, key: str) -> CellState:
        return self.cells.get(key, CellState())

    def set_run(self, key: str, run_id: str) -> None:
        self._ensure_store_recorded()  # the experiment exists once a cell has a run
        if self.cell(key).run_id != run_id:
            self._append({"kind": "run", "cell": key, "run_id": run_id})

    def describe(
        self,
        key: str,
        run_name: str,
        params: dict[str, Any],
        tags: dict[str, str],
        parent_id: str,
        **more: Any,
    ) -> None:
        """What the cell's run needs, for the store to get it later (``more``: its batch
        sizes, identity baseline's cell key, whether engines are logged)."""
        record = {"run_name": run_name, "params": params, "tags": tags, "parent_id": parent_id}
        record = json.loads(json.dumps({**record, **more}, default=str))
        current = self.cell(key).description or {}
        if not self.cell(key).closed and all(current.get(k) == v for k, v in record.items()):
            return
        self._append({**record, "kind": "cell", "cell": key})

    def closed(self, key: str) -> None:
        """The store holds the cell's final status."""
        self._append({"kind": "closed", "cell": key})

    def measured(self, key: str, batch_size: int, result: dict[str, Any]) -> None:
        # the record's own fields win over the result's (a result read back from a journal
        # holds a kind, cell and batch size of its own)
        self._append({**result, "kind": "measured", "cell": key, "batch_size": batch_size})

    def settled(self, key: str, batch_size: int, result: dict[str, Any]) -> None:
        """A logged result with its re-run interval settled at the run's end: its record
        from now on, and the store's copy out of date until :meth:`logged` says again."""
        # the result is the journal's own record, its kind "measured" or "settled": this wins
        self._append({**result, "kind": "settled", "cell": key, "batch_size": batch_size})

    def logged(self, key: str, batch_size: int) -> None:
        self._append({"kind": "logged", "cell": key, "batch_size": batch_size})

    def failed(self, key: str, batch_size: int, reason: str) -> None:
        self._append({"kind": "failed", "cell": key, "batch_size": batch_size, "reason": reason})

    def remeasure(self, key: str, batch_size: int) -> None:
        """``(key, batch_size)`` is to be measured again (``--remeasure``): pending until its
        new result is logged, to the run the cell already has (its run id is kept)."""
        self._append({"kind": "remeasure", "cell": key, "batch_size": batch_size})

    def indexed(self, spec_hash: str, parent_id: str) -> None:
        """The parent's results index holds every cell of ``spec_hash`` as logged."""
        self._append({"kind": "indexed", "spec_hash": spec_hash, "parent_id": parent_id})

    def up_to_date(self, spec_hash: str) -> bool:
        """Whether nothing was recorded since ``spec_hash``'s index was written: no cell
        measured or logged since (by this spec or another that shares cells or baselines)."""
        last = self.last or {}
        return last.get("kind") == "indexed" and last.get("spec_hash") == spec_hash

    def parent_finished(self) -> bool:
        """Whether the parent run of the latest ``indexed`` record is not left RUNNING in the
        store (a journal written before the parent was ended last, then killed). True when
        the store cannot be asked: the journal is trusted."""
        parent = (self.last or {}).get("parent_id")
        if not parent or self._target is None:
            return True
        try:
            status = probe_run_status(self._target[0], parent)
        except StoreUnreachable as exc:
            log.debug("parent run %s not checked: %s", parent, exc)
            return True
        return status != "RUNNING"

    def done(self, key: str, batch_size: int, retry_failed: bool = False) -> bool:
        """Whether ``(key, batch_size)`` needs no more work."""
        cell = self.cell(key)
        if batch_size in cell.logged:
            return True
        return batch_size in cell.failed and not retry_failed


def _write_error(exc: OSError, path: Path) -> Exception:
    """A write to the journal failed: one line naming the path and the fix when the host
    is at fault (a full disk, a read-only home), else the error itself."""
    exc.filename = str(path)
    fault = host_fault(
        exc, "write the resume journal", "every result measured before is kept in it"
    )
    return fault or exc


# --- one invocation at a time ---------------------------------------------------------------
class JournalLock:
    """An exclusive lock beside a journal (``<journal>.lock``): one invocation measures into
    a journal at a time. The kernel drops it when its holder dies (even by ``kill -9``), so
    it is never left behind. The file says who holds it (pid, host, since when)."""

    def __init__(self, journal_path: Path) -> None:
        self.path = Path(journal_path).with_suffix(".lock")
        self._handle = None

    def holder(self) -> str:
        """Who holds it, in words (from the file its holder wrote)."""
        try:
            info = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return "another mlflow-ngraph process"
        since = time.strftime("%H:%M:%S", time.localtime(info.get("since", 0)))
        return f"mlflow-ngraph pid {info.get('pid', '?')} on {info.get('host', '?')}, since {since}"

    def acquire(self, wait: bool = True, on_wait=None) -> bool:
        """Take the lock; when another process holds it, call ``on_wait(holder)`` once and
        wait for it (``wait``) or return False.

        Raises:
            HostFault: the lock file cannot be created (a full or read-only home).
        """
        import fcntl
        import socket

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(self.path, "a+")
        except OSError as exc:
            raise _write_error(exc, self.path) from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait(self.holder())
            if not wait:
                handle.close()
                return False
            fcntl.flock(handle, fcntl.LOCK_EX)
        self._handle = handle
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(info))
            handle.flush()
        except OSError:  # who holds it is only said to a waiting copy: not worth failing for
            pass
        return True

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file drops the lock
            self._handle = None


# --- records ------------------------------------------------------------------------------
def checksum(record: dict[str, Any]) -> str:
    """A record's checksum: of every field but ``crc`` (where it is kept)."""
    payload = {k: v for k, v in record.items() if k != "crc"}
    text = json.dumps(payload, sort_keys=True, default=float)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _parse_line(raw: bytes) -> list[tuple[dict[str, Any], str]]:
    """The records of one line, each with ``""`` or why it cannot be applied. A line holding
    a torn record followed by a whole one (written after a kill) yields both."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return [({}, "not UTF-8 text")]
    starts = [i for i in range(len(text)) if text.startswith('{"v"', i)] or [0]
    if starts[0] != 0:
        starts.insert(0, 0)
    out = []
    for begin, end in zip(starts, [*starts[1:], len(text)], strict=True):
        segment = text[begin:end].strip()
        try:
            record = json.loads(segment)
        except json.JSONDecodeError:
            out.append(({}, "torn or garbled JSON"))
            continue
        out.append((record, _problem(record)))
    return out


def _problem(record: Any) -> str:
    """Why ``record`` cannot be trusted, or ``""``."""
    if not isinstance(record, dict):
        return "not a record"
    fields = _FIELDS.get(record.get("kind"))  # type: ignore[arg-type]
    if fields is None:
        return f"unknown kind {record.get('kind')!r}"
    for name, kind in fields.items():
        value = record.get(name)
        if isinstance(value, float) and kind is int and value.is_integer():
            record[name] = value = int(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"{record['kind']} record without a valid {name!r}"
    if "crc" in record and record["crc"] != checksum(record):
        return "checksum mismatch"
    return ""


# --- probing the store without MLflow's client (a resume that has nothing to do stays fast)
class StoreUnreachable(Exception):
    """The store could not be asked (server down, database locked or half-made)."""


def _query_sqlite(path: Path, sql: str, args: tuple) -> list[tuple]:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as db:
            return db.execute(sql, args).fetchall()
    except sqlite3.Error as exc:
        raise StoreUnreachable(f"sqlite store {path}: {exc}") from None


def _rest(tracking_uri: str, method: str, endpoint: str, **kwargs) -> Any:
    import requests

    auth = None
    user, password = (
        os.environ.get("MLFLOW_TRACKING_USERNAME"),
        os.environ.get("MLFLOW_TRACKING_PASSWORD"),
    )
    headers = {}
    if user and password:
        auth = (user, password)
    elif os.environ.get("MLFLOW_TRACKING_TOKEN"):
        headers["Authorization"] = f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"
    url = tracking_uri.rstrip("/") + "/api/2.0/mlflow/" + endpoint
    try:
        response = requests.request(method, url, auth=auth, headers=headers, timeout=10, **kwargs)
    except requests.RequestException as exc:
        raise StoreUnreachable(type(exc).__name__) from None
    if response.status_code == 404 and "RESOURCE_DOES_NOT_EXIST" in response.text:
        return None
    if response.status_code != 200:
        raise StoreUnreachable(f"HTTP {response.status_code}")
    return response.json()


def probe_experiment(tracking_uri: str, name: str) -> tuple[str, int, str] | None:
    """``(id, creation time in ms, lifecycle stage)`` of experiment ``name`` in the store,
    or None when the store has no such experiment (or, for sqlite, no database file yet).

    Raises:
        StoreUnreachable: the store could not be asked.
    """
    path = local_sqlite(tracking_uri)
    if path is not None:
        if not path.exists():
            return None
        rows = _query_sqlite(
            path,
            "SELECT experiment_id, creation_time, lifecycle_stage FROM experiments WHERE name=?",
            (name,),
        )
        return (str(rows[0][0]), int(rows[0][1] or 0), str(rows[0][2])) if rows else None
    if tracking_uri.startswith(("http://", "https://")):
        query = {"experiment_name": name}
        data = _rest(tracking_uri, "GET", "experiments/get-by-name", params=query)
        if data is None:
            return None
        exp = data["experiment"]
        return str(exp["experiment_id"]), int(exp.get("creation_time") or 0), exp["lifecycle_stage"]
    try:
        from mlflow.tracking import MlflowClient

        exp = MlflowClient(tracking_uri).get_experiment_by_name(name)
    except Exception as exc:
        raise StoreUnreachable(type(exc).__name__) from None
    if exp is None:
        return None
    return exp.experiment_id, int(exp.creation_time or 0), exp.lifecycle_stage


def probe_run_status(tracking_uri: str, run_id: str) -> str | None:
    """The status of run ``run_id`` (RUNNING, FINISHED, ...), None if the store lacks it.

    Raises:
        StoreUnreachable: the store could not be asked.
    """
    path = local_sqlite(tracking_uri)
    if path is not None:
        if not path.exists():
            return None
        rows = _query_sqlite(path, "SELECT status FROM runs WHERE run_uuid=?", (run_id,))
        return str(rows[0][0]) if rows else None
    if tracking_uri.startswith(("http://", "https://")):
        data = _rest(tracking_uri, "GET", "runs/get", params={"run_id": run_id})
        return data["run"]["info"]["status"] if data else None
    try:
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri).get_run(run_id).info.status
    except Exception as exc:
        raise StoreUnreachable(type(exc).__name__) from None


def probe_runs(tracking_uri: str, experiment_id: str, run_ids: list[str]) -> set[str]:
    """Which of ``run_ids`` are active runs of the experiment in the store.

    Raises:
        StoreUnreachable: the store could not be asked.
    """
    alive: set[str] = set()
    path = local_sqlite(tracking_uri)
    for start in range(0, len(run_ids), 100):
        chunk = run_ids[start : start + 100]
        if path is not None:
            marks = ",".join("?" * len(chunk))
            rows = _query_sqlite(
                path,
                f"SELECT run_uuid FROM runs WHERE lifecycle_stage='active' AND "
                f"experiment_id=? AND run_uuid IN ({marks})",
                (experiment_id, *chunk),
            )
            alive.update(r[0] for r in rows)
            continue
        ids = ",".join(f"'{r}'" for r in chunk)
        if tracking_uri.startswith(("http://", "https://")):
            body = {
                "experiment_ids": [experiment_id],
                "filter": f"attributes.run_id IN ({ids})",
                "max_results": 1000,
                "run_view_type": "ACTIVE_ONLY",
            }
            data = _rest(tracking_uri, "POST", "runs/search", json=body) or {}
            alive.update(r["info"]["run_id"] for r in data.get("runs", []))
            continue
        try:
            from mlflow.tracking import MlflowClient

            runs = MlflowClient(tracking_uri).search_runs(
                [experiment_id], f"attributes.run_id IN ({ids})", max_results=1000
            )
        except Exception as exc:
            raise StoreUnreachable(type(exc).__name__) from None
        alive.update(r.info.run_id for r in runs)
    return alive
