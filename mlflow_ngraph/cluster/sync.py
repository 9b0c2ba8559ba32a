"""``mlflow-ngraph sync``: send results that are in the journals but not in the store.

A result measured while the tracking server was down stays in its journal as measured but
not logged, and a cell that started while it was down has no run yet (its journal holds
what the run needs). Sync creates the missing runs and sends every result exactly once with
the benchmark's own recorder, so the store ends as an uninterrupted run leaves it: a run
that already holds a result (sent before a kill, unmarked) is only marked logged in the
journal. A cell whose every batch size is done gets its final status; one a kill cut short
is ended KILLED (the same benchmark command measures the rest).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from mlflow_ngraph.tracking import mlflow_log as ml
from mlflow_ngraph.tracking.journal import CellState, Journal, store_identity
from mlflow_ngraph.tracking.provenance import producer
from mlflow_ngraph.tracking.recorder import CellRecorder

log = logging.getLogger(__name__)


@dataclass
class SyncResult:
    sent: int = 0  #: results logged to the store now
    present: int = 0  #: results the store already held (marked logged)
    unsendable: int = 0  #: results whose cell has neither a run nor a description
    journals: int = 0
    runs_created: int = 0  #: cell runs that did not exist (the cell started offline)
    settled: int = 0  #: re-run intervals settled at a run's end that the store lacked


def journals_of(home: Path, tracking_uri: str) -> list[Path]:
    """The journals in ``home`` written against the store ``tracking_uri`` names."""
    store = ml.redact_uri(store_identity(tracking_uri))
    paths = []
    for path in sorted((Path(home) / "journals").glob("*.jsonl")):
        if ".stale-" in path.name:
            continue
        journal = Journal(path)
        if journal.store and journal.store.get("store") == store:
            paths.append(path)
    return paths


def sync(home: Path, tracking_uri: str) -> SyncResult:
    """Send what every journal of ``tracking_uri``'s store holds and the store lacks."""
    result = SyncResult()
    client = None
    for path in journals_of(home, tracking_uri):
        journal = Journal(path)
        result.journals += 1
        experiment_id = journal.store["experiment_id"]  # type: ignore[index]
        for key, cell in list(journal.cells.items()):
            if not cell.unsent():
                continue
            if cell.run_id is None and cell.description is None:
                result.unsendable += len(cell.unlogged())
                continue
            client = client or ml.connect(tracking_uri)
            _send_cell(client, experiment_id, journal, key, Path(home), result)
    return result


def _send_cell(
    client, experiment_id: str, journal: Journal, key: str, home: Path, result: SyncResult
) -> None:
    cell: CellState = journal.cell(key)
    description = cell.description or {}
    recorder = CellRecorder(
        client,
        experiment_id,
        description.get("parent_id", ""),
        bool(description.get("log_engines", True)),
        producer(home),
    )
    # closed: only a settled re-run interval to send; its run stays as it ended
    closed = bool(cell.closed and cell.run_id)
    if cell.run_id is None:
        result.runs_created += 1
    if closed:
        run_id = str(cell.run_id)
    else:
        run_id = recorder.open(key, description.get("run_name") or key, cell.run_id)
        journal.set_run(key, run_id)
    waiting = len(cell.unlogged())
    result.settled += len(cell.settling)
    sent = recorder.replay(journal, key, run_id)
    result.sent += sent
    result.present += waiting - sent
    if closed or cell.description is None:
        return  # closed before, or a journal from before cells were described
    if journal.cell(key).complete():
        recorder.close(journal, key, run_id, home / "logs" / key / "worker.log")
    else:
        ml.finish(client, run_id, "KILLED")
