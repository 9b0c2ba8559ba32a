"""The catch-up: a cell's run made to hold what the journal holds of it, each result once,
and the journal made to hold what a run already holds.

A result goes to its cell's run as it is measured, or, when the store was unreachable then,
on the next contact with the store, with the rest of what the journal holds and the store
lacks (the params and tags of the cell's description, its failures); under ``--log-models``
its engine becomes a logged model of the run. A run the store holds while the journal knows
nothing of its cell (another host of the same device, or a fresh home) goes the other way:
its results are journaled as done, not measured again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from mlflow_ngraph import faultpoint
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.tracking import mlflow_log as ml
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tracking.journal import Journal
from mlflow_ngraph.tracking.recorder import CellRecorder

if TYPE_CHECKING:
    from mlflow_ngraph.devices import DeviceProfile
    from mlflow_ngraph.plan.cells import Cell
    from mlflow_ngraph.plan.config import Spec

log = logging.getLogger(__name__)

#: logs one result's engine as an MLflow logged model of its cell run:
#: ``(record, *, run_id, experiment_id, device, model, compiler, batch_size, tracking_uri)``;
#: raises NgraphError when it cannot
ModelLogger = Callable[..., None]


class CatchUp:
    """What the journal holds of the cells of one invocation, to their runs, each result once.

    Args:
        recorder: the writer of the cells' runs (its client and experiment are the store's).
        model_logger: what logs an engine as a logged model under ``--log-models``; None:
            none is logged.
    """

    def __init__(
        self,
        journal: Journal,
        recorder: CellRecorder,
        spec: Spec,
        profile: DeviceProfile,
        tracking_uri: str,
        model_logger: ModelLogger | None = None,
    ) -> None:
        self.journal = journal
        self.recorder = recorder
        self.spec = spec
        self.profile = profile
        self.tracking_uri = tracking_uri
        self.model_logger = model_logger

    def unsent(self, run_id: str, cell: Cell) -> None:
        """What the journal holds of ``cell`` and its run ``run_id`` lacks: the params and
        tags of its description, its failures and every result not logged."""

        def send(run: str, b: int, record: dict) -> None:
            self.send(run, cell, b, record)

        sent = self.recorder.replay(self.journal, cell.key, run_id, send)
        if sent:
            log.info(
                "%s: %d result(s) measured while the store was unreachable sent", cell.title, sent
            )

    def unlogged(self, run_id: str, cell: Cell, b: int, record: dict) -> None:
        """:meth:`send` unless the result is logged already: asked inside the write, because
        the write itself may find the store back and send what the journal holds first, this
        result included."""
        if b not in self.journal.cell(cell.key).logged:
            self.send(run_id, cell, b, record)

    def send(self, run_id: str, cell: Cell, b: int, record: dict) -> None:
        """One result to the cell's run (and its engine as a logged model), then marked
        logged in the journal."""
        self.recorder.record(run_id, b, record, self.journal.cell(cell.key).description)
        faultpoint.point("record_sent")
        if (
            self.spec.log_models
            and self.spec.log_engines
            and record.get("engine_dir")
            and record["status"] == S.STATUS_OK
        ):
            self._log_model(cell, run_id, b, record)
        self.journal.logged(cell.key, b)
        faultpoint.point("record_logged")

    def _log_model(self, cell: Cell, run_id: str, b: int, record: dict) -> None:
        """The engine as an MLflow logged model of its cell run (``--log-models``), so
        ``mlflow.search_logged_models`` ranks engines by their metrics; the deploy layer's
        :data:`ModelLogger` does it (this layer does not know how an engine is loaded)."""
        if self.model_logger is None:
            return
        try:
            self.model_logger(
                record,
                run_id=run_id,
                experiment_id=self.recorder.experiment_id,
                device=self.profile.name,
                model=cell.model.label,
                compiler=cell.compiler.name,
                batch_size=b,
                tracking_uri=self.tracking_uri,
            )
        except NgraphError as exc:  # the result stands; only its model is missing
            log.warning("%s bs%d: not logged as a model: %s", cell.title, b, exc)

    def take_stored(self, cell: Cell, run_id: str) -> None:
        """Journal the results run ``run_id`` already holds as measured and logged (FAILED
        batch sizes as failed): they are not measured, nor logged, again."""
        client = self.recorder.client
        measured, failed = ml.stored_results(client, run_id, self.spec.batch_sizes)
        for b, record in measured.items():
            record["from_store"] = True  # another host's (or home's): never signed here
            if record.pop("torn", False):  # its metrics landed, its tags did not
                ml.log_batch(client, run_id, tags={f"{S.T_STATUS}.bs{b}": record["status"]})
            self.journal.measured(cell.key, b, record)
            self.journal.logged(cell.key, b)
        for b, reason in failed.items():
            self.journal.failed(cell.key, b, reason)
        if measured or failed:
            log.info(
                "%s: the store already holds %d result(s) and %d failure(s) of this cell "
                "(an earlier run on this device): not measured again",
                cell.title,
                len(measured),
                len(failed),
            )
