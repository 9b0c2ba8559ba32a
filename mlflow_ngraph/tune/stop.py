"""When a tune's search stops: its wall clock over every invocation, and the rules that end
the search (the trial count, the budget, a space Optuna has exhausted, patience)."""

from __future__ import annotations

import time

from mlflow_ngraph.tune.settings import TuneSettings
from mlflow_ngraph.tune.trials import Trial, TuneJournal

#: an improvement smaller than this share of the best is not one (patience counts on)
IMPROVEMENT = 0.01


class Budget:
    """A tune's wall clock over every invocation: the seconds its groups took (each counted
    once, as the tune journal has them) and the time since the last one ended."""

    def __init__(self, budget_s: float | None) -> None:
        self.budget_s = budget_s
        self.started = time.monotonic()
        self.spent_before = 0.0

    def spent(self) -> float:
        return self.spent_before + (time.monotonic() - self.started)

    def left(self) -> float | None:
        return None if self.budget_s is None else self.budget_s - self.spent()

    def charge(self, journal: TuneJournal, group: int, seconds: float) -> None:
        """The group's seconds into the journal, counted once in the budget."""
        journal.append("spent", seconds=seconds, group=group)
        self.spent_before += seconds
        self.started = time.monotonic()


def group_cost(journal: TuneJournal) -> float:
    """What one more group is expected to take: the mean of the groups so far."""
    seconds = list(journal.group_seconds().values())
    return sum(seconds) / len(seconds) if seconds else 0.0


def reason_to_stop(
    settings: TuneSettings,
    trials: list[Trial],
    exhausted: set[int],
    budget: Budget,
    journal: TuneJournal,
) -> str:
    """Why the search ends before its next group, ``""`` while it goes on: ``trials``,
    ``budget`` (the next group and the finalists would overrun it), ``space_exhausted``
    (at every batch size in ``exhausted``) or ``no_improvement`` (patience)."""
    s = settings
    searched = [t for t in trials if t.stage == "search"]
    if s.max_trials is not None and len(searched) >= s.max_trials:
        return "trials"
    left = budget.left()
    # the next group, then the finalists: about one group per batch size
    if left is not None and left < group_cost(journal) * (1 + len(s.batch_sizes)):
        return "budget"
    if exhausted >= set(s.batch_sizes):
        return "space_exhausted"
    if stale(trials, s.higher) >= s.patience:
        return "no_improvement"
    return ""


def stale(trials: list[Trial], higher: bool) -> int:
    """Trials in a row (in the order measured) that improved no batch size's best
    (``higher``: the first objective's figure is better higher)."""
    best: dict[int, float] = {}
    count = 0
    for trial in trials:
        if trial.stage != "search" or trial.status is None:
            continue
        value = trial.values[0] if trial.values and trial.feasible else None
        score = None if value is None else (value if higher else -value)
        previous = best.get(trial.batch_size)
        if score is not None and (
            previous is None or score > previous + IMPROVEMENT * abs(previous)
        ):
            best[trial.batch_size] = score
            count = 0
        else:
            count += 1
    return count
