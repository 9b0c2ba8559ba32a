"""``mlflow-ngraph tune``: the fastest verified configuration of a model on a device, found
by Optuna across every compiler and its knobs, each trial a benchmark cell.

How a tune runs:

1. **Groups of trials.** Optuna's TPE sampler (one study per batch size, the compiler its
   first parameter, each compiler's knobs after it: :mod:`.space`) asks for a few
   configurations. They are measured together as one benchmark of the model at that batch
   size (:class:`mlflow_ngraph.run.runner.Runner`): each in its own worker, interleaved in
   rounds with an identity engine that stays warm for the group, outputs checked, engines
   cached, every cell a child of the tune's run. Optuna is told the **paired** figure (the
   speedup over identity from the same rounds), never an absolute throughput measured
   minutes from another: on a drifting host that would rank the host.
2. **Defaults first.** Every compiler's default configuration, together in the first group
   of every batch size: the tune measures what it must beat, in one set of rounds.
3. **Stop** on the budget (wall clock over every invocation of the same tune, the next group
   and the finalists reserved), the trial count, ``patience`` trials in a row that improved
   no batch size's best by over 1%, or when Optuna proposes only what was measured.
4. **Finalists.** The best few per batch size, and every compiler's defaults, are measured
   again in one group, longer and to a tighter precision; the winner's lead over the next
   must clear both intervals, or the tune says it is a tie.
5. A ``kill -9`` loses at most the group in flight: the tune journal says what was asked,
   the benchmark journal what was measured; Optuna's state is rebuilt from them.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from mlflow_ngraph.compilers.base import HostLimits
from mlflow_ngraph.compilers.registry import get_compiler, require_available
from mlflow_ngraph.devices import check_profile_runs_here, get_profile
from mlflow_ngraph.measure.quiet import HostCheck
from mlflow_ngraph.models.registry import validate_model_spec
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tune.book import TrialBook
from mlflow_ngraph.tune.figures import payback
from mlflow_ngraph.tune.finalists import FinalRound
from mlflow_ngraph.tune.groups import GroupBenchmark
from mlflow_ngraph.tune.settings import OBJECTIVE_METRICS, TuneSettings
from mlflow_ngraph.tune.space import SearchSpace, build_space
from mlflow_ngraph.tune.stop import Budget, reason_to_stop
from mlflow_ngraph.tune.studies import Studies
from mlflow_ngraph.tune.trials import Trial, TuneJournal, flags_key
from mlflow_ngraph.tune.tune_run import open_tune_run

log = logging.getLogger(__name__)

#: the finalists' rounds by default (--final-precision, --final-max-duration): a tighter
#: stop rule and a longer cap than the search's
FINAL_PRECISION = 0.01
FINAL_MAX_S = 12.0


class Tune:
    """One tune of ``settings`` into the store at ``tracking_uri``, caches under ``home``:
    it asks (:class:`.studies.Studies`), measures (:class:`.groups.GroupBenchmark`),
    keeps its trials (:class:`.book.TrialBook`) and its clock (:class:`.stop.Budget`),
    and ends with the finalists (:class:`.finalists.FinalRound`).

    Args:
        say: where the live lines go (trials done, the best so far, the time left).
        max_interval / stable_retries: the stability rule of every trial's cell.
        host_check: samples the host before the first group is measured (busy: said,
            waited for or stopped at; the wait is not charged to the budget); None: no look.
    """

    def __init__(
        self,
        settings: TuneSettings,
        home: Path,
        tracking_uri: str,
        say: Callable[[str], None] | None = None,
        stable_retries: int = 1,
        max_interval: float = 0.05,
        precision: float = 0.02,
        experiment_explicit: bool = True,
        final_precision: float = FINAL_PRECISION,
        final_max_s: float = FINAL_MAX_S,
        remeasure: str | None = None,
        host_check: HostCheck | None = None,
    ) -> None:
        self.settings = settings
        #: ``--remeasure``: the final round's stored results measured again, in place
        self.remeasure = remeasure
        self.host_check = host_check
        self.home = Path(home)
        self.uri = tracking_uri
        self.say = say or (lambda text: log.info("%s", text))
        self.stable_retries = stable_retries
        self.max_interval = max_interval
        self.precision = precision
        #: the finalists' stop rule and cap on each engine's windows (their cells' settings)
        self.final_precision = final_precision
        self.final_max_s = final_max_s
        #: the experiment was named by the user (under ``mlflow run`` it must then be the
        #: project run's)
        self.experiment_explicit = experiment_explicit
        self.profile = get_profile(settings.device)
        self.book = TrialBook(settings)
        self.run_id: str | None = None
        self.budget = Budget(settings.budget_s)
        self.stop_reason = ""

    @property
    def trials(self) -> list[Trial]:
        """Every trial asked, in order: the search's, then the finalists'."""
        return self.book.trials

    @trials.setter
    def trials(self, trials: list[Trial]) -> None:
        self.book.trials = trials

    # --- checks before anything runs ------------------------------------------------------
    def prepare(self) -> SearchSpace:
        """Validate everything that can be validated; the search space.

        Raises:
            NgraphError: one line: an unknown model, compiler or knob, an empty space, a
                budget shorter than one trial, an objective the device does not produce.
        """
        s = self.settings
        check_profile_runs_here(self.profile)
        s.validate(self.profile.kind)
        validate_model_spec(s.model.name, s.model.params, self.home)
        entries = []
        for cspec in s.compilers:
            compiler = get_compiler(cspec.name)
            require_available(compiler, self.profile.kind)
            entries.append((compiler, self.profile.compiler_flags.get(cspec.name, {}), cspec.flags))
        host = HostLimits.here(self.profile.kind, s.scenario)
        self.space = build_space(entries, host, s.allow_precision)
        self.journal = TuneJournal(self.home, TuneJournal.name_for(s.key(), self.uri))
        return self.space

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """One invocation of this tune (home, store and search) at a time, as the
        benchmark's: a second copy says so in one line, waits for the first to end, then
        takes what it left (its trials measured, its winner called)."""
        lock = self.journal.lock()

        def waiting(holder: str) -> None:
            self.say(
                f"[tune] another copy of this tune is running ({holder}): waiting for it to "
                "end, then taking what it left (Ctrl-C to stop waiting)"
            )

        lock.acquire(on_wait=waiting)
        try:
            yield
        finally:
            lock.release()

    # --- the search -------------------------------------------------------------------------
    def run(self) -> list[Trial]:
        """Search, then call the winner; every trial is in the store as a cell."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        if not hasattr(self, "space"):
            self.prepare()
        self._open_run()
        asked, self.budget.spent_before, _ = self.journal.load()
        self.bench.references.update(self.journal.references())
        self.studies = Studies(self.settings, self.space)
        self._resume(asked)
        self._look()
        group = self.book.next_group()
        while not self._should_stop():
            b = self.settings.batch_sizes[group % len(self.settings.batch_sizes)]
            batch = [] if b in self.studies.exhausted else self._ask(b, group)
            if batch:
                self._measure_group(batch, b, group)
            group += 1
        defaults = {(name, flags_key(flags)) for name, flags, _ in self.space.defaults()}
        final = FinalRound(
            self.book,
            self.bench,
            self.journal,
            self.say,
            precision=self.final_precision,
            max_s=self.final_max_s,
            remeasure=self.remeasure,
        )
        final.run(group, defaults)
        return self.trials

    def _open_run(self) -> None:
        """The tune's run (found again on a resume), and the benchmark of its groups, their
        cells children of that run."""
        run = open_tune_run(self.settings, self.space, self.uri, self.experiment_explicit)
        self.client, self.experiment_id, self.experiment_name, self.run_id = run
        self.journal.append("run", run_id=self.run_id)
        self.bench = GroupBenchmark(
            self.settings,
            self.home,
            self.uri,
            self.experiment_name,
            self.run_id,
            self.journal,
            max_interval=self.max_interval,
            stable_retries=self.stable_retries,
            final_max_s=self.final_max_s,
        )

    def _resume(self, asked: list[Trial]) -> None:
        """The trials of earlier invocations: measured ones told to Optuna again, the group
        a kill cut short measured first (its measured cells are not measured again)."""
        if not asked:
            return
        self.say(f"[tune] resuming: {len(asked)} trial(s) asked before")
        by_group: dict[int, list[Trial]] = {}
        for trial in asked:
            by_group.setdefault(trial.group, []).append(trial)
        for group, members in sorted(by_group.items()):
            self.trials.extend(members)
            b = members[0].batch_size
            if members[0].stage == "final":
                continue  # the finalists are chosen and measured again at the end
            complete = self.bench.read(members, b)
            # a kill between the group's last result and its reference line: the group's
            # benchmark again measures nothing and takes identity's record from its journal
            unpaired = (group, b) not in self.bench.references and any(
                t.status == S.STATUS_OK for t in members
            )
            if not complete or unpaired:
                began = time.monotonic()
                self.bench.measure(members, b, group, self.settings.measure, self.precision)
                self.bench.read(members, b)
                self.budget.charge(self.journal, group, time.monotonic() - began)
            for trial in members:
                self.studies.tell_new(trial, self.bench.references)

    # --- one group --------------------------------------------------------------------------
    def _ask(self, b: int, group: int) -> list[Trial]:
        """The group's configurations: the defaults not measured yet at ``b`` first, then
        Optuna's. A configuration measured before is told its known figure at once and not
        measured again; when Optuna keeps proposing only those, the space is exhausted."""
        known = self.book.known(b)
        batch: list[Trial] = []
        for name, flags, params in self.space.defaults():  # all in one group: the yardstick
            if (name, flags_key(flags)) not in known and not self.book.cap_reached(len(batch)):
                batch.append(self.book.new(b, name, flags, params, group, offset=len(batch)))
        proposals = self.studies.proposals(b, known, batch)
        while len(batch) < self.settings.per_group and not self.book.cap_reached(len(batch)):
            proposal = next(proposals, None)
            if proposal is None:  # the space is exhausted at b
                break
            name, flags, live = proposal
            trial = self.book.new(b, name, flags, dict(live.params), group, offset=len(batch))
            self.studies.live[trial.number] = live
            batch.append(trial)
        self.book.add(batch, self.journal)
        return batch

    def _measure_group(self, batch: list[Trial], b: int, group: int) -> None:
        began = time.monotonic()
        self.bench.measure(batch, b, group, self.settings.measure, self.precision)
        self.bench.read(batch, b)
        for trial in batch:
            self.studies.tell_new(trial, self.bench.references)
        self.budget.charge(self.journal, group, time.monotonic() - began)
        self._say_progress(batch, b)

    # --- when to stop -----------------------------------------------------------------------
    def spent(self) -> float:
        return self.budget.spent()

    def left(self) -> float | None:
        return self.budget.left()

    def _look(self) -> None:
        """The host sampled, unless the search has nothing left to measure (a resume of a
        finished one does not pay for it); a wait for quiet is not charged to the budget."""
        if self.host_check is None or self._should_stop():
            return
        started = time.monotonic()
        self.host_check.run()
        self.budget.started += time.monotonic() - started

    def _should_stop(self) -> bool:
        self.stop_reason = reason_to_stop(
            self.settings, self.trials, self.studies.exhausted, self.budget, self.journal
        )
        return bool(self.stop_reason)

    def _say_progress(self, batch: list[Trial], b: int) -> None:
        searched = [t for t in self.trials if t.stage == "search" and t.status is not None]
        parts = [f"{t.label}: {describe_figure(t)}" for t in batch]
        best = self.best(b)
        left = self.left()
        when = f"{_duration(left)} left" if left is not None else ""
        cap = f" of {self.settings.max_trials}" if self.settings.max_trials else ""
        self.say(
            f"[tune] {len(searched)}{cap} trial(s) | bs{b}: "
            + "; ".join(parts)
            + (f" | best bs{b}: {best.label} {describe_figure(best)}" if best else "")
            + (f" | {when}" if when else "")
        )

    # --- what the tune's end reads ----------------------------------------------------------
    def best(self, b: int, stage: str = "search") -> Trial | None:
        """The best feasible trial at ``b`` by the first objective's paired figure."""
        return self.book.best(b, stage)

    def cell_runs(self) -> list[str]:
        """The runs of every trial's cell and of the identity cells they rest on: what the
        tune's results index holds (``compare`` needs the baseline with the trials)."""
        return self.bench.cell_runs(self.trials)

    def final_value(self, trial: Trial) -> float | None:
        """The figure a finalist is judged on across batch sizes: the objective's own
        metric (throughput in samples/s, latencies in ms)."""
        metric, _ = OBJECTIVE_METRICS[self.settings.objectives[0]]
        return trial.metrics.get(metric)

    def payback(self, trial: Trial) -> float | None:
        """Samples until ``trial``'s compile is paid back against the identity of its group;
        a finalist (its engine from the cache) takes the compile of its search trial."""
        return payback(trial, self.book.compiled(trial), self.bench.references)


def describe_figure(trial: Trial) -> str:
    """``1.42x [1.38-1.46]``, ``INVALID``, ``FAILED (reason)``."""
    if trial.status is None:
        return "not measured"
    if trial.status == S.STATUS_FAILED:
        return f"FAILED ({trial.reason[:80]})"
    if trial.status != S.STATUS_OK:
        return trial.status
    if trial.speedup is None:
        return "no paired speedup"
    interval = trial.interval
    text = f"{trial.speedup:.2f}x"
    if interval:
        text += f" [{interval[0]:.2f}-{interval[1]:.2f}]"
    if trial.stable is False:
        text += " UNSTABLE"
    return text


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = max(0.0, seconds)
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"
