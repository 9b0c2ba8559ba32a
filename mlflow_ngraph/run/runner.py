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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mlflow_ngraph.compilers.base import Compiler
from mlflow_ngraph.compilers.registry import get_compiler, require_available
from mlflow_ngraph.console import DETAIL
from mlflow_ngraph.devices import DeviceProfile, check_profile_runs_here, get_profile
from mlflow_ngraph.env import host_fingerprint
from mlflow_ngraph.errors import NgraphError, host_fault
from mlflow_ngraph.measure.quiet import HostCheck
from mlflow_ngraph.models.registry import validate_model_spec
from mlflow_ngraph.plan.cells import Cell, cell_run_name, differing_flags
from mlflow_ngraph.plan.config import CompilerSpec, ModelSpec, RunPolicy, Spec
from mlflow_ngraph.plan.estimate import Estimate, Host, Item, Timings
from mlflow_ngraph.run.cellwork import CellWork, Outcome
from mlflow_ngraph.run.combine import SittingsCombiner
from mlflow_ngraph.run.groups import GroupDispatch
from mlflow_ngraph.run.live import PlainView
from mlflow_ngraph.run.resume import REMEASURE_MODES, Resume
from mlflow_ngraph.run.worker import (
    CHECK_SEED,
    compare_outputs,
    one_line,
)
from mlflow_ngraph.tracking import mlflow_log as ml
from mlflow_ngraph.tracking.catchup import ModelLogger
from mlflow_ngraph.tracking.journal import Journal, JournalLock
from mlflow_ngraph.tracking.session import StoreSession
from mlflow_ngraph.tracking.sink import ResultSink, Row, row_of

__all__ = ["CHECK_SEED", "Cell", "Plan", "Row", "Runner", "compare_outputs", "plan"]

log = logging.getLogger(__name__)

ISOLATION_MODES = ("process", "none")
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


def check_remeasure(mode: str | None) -> None:
    """Raises:
    NgraphError: a ``--remeasure`` that is neither ``unstable`` nor ``all``."""
    if mode is not None and mode not in REMEASURE_MODES:
        raise NgraphError(
            f"--remeasure {mode}: not a choice; use --remeasure unstable (the UNSTABLE "
            "measurements) or --remeasure all (every one)"
        )


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

    The work is shared among collaborators made once the journal is held
    (:meth:`_open`): :class:`~mlflow_ngraph.run.resume.Resume` says what is left,
    :class:`~mlflow_ngraph.run.cellwork.CellWork` hands each cell to its worker and takes its
    events, :class:`~mlflow_ngraph.run.groups.GroupDispatch` measures a model's cells
    together (and in sittings), :class:`~mlflow_ngraph.run.combine.SittingsCombiner`
    combines the sittings.

    Args:
        isolation: ``process`` (each cell in a fresh spawned worker) or ``none`` (in this
            process, as a baseline for the cost of isolation).
        cell_timeout_s: a worker still running after this many seconds is killed and its
            cell's remaining batch sizes are FAILED (process isolation only).
        host_check: samples the host before the first compile of a run with work to do
            (says when it is busy, waits or stops; the estimate takes its load); None: the
            run does not look.
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
        remeasure: str | None = None,
        remeasure_hint: str | None = None,
        host_check: HostCheck | None = None,
    ) -> None:
        if isolation not in ISOLATION_MODES:
            raise NgraphError(f"isolation {isolation!r} is not one of: process, none")
        check_remeasure(remeasure)
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
        self.view, self.sink = view, None  # the sink once run() started
        #: the experiment was named on the command line (not taken from the spec file)
        self.experiment_explicit = experiment_explicit
        #: a group whose identity cell was measured before gets an identity engine of its
        #: own to pair its speedups with (``mlflow-ngraph tune``: every trial is paired)
        self.reference = reference
        #: logs an engine as a logged model under ``--log-models`` (the command gives it)
        self.model_logger = model_logger
        #: the run the cells nest under, owned by the caller (a tune), else the benchmark's
        self.parent_run = parent_run
        self.host_check = host_check  # looks at the host before the first compile
        self.store: StoreSession | None = None  # once run() started
        self.estimate: Estimate | None = None  # once run() has planned what is left
        self.groups: GroupDispatch | None = None  # once run() started
        #: ``unstable``/``all``: stored measurements measured again in place; and the command
        self.remeasure, self.remeasure_hint = remeasure, remeasure_hint

    @property
    def rows(self) -> list[Row]:
        """The summary's rows: every batch size of every cell, measured, failed or taken
        from an earlier run."""
        return self.sink.rows if self.sink is not None else []

    @property
    def references(self) -> dict[int, dict | None]:
        """Batch size -> the record of the identity reference (None: it failed), the last
        group's (:attr:`~mlflow_ngraph.run.groups.GroupDispatch.references`)."""
        return self.groups.references if self.groups is not None else {}

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
        self._open()
        if self.remeasure:
            self.resume.remeasure(self.remeasure)
        if self.resume.finished_before():
            self._order_rows()
            return self.rows
        self._start(self.resume.todo())
        self._measure()
        if self.combiner.pending:
            self.combiner.settle(self.journal, self.sink)
        self.store.finish(self.sink.host_failures, self.rows)
        self._order_rows()
        return self.rows

    def _open(self) -> None:
        """The run's journal, store session and result sink, and the collaborators that
        work through them."""
        self.journal = Journal.for_target(
            self.home, self.tracking_uri, self.spec.experiment, ml.device_name(self.profile.name)
        )
        self.store = StoreSession(
            self.tracking_uri, self.home, self.spec, self.profile, self.journal, self.plan.cells,
            retry_failed=self.retry_failed, experiment_explicit=self.experiment_explicit,
            parent_run=self.parent_run, model_logger=self.model_logger,
        )  # fmt: skip
        self.sink = ResultSink(
            self.journal, self.store, self.home, self.spec.batch_sizes, self.view, self.on_row,
            self._item_done,
        )  # fmt: skip
        self.resume = Resume(
            self.spec, self.plan.cells, self.journal, self.store, self.sink, self.view,
            self.remeasure_hint,
        )  # fmt: skip
        self.combiner = SittingsCombiner(self.home, self.policy, kind=self.profile.kind)
        self.work = CellWork(
            self.spec, self.profile, self.home, self.policy, self.store, self.sink,
            self.combiner, self.view,
        )  # fmt: skip
        self.combiner.occasion = self.work.occasion
        self.groups = GroupDispatch(
            self.spec, self.policy, self.home, self.resume, self.work, self.sink,
            self.reference, self.cell_timeout_s,
        )  # fmt: skip

    def _start(self, todo: list[tuple]) -> None:
        """Look at the host, open the store's parent run (the workers' template importing
        meanwhile) and say what the ``todo`` items will cost."""
        from mlflow_ngraph.run.environment import environment

        host = None
        try:
            if todo and self.isolation == "process":
                from mlflow_ngraph.run import template

                template.context()  # the workers' template imports while the host is sampled
            if todo and self.host_check is not None:  # before a parent run a stop would leave
                load = self.host_check.run()
                host = Host(load.share, self.host_check.busy(load))
            self.store.start(environment(self.profile.name, self.profile.kind, self.home))
        except BaseException:
            if self.isolation == "process":
                from mlflow_ngraph.run.isolation import shutdown

                shutdown()  # the template, started for a run that cannot start
            raise
        self.estimate = Estimate.of(
            todo, self.spec.measure, Timings(self.home), self.policy.stable_retries,
            grouped=self.isolation == "process", sittings=self.policy.sittings, host=host,
        )  # fmt: skip
        if self.view:  # its opening line says the estimate; the log file has it too
            log.log(DETAIL, self.estimate.said())
            self.view.start(self.estimate)
        elif todo:
            log.info(self.estimate.said())

    def _measure(self) -> None:
        """Every model's groups (each sitting of them), the workers stopped however it ends;
        a store that failed under the run is one line: the journal holds every result."""
        try:
            if self.isolation == "process" and self.policy.sittings > 1:
                self.groups.run_sittings()
            else:
                for model_spec in self.spec.models:
                    self._run_model(model_spec, self.resume.model_cells(model_spec))
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

    def _run_model(self, model_spec: ModelSpec, cells: list[Cell]) -> None:
        if self.resume.model_done(model_spec, cells):
            return
        if self.isolation == "process":
            self.groups.run_group(cells)
            return
        for cell in cells:
            self._run_cell(cell)

    def _run_cell(self, cell: Cell) -> None:
        """One cell in this process (``--isolation none``)."""
        pending = self.resume.open_cell(cell)
        if pending is None:
            return
        outcome = self.work.measure_here(cell, pending) if pending else Outcome(info={})
        self.work.end(cell, pending, outcome)

    def _item_done(self, cell: Cell, b: int, record: dict | None) -> None:  # the sink's on_done
        """What a batch size cost goes to the estimate (``record`` None: it failed)."""
        if self.estimate is not None:
            item = Item(cell.model.label, cell.compiler.name, cell.flags, b)
            self.estimate.done(item, record)
