"""One benchmark invocation's side of the tracking store: the parent run, and every write to
the cells' runs, whether the store answers or not.

The runner hands it cells and plain records; it journals what a run needs before writing
it, writes through the :class:`~mlflow_ngraph.tracking.recorder.CellRecorder`, and keeps the
:class:`~mlflow_ngraph.tracking.mlflow_log.StoreLink`: the first write that finds the store
unreachable is said once and later writes are skipped (the journal holds them) until the
store answers a probe again; then what it lacks is sent first, each result once. A cell's
run the store already holds while the journal knows nothing of it (another host of the same
device, or a fresh home) is found by its cell key and its results are taken as done.

The session decides when a write may go to the store; what is written comes from its
collaborators: :class:`~mlflow_ngraph.tracking.description.CellDescription` (a cell run's
params and tags), :class:`~mlflow_ngraph.tracking.catchup.CatchUp` (each result once, and
what the journal holds and the store lacks) and
:class:`~mlflow_ngraph.tracking.parent.ParentRun` (the parent run, opened and ended).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow_ngraph import faultpoint
from mlflow_ngraph.errors import HostFault, StoreAway, host_fix
from mlflow_ngraph.redaction import first_line
from mlflow_ngraph.tracking import mlflow_log as ml
from mlflow_ngraph.tracking.catchup import CatchUp, ModelLogger
from mlflow_ngraph.tracking.description import CellDescription
from mlflow_ngraph.tracking.journal import Journal
from mlflow_ngraph.tracking.parent import ParentRun
from mlflow_ngraph.tracking.provenance import producer
from mlflow_ngraph.tracking.recorder import CellRecorder

if TYPE_CHECKING:
    from mlflow_ngraph.devices import DeviceProfile
    from mlflow_ngraph.plan.cells import Cell
    from mlflow_ngraph.plan.config import Spec

log = logging.getLogger(__name__)

#: seconds a Ctrl-C waits at most for the store write it landed in (a commit takes ms)
LATEST_S = 2.0


@contextlib.contextmanager
def interrupts_after():
    """Ctrl-C (SIGINT, and SIGTERM where the CLI makes it one) during the block is raised
    when the block ends: one write to the store is never cut inside its transaction. Cut in
    a commit, a write left the sqlite store locked, so that marking the runs KILLED failed
    (the parent stayed RUNNING) and MLflow printed the error with its traceback. A second
    Ctrl-C within the block is raised at once, and so is the first when the write still runs
    :data:`LATEST_S` later (a store that hangs never holds Ctrl-C back). Outside the main
    thread, nothing changes."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {}
    main = threading.main_thread().ident

    def later(signum, frame) -> None:
        if pending:  # pressed again, or the write still runs after LATEST_S: now
            handler = previous[signum]
            handler(signum, frame)
        pending.append(signum)
        timer = threading.Timer(LATEST_S, signal.pthread_kill, (main, signum))
        timer.daemon = True
        timers.append(timer)
        timer.start()

    timers: list[threading.Timer] = []

    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if callable(handler):
            previous[signum] = signal.signal(signum, later)
    try:
        yield
    finally:
        for timer in timers:
            timer.cancel()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if pending:
            signal.raise_signal(pending[0])


class StoreSession:
    """The tracking store of one invocation of the benchmark on one device.

    Args:
        cells: every cell of the plan (the catch-up sends what the store lacks of any).
        retry_failed: FAILED batch sizes are measured again (a cell with one is pending).
        experiment_explicit: the experiment was named on the command line (under
            ``mlflow run`` it then wins over the project run's experiment).
        parent_run: a run of the caller's (a tune's) that the cells nest under (see
            :class:`~mlflow_ngraph.tracking.parent.ParentRun`).
        model_logger: what logs an engine as a logged model under ``--log-models``
            (``deploy.register.log_cell_engine``, given by the command).
    """

    def __init__(
        self,
        tracking_uri: str,
        home: Path,
        spec: Spec,
        profile: DeviceProfile,
        journal: Journal,
        cells: Sequence[Cell],
        retry_failed: bool = False,
        experiment_explicit: bool = False,
        parent_run: str | None = None,
        model_logger: ModelLogger | None = None,
    ) -> None:
        self.tracking_uri = tracking_uri
        #: logs a result's engine as a logged model (``--log-models``); None: not logged
        self.model_logger = model_logger
        self.home = Path(home)
        self.spec = spec
        self.profile = profile
        self.journal = journal
        self.cells = list(cells)
        self.retry_failed = retry_failed
        self.experiment_explicit = experiment_explicit
        #: where the results go (under ``mlflow run``: the project run's experiment)
        self.experiment_name = spec.experiment
        self.link = ml.StoreLink(tracking_uri)
        #: the cells whose runs are open (the cells of one model are measured together):
        #: the catch-up does not end their runs
        self.open_cells: dict[str, Cell] = {}
        self.parent = ParentRun(tracking_uri, spec, profile, journal, cells, parent_run)
        self._runs: dict[str, str] = {}  # cell key -> its run, once opened here

    @property
    def parent_id(self) -> str | None:
        """The run the cells nest under, once :meth:`start` opened it."""
        return self.parent.run_id

    @property
    def view_key(self) -> str | None:
        """The share key of the designed view (tracking/ui.py), once written."""
        return self.parent.view_key

    def start(self, env: dict[str, Any]) -> None:
        """Connect, find or create the experiment, and open the parent run.

        Raises:
            NgraphError: the store is unreachable or refuses (one line).
        """
        self.client = ml.connect(self.tracking_uri)
        self.experiment_id, self.experiment_name = ml.run_experiment(
            self.client, self.spec.experiment, self.experiment_explicit
        )
        self.parent.open(self.client, self.experiment_id, env)
        faultpoint.point("parent_started")
        self.journal.ensure_store_recorded()
        self.recorder = CellRecorder(
            self.client,
            self.experiment_id,
            self.parent_id,
            self.spec.log_engines,
            producer(self.home),
        )
        self.description = CellDescription(
            self.spec, self.profile, self.journal, env, self.parent_id
        )
        self.catchup = CatchUp(
            self.journal,
            self.recorder,
            self.spec,
            self.profile,
            self.tracking_uri,
            self.model_logger,
        )

    # --- the store, reachable or not -------------------------------------------------------
    def ready(self, force: bool = False) -> bool:
        """Whether the store can be written now. When it answers again after an outage,
        what it lacks is sent first (each result once)."""
        if not self.link.offline:
            return True
        return self.link.back(force) and self.catch_up(self.cells)

    def write(self, write: Callable[[], Any]) -> bool:
        """Run one write to the store; False when the store is unreachable (said once, the
        journal keeps what was to be written). An error the store answers with is raised."""
        if not self.ready():
            return False
        try:
            with self.link.watch(), interrupts_after():
                write()
        except Exception as exc:
            if not self.link.lost(exc):
                raise
            return False
        return True

    def to_run(self, cell: Cell, write: Callable[..., Any], *args: Any) -> bool:
        """``write(run_id, *args)`` to ``cell``'s run (opened first if need be)."""
        return self.write(lambda: write(self.open(cell), *args))

    def catch_up(self, cells: Sequence[Cell]) -> bool:
        """Send what the store lacks of ``cells``: their runs, params, tags, results and,
        for a cell that is done, its final status. True when everything was sent."""
        for cell in cells:
            state = self.journal.cell(cell.key)
            if not state.unsent():
                continue
            if state.closed and state.run_id:  # a settle cut short: the run stays as it ended
                sent = self.write(lambda s=state, c=cell: self.catchup.unsent(s.run_id, c))
            else:
                sent = self.to_run(cell, self._send_unsent, cell)
            if not sent:
                return False
        return True

    def _send_unsent(self, run_id: str, cell: Cell) -> None:
        self.catchup.unsent(run_id, cell)
        if cell.key not in self.open_cells and not self.pending(cell):
            self._close(run_id, cell)

    # --- a cell's run ----------------------------------------------------------------------
    def pending(self, cell: Cell) -> list[int]:
        """The batch sizes of ``cell`` still to measure, as the journal says."""
        return [
            b
            for b in self.spec.batch_sizes
            if not self.journal.done(cell.key, b, self.retry_failed)
        ]

    def open(self, cell: Cell) -> str:
        """The cell's run, found or created on first use. A run the store holds while the
        journal knows nothing of the cell (a host with a fresh home): its results are done.

        Raises:
            the store's error.
        """
        run_id = self._runs.get(cell.key)
        if run_id is not None:
            return run_id
        state = self.journal.cell(cell.key)
        fresh = state.run_id is None and not state.measured and not state.failed
        run_id = self.recorder.open(cell.key, cell.run_name or cell.name, state.run_id)
        self.journal.set_run(cell.key, run_id)
        if fresh:
            self.catchup.take_stored(cell, run_id)
        self._runs[cell.key] = run_id
        return run_id

    def begin(self, cell: Cell) -> None:
        """``cell`` is measured next: describe it and open its run with its tags."""
        self.open_cells[cell.key] = cell
        self.description.describe(cell)
        self.to_run(cell, self.recorder.tags, self.description.tags())
        faultpoint.point("cell_begun")

    def params(self, cell: Cell, info: dict[str, Any] | None) -> None:
        """The cell's params (``info``: what the worker says of the built model)."""
        params = self.description.params(cell, info)
        self.description.describe(cell, params)
        self.to_run(cell, self.recorder.params, params)

    def record(self, cell: Cell, b: int, record: dict) -> None:
        """One measured batch size, journaled first by the caller."""
        self.to_run(cell, self.catchup.unlogged, cell, b, record)

    def failed(self, cell: Cell, b: int, reason: str) -> None:
        self.journal.failed(cell.key, b, reason)
        self.to_run(cell, self.recorder.failed, b, reason)

    def end(self, cell: Cell, host_failure: str | None = None) -> None:
        """The cell is done: its log, relative metrics and final status. ``host_failure``:
        the host kept some batch size from being measured; the run ends KILLED (not closed:
        a plain re-run measures the rest and closes it)."""
        if host_failure:
            self.to_run(cell, self.recorder.interrupted, host_failure)
        else:
            self.to_run(cell, self._close, cell)
        self.open_cells.pop(cell.key, None)

    def relative(self, cell: Cell) -> None:
        """The relative metrics of a cell measured earlier (a baseline may exist since)."""
        run_id = self.journal.cell(cell.key).run_id
        if run_id:
            self.write(
                lambda: self.recorder.relative_from(self.journal, cell.key, run_id, cell.baseline)
            )

    def _close(self, run_id: str, cell: Cell) -> None:
        self.recorder.close(self.journal, cell.key, run_id, self.log_file(cell), cell.baseline)

    def log_file(self, cell: Cell) -> Path:
        """Where the cell's worker writes its log (an artifact of the cell's run)."""
        return self.home / "logs" / cell.key / "worker.log"

    # --- the invocation's end ----------------------------------------------------------------
    def killed(self) -> None:
        """Mark the open cells' runs and the parent KILLED (not while the store is
        unreachable: that would only wait for it)."""
        current = [self._runs.get(key) for key in self.open_cells]
        for run_id in (*current, self.parent_id):
            if run_id is None or self.link.offline:
                continue
            try:  # best effort: the store itself may be what failed
                with interrupts_after():
                    ml.finish(self.client, run_id, "KILLED")
            except Exception as finish_exc:
                log.debug("could not mark run %s KILLED: %s", run_id, first_line(finish_exc))

    def finish(self, host_failures: Sequence[str] = (), rows: Sequence[Any] = ()) -> None:
        """The designed view of ``rows`` (the summary's rows, :mod:`..ui`), the results
        index and the parent's end, once the store holds every cell
        (:meth:`ParentRun.close <mlflow_ngraph.tracking.parent.ParentRun.close>`).

        Raises:
            StoreAway: the store is still unreachable: how many results wait in the
                journal and how to send them.
            HostFault: ``host_failures`` (reasons) kept batch sizes from being measured:
                the parent ends KILLED, unindexed; the same command measures them later.
        """
        if host_failures:
            self.write(lambda: ml.finish(self.client, self.parent_id, "KILLED"))
            raise HostFault(
                f"{len(host_failures)} batch size(s) not measured because this host failed, "
                f"not the compiler ({host_failures[0]}); every result measured is kept: "
                f"{host_fix(host_failures[0])}, then run the same command again to measure them"
            )
        caller_run = self.parent.caller_run
        if caller_run and self.ready(force=True):
            return  # every cell's results are in the store; the parent is its owner's
        if self.ready(force=True) and not caller_run:
            try:
                self.parent.close(rows)
                return
            except Exception as exc:
                if not self.link.lost(exc):
                    raise closing_failed(exc, self.tracking_uri) from None
        waiting = sum(  # a settled re-run interval the run lacks waits too
            len(self.journal.cell(c.key).unlogged()) + len(self.journal.cell(c.key).settling)
            for c in self.cells
        )
        unsent = sum(self.journal.cell(c.key).unsent() for c in self.cells)
        uri = ml.redact(self.tracking_uri)
        raise StoreAway(
            f"tracking server {uri} did not answer again: {waiting} result(s) of {unsent} "
            f"cell(s) wait in the journal {self.journal.path}; send them with "
            f"'mlflow-ngraph sync --tracking-uri {uri} --home {self.home}' or by running the "
            "same command again"
        )


def closing_failed(exc: Exception, tracking_uri: str) -> Exception:
    """What the end of an invocation raises when the store answered its closing writes (the
    view, the results index, the parent's status) with an error: a store error as one
    redacted line (every result is in the store and the journal), anything else as it is."""
    if not ml.is_store_error(exc):
        return exc
    return ml.store_failed(
        exc,
        tracking_uri,
        hint="every measured result is in the journal: run the same command again to "
        "finish the benchmark's run",
    )
