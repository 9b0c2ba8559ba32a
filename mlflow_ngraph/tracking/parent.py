"""The parent run of one benchmark invocation: the run its cells' runs nest under, opened at
the start and, once the store holds every cell, given the designed view (:mod:`..ui`), the
results index (:mod:`..index`) and its FINISHED status, in that order."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mlflow_ngraph import faultpoint
from mlflow_ngraph.redaction import first_line
from mlflow_ngraph.tracking import index, ui
from mlflow_ngraph.tracking import mlflow_log as ml
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tracking.journal import Journal

if TYPE_CHECKING:
    from mlflow_ngraph.devices import DeviceProfile
    from mlflow_ngraph.plan.cells import Cell
    from mlflow_ngraph.plan.config import Spec

log = logging.getLogger(__name__)


class ParentRun:
    """The parent run of one invocation on one device.

    Args:
        cells: every cell of the plan (the view and the index name their runs).
        caller_run: a run of the caller's (a tune's) that the cells nest under instead: it
            is neither described, indexed nor ended here (its owner does that).
    """

    def __init__(
        self,
        tracking_uri: str,
        spec: Spec,
        profile: DeviceProfile,
        journal: Journal,
        cells: Sequence[Cell],
        caller_run: str | None = None,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.spec = spec
        self.profile = profile
        self.journal = journal
        self.cells = list(cells)
        self.caller_run = caller_run
        #: the parent run, once opened
        self.run_id: str | None = None
        #: the share key of the designed view (tracking/ui.py), once written
        self.view_key: str | None = None

    def open(self, client, experiment_id: str, env: dict[str, Any]) -> str:
        """The caller's run, else the benchmark's own (found again or created), RUNNING.

        Raises:
            the store's error.
        """
        self.client = client
        self.experiment_id = experiment_id
        if self.caller_run:
            self.run_id = self.caller_run
        else:
            self.run_id = ml.parent_run(
                client, experiment_id, self.spec, self.profile, env, {S.T_HOST: env["host"]}
            )
        return self.run_id

    def close(self, rows: Sequence[Any]) -> None:
        """The designed view of ``rows``, the results index and the FINISHED status; the
        journal's ``indexed`` record comes last: a kill before it leaves a re-run that opens
        the store and ends the parent, never a parent RUNNING for good.

        Raises:
            the store's error.
        """
        run_ids = [r for r in (self.journal.cell(c.key).run_id for c in self.cells) if r]
        self.publish(rows)
        index.write(self.client, self.run_id, index.snapshot(self.client, run_ids))
        faultpoint.point("index_written")
        ml.finish(self.client, self.run_id, "FINISHED", announce=True)
        faultpoint.point("parent_finished")
        self.journal.indexed(self.spec.spec_hash, self.run_id)
        faultpoint.point("indexed")

    def publish(self, rows: Sequence[Any]) -> None:
        """The shared view, the descriptions and the run colors (``view_key`` once written).
        Cosmetic: a store that refuses them (a user who may not edit the experiment) is said
        in one warning; a store that went away is the caller's to handle."""
        cells = {
            run_id: (c.model.label, c.compiler.name, c.flags)
            for c in self.cells
            if (run_id := self.journal.cell(c.key).run_id)
        }
        device = ml.device_name(self.profile.name)
        try:
            self.view_key = ui.publish(
                self.client,
                self.experiment_id,
                self.run_id,
                self.spec,
                device,
                rows,
                cells,
            )
        except Exception as exc:
            if ml.is_store_error(exc) and not ml.store_answers(self.tracking_uri):
                raise
            first = first_line(exc) or type(exc).__name__
            log.warning("the MLflow view of this run was not written: %s", first)
