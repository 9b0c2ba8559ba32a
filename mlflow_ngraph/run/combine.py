"""The combining of a group's sittings (``--sittings N``): each result from the records of
its sittings (:func:`mlflow_ngraph.measure.sittings.combine`), with the spread between
sittings this run measured so far; at the run's end every combined result is settled again
on the whole run's spread.

A run of one sitting is settled too: each result's re-run interval was built, as it was
measured, on the spread the host's history held before this run; at the run's end the
history holds this run as well, the latest evidence of how far a run moves from the ones
before it. A quiet hour's spread (0.37% between runs) had given a noisier hour's run
intervals that held only 87.5% of the previous run's speedups (docs/measurement.md).

Where a run's figures moved from the same engines' earlier runs more than the history's
spread allows (:func:`mlflow_ngraph.measure.history.run_against_history`), the host is in a
state its history has not measured: the settle says so in one line and judges the run's
re-run intervals on the spread between runs its own moves give."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

from mlflow_ngraph.plan.cells import Cell
from mlflow_ngraph.plan.config import RunPolicy
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tracking.journal import Journal
from mlflow_ngraph.tracking.sink import ResultSink

log = logging.getLogger("mlflow_ngraph.run.runner")  # the runner's lines


class SittingsCombiner:
    """A run's results combined from their sittings, and the spread between sittings the
    run itself measured (per kind of figure and model family)."""

    def __init__(
        self, home: Path, policy: RunPolicy, occasion: str = "", kind: str = "cpu"
    ) -> None:
        self.home = Path(home)
        self.policy = policy
        #: the device kind whose history the spreads are read from (``cpu``, ``cuda``)
        self.kind = kind
        #: this invocation's occasion in the host's history (its sittings carry it)
        self.occasion = occasion
        #: per kind of figure, this run's moves against the history where they were wider
        #: than its spread allows (read once, at the settle)
        self.shifts: dict[str, object] = {}
        #: per kind of figure and model family, this run's engines measured in every
        #: sitting (the spread between sittings the run itself measured)
        self._sat: dict[str, dict[str, list]] = {"throughput": {}, "speedup": {}}
        #: (cell, batch size, its sittings' records, model family) of every combined result
        self.results: list[tuple[Cell, int, list[dict], str]] = []
        #: (cell, batch size, model family) of every result a single sitting measured
        self.single: list[tuple[Cell, int, str]] = []

    def keep(self, cell: Cell, b: int, family: str) -> None:
        """A result of one sitting, settled at the run's end (:meth:`settle`)."""
        self.single.append((cell, b, family))

    @property
    def pending(self) -> bool:
        """Whether any result waits to be settled."""
        return bool(self.results or self.single)

    def combine(self, cell: Cell, b: int, records: list[dict], family: str) -> dict:
        """The record of ``cell`` at batch size ``b`` from its sittings' ``records`` (in
        order), kept to be settled at the run's end (:meth:`settle`)."""
        self.results.append((cell, b, records, family))
        return self.combined(records, family, _group(cell, b))

    def combined(
        self, records: list[dict], family: str, group: str = "", settled: bool = False
    ) -> dict:
        """The record of a batch size measured in ``records`` (its sittings, in order):
        :func:`mlflow_ngraph.measure.sittings.combine`, with the spread between sittings
        this run measured so far (this engine's sittings included; ``settled``: the whole
        run's, every engine already in it), else the host's; the spread between runs, which
        a run's own sittings cannot see, from the host's history where it has one."""
        from mlflow_ngraph.measure import history
        from mlflow_ngraph.measure import sittings as sit

        if len(records) < 2:
            return records[-1]
        spreads = {}
        for what, by_family in self._sat.items():
            own = sit.engine_sittings(records, what, group)
            if own is not None and not settled:
                by_family.setdefault(family, []).append(own)
            known = history.given_or_measured(
                self.home, what, family, self.policy.rerun_sd, self.kind
            )
            if settled and self.policy.rerun_sd is None:
                known = history.with_shift(known, self.shifts.get(what), family)
            spreads[what] = sit.with_runs(
                sit.run_spread(by_family, family, self.policy.sittings), known
            )
        return sit.combine(records, spreads, self.policy.max_interval)

    def settle(self, journal: Journal, sink: ResultSink) -> None:
        """Every result's re-run interval again: a combined one's from the spread between
        sittings of the whole run (a group measured early had only the engines before it),
        a single sitting's from the host's history with this run in it
        (:meth:`single_settled`): where it changed, journaled and sent to the cell's run,
        and its row shows it."""
        self.look_at_state()
        settled = [
            (cell, b, self.combined(records, family, _group(cell, b), settled=True))
            for cell, b, records, family in self.results
        ]
        spreads: dict[str, dict] = {}  # each family's spreads read once, not per result
        for cell, b, family in self.single:
            before = journal.cell(cell.key).measured.get(b)
            if before is not None:
                settled.append((cell, b, self.single_settled(before, family, spreads)))
        for cell, b, record in settled:
            before = journal.cell(cell.key).measured.get(b)
            if before is None or before.get("status") != record["status"]:
                continue
            if record.get("rerun") == before.get("rerun") and all(
                record["metrics"].get(k) == before["metrics"].get(k) for k in S.RERUN_METRICS
            ):
                continue
            record = {**before, "metrics": {**before["metrics"], **{
                k: record["metrics"][k] for k in S.RERUN_METRICS if k in record["metrics"]
            }}, "rerun": record.get("rerun")}  # fmt: skip
            sink.rerun(cell, b, record)

    def single_settled(self, record: dict, family: str, known: dict | None = None) -> dict:
        """A single sitting's ``record`` with its re-run intervals from the host's spread
        as its history holds it now (this run's figures in it), each figure's where its
        kind has a spread (a paired row's throughput can have one while its speedup has
        none yet); the record as it was where ``--rerun-sd`` fixed the spread. ``known``:
        the spreads already read, by family (filled here)."""
        from mlflow_ngraph.measure import history
        from mlflow_ngraph.measure import sittings as sit

        if self.policy.rerun_sd is not None:
            return record
        self.look_at_state()
        known = {} if known is None else known
        if family not in known:  # each read scans the whole history
            known[family] = {
                what: history.with_shift(
                    history.spread(self.home, what, family, self.kind),
                    self.shifts.get(what),
                    family,
                )
                for what in sit.FIELDS
            }
        spreads = known[family]
        got = {what: sit.figure(record, what) for what in sit.FIELDS}
        out = copy.deepcopy(record)
        metrics = out["metrics"]
        for what, (_, _, _, names) in sit.FIELDS.items():
            value, h = got[what] or (None, None)
            interval = history.rerun_interval(value, h, spreads[what]) if value else None
            if interval is not None:  # each figure on its own spread, where it has one
                metrics[names[0]], metrics[names[1]] = interval[:2]
        chosen = spreads["speedup" if got["speedup"] else "throughput"]
        if chosen is not None:
            one = chosen.of_mean(1)
            metrics["rerun_sd"], metrics["rerun_df"] = one.sd, float(min(one.df, 10**6))
            out["rerun"] = chosen.words()
        return out

    def look_at_state(self) -> None:
        """This run's figures against the host's history (:attr:`shifts`), each kind where
        they moved more than its spread allows said in one line."""
        from mlflow_ngraph.measure import history

        if self.policy.rerun_sd is not None or not self.occasion or self.shifts:
            return  # fixed by --rerun-sd, no occasion to tell this run by, or looked at
        for what in ("speedup", "throughput"):
            shift = history.run_against_history(self.home, what, self.occasion, self.kind)
            self.shifts[what] = shift
            if shift is not None:
                log.warning("%s", shift.words())


def _group(cell: Cell, b: int) -> str:
    """The group ``cell`` is measured in at batch size ``b``: its model there (every
    compiler's engine of it shares a sitting's baseline and host)."""
    return f"{cell.model.label}/bs{b}"
