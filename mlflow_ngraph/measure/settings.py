"""How one cell is measured: the scenario, the protocol, warm-up, repetitions and the
measured time's floor and cap (every one logged as a param of the cell's run)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from mlflow_ngraph.errors import NgraphError

SCENARIOS = ("throughput", "latency")
#: how a cell is timed: ``rounds`` (windows interleaved with the model's other engines, the
#: stop rule, paired speedups: measure/rounds.py) or ``paper`` (exactly ``repetitions``
#: single inferences after ``warmup``, one request at a time, each timed: the paper's
#: protocol, its figures the mean and standard deviation of b / t_i: measure/paper.py)
PROTOCOLS = ("rounds", "paper")
#: warm-up repetitions before measuring: enough for lazy allocation, JIT specialisation and
#: CPU frequency to settle on the models of the paper (pyperf uses 1 warm-up per process, but
#: runtimes such as OpenVINO and inductor keep specialising over the first few calls).
DEFAULT_WARMUP = 10
#: the paper measures 100 repetitions per configuration.
DEFAULT_REPETITIONS = 100
#: a floor on the measured window so very fast models are measured over enough time for the
#: CPU-usage sampler and the clock resolution to be meaningful.
DEFAULT_MIN_DURATION_S = 1.0


def sitting_floors(repetitions: int, min_duration_s: float, sittings: int) -> tuple[int, float]:
    """One sitting's share of the ``--repetitions`` and ``--min-duration`` floors, of
    ``sittings`` (the groups measure to it, the estimate prices it)."""
    return math.ceil(repetitions / sittings), min_duration_s / sittings


@dataclass
class MeasureSettings:
    """How one cell is measured (all logged as params)."""

    scenario: str = "throughput"
    warmup: int = DEFAULT_WARMUP
    repetitions: int = DEFAULT_REPETITIONS
    min_duration_s: float = DEFAULT_MIN_DURATION_S
    #: hard cap on one cell's measured window; ``None`` for no cap
    max_duration_s: float | None = None
    protocol: str = "rounds"

    def key(self) -> dict[str, Any]:
        """What a cell's key and a spec's hash take of these settings: the default protocol
        left out, so that a spec that does not set one keeps the keys of earlier runs."""
        data = dict(self.__dict__)
        if data["protocol"] == "rounds":
            data.pop("protocol")
        return data

    def per_sitting(self, sittings: int) -> MeasureSettings:
        """The floors each of ``sittings`` sittings of a cell meets (``--sittings N``): the
        run's figure rests on every sitting's windows, so each takes its share of the
        requests and seconds, as each takes its share of the default cap
        (:meth:`mlflow_ngraph.run.worker.CellTask.policy`). Every sitting still warms up in
        full (a fresh process) and takes the rounds its own interval needs; an explicit
        ``--max-duration`` stays each sitting's cap."""
        if sittings <= 1:
            return self
        repetitions, min_duration_s = sitting_floors(
            self.repetitions, self.min_duration_s, sittings
        )
        return replace(self, repetitions=repetitions, min_duration_s=min_duration_s)

    def validate(self) -> None:
        if self.scenario not in SCENARIOS:
            raise NgraphError(f"scenario {self.scenario!r} is not one of: {', '.join(SCENARIOS)}")
        if self.protocol not in PROTOCOLS:
            raise NgraphError(f"protocol {self.protocol!r} is not one of: {', '.join(PROTOCOLS)}")
        if self.protocol == "paper" and self.scenario != "latency":
            raise NgraphError(
                "protocol paper times one request at a time, so its engines are built for "
                "that: use --scenario latency with it (the paper spec does)"
            )
        if self.warmup < 0:
            raise NgraphError(f"warmup must be >= 0, got {self.warmup}")
        if self.repetitions < 1:
            raise NgraphError(f"repetitions must be >= 1, got {self.repetitions}")
        if not (math.isfinite(self.min_duration_s) and self.min_duration_s >= 0):
            raise NgraphError(
                f"min-duration must be a finite number of seconds >= 0, got {self.min_duration_s}"
            )
        if self.max_duration_s is not None:
            if not (math.isfinite(self.max_duration_s) and self.max_duration_s > 0):
                raise NgraphError(
                    "max-duration must be a finite number of seconds > 0, got "
                    f"{self.max_duration_s}"
                )
            if self.max_duration_s < self.min_duration_s:
                raise NgraphError(
                    f"max-duration {self.max_duration_s:g} s is below min-duration "
                    f"{self.min_duration_s:g} s: raise --max-duration or lower --min-duration"
                )
