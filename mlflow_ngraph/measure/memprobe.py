"""The host's memory speed, read between rounds.

A shared host's cache and memory are other tenants' too. On the 2-core EPYC VM this tool is
developed on (32 MB of L3 shared with the VM's neighbours), sums over 32 MB and 512 MB ran
at two speeds, 1.5x apart, in stretches of 1-25 s that came and went over minutes, with no
other process, no steal and every core ours; an in-cache matrix product did not move.
An engine slows with it as far as its work streams memory, by its own amount: the attention
block's ONNX Runtime speedup over eager read 1.46-1.50x in the slow state and 1.76-1.78x in
the fast one (docs/measurement.md). Neither the CPU screen nor the pairing sees it.

So the coordinator of a group reads the memory's speed before the first round and after
each one: the best of :data:`PROBE_PASSES` sums over :data:`PROBE_MB` MB (past the L3, so
each sum streams memory: 2 ms a pass here), in its own process while every worker is
stopped. A round's reading is the lower of the two around it. A round whose reading is
under :data:`MEMORY_SLOW` of the host's fast speed (:data:`REFERENCE_Q` of every reading
this process took: the runner's whole run, not one group) met the slow state; the rounds
(:mod:`~mlflow_ngraph.measure.rounds`) compare each figure over the slow rounds with the
rest, and a figure that differs beyond both intervals is UNSTABLE and names the cause.

The reading is opt-in: ``MLFLOW_NGRAPH_MEMORY_PROBE=1`` turns it on. On this host the state
that flips the attention block turned out to be another one (docs/measurement.md: the cost
of the two threads' meeting at every operator, which a one-thread stream does not see: 0.96x
in the engine's slow rounds), while the probe evicts the L3 before each round's first
window; until a reading of that state replaces it, no run pays for a reading that did not
mark a figure here.
"""

from __future__ import annotations

import os
import time

import numpy as np

#: the probe sums this many MB of float64 (past a 32 MB L3: each pass streams memory)
PROBE_MB = 64
#: passes of a reading; the fastest counts (a pass the scheduler interrupted reads slow)
PROBE_PASSES = 2
#: a round read under this share of the host's fast speed met the slow state (here the two
#: states were 1.5x apart, the slow one at 0.6-0.7 of the fast one's median; the fast
#: state's own readings spread 0.84-1.1 of their median)
MEMORY_SLOW = 0.75
#: the host's fast speed: this quantile of the readings the process took so far
REFERENCE_Q = 0.9
#: readings before a fast speed is named (fewer: no round is judged slow)
REFERENCE_MIN = 12
#: readings kept for the reference (a long run's oldest drop out)
KEEP = 4096
ENV = "MLFLOW_NGRAPH_MEMORY_PROBE"


class MemoryProbe:
    """Reads the memory's speed (GB/s) on demand and keeps the readings for the reference."""

    def __init__(self, mb: int = PROBE_MB, passes: int = PROBE_PASSES) -> None:
        self.mb, self.passes = mb, passes
        self._data: np.ndarray | None = None
        self.readings: list[float] = []

    def read(self) -> float | None:
        """The fastest of the passes, in GB/s (None where the array cannot be had)."""
        if self._data is None:
            try:
                self._data = np.ones(self.mb * 2**20 // 8)
            except MemoryError:
                return None
            self._data.sum()  # its pages faulted in: not a reading
        best = min(self._pass() for _ in range(self.passes))
        gbs = self._data.nbytes / best / 1e9 if best > 0 else None
        if gbs is not None:
            self.readings = [*self.readings[-(KEEP - 1) :], gbs]
        return gbs

    def _pass(self) -> float:
        began = time.perf_counter()
        self._data.sum()
        return time.perf_counter() - began

    def reference(self) -> float | None:
        """The host's fast speed as this process has seen it (None: too few readings)."""
        if len(self.readings) < REFERENCE_MIN:
            return None
        return float(np.quantile(self.readings, REFERENCE_Q))


_probe: MemoryProbe | None = None


def coordinator_probe() -> MemoryProbe | None:
    """This process's probe (one per process: its readings are the reference), ``None``
    unless :data:`ENV` turns it on."""
    global _probe
    if os.environ.get(ENV, "").strip().lower() not in ("1", "on", "true", "yes"):
        return None
    if _probe is None:
        _probe = MemoryProbe()
    return _probe


def states(readings: list[float | None], reference: float | None) -> list[bool | None]:
    """Each round's state from its reading: True where it met the slow state, False where
    not, None where it has no reading or no reference is known yet."""
    if reference is None or reference <= 0:
        return [None] * len(readings)
    return [None if r is None else bool(r < MEMORY_SLOW * reference) for r in readings]
