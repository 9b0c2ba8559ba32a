"""Where a run's results go, one way: each result is journaled first (a kill after it loses
nothing), then sent to the store (:class:`~mlflow_ngraph.tracking.session.StoreSession`),
then shown (a row of the summary, the live view, the caller's ``on_row``). The runner plans
and dispatches; what it measured it hands here and reads the rows back."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow_ngraph import faultpoint
from mlflow_ngraph.console import DETAIL
from mlflow_ngraph.errors import VANISHED, host_errno, vanished
from mlflow_ngraph.measure import metrics as M
from mlflow_ngraph.plan.cells import Cell
from mlflow_ngraph.tracking import schema as S

log = logging.getLogger(__name__)


@dataclass
class Row:
    """One line of the summary: a cell at one batch size."""

    model: str
    compiler: str
    batch_size: int
    status: str
    throughput: float | None = None
    throughput_std: float | None = None
    ci_low: float | None = None  # the throughput's 95% interval
    ci_high: float | None = None
    latency_p50_ms: float | None = None
    cpu_percent: float | None = None
    compile_s: float | None = None
    speedup: float | None = None
    max_rel_error: float | None = None
    note: str = ""
    skipped: bool = False
    #: the cell's resolved compiler flags: two settings of one compiler are two rows
    flags: dict[str, Any] = field(default_factory=dict)
    #: whether the measurement is STABLE (None: not judged, e.g. FAILED or an old record)
    stable: bool | None = None
    speedup_ci_low: float | None = None  # the speedup's 95% interval (paired rounds)
    speedup_ci_high: float | None = None
    drift: float | None = None  # the host's drift during the rounds (sd of log rate)
    #: samples until the compile is paid back against identity (inf: never; None: not
    #: known, or the engine came from the cache)
    payback: float | None = None
    cache_hit: bool = False
    #: where a re-run on this host is expected to land, 95% (None: the host has no
    #: measured spread between sittings yet)
    speedup_rerun_low: float | None = None
    speedup_rerun_high: float | None = None
    rerun_low: float | None = None
    rerun_high: float | None = None
    #: T_c / T_identity, the ratio of the two throughputs, and whether ``speedup`` is the
    #: paired estimate of the rounds instead (measure/verdict.py shows the ratio beside it
    #: where the two part by more than their intervals)
    speedup_ratio: float | None = None
    paired: bool = False
    #: why it is UNSTABLE, or how a STABLE figure moved against this engine's history (the
    #: full text; the cell's line on the terminal shortens it)
    stability_note: str = ""


class ResultSink:
    """A run's results, each to the journal, the store and the terminal in that order.

    Args:
        journal: the run's journal (written first).
        store: the store session the cells' runs are written through.
        home: the home (a cache file that vanished under a cell is said so).
        batch_sizes: the spec's, in order (rows from the journal come in it).
        view: the live view (``row``, ``cell_done``), or None.
        on_row: called with each row as it is shown.
        on_done: called with (cell, batch size, record or None) as each batch size ends,
            before it is journaled (what it cost, for the estimate).
    """

    def __init__(
        self,
        journal,
        store,
        home: Path,
        batch_sizes: list[int],
        view=None,
        on_row: Callable[[Row], None] | None = None,
        on_done: Callable[[Cell, int, dict | None], None] | None = None,
    ) -> None:
        self.journal = journal
        self.store = store
        self.home = Path(home)
        self.batch_sizes = list(batch_sizes)
        self.view = view
        self.on_row = on_row or (lambda row: None)
        self.on_done = on_done or (lambda cell, b, record: None)
        self.rows: list[Row] = []
        #: why the host failed under a batch size, each time it did (the run ends saying so)
        self.host_failures: list[str] = []
        self._host_failed: list[tuple[Cell, str]] = []
        self._rerun_said: str | None = None

    def _view(self, method: str, *args: Any) -> None:
        if self.view is not None:
            getattr(self.view, method)(*args)

    def measured(self, cell: Cell, b: int, record: dict) -> None:
        """A batch size's result: journaled, sent to the cell's run, shown."""
        self.on_done(cell, b, record)
        self.journal.measured(cell.key, b, record)
        faultpoint.point("journal_measured")
        self._say(cell, b, record)
        self.store.record(cell, b, record)
        self.emit(row(cell, b, record))

    def _say(self, cell: Cell, b: int, record: dict) -> None:
        """The full word on a result's stability to the run's log file (and ``-v``): the
        cell's line on the terminal carries it short (:attr:`Row.stability_note`)."""
        stability = record.get("stability") or {}
        if stability.get("stable") is False:
            log.log(DETAIL, "%s bs%d UNSTABLE: %s", cell.title, b, stability.get("reason", ""))
        elif record.get("moved"):  # an UNSTABLE one names it in its reason
            log.log(DETAIL, "%s bs%d: %s", cell.title, b, record["moved"])
        rerun, said = record.get("rerun"), self._rerun_said
        # once, and again only where the host gets (or loses) a spread: the degrees of
        # freedom grow with every cell, and a line each time was 35 lines of one run
        if rerun and (said is None or rerun.startswith("none") != said.startswith("none")):
            self._rerun_said = rerun
            log.log(DETAIL, "re-run intervals: %s", rerun)  # the summary's legend says it

    def failed(self, cell: Cell, b: int, reason: str) -> None:
        """A batch size failed: for good when the model or compiler failed; when the host
        did (a full disk, a read-only home, no memory), it stays pending for a plain re-run
        and the invocation ends with one line that says so."""
        status = S.STATUS_FAILED
        self.on_done(cell, b, None)
        if vanished(reason, self.home):  # a file of the caches went under it: not the compiler
            reason = f"{VANISHED} ({reason})"
        if host_errno(reason) is not None:
            status = S.STATUS_HOST_FAILED
            log.warning("%s bs%d not measured, the host failed: %s", cell.title, b, reason)
            self._host_failed.append((cell, reason))
            self.host_failures.append(reason)
        else:
            self.store.failed(cell, b, reason)
        self.emit(
            Row(
                cell.model.label,
                cell.compiler.name,
                b,
                status,
                note=reason,
                flags=dict(cell.flags),
            )
        )

    def rerun(self, cell: Cell, b: int, record: dict) -> None:
        """A result's re-run interval settled again: journaled, sent to its run (with its
        signed record), and its row shows it. Until the run holds both, the journal says
        the store's copy is out of date, and the next contact with the store (a re-run
        after a kill, a store back) sends them: a kill here never leaves the run's figures
        other than the ones its producer signed."""
        self.journal.settled(cell.key, b, record)
        faultpoint.point("rerun_journaled")
        description = self.journal.cell(cell.key).description
        if self.store.to_run(cell, self.store.recorder.rerun, b, record, description):
            self.journal.logged(cell.key, b)
        for i, old in enumerate(self.rows):
            if row_of(old, cell) and old.batch_size == b:
                new = row(cell, b, record)
                new.speedup, new.payback = old.speedup, old.payback
                self.rows[i] = new

    def close(self, cell: Cell) -> None:
        """A cell its worker is done with: its run ended, its rows' speedups set."""
        host = [r for c, r in self._host_failed if c is cell]
        self.store.end(cell, host[0] if host else None)
        self.set_speedups(cell)
        self._view("cell_done", cell.title, self.cell_rows(cell))

    def earlier(self, cell: Cell, only: int | None = None, skipped_view: bool = False) -> None:
        """The rows of what an earlier run measured of ``cell`` (``only``: one batch size)."""
        state = self.journal.cell(cell.key)
        for b in self.batch_sizes:
            if only is not None and b != only:
                continue
            if b in state.measured:
                found = row(cell, b, state.measured[b])
            elif b in state.failed:
                found = Row(
                    cell.model.label,
                    cell.compiler.name,
                    b,
                    S.STATUS_FAILED,
                    note=state.failed[b],
                    flags=dict(cell.flags),
                )
            else:
                continue
            found.skipped = True
            self.emit(found)

    def set_speedups(self, cell: Cell) -> None:
        """Each row of ``cell``: its speedup (the paired one where the rounds made it, else
        the ratio of throughputs) and its payback."""
        state = self.journal.cell(cell.key)
        own, paired = state.throughputs(), state.paired_speedups()
        identity = self.journal.cell(cell.baseline).throughputs() or {}
        for found in self.rows:
            if row_of(found, cell):
                ratio = M.speedup(own.get(found.batch_size), identity.get(found.batch_size))
                found.speedup = paired.get(found.batch_size, ratio) if ratio is not None else None
                found.speedup_ratio = ratio
                found.paired = ratio is not None and found.batch_size in paired
                if found.compiler != "identity" and not found.cache_hit:
                    found.payback = M.payback(
                        found.compile_s, identity.get(found.batch_size), found.speedup,
                        found.batch_size,
                    )  # fmt: skip

    def cell_rows(self, cell: Cell) -> list[Row]:
        return [r for r in self.rows if row_of(r, cell)]

    def emit(self, found: Row) -> None:
        self.rows.append(found)
        self._view("row", found)
        self.on_row(found)


def row_of(row: Row, cell: Cell) -> bool:
    return (
        row.model == cell.model.label
        and row.compiler == cell.compiler.name
        and row.flags == cell.flags
    )


def row(cell: Cell, b: int, record: dict) -> Row:
    m = record["metrics"]
    return Row(
        cell.model.label,
        cell.compiler.name,
        b,
        record["status"],
        throughput=m.get(S.M_THROUGHPUT),
        throughput_std=m.get(S.M_THROUGHPUT_STD),
        ci_low=m.get(S.M_THROUGHPUT_CI_LOW),
        ci_high=m.get(S.M_THROUGHPUT_CI_HIGH),
        latency_p50_ms=m.get(S.M_LATENCY_P50),
        cpu_percent=m.get(S.M_CPU),
        compile_s=m.get(S.M_COMPILE),
        max_rel_error=m.get(S.M_MAX_REL_ERROR),
        note=record.get("note") or ("untuned" if m.get("tuned") == 0.0 else ""),
        flags=dict(cell.flags),
        stable=(record.get("stability") or {}).get("stable"),
        stability_note=_stability_note(record),
        speedup_ci_low=m.get(S.M_SPEEDUP_CI_LOW),
        speedup_ci_high=m.get(S.M_SPEEDUP_CI_HIGH),
        drift=m.get(S.M_HOST_DRIFT),
        cache_hit=bool(m.get(S.M_CACHE_HIT)),
        speedup_rerun_low=m.get(S.M_SPEEDUP_RERUN_LOW),
        speedup_rerun_high=m.get(S.M_SPEEDUP_RERUN_HIGH),
        rerun_low=m.get(S.M_THROUGHPUT_RERUN_LOW),
        rerun_high=m.get(S.M_THROUGHPUT_RERUN_HIGH),
    )


def _stability_note(record: dict) -> str:
    stability = record.get("stability") or {}
    if stability.get("stable") is False:
        return str(stability.get("reason") or "")
    return str(record.get("moved") or "")
