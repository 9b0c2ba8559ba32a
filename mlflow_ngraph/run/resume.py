"""What is left to measure: each cell's pending batch sizes, from the journal and the store
(:meth:`~mlflow_ngraph.tracking.session.StoreSession.pending`), and the rows of what an
earlier run measured shown as the run reaches them.

A resumed run measures only what the journal lacks; a cell, a model or a whole invocation
finished before is shown from the journal and left as it ended. ``--remeasure`` makes
measurements the journal holds pending again (:meth:`Resume.remeasure`), in their own runs.
"""

from __future__ import annotations

import logging
import os

from mlflow_ngraph.plan.cells import Cell
from mlflow_ngraph.plan.config import ModelSpec, Spec
from mlflow_ngraph.run.live import PlainView, notify
from mlflow_ngraph.tracking.journal import Journal
from mlflow_ngraph.tracking.session import StoreSession
from mlflow_ngraph.tracking.sink import ResultSink

log = logging.getLogger("mlflow_ngraph.run.runner")  # the runner's lines

#: what ``--remeasure`` takes: the UNSTABLE measurements the store holds, or every one
REMEASURE_MODES = ("unstable", "all")


class Resume:
    """The pending work of a plan's ``cells`` in one store session, and the opening of each
    cell: what an earlier run measured is shown before the rest is measured."""

    def __init__(
        self,
        spec: Spec,
        cells: list[Cell],
        journal: Journal,
        store: StoreSession,
        sink: ResultSink,
        view: PlainView | None = None,
        remeasure_hint: str | None = None,
    ) -> None:
        self.spec = spec
        #: the command that measures the UNSTABLE measurements again (said when none is due)
        self.remeasure_hint = remeasure_hint
        self.cells = cells
        self.journal = journal
        self.store = store
        self.sink = sink
        self.view = view

    def pending(self, cell: Cell) -> list[int]:
        return self.store.pending(cell)

    def todo(self) -> list[tuple]:
        """Every pending batch size as an item of the estimate: (model label, compiler,
        flags, batch size)."""
        return [
            (cell.model.label, cell.compiler.name, cell.flags, b)
            for cell in self.cells
            for b in self.pending(cell)
        ]

    def model_cells(self, model_spec: ModelSpec) -> list[Cell]:
        return [c for c in self.cells if c.model is model_spec]

    def finished_before(self) -> bool:
        """A re-run of an invocation that finished and indexed every cell, with nothing
        recorded in the journal since: its rows come from the journal, MLflow is not opened
        (the store already holds everything, relative metrics included). Not under
        ``mlflow run``, which created a run for this invocation that must be filled."""
        if os.environ.get("MLFLOW_RUN_ID"):  # `mlflow run` made a run for this invocation
            return False
        if not self.journal.up_to_date(self.spec.spec_hash):
            return False
        if any(self.pending(cell) for cell in self.cells):
            return False
        if not self.journal.parent_finished():
            log.info("the parent run of the last invocation was left unfinished: ending it")
            return False
        log.info("every cell was measured and logged by an earlier run: nothing to do")
        self._say_unstable()
        for cell in self.cells:
            self.sink.earlier(cell)
            self.sink.set_speedups(cell)
        return True

    def model_done(self, model_spec: ModelSpec, cells: list[Cell]) -> bool:
        """Whether every cell of a model was measured before (its rows are then shown)."""
        if self.store.ready():
            self.store.catch_up(cells)  # what an earlier run measured while the store was away
        if any(self.pending(c) for c in cells):
            return False
        log.info("%s: every cell already measured; skipping", model_spec.label)
        for cell in cells:
            notify(self.view, "cell_started", cell.title)
            self.sink.earlier(cell)
            self.store.relative(cell)  # a baseline measured since may exist
            self.sink.set_speedups(cell)
            notify(self.view, "cell_done", cell.title)
        return True

    def open_cell(self, cell: Cell) -> list[int] | None:
        """Start ``cell``: ``None`` when an earlier run finished it, else its run is open,
        the rows of the batch sizes it already holds are shown, and the pending ones are
        returned."""
        notify(self.view, "cell_started", cell.title)
        if self._finished_cell(cell):
            return None
        self.store.begin(cell)  # opens the run
        pending = self.pending(cell)  # after the run's stored results were taken
        for b in self.spec.batch_sizes:
            if b not in pending:
                self.sink.earlier(cell, only=b)
        return pending

    def _finished_cell(self, cell: Cell) -> bool:
        """A cell finished by an earlier run: its rows are shown and its run is left as it
        ended (its end time kept)."""
        if self.pending(cell) or not self.journal.cell(cell.key).closed:
            return False
        self.sink.earlier(cell)
        self.store.relative(cell)
        self.sink.set_speedups(cell)
        notify(self.view, "cell_done", cell.title, self.sink.cell_rows(cell))
        return True

    def remeasure(self, mode: str) -> int:
        """Make measurements the journal holds pending again, to be measured into the runs
        they are in: ``unstable``: every batch size of a model at which some cell's result
        is UNSTABLE, ``all``: every batch size. The unit is a model's whole group at a batch
        size, its identity baseline included: the cells of a model are measured in
        interleaved rounds and their speedups paired within them, so a cell measured again
        alone would be paired with nothing, or its speedup would mix figures measured
        apart. Returns how many measurements are pending again (none: the journal is left
        as it was, and a finished invocation still has nothing to do)."""
        marked = 0
        for model_spec in self.spec.models:
            cells = self.model_cells(model_spec)
            states = [self.journal.cell(c.key) for c in cells]
            if mode == "all":
                sizes = {b for s in states for b in s.logged if b in s.measured}
            else:
                sizes = {b for s in states for b in s.unstable()}
            for b in sorted(sizes & set(self.spec.batch_sizes)):
                for cell, state in zip(cells, states, strict=True):
                    if b in state.measured and b in state.logged:
                        self.journal.remeasure(cell.key, b)
                        marked += 1
        if marked:
            log.warning(
                "measuring %d measurement(s) again (--remeasure %s), each into its own cell "
                "run: a model's whole group at each such batch size, baseline included",
                marked,
                mode,
            )
        return marked

    def unstable_count(self) -> tuple[int, int]:
        """(UNSTABLE measurements, measurements) the journal holds of the plan's cells."""
        states = [self.journal.cell(c.key) for c in self.cells]
        measured = sum(len([b for b in s.logged if b in s.measured]) for s in states)
        return sum(len(s.unstable()) for s in states), measured

    def _say_unstable(self) -> None:
        unstable, measured = self.unstable_count()
        if unstable:
            command = self.remeasure_hint or "the same command with --remeasure unstable"
            log.warning(
                "%d of %d measurements in the store are UNSTABLE: measure them again in their "
                "own runs with: %s",
                unstable,
                measured,
                command,
            )
