"""A group of a tune's trials measured as one benchmark of the model at one batch size, and
each trial's figures read back from the benchmark journal (the one source a resume and the
store read: results are never copied into the tune journal)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mlflow_ngraph.measure.settings import MeasureSettings
from mlflow_ngraph.plan.config import CompilerSpec, RunPolicy, Spec
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tune.settings import TuneSettings
from mlflow_ngraph.tune.trials import Trial, TuneJournal, flags_key
from mlflow_ngraph.variables import ENV_PARENT_RUN, ENV_TUNE_RUN, environment


class GroupBenchmark:
    """The benchmarks of a tune's groups, their cells children of the tune's run ``run_id``
    in ``experiment``; the identity references the trials were paired with (each also a
    line of the tune ``journal``) and the identity cells behind them.

    Args:
        max_interval / stable_retries: the stability rule of every trial's cell.
        final_max_s: the finalists' cap on each engine's windows (a setting of their cells).
    """

    def __init__(
        self,
        settings: TuneSettings,
        home: Path,
        tracking_uri: str,
        experiment: str,
        run_id: str,
        journal: TuneJournal,
        *,
        max_interval: float,
        stable_retries: int,
        final_max_s: float,
    ) -> None:
        self.settings = settings
        self.home = home
        self.uri = tracking_uri
        self.experiment = experiment
        self.run_id = run_id
        self.tune_journal = journal
        self.max_interval = max_interval
        self.stable_retries = stable_retries
        self.final_max_s = final_max_s
        #: the identity cells the trials' speedups rest on (search and final settings)
        self.identity_keys: set[str] = set()
        self.references: dict[tuple[int, int], dict] = {}  # (group, b) -> identity's record
        self.journal = None  # the benchmark journal, once a group ran or was read

    def measure(
        self, batch, b, group, measure: MeasureSettings, precision, remeasure: str | None = None
    ) -> None:
        """The group's cells measured as one benchmark of the model at ``b``, nested under
        the tune's run, each paired with identity in the same rounds (``remeasure``: the
        group's stored results measured again, in their own cells: ``unstable``/``all``)."""
        from mlflow_ngraph.run.runner import Runner, plan

        unique: dict[tuple[str, str], Trial] = {}
        for trial in batch:
            unique.setdefault(trial.config(), trial)
        compilers = [CompilerSpec("identity")] + [
            CompilerSpec(t.compiler, {k: v for k, v in t.flags.items() if v is not None})
            for t in unique.values()
        ]
        work = plan(self._spec(compilers, b, measure), self.home)
        if batch and batch[0].stage == "final":  # its own cells: the run names say so
            for cell in work.cells:
                cell.run_name = f"{cell.run_name} final"
        runner = Runner(
            work,
            self.uri,
            self.home,
            policy=RunPolicy(
                max_interval=self.max_interval,
                stable_retries=self.stable_retries,
                precision=precision,
            ),
            experiment_explicit=True,
            reference=True,
            parent_run=self.run_id,
            remeasure=remeasure,
        )
        with environment({ENV_TUNE_RUN: self.run_id, ENV_PARENT_RUN: None, "MLFLOW_RUN_ID": None}):
            runner.run()
        identity = work.cells[0]
        self.identity_keys.add(identity.key)
        keys = {(c.compiler.name, flags_key(c.flags)): c.key for c in work.cells[1:]}
        for trial in batch:
            trial.cell_key = keys.get(trial.config(), "")
        reference = runner.references.get(b) or runner.journal.cell(identity.key).measured.get(b)
        if reference:
            self.references[(group, b)] = reference
            metrics = reference.get("metrics") or {}
            self.tune_journal.append("reference", group=group, batch_size=b, metrics=metrics)
        self.journal = runner.journal

    def _spec(self, compilers: list[CompilerSpec], b: int, measure: MeasureSettings) -> Spec:
        """The benchmark spec of a group (or of one trial, for its cell key): the model at
        ``b`` in the tune's scenario, into the tune's experiment."""
        return Spec(
            models=[self.settings.model],
            compilers=compilers,
            batch_sizes=[b],
            device=self.settings.device,
            experiment=self.experiment,
            measure=replace(measure, scenario=self.settings.scenario),
            tracking_uri=self.uri,
        )

    def read(self, batch: list[Trial], b: int) -> bool:
        """Each trial's figures from the benchmark journal; False when one is missing (a
        group a kill cut short)."""
        from mlflow_ngraph.tracking.journal import Journal
        from mlflow_ngraph.tracking.mlflow_log import device_name

        journal = self.journal or Journal.for_target(
            self.home, self.uri, self.experiment, device_name(self.settings.device)
        )
        self.journal = journal
        complete = True
        for trial in batch:
            if not trial.cell_key:
                trial.cell_key = self._cell_key(trial)
            state = journal.cell(trial.cell_key)
            if b in state.measured:
                record = state.measured[b]
                trial.status = record["status"]
                trial.metrics = dict(record["metrics"])
                trial.stable = (record.get("stability") or {}).get("stable")
                trial.run_id = state.run_id
            elif b in state.failed:
                trial.status, trial.reason = S.STATUS_FAILED, state.failed[b]
                trial.run_id = state.run_id
            else:
                complete = False
        return complete

    def _cell_key(self, trial: Trial) -> str:
        """The cell key a trial's benchmark gives its cell (without running it)."""
        from mlflow_ngraph.run.runner import plan

        measure = self.settings.measure
        if trial.stage == "final":
            measure = replace(measure, max_duration_s=self.final_max_s)
        spec = self._spec(
            [CompilerSpec(trial.compiler, {k: v for k, v in trial.flags.items() if v is not None})],
            trial.batch_size,
            measure,
        )
        work = plan(spec, self.home)
        cell = next(c for c in work.cells if c.compiler.name == trial.compiler)
        self.identity_keys.add(cell.baseline)
        return cell.key

    def cell_runs(self, trials: list[Trial]) -> list[str]:
        """The runs of every trial's cell and of the identity cells they rest on: what the
        tune's results index holds (``compare`` needs the baseline with the trials)."""
        runs = {t.run_id for t in trials if t.run_id}
        if self.journal is not None:
            runs |= {self.journal.cell(k).run_id for k in self.identity_keys} - {None}
        return sorted(runs)
