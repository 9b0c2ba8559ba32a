"""The cells of a model measured together, each in its own worker (``--isolation process``):
the group's cells opened, measured interleaved
(:func:`mlflow_ngraph.run.isolation.run_group`) once, or in ``--sittings N`` spread over the
run, and closed. The next group's workers start as spares meanwhile."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from mlflow_ngraph.compilers.registry import get_compiler
from mlflow_ngraph.console import DETAIL
from mlflow_ngraph.plan.cells import Cell, cell_run_name
from mlflow_ngraph.plan.config import RunPolicy, Spec
from mlflow_ngraph.run.cellwork import CellWork, Outcome
from mlflow_ngraph.run.resume import Resume
from mlflow_ngraph.run.worker import CellTask, relog
from mlflow_ngraph.tracking.sink import ResultSink

log = logging.getLogger("mlflow_ngraph.run.runner")  # the runner's lines

#: the group member name of an identity engine measured only as a baseline (``reference``)
REFERENCE_KEY = "identity-reference"


class GroupDispatch:
    """The groups of a run, each model's pending cells in their own workers.

    Args:
        reference: a group whose identity cell was measured before gets an identity engine
            of its own to pair its speedups with (``mlflow-ngraph tune``: every trial is
            paired).
        cell_timeout_s: a worker still running after this many seconds is killed and its
            cell's remaining batch sizes are FAILED.
    """

    def __init__(
        self,
        spec: Spec,
        policy: RunPolicy,
        home: Path,
        resume: Resume,
        work: CellWork,
        sink: ResultSink,
        reference: bool,
        cell_timeout_s: float,
    ) -> None:
        self.spec = spec
        self.policy = policy
        self.home = Path(home)
        self.resume = resume
        self.work = work
        self.sink = sink
        self.reference = reference
        self.cell_timeout_s = cell_timeout_s
        #: batch size -> the record of that reference (None: it failed), the last group's
        self.references: dict[int, dict | None] = {}

    def run_group(self, cells: list[Cell]) -> None:
        """The cells of one model, each in its own worker, measured interleaved
        (:func:`mlflow_ngraph.run.isolation.run_group`); speedups are paired with the model's
        identity cell when it is measured in the same group. The next model's workers start
        as spares meanwhile."""
        jobs = self._group_jobs(cells)
        if not jobs:
            return
        models = self.spec.models
        index = next(i for i, m in enumerate(models) if m is cells[0].model)
        following = self.resume.model_cells(models[index + 1]) if index + 1 < len(models) else []
        _say_group(jobs)
        members = self._sitting(jobs, {}, 0, _ahead(following))
        self._end_group(jobs, members)

    def run_sittings(self) -> None:
        """``--sittings N``: every group measured N times, each time in fresh workers, the
        sittings spread over the run (the first sitting of every model, then the second,
        ...), so that a model's sittings are minutes apart and see how the host drifts
        over a run, not seconds apart; each result combined from its sittings
        (:mod:`mlflow_ngraph.measure.sittings`) and logged in the last one. A run stopped
        before its last sitting measures its groups again."""
        groups = []
        for model_spec in self.spec.models:
            cells = self.resume.model_cells(model_spec)
            if not self.resume.model_done(model_spec, cells):
                jobs = self._group_jobs(cells)
                if jobs:
                    groups.append(jobs)
        sittings = self.policy.sittings
        order = [(s, jobs) for s in range(1, sittings + 1) for jobs in groups]
        earlier: dict[str, dict[int, list[dict]]] = {
            cell.key: {} for jobs in groups for cell, *_ in jobs
        }
        for i, (sitting, jobs) in enumerate(order):
            after = [cell for cell, *_ in order[i + 1][1]] if i + 1 < len(order) else []
            _say_group(jobs, f", sitting {sitting} of {sittings}")
            members = self._sitting(jobs, earlier, sittings - sitting, _ahead(after))
            if sitting == sittings:
                self._end_group(jobs, members)

    def _group_jobs(self, cells: list[Cell]) -> list[tuple[Cell, list[int], Outcome, CellTask]]:
        """A group's cells opened, each with its pending batch sizes, its outcome and its
        worker's task (a cell an earlier run finished, or with nothing pending, is left
        out)."""
        jobs = []
        for cell in cells:
            pending = self.resume.open_cell(cell)
            if pending is None:
                continue
            if not pending:
                self.sink.close(cell)
                continue
            jobs.append((cell, pending, Outcome(), self.work.worker_task(cell, pending)))
        if len(jobs) == 1:
            name = jobs[0][0].name
            log.log(DETAIL, "%s: one engine to measure: its windows run back to back", name)
        return jobs

    def _end_group(self, jobs, members) -> None:
        for (cell, pending, outcome, _), member in zip(jobs, members):
            outcome.death = member.death
            self.work.end(cell, pending, outcome)

    def _sitting(self, jobs, earlier, to_come: int, ahead) -> list:
        """One sitting of a group's ``jobs``: fresh workers, measured together, ``to_come``
        sittings still after it. A sitting before the last keeps its results in
        ``earlier`` (cell key -> batch size -> records); the last one's are combined with
        them, journaled and logged. A retry of any of them is judged with the earlier ones
        and the number to come. Returns the members, the cells' first (their ``death`` says
        why a worker ended early)."""
        from mlflow_ngraph.run.isolation import GroupCell, run_group

        members = []
        for cell, _, outcome, task in jobs:
            kept = earlier[cell.key] if self.policy.sittings > 1 else None
            events = self.work.events(cell, outcome, kept, not to_come)
            members.append(GroupCell(cell.key, task, events, earlier=kept, to_come=to_come))
        baseline = next((c.key for c, *_ in jobs if c.compiler.name == "identity"), None)
        if baseline is None and self.reference:
            sizes = sorted({b for _, pending, *_ in jobs for b in pending})
            members.append(self._reference_member(jobs[0][0], sizes))
            baseline = members[-1].name
        run_group(
            members,
            list(self.spec.batch_sizes),
            baseline,
            self.spec.measure.per_sitting(self.policy.sittings),
            members[0].task.policy(),
            self.policy.stable_retries,
            self.cell_timeout_s,
            ahead,
        )
        return members

    def _reference_member(self, cell: Cell, sizes: list[int]):
        """An identity engine measured with the group, its speedups' baseline: its records
        are kept in :attr:`references`, not logged as a cell (the model's identity cell
        holds the identity's results)."""
        from mlflow_ngraph.run.isolation import GroupCell

        identity = get_compiler("identity")
        reference = Cell(cell.model, identity, {}, REFERENCE_KEY, "reference")
        task = self.work.task(reference, sizes)
        task.log_file = str(self.home / "logs" / REFERENCE_KEY / "worker.log")
        self.references = {}

        def on_event(kind: str, payload: Any) -> None:
            if kind == "log":
                relog(payload)
            elif kind == "record":
                self.references[payload[0]] = payload[1]
            elif kind == "failed":
                log.warning("the identity reference failed at bs%d: %s", *payload)
                self.references[payload[0]] = None

        return GroupCell(REFERENCE_KEY, task, on_event)


def _say_group(jobs, sitting: str = "") -> None:
    """One line as a model's group starts, so the terminal is not silent while its engines
    are built: the lines of each engine's compile or load are the log file's (and ``-v``'s)."""
    model = cell_run_name(jobs[0][0].model.label, "", {}, ())
    sizes = ",".join(str(b) for b in sorted({b for _, pending, *_ in jobs for b in pending}))
    log.info(
        "%s%s: building or loading %d engine(s), then measuring batch size(s) %s",
        model.strip(), sitting, len(jobs), sizes,
    )  # fmt: skip


def _ahead(cells: list[Cell]):
    """What the spare workers started while a group measures should prepare: ``cells``,
    the group measured next."""
    from mlflow_ngraph.run.isolation import Ahead

    return [Ahead(c.model.name, c.compiler.name, dict(c.model.params)) for c in cells]
