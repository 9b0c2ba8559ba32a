"""The per-device loop: plan the cells, resume from the journal, dispatch each cell to the
worker step and hand its results to the store session.

For each model and compiler (a cell), the pending batch sizes are measured by
:func:`mlflow_ngraph.run.worker.measure_cell`, by default in a fresh spawned process per cell
(:mod:`mlflow_ngraph.run.isolation`; ``--isolation none`` runs it in this process). Each batch
size's record is written to the journal the moment it arrives, then to MLflow by the
:class:`~mlflow_ngraph.tracking.session.StoreSession` (which keeps measuring going when the
tracking server is away, and sends what it lacks when it answers again). A cell that fails
(a compiler error, a model that cannot be built, a worker that crashed or timed out) is
marked FAILED with the reason and the loop goes on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow_ngraph.compilers.base import Compiler
from mlflow_ngraph.compilers.registry import get_compiler, require_available
from mlflow_ngraph.devices import DeviceProfile, check_profile_runs_here, get_profile
from mlflow_ngraph.env import host_fingerprint
from mlflow_ngraph.errors import NgraphError, host_fault
from mlflow_ngraph.models.registry import validate_model_spec
from mlflow_ngraph.plan.cells import Cell, cell_run_name, differing_flags
from mlflow_ngraph.plan.config import CompilerSpec, ModelSpec, RunPolicy, Spec
from mlflow_ngraph.plan.estimate import Estimate, Item, Timings, describe
from mlflow_ngraph.run.live import PlainView
from mlflow_ngraph.run.worker import (
    CHECK_SEED,
    CellTask,
    compare_outputs,
    one_line,
)
from mlflow_ngraph.tracking import mlflow_log as ml
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tracking.journal import Journal, JournalLock
from mlflow_ngraph.tracking.session import ModelLogger, StoreSession
from mlflow_ngraph.tracking.sink import ResultSink, Row, row_of

__all__ = ["CHECK_SEED", "Cell", "Plan", "Row", "Runner", "compare_outputs", "plan"]

log = logging.getLogger(__name__)

ISOLATION_MODES = ("process", "none")
#: the group member name of an identity engine measured only as a baseline (``reference``)
REFERENCE_KEY = "identity-reference"
#: default of ``--cell-timeout``: generous enough for a TVM tuning of a large model
DEFAULT_CELL_TIMEOUT_S = 1800.0


@dataclass
class Plan:
    spec: Spec
    profile: DeviceProfile
    cells: list[Cell] = field(default_factory=list)


def plan(spec: Spec, home: Path | None = None) -> Plan:
    """Validate everything that can be validated before any work starts.

    ``home`` (the cache directory) lets model names be checked against cached lists
    instead of importing the libraries that define them.

    Raises:
        NgraphError: unknown model, compiler, flag or profile; a compiler unavailable here.
    """
    profile = get_profile(spec.device)
    check_profile_runs_here(profile)
    for model in spec.models:
        validate_model_spec(model.name, model.params, home)
    compilers: list[tuple[Compiler, dict]] = []
    given_as: dict[str, str] = {}  # resolved setting -> how it was first written
    for cspec in _identity_first(spec.compilers):
        compiler = get_compiler(cspec.name)
        defaults = {
            **profile.compiler_flags.get(cspec.name, {}),
            **compiler.math_flags(spec.math),  # how it applies the run's --math
        }
        given = {**{k: v for k, v in defaults.items() if k in compiler.flags}, **cspec.flags}
        flags = compiler.resolve_flags(given)
        require_available(compiler, profile.kind)
        setting = json.dumps([compiler.name, flags], sort_keys=True, default=str)
        written = cspec.name + "".join(f":{k}={v}" for k, v in sorted(cspec.flags.items()))
        if setting in given_as:  # one cell, measured once (two would share one key)
            log.warning(
                "compiler %s resolves to the same flags as %s: measured once",
                written,
                given_as[setting],
            )
            continue
        given_as[setting] = written
        compilers.append((compiler, flags))
    differing = differing_flags((compiler.name, flags) for compiler, flags in compilers)
    identity = get_compiler("identity")
    cells = [
        Cell(
            model,
            compiler,
            flags,
            _cell_key(spec, profile, model, compiler, flags),
            cell_run_name(model.label, compiler.name, flags, differing[compiler.name]),
            _cell_key(spec, profile, model, identity, {}),
        )
        for model in spec.models
        for compiler, flags in compilers
    ]
    return Plan(spec, profile, cells)


def check_sittings(sittings: int, isolation: str, protocol: str) -> None:
    """Raises:
    NgraphError: sittings that cannot be had (fewer than one, without fresh workers, or of
        a protocol that measures once)."""
    if sittings < 1:
        raise NgraphError(f"sittings must be at least 1, got {sittings}")
    if sittings > 1 and isolation != "process":
        raise NgraphError(
            "--sittings measures each group in fresh worker processes: it needs "
            "--isolation process (the default)"
        )
    if sittings > 1 and protocol != "rounds":
        raise NgraphError("--sittings combines rounds: use it with --protocol rounds")


def _identity_first(compilers: list[CompilerSpec]) -> list[CompilerSpec]:
    return sorted(compilers, key=lambda c: c.name != "identity")


def _cell_key(
    spec: Spec, profile: DeviceProfile, model: ModelSpec, compiler: Compiler, flags
) -> str:
    parts = {
        "device": ml.device_name(profile.name),
        "fingerprint": host_fingerprint(),
        "model": model.name,
        "params": model.params,
        "compiler": compiler.name,
        "flags": flags,
        "measure": spec.measure.key(),
        "tolerance": spec.tolerance,
    }
    if spec.atol is not None or spec.rtol:  # unset, they keep the keys of earlier runs
        parts.update(atol=spec.atol, rtol=spec.rtol)
    if spec.math != "fp32":  # likewise
        parts["math"] = spec.math
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


class Runner:
    """Runs a :class:`Plan` into one tracking store, resuming from the journal.

    Args:
        isolation: ``process`` (each cell in a fresh spawned worker) or ``none`` (in this
            process, as a baseline for the cost of isolation).
        cell_timeout_s: a worker still running after this many seconds is killed and its
            cell's remaining batch sizes are FAILED (process isolation only).
    """

    def __init__(
        self,
        plan_: Plan,
        tracking_uri: str,
        home: Path,
        retry_failed: bool = False,
        on_row: Callable[[Row], None] | None = None,
        isolation: str = "process",
        cell_timeout_s: float = DEFAULT_CELL_TIMEOUT_S,
        policy: RunPolicy | None = None,
        view: PlainView | None = None,
        experiment_explicit: bool = False,
        reference: bool = False,
        parent_run: str | None = None,
        model_logger: ModelLogger | None = None,
    ) -> None:
        if isolation not in ISOLATION_MODES:
            raise NgraphError(f"isolation {isolation!r} is not one of: process, none")
        self.policy = policy or RunPolicy()
        self.policy.validate()
        check_sittings(self.policy.sittings, isolation, plan_.spec.measure.protocol)
        self.plan = plan_
        self.spec = plan_.spec
        self.profile = plan_.profile
        self.tracking_uri = tracking_uri
        self.home = Path(home)
        self.retry_failed = retry_failed
        self.on_row = on_row or (lambda row: None)
        self.isolation = isolation
        self.cell_timeout_s = cell_timeout_s
        #: per kind of figure and model family, this run's engines measured in every
        #: sitting (the spread between sittings the run itself measured)
        self._sat: dict[str, dict[str, list]] = {"throughput": {}, "speedup": {}}
        #: (cell, batch size, its sittings' records, model family) of every combined result
        self._combined_results: list[tuple[Cell, int, list[dict], str]] = []
        self.view = view
        self.sink: ResultSink | None = None  # once run() started
        #: the experiment was named on the command line (not taken from the spec file)
        self.experiment_explicit = experiment_explicit
        #: a group whose identity cell was measured before gets an identity engine of its
        #: own to pair its speedups with (``mlflow-ngraph tune``: every trial is paired)
        self.reference = reference
        #: logs an engine as a logged model under ``--log-models`` (the command gives it)
        self.model_logger = model_logger
        #: batch size -> the record of that reference (None: it failed), the last group's
        self.references: dict[int, dict | None] = {}
        #: the run the cells nest under, owned by the caller (a tune), else the benchmark's
        self.parent_run = parent_run
        self.store: StoreSession | None = None  # once run() started
        self.estimate: Estimate | None = None  # once run() has planned what is left

    @property
    def rows(self) -> list[Row]:
        """The summary's rows: every batch size of every cell, measured, failed or taken
        from an earlier run."""
        return self.sink.rows if self.sink is not None else []

    @property
    def experiment_name(self) -> str:
        """Where the results went (under ``mlflow run``: the project run's experiment)."""
        return self.store.experiment_name if self.store else self.spec.experiment

    @property
    def experiment_id(self) -> str | None:
        return getattr(self.store, "experiment_id", None)

    def run(self) -> list[Row]:
        """Measure what the journal lacks, one invocation per journal at a time: a second
        copy of the same command waits for the first (said in one line), then finds its
        work done."""
        from mlflow_ngraph.cache import in_use

        target = (self.tracking_uri, self.spec.experiment, ml.device_name(self.profile.name))
        lock = JournalLock(Journal.path_for(self.home, *target))
        lock.acquire(on_wait=self._say_waiting)
        try:
            with in_use(self.home, "a benchmark"):  # a `cache --prune` beside it keeps its own
                return self._run()
        except OSError as exc:  # the host failed under the runner (a full or read-only home)
            fault = host_fault(exc, "write", "every result measured before is in the journal")
            if fault is None:
                raise
            raise fault from None
        finally:
            lock.release()

    @staticmethod
    def _say_waiting(holder: str) -> None:
        log.warning(
            "another copy of this benchmark is running (%s) with the same journal: waiting "
            "for it to end, then taking what it left (Ctrl-C to stop waiting)",
            holder,
        )

    def _run(self) -> list[Row]:
        self.journal = Journal.for_target(
            self.home, self.tracking_uri, self.spec.experiment, ml.device_name(self.profile.name)
        )
        self.store = StoreSession(
            self.tracking_uri,
            self.home,
            self.spec,
            self.profile,
            self.journal,
            self.plan.cells,
            retry_failed=self.retry_failed,
            experiment_explicit=self.experiment_explicit,
            parent_run=self.parent_run,
            model_logger=self.model_logger,
        )
        self.sink = ResultSink(
            self.journal, self.store, self.home, self.spec.batch_sizes, self.view, self.on_row,
            self._item_done,
        )  # fmt: skip
        if self._finished_before():
            self._order_rows()
            return self.rows
        todo = [
            (cell.model.label, cell.compiler.name, cell.flags, b)
            for cell in self.plan.cells
            for b in self._pending(cell)
        ]
        self._start(todo)
        self._measure()
        if self._combined_results:
            self._settle_sittings()
        self.store.finish(self.sink.host_failures, self.rows)
        self._order_rows()
        return self.rows

    def _start(self, todo: list[tuple]) -> None:
        """Open the store's parent run (the workers' template importing meanwhile) and say
        what the ``todo`` items will cost."""
        from mlflow_ngraph.run.environment import environment

        try:
            if todo and self.isolation == "process":
                from mlflow_ngraph.run import template

                template.context()  # the workers' template imports while the store opens
            self.store.start(environment(self.profile.name, self.profile.kind, self.home))
        except BaseException:
            if self.isolation == "process":
                from mlflow_ngraph.run.isolation import shutdown

                shutdown()  # the template, started for a run that cannot start
            raise
        self.estimate = Estimate.of(
            todo, self.spec.measure, Timings(self.home), self.policy.stable_retries,
            grouped=self.isolation == "process", sittings=self.policy.sittings,
        )  # fmt: skip
        if todo:
            log.info(describe(self.estimate.total_s, self.estimate.known, len(todo)))
        if self.view:
            self.view.start(self.estimate)

    def _measure(self) -> None:
        """Every model's groups (each sitting of them), the workers stopped however it ends;
        a store that failed under the run is one line: the journal holds every result."""
        try:
            if self.isolation == "process" and self.policy.sittings > 1:
                self._run_sittings()
            else:
                for model_spec in self.spec.models:
                    self._run_model(model_spec, self._model_cells(model_spec))
        except BaseException as exc:
            self.store.killed()
            if ml.is_store_error(exc):  # the journal holds every measured result
                raise NgraphError(
                    f"tracking store {ml.redact(self.tracking_uri)} failed ({one_line(exc)}); "
                    "every measured result is kept in the journal: run the same command again once "
                    "the store is back to send them and finish the rest"
                ) from None
            raise
        finally:
            if self.isolation == "process":
                from mlflow_ngraph.run.isolation import shutdown

                shutdown()  # the spare worker started for a cell that will not come
            if self.view:
                self.view.stop()

    def _order_rows(self) -> None:
        """The rows in the plan's order (cell, then batch size): the cells of a model
        measured together send their results in whatever order their workers finish."""
        cells = self.plan.cells
        sizes = list(self.spec.batch_sizes)

        def key(row: Row) -> tuple[int, int]:
            index = next((i for i, c in enumerate(cells) if row_of(row, c)), len(cells))
            return index, sizes.index(row.batch_size) if row.batch_size in sizes else len(sizes)

        self.rows.sort(key=key)

    def _finished_before(self) -> bool:
        """A re-run of an invocation that finished and indexed every cell, with nothing
        recorded in the journal since: its rows come from the journal, MLflow is not opened
        (the store already holds everything, relative metrics included). Not under
        ``mlflow run``, which created a run for this invocation that must be filled."""
        if os.environ.get("MLFLOW_RUN_ID"):  # `mlflow run` made a run for this invocation
            return False
        if not self.journal.up_to_date(self.spec.spec_hash):
            return False
        if any(self._pending(cell) for cell in self.plan.cells):
            return False
        if not self.journal.parent_finished():
            log.info("the parent run of the last invocation was left unfinished: ending it")
            return False
        log.info("every cell was measured and logged by an earlier run: nothing to do")
        for cell in self.plan.cells:
            self.sink.earlier(cell)
            self.sink.set_speedups(cell)
        return True

    # --- one model ------------------------------------------------------------------------
    def _pending(self, cell: Cell) -> list[int]:
        return self.store.pending(cell)

    def _model_cells(self, model_spec: ModelSpec) -> list[Cell]:
        return [c for c in self.plan.cells if c.model is model_spec]

    def _model_done(self, model_spec: ModelSpec, cells: list[Cell]) -> bool:
        """Whether every cell of a model was measured before (its rows are then shown)."""
        if self.store.ready():
            self.store.catch_up(cells)  # what an earlier run measured while the store was away
        if any(self._pending(c) for c in cells):
            return False
        log.info("%s: every cell already measured; skipping", model_spec.label)
        for cell in cells:
            self._view("cell_started", cell.title)
            self.sink.earlier(cell)
            self.store.relative(cell)  # a baseline measured since may exist
            self.sink.set_speedups(cell)
            self._view("cell_done", cell.title)
        return True

    def _run_model(self, model_spec: ModelSpec, cells: list[Cell]) -> None:
        if self._model_done(model_spec, cells):
            return
        if self.isolation == "process":
            self._run_group(cells)
            return
        for cell in cells:
            self._run_cell(cell)

    # --- one cell -------------------------------------------------------------------------
    def _finished_cell(self, cell: Cell) -> bool:
        """A cell finished by an earlier run: its rows are shown and its run is left as it
        ended (its end time kept)."""
        if self._pending(cell) or not self.journal.cell(cell.key).closed:
            return False
        self.sink.earlier(cell)
        self.store.relative(cell)
        self.sink.set_speedups(cell)
        self._view("cell_done", cell.title, self.sink.cell_rows(cell))
        return True

    def _open_cell(self, cell: Cell) -> list[int] | None:
        """Start ``cell``: ``None`` when an earlier run finished it, else its run is open,
        the rows of the batch sizes it already holds are shown, and the pending ones are
        returned."""
        self._view("cell_started", cell.title)
        if self._finished_cell(cell):
            return None
        self.store.begin(cell)  # opens the run
        pending = self._pending(cell)  # after the run's stored results were taken
        for b in self.spec.batch_sizes:
            if b not in pending:
                self.sink.earlier(cell, only=b)
        return pending

    def _run_cell(self, cell: Cell) -> None:
        pending = self._open_cell(cell)
        if pending is None:
            return
        log_file = self.store.log_file(cell)
        outcome = self._dispatch(cell, pending, log_file) if pending else _Outcome(info={})
        self._end_cell(cell, pending, outcome)

    def _end_cell(self, cell: Cell, pending: list[int], outcome: _Outcome) -> None:
        """Close a cell its worker is done with: what the worker's death left unmeasured
        fails, and a model that never built gets the params it can have."""
        if outcome.info is None:
            self.store.params(cell, None)
        for b in pending:
            if b not in outcome.seen and outcome.death:
                self.sink.failed(cell, b, outcome.death)
        self.sink.close(cell)

    def _view(self, method: str, *args: Any) -> None:
        if self.view is not None:
            getattr(self.view, method)(*args)

    def _events(
        self,
        cell: Cell,
        outcome: _Outcome,
        earlier: dict[int, list[dict]] | None = None,
        last: bool = True,
    ) -> Callable[[str, Any], None]:
        """Where a cell's worker events go: each result is journaled, then logged; with
        ``earlier`` (batch size -> the records of the sittings before this one), the result
        is first combined with them (:meth:`_combined`). In a sitting before the ``last``
        the results go to ``earlier`` only (nothing is journaled or logged: a run stopped
        there measures the group again), and a failure is the last sitting's to report."""

        def on_event(kind: str, payload: Any) -> None:
            if kind == "log":
                log.log(*payload)
            elif kind == "phase":
                self._view("phase", *payload)
            elif kind == "model":
                outcome.info = payload
                self.store.params(cell, payload)
            elif kind == "record" and not last:
                earlier.setdefault(payload[0], []).append(payload[1])
            elif kind == "record":
                b, record = payload
                outcome.seen.add(b)
                if earlier is not None:
                    family = (outcome.info or {}).get("family") or "-"
                    records = [*earlier.get(b, []), record]
                    self._combined_results.append((cell, b, records, family))
                    record = self._combined(records, family)
                self.sink.measured(cell, b, record)
            elif kind == "failed" and not last:
                log.info("%s bs%d: failed in a sitting: %s", cell.title, *payload)
            elif kind == "failed":
                b, reason = payload
                outcome.seen.add(b)
                self.sink.failed(cell, b, reason)

        return on_event

    def _combined(self, records: list[dict], family: str, settled: bool = False) -> dict:
        """The record of a batch size measured in ``records`` (its sittings, in order):
        :func:`mlflow_ngraph.measure.sittings.combine`, with the spread between sittings
        this run measured so far (this engine's sittings included; ``settled``: the whole
        run's, every engine already in it), else the host's."""
        from mlflow_ngraph.measure import history
        from mlflow_ngraph.measure import sittings as sit

        if len(records) < 2:
            return records[-1]
        spreads = {}
        for what, by_family in self._sat.items():
            own = sit.engine_sittings(records, what)
            if own is not None and not settled:
                by_family.setdefault(family, []).append(own)
            spreads[what] = sit.run_spread(by_family, family, self.policy.sittings)
            if spreads[what] is None:
                spreads[what] = history.given_or_measured(
                    self.home, what, family, self.policy.rerun_sd
                )
        return sit.combine(records, spreads, self.policy.max_interval)

    def _settle_sittings(self) -> None:
        """Every combined result's re-run interval again, from the spread between sittings
        of the whole run (a group measured early had only the engines before it): where it
        changed, journaled and sent to the cell's run, and its row shows it."""
        for cell, b, records, family in self._combined_results:
            record = self._combined(records, family, settled=True)
            before = self.journal.cell(cell.key).measured.get(b)
            if before is None or before.get("status") != record["status"]:
                continue
            if record.get("rerun") == before.get("rerun") and all(
                record["metrics"].get(k) == before["metrics"].get(k) for k in S.RERUN_METRICS
            ):
                continue
            record = {**before, "metrics": {**before["metrics"], **{
                k: record["metrics"][k] for k in S.RERUN_METRICS if k in record["metrics"]
            }}, "rerun": record.get("rerun")}  # fmt: skip
            self.sink.rerun(cell, b, record)

    def _item_done(self, cell: Cell, b: int, record: dict | None) -> None:  # the sink's on_done
        """What a batch size cost goes to the estimate (``record`` None: it failed)."""
        if self.estimate is not None:
            item = Item(cell.model.label, cell.compiler.name, cell.flags, b)
            self.estimate.done(item, record)

    def _task(self, cell: Cell, pending: list[int]) -> CellTask:
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
        )

    def _dispatch(self, cell: Cell, pending: list[int], log_file: Path):
        """Measure ``pending`` batch sizes of ``cell`` in this process (``--isolation
        none``: one engine at a time, windows back to back); results are journaled and
        logged as they arrive."""
        from mlflow_ngraph.run.worker import measure_cell

        outcome = _Outcome()
        measure_cell(self._task(cell, pending), self._events(cell, outcome))
        return outcome

    def _run_group(self, cells: list[Cell]) -> None:
        """The cells of one model, each in its own worker, measured interleaved
        (:func:`mlflow_ngraph.run.isolation.run_group`); speedups are paired with the model's
        identity cell when it is measured in the same group. The next model's workers start
        as spares meanwhile."""
        jobs = self._group_jobs(cells)
        if not jobs:
            return
        models = self.spec.models
        index = next(i for i, m in enumerate(models) if m is cells[0].model)
        following = self._model_cells(models[index + 1]) if index + 1 < len(models) else []
        members = self._sitting(jobs, {}, True, _ahead(following))
        self._end_group(jobs, members)

    def _run_sittings(self) -> None:
        """``--sittings N``: every group measured N times, each time in fresh workers, the
        sittings spread over the run (the first sitting of every model, then the second,
        ...), so that a model's sittings are minutes apart and see how the host drifts
        over a run, not seconds apart; each result combined from its sittings
        (:mod:`mlflow_ngraph.measure.sittings`) and logged in the last one. A run stopped
        before its last sitting measures its groups again."""
        groups = []
        for model_spec in self.spec.models:
            cells = self._model_cells(model_spec)
            if not self._model_done(model_spec, cells):
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
            log.info("%s: sitting %d of %d", jobs[0][0].model.label, sitting, sittings)
            members = self._sitting(jobs, earlier, sitting == sittings, _ahead(after))
            if sitting == sittings:
                self._end_group(jobs, members)

    def _group_jobs(self, cells: list[Cell]) -> list[tuple[Cell, list[int], _Outcome, CellTask]]:
        """A group's cells opened, each with its pending batch sizes, its outcome and its
        worker's task (a cell an earlier run finished, or with nothing pending, is left
        out)."""
        jobs = []
        for cell in cells:
            pending = self._open_cell(cell)
            if pending is None:
                continue
            if not pending:
                self.sink.close(cell)
                continue
            task = self._task(cell, pending)
            task.log_file = str(self.store.log_file(cell))
            jobs.append((cell, pending, _Outcome(), task))
        if len(jobs) == 1:
            log.info("%s: one engine to measure: its windows run back to back", jobs[0][0].name)
        return jobs

    def _end_group(self, jobs, members) -> None:
        for (cell, pending, outcome, _), member in zip(jobs, members):
            outcome.death = member.death
            self._end_cell(cell, pending, outcome)

    def _sitting(self, jobs, earlier, last: bool, ahead) -> list:
        """One sitting of a group's ``jobs``: fresh workers, measured together. A sitting
        before the ``last`` keeps its results in ``earlier`` (cell key -> batch size ->
        records); the last one's are combined with them, journaled and logged. Returns the
        members, the cells' first (their ``death`` says why a worker ended early)."""
        from mlflow_ngraph.run.isolation import GroupCell, run_group

        members = []
        for cell, _, outcome, task in jobs:
            kept = earlier[cell.key] if self.policy.sittings > 1 else None
            members.append(GroupCell(cell.key, task, self._events(cell, outcome, kept, last)))
        baseline = next((c.key for c, *_ in jobs if c.compiler.name == "identity"), None)
        if baseline is None and self.reference:
            sizes = sorted({b for _, pending, *_ in jobs for b in pending})
            members.append(self._reference_member(jobs[0][0], sizes))
            baseline = members[-1].name
        run_group(
            members,
            list(self.spec.batch_sizes),
            baseline,
            self.spec.measure,
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
        task = self._task(reference, sizes)
        task.log_file = str(self.home / "logs" / REFERENCE_KEY / "worker.log")
        self.references = {}

        def on_event(kind: str, payload: Any) -> None:
            if kind == "log":
                log.log(*payload)
            elif kind == "record":
                self.references[payload[0]] = payload[1]
            elif kind == "failed":
                log.warning("the identity reference failed at bs%d: %s", *payload)
                self.references[payload[0]] = None

        return GroupCell(REFERENCE_KEY, task, on_event)


@dataclass
class _Outcome:
    """What the runner saw of one cell's worker."""

    info: dict[str, Any] | None = None  # the built model, once the worker said
    seen: set[int] = field(default_factory=set)  # batch sizes with a record or a failure
    death: str | None = None  # why the worker ended before finishing, if it did


def _ahead(cells: list[Cell]):
    """What the spare workers started while a group measures should prepare: ``cells``,
    the group measured next."""
    from mlflow_ngraph.run.isolation import Ahead

    return [Ahead(c.model.name, c.compiler.name, dict(c.model.params)) for c in cells]
