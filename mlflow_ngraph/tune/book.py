"""A tune's trials in the order they were asked, and what the search reads from them."""

from __future__ import annotations

from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tune.settings import TuneSettings
from mlflow_ngraph.tune.trials import Trial, TuneJournal


class TrialBook:
    """Every trial of a tune, the search's and the finalists', in the order asked: each
    numbered after those before it and in the tune journal before it is measured; which
    configurations a batch size has measured, and its best ones."""

    def __init__(self, settings: TuneSettings) -> None:
        self.settings = settings
        self.trials: list[Trial] = []

    def new(self, b, name, flags, params, group, stage="search", offset=0) -> Trial:
        """A trial numbered after every trial so far (``offset``: those of its own group
        not added yet)."""
        return Trial(len(self.trials) + offset, b, name, flags, params, group, stage)

    def add(self, batch: list[Trial], journal: TuneJournal) -> None:
        """Asked trials: their lines in the tune journal (before they are measured), then
        here."""
        for trial in batch:
            journal.record(trial)
        self.trials.extend(batch)

    def next_group(self) -> int:
        return max((t.group for t in self.trials), default=-1) + 1

    def known(self, b: int) -> dict[tuple[str, str], Trial]:
        """The configurations the search has asked at ``b``, each with its trial."""
        return {t.config(): t for t in self.trials if t.batch_size == b and t.stage == "search"}

    def cap_reached(self, in_batch: int) -> bool:
        """Whether ``--trials`` is reached with ``in_batch`` trials of a group not added yet."""
        cap = self.settings.max_trials
        done = sum(t.stage == "search" for t in self.trials)
        return cap is not None and done + in_batch >= cap

    def best(self, b: int, stage: str = "search") -> Trial | None:
        """The best feasible trial at ``b`` by the first objective's paired figure."""
        pool = self._ranked(b, stage)
        if not pool:
            return None
        return (max if self.settings.higher else min)(pool, key=lambda t: t.values[0])

    def top(self, b: int, defaults: set[tuple[str, str]]) -> list[Trial]:
        """The finalists at ``b``: the best few distinct configurations of the search, then
        the ``defaults`` (configurations) it measured that are not among them."""
        pool = self._ranked(b, "search")
        pool.sort(key=lambda t: t.values[0], reverse=self.settings.higher)
        out: list[Trial] = []
        for trial in pool:
            if trial.config() not in {t.config() for t in out}:
                out.append(trial)
            if len(out) == self.settings.finalists:
                break
        # every compiler's defaults go on to the final round too: a search figure was
        # paired with its own group's identity, minutes from another's, and a default that
        # read low there must still be beaten head to head (the tune never ends worse than
        # the defaults it measured)
        for trial in pool:
            if trial.config() in defaults and trial.config() not in {t.config() for t in out}:
                out.append(trial)
        return out

    def _ranked(self, b: int, stage: str) -> list[Trial]:
        """The trials at ``b`` of ``stage`` that can be ranked: feasible, with figures."""
        return [
            t
            for t in self.trials
            if t.batch_size == b and t.stage == stage and t.feasible and t.values
        ]

    def compiled(self, trial: Trial) -> Trial | None:
        """The trial whose cell built ``trial``'s engine: itself, or (its engine from the
        cache, as a finalist's) the search trial of its configuration that compiled it."""
        if not trial.metrics.get(S.M_CACHE_HIT):
            return trial
        return next(
            (
                t
                for t in self.trials
                if t.stage == "search"
                and t.batch_size == trial.batch_size
                and t.config() == trial.config()
                and not t.metrics.get(S.M_CACHE_HIT)
            ),
            None,
        )
