"""A tune's final round: the best few configurations per batch size, and every compiler's
defaults, measured again together, longer and to a tighter precision, to call the winner."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tune.book import TrialBook
from mlflow_ngraph.tune.figures import paired_values
from mlflow_ngraph.tune.groups import GroupBenchmark
from mlflow_ngraph.tune.trials import Trial, TuneJournal


class FinalRound:
    """The finalists of every batch size, each batch size's measured as one group (their
    own cells: a longer cap is another measurement setting), then judged on their figures
    and the constraints.

    Args:
        precision / max_s: the finalists' stop rule and cap on each engine's windows.
    """

    def __init__(
        self,
        book: TrialBook,
        bench: GroupBenchmark,
        journal: TuneJournal,
        say: Callable[[str], None],
        *,
        precision: float,
        max_s: float,
        remeasure: str | None = None,
    ) -> None:
        self.book = book
        self.bench = bench
        self.journal = journal
        self.say = say
        self.precision = precision
        self.max_s = max_s
        #: ``unstable`` / ``all``: finalists measured before are measured again, in place
        self.remeasure = remeasure

    def run(self, group: int, defaults: set[tuple[str, str]]) -> None:
        """The finalists measured from group ``group`` on, one group per batch size
        (``defaults``: every compiler's default configuration, a finalist where measured);
        a resumed tune measures only what its finalists lack."""
        settings = self.book.settings
        finals = [t for t in self.book.trials if t.stage == "final"]
        for b in settings.batch_sizes:
            chosen = self.book.top(b, defaults)
            if not chosen:
                continue
            done = [t for t in finals if t.batch_size == b]
            if done and {t.config() for t in done} == {t.config() for t in chosen}:
                batch = done  # a resumed tune: the same finalists
            else:
                batch = [
                    self.book.new(b, t.compiler, t.flags, t.params, group, "final", i)
                    for i, t in enumerate(chosen)
                ]
                self.book.add(batch, self.journal)
            measure = replace(settings.measure, max_duration_s=self.max_s)
            if not self.bench.read(batch, b):
                self.say(f"[tune] bs{b}: measuring the {len(batch)} finalist(s) again, together")
                self.bench.measure(batch, b, group, measure, self.precision)
                self.bench.read(batch, b)
            elif self._remeasured(batch):
                self.say(
                    f"[tune] bs{b}: measuring the {len(batch)} finalist(s) again in their own "
                    f"runs, with their baseline (--remeasure {self.remeasure})"
                )
                self.bench.measure(batch, b, group, measure, self.precision, self.remeasure)
                self.bench.read(batch, b)
            for trial in batch:
                self._judge(trial)
            group += 1

    def _remeasured(self, batch: list[Trial]) -> bool:
        """Whether ``--remeasure`` asks for this batch size's final round again: ``all``,
        or ``unstable`` where a finalist's figures are UNSTABLE (the winner is called on
        them; the search's trials only steered the search and are left as they are)."""
        if self.remeasure == "all":
            return True
        return self.remeasure == "unstable" and any(t.stable is False for t in batch)

    def _judge(self, trial: Trial) -> None:
        """A finalist's figures paired with its group's identity, and whether it is
        valid and meets every constraint."""
        settings = self.book.settings
        trial.values = paired_values(trial, settings.objectives, self.bench.references)
        trial.feasible = (
            trial.status == S.STATUS_OK
            and trial.values is not None
            and settings.constraints.miss(trial.metrics) is None
        )
