"""``mlflow-ngraph sync``: send results that are in the journals but not in the store.

A result measured while the tracking server was down stays in its journal as measured but
not logged. Sync sends each exactly once: a run that already holds the result's metrics
(sent before a kill, unmarked) is only marked logged in the journal.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from mlflow_ngraph.tracking import mlflow_log as ml
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tracking.journal import Journal, store_identity

log = logging.getLogger(__name__)


@dataclass
class SyncResult:
    sent: int = 0  #: results logged to the store now
    present: int = 0  #: results the store already held (marked logged)
    unsendable: int = 0  #: results whose cell has no run (run the benchmark again)
    journals: int = 0


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
    """Send every measured-but-unlogged journal record of ``tracking_uri``'s store."""
    result = SyncResult()
    client = None
    for path in journals_of(home, tracking_uri):
        journal = Journal(path)
        result.journals += 1
        for key, cell in list(journal.cells.items()):
            pending = sorted(b for b in cell.measured if b not in cell.logged)
            if not pending:
                continue
            if cell.run_id is None:
                result.unsendable += len(pending)
                continue
            client = client or ml.connect(tracking_uri)
            held = client.get_run(cell.run_id).data.metrics
            for b in pending:
                record = cell.measured[b]
                if S.flat_key(S.M_THROUGHPUT, b) in held:
                    result.present += 1
                else:
                    tags = {f"{S.T_STATUS}.bs{b}": record["status"]}
                    metrics = ml.batch_metrics(record["metrics"], b)
                    ml.log_batch(client, cell.run_id, metrics=metrics, tags=tags)
                    result.sent += 1
                journal.logged(key, b)
    return result
