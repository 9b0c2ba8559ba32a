"""Optuna's side of a tune: one TPE study per batch size, asked for configurations and told
the paired figures measured for them."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tune.figures import References, paired_values
from mlflow_ngraph.tune.settings import OBJECTIVES, TuneSettings
from mlflow_ngraph.tune.space import COMPILER_PARAM, SearchSpace
from mlflow_ngraph.tune.trials import Trial, flags_key

log = logging.getLogger(__name__)

#: proposals in a row that were all measured before: the space is exhausted
MAX_ASKS = 30


class Studies:
    """One study per batch size (the compiler its first parameter, each compiler's knobs
    after it), the trials it asked that wait for their figures, and the batch sizes whose
    space it has exhausted."""

    def __init__(self, settings: TuneSettings, space: SearchSpace) -> None:
        self.settings = settings
        self.space = space
        self.studies = {b: self._study(b) for b in settings.batch_sizes}
        self.live: dict[int, Any] = {}  # trial number -> the Optuna trial asked for it
        self.exhausted: set[int] = set()  # batch sizes whose space Optuna has exhausted

    def _study(self, b: int):
        import optuna

        directions = [OBJECTIVES[o] for o in self.settings.objectives]
        sampler = optuna.samplers.TPESampler(
            seed=self.settings.seed + b,
            multivariate=True,
            group=True,
            constant_liar=True,  # the trials of one group are asked before any is told
            n_startup_trials=min(8, max(2, self.space.size() // 4)),
        )
        return optuna.create_study(directions=directions, sampler=sampler)

    def proposals(
        self, b: int, known: dict[tuple[str, str], Trial], batch: list[Trial]
    ) -> Iterator[tuple[str, dict[str, Any], Any]]:
        """Optuna's next configurations at ``b`` not in ``batch`` (the group so far, as its
        asker fills it), each with the Optuna trial that asked it. A configuration measured
        before (``known``) is told its known figure at once and not proposed; after
        :data:`MAX_ASKS` asks the space counts as exhausted at ``b``."""
        import optuna

        study = self.studies[b]
        for _ in range(MAX_ASKS):
            live = study.ask()
            try:
                name, flags = self.space.suggest(live)
            except NgraphError as exc:  # the compiler's own rules refuse the combination
                study.tell(live, state=optuna.trial.TrialState.FAIL)
                log.debug("excluded: %s", exc)
                continue
            config = (name, flags_key(flags))
            if config in {t.config() for t in batch}:
                study.tell(live, state=optuna.trial.TrialState.FAIL)
                continue
            if config in known:  # measured before: its figure, without measuring it again
                self._tell(live, known[config])
                continue
            yield name, flags, live
        self.exhausted.add(b)

    def tell_new(self, trial: Trial, references: References) -> None:
        """Judge a measured trial on its figures paired with its group's identity
        (``references``) and tell Optuna: the trial it asked for, or (a default, a trial of
        an earlier invocation) a trial added with its params."""
        import optuna

        if trial.status is None or trial.stage != "search":
            return
        trial.values = paired_values(trial, self.settings.objectives, references)
        trial.constraints = self.settings.constraints.violations(
            trial.metrics, trial.status == S.STATUS_OK
        )
        trial.feasible = trial.values is not None and all(c <= 0 for c in trial.constraints)
        live = self.live.pop(trial.number, None)
        if live is not None:
            self._tell(live, trial)
            return
        if trial.params is None:
            return  # a default outside the searched values: compared, not told
        state = optuna.trial.TrialState.COMPLETE if trial.values else optuna.trial.TrialState.FAIL
        frozen = optuna.trial.create_trial(
            params=trial.params,
            distributions=self._distributions(trial.params),
            values=trial.values or None,
            state=state,
            user_attrs={"cell_key": trial.cell_key},
            # constrained TPE (Optuna 5): a trial with a value > 0 is infeasible
            constraints={f"c{i}": value for i, value in enumerate(trial.constraints)},
        )
        self.studies[trial.batch_size].add_trial(frozen)

    def _tell(self, live, trial: Trial) -> None:
        """Tell Optuna's asked trial ``live`` the figures of ``trial``."""
        import optuna

        study = self.studies[trial.batch_size]
        if not trial.values:
            study.tell(live, state=optuna.trial.TrialState.FAIL)
            return
        for i, value in enumerate(trial.constraints or []):
            live.set_constraint(f"c{i}", value)
        study.tell(live, trial.values)

    def _distributions(self, params: dict[str, Any]):
        from optuna.distributions import CategoricalDistribution

        out = {}
        for name in params:
            if name == COMPILER_PARAM:
                out[name] = CategoricalDistribution(self.space.compilers)
                continue
            compiler, _, knob = name.partition(".")
            space = self.space.spaces[compiler]
            choices = next(k.choices for k in space.knobs if k.name == knob)
            out[name] = CategoricalDistribution(list(choices))
        return out
