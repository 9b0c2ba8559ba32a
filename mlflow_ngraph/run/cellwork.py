"""One cell's work as the runner sees it: the task its worker gets, where the worker's
events go (the sink, which journals and logs each result, and the live view) and the close
of the cell once its worker is done."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow_ngraph.console import DETAIL
from mlflow_ngraph.devices import DeviceProfile
from mlflow_ngraph.plan.cells import Cell
from mlflow_ngraph.plan.config import RunPolicy, Spec
from mlflow_ngraph.run.combine import SittingsCombiner
from mlflow_ngraph.run.live import PlainView, notify
from mlflow_ngraph.run.worker import CellTask, measure_cell, relog
from mlflow_ngraph.tracking.session import StoreSession
from mlflow_ngraph.tracking.sink import ResultSink

log = logging.getLogger("mlflow_ngraph.run.runner")  # the runner's lines


@dataclass
class Outcome:
    """What the runner saw of one cell's worker."""

    info: dict[str, Any] | None = None  # the built model, once the worker said
    seen: set[int] = field(default_factory=set)  # batch sizes with a record or a failure
    death: str | None = None  # why the worker ended before finishing, if it did


class CellWork:
    """The cells of one run as their workers see them: each cell's task out, its events in,
    its close."""

    def __init__(
        self,
        spec: Spec,
        profile: DeviceProfile,
        home: Path,
        policy: RunPolicy,
        store: StoreSession,
        sink: ResultSink,
        combiner: SittingsCombiner,
        view: PlainView | None = None,
    ) -> None:
        self.spec = spec
        self.profile = profile
        self.home = Path(home)
        self.policy = policy
        self.store = store
        self.sink = sink
        self.combiner = combiner
        self.view = view
        #: this invocation of the tool: the sittings it measures share its occasion in the
        #: host's history (the spread between runs is told from that between sittings)
        self.occasion = uuid.uuid4().hex[:12]

    def task(self, cell: Cell, pending: list[int]) -> CellTask:
        """What a worker needs to measure the ``pending`` batch sizes of ``cell``."""
        return CellTask(
            name=cell.name,
            model_name=cell.model.name,
            model_params=dict(cell.model.params),
            compiler=cell.compiler.name,
            flags=dict(cell.flags),
            batch_sizes=pending,
            device=self.profile.name,
            device_kind=self.profile.kind,
            home=str(self.home),
            measure=self.spec.measure,
            tolerance=self.spec.tolerance,
            atol=self.spec.atol,
            rtol=self.spec.rtol,
            run=self.policy.per_sitting(),
            math=self.spec.math,
            extra={"occasion": self.occasion},
        )

    def worker_task(self, cell: Cell, pending: list[int]) -> CellTask:
        """:meth:`task` for a worker process: its output goes to the cell's log file."""
        task = self.task(cell, pending)
        task.log_file = str(self.store.log_file(cell))
        return task

    def measure_here(self, cell: Cell, pending: list[int]) -> Outcome:
        """Measure ``pending`` batch sizes of ``cell`` in this process (``--isolation
        none``: one engine at a time, windows back to back); results are journaled and
        logged as they arrive."""
        outcome = Outcome()
        task = self.task(cell, pending)
        task.extra["baseline_moved"] = self.baseline_moved(cell)
        measure_cell(task, self.events(cell, outcome))
        return outcome

    def baseline_moved(self, cell: Cell) -> dict[int, tuple[str, float]]:
        """Batch size -> (what it said, now over then) of the gross move against this
        host's history that marked the identity figure this cell's unpaired speedups are
        divided by (journaled: measured before it in this process, or by an earlier run)."""
        if cell.baseline == cell.key:
            return {}
        from mlflow_ngraph.run.worker import baseline_move

        state = self.sink.journal.cell(cell.baseline)
        usable, out = state.throughputs(), {}
        for b, record in state.measured.items():
            said = record.get("stability") or {}
            if b in usable and said.get("history") and said.get("history_ratio"):
                out[b] = baseline_move("identity", said["history"], said["history_ratio"])
        return out

    def events(
        self,
        cell: Cell,
        outcome: Outcome,
        earlier: dict[int, list[dict]] | None = None,
        last: bool = True,
    ) -> Callable[[str, Any], None]:
        """Where a cell's worker events go: each result is journaled, then logged; with
        ``earlier`` (batch size -> the records of the sittings before this one), the result
        is first combined with them (:meth:`SittingsCombiner.combine`). In a sitting before
        the ``last`` the results go to ``earlier`` only (nothing is journaled or logged: a
        run stopped there measures the group again), and a failure is the last sitting's
        to report."""

        def on_event(kind: str, payload: Any) -> None:
            if kind == "log":
                relog(payload)
            elif kind == "phase":
                notify(self.view, "phase", *payload)
            elif kind == "model":
                outcome.info = payload
                self.store.params(cell, payload)
            elif kind == "record" and not last:
                earlier.setdefault(payload[0], []).append(payload[1])
            elif kind == "record":
                b, record = payload
                outcome.seen.add(b)
                family = (outcome.info or {}).get("family") or "-"
                if earlier is not None:
                    record = self.combiner.combine(cell, b, [*earlier.get(b, []), record], family)
                else:
                    self.combiner.keep(cell, b, family)
                self.sink.measured(cell, b, record)
            elif kind == "failed" and not last:
                log.log(DETAIL, "%s bs%d: failed in a sitting: %s", cell.title, *payload)
            elif kind == "failed":
                b, reason = payload
                outcome.seen.add(b)
                self.sink.failed(cell, b, reason)

        return on_event

    def end(self, cell: Cell, pending: list[int], outcome: Outcome) -> None:
        """Close a cell its worker is done with: what the worker's death left unmeasured
        fails, and a model that never built gets the params it can have."""
        if outcome.info is None:
            self.store.params(cell, None)
        for b in pending:
            if b not in outcome.seen and outcome.death:
                self.sink.failed(cell, b, outcome.death)
        self.sink.close(cell)
