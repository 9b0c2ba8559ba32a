"""The Server scenario's search: the highest Poisson arrival rate (``server_target_qps``)
whose LoadGen run is VALID (its p99 under the bound, its duration, query count and early
stopping met). Each step is one whole LoadGen run; the search grows the rate from its start
until a run fails, shrinks it until one holds, then bisects between the highest rate that
held and the lowest that failed. Pure logic: the caller runs LoadGen."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: growth and shrink factors before the bracket is found: a start from the engine's
#: measured capacity is within 2x of the answer, so 1.5 finds it in one or two steps
GROW = 1.5
SHRINK = 0.5
#: the bracket is narrow enough once its ends are within this ratio (3%: below the
#: run-to-run spread of a 60 s Server run on a shared host)
PRECISION = 0.03
#: the duration asked for is the needed queries' time at the step's rate, with this margin
#: (a Poisson count over a fixed time varies; a run just long enough may fall short again)
DURATION_MARGIN = 1.1


@dataclass
class Step:
    qps: float
    valid: bool
    #: the latency held but LoadGen's early stopping asked for this many queries, more than
    #: the run had: a lower rate has fewer still, so the run must be longer, not slower
    needed: int | None = None

    @property
    def too_short(self) -> bool:
        return self.needed is not None


def duration_for(queries: int, qps: float) -> int:
    """Whole seconds in which ``queries`` arrive at ``qps``, with a margin."""
    return math.ceil(DURATION_MARGIN * queries / max(qps, 1e-9))


@dataclass
class ServerSearch:
    """Where the search stands; :meth:`next_qps` is the next rate to run, None when done."""

    start_qps: float
    steps: int
    precision: float = PRECISION
    #: below this rate the engine is idle most of the time: a p99 over the bound there is
    #: the engine's own latency, which no lower rate shortens (0: no floor)
    floor_qps: float = 0.0
    done: list[Step] = field(default_factory=list)
    stop_reason: str = ""

    @property
    def held(self) -> float | None:
        """The highest rate that held."""
        rates = [s.qps for s in self.done if s.valid]
        return max(rates) if rates else None

    @property
    def failed(self) -> float | None:
        """The lowest rate above every rate that held that failed (the bracket's top)."""
        held = self.held or 0.0
        rates = [s.qps for s in self.done if not s.valid and s.qps > held]
        return min(rates) if rates else None

    def report(self, qps: float, valid: bool, needed: int | None = None) -> None:
        """A step's verdict; ``needed``: the queries early stopping asked for when the latency
        held but the run was too short for it."""
        self.done.append(Step(qps, valid, needed))

    def next_qps(self) -> float | None:
        if len(self.done) >= self.steps:
            self.stop_reason = self.stop_reason or f"the {self.steps} steps were used"
            return None
        if not self.done:
            return self.start_qps
        last = self.done[-1]
        if last.needed is not None:
            self.stop_reason = (
                f"the p99 held at {last.qps:.1f} QPS but LoadGen's early stopping needs "
                f"{last.needed} queries there: raise --min-duration to at least "
                f"{duration_for(last.needed, last.qps)} s"
            )
            return None
        held, failed = self.held, self.failed
        if held is None and last.qps * SHRINK < self.floor_qps:
            self.stop_reason = (
                f"the p99 did not hold even at {last.qps:.1f} QPS, with the engine idle most "
                "of the time: its own latency is over the bound, and no lower rate holds it"
            )
            return None
        if held is None:
            return last.qps * SHRINK
        if failed is None:
            return held * GROW
        if failed / held - 1 <= self.precision:
            self.stop_reason = f"bracketed within {100 * self.precision:g}%"
            return None
        return (held * failed) ** 0.5  # geometric: the bracket's ratio halves in log
