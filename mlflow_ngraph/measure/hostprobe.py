"""The host's state, read between rounds.

A shared host runs in states no pairing cancels. On the 2-core EPYC VM this tool is developed
on, with no other process, no steal and every core ours, the eager attention block ran at
two speeds 1.6x apart in stretches of seconds to minutes (docs/measurement.md). Each engine
moves by its own amount: eager, TorchScript and ONNX Runtime, which start and join a
parallel region at every operator, lost ~40%; torch.compile, with fewer fused kernels, 22%;
OpenVINO's independent streams nothing. So a speedup over eager is the state's (OpenVINO's
1.6x higher in the slow state), and a group whose rounds met both states gives a figure of
neither. The CPU screen does not see it (each window had both cores) and the pairing does
not cancel it.

What tracked it was the cost of the two threads' meeting: an add of two 64K-float tensors
(just past ATen's grain size, so both threads take half and join at its end) ran 0.61x in
the engine's slow rounds (correlation of logs +0.76-0.87); a one-thread stream over 64 MB
(0.96x) and two-thread sums over 32-512 MB (faster) did not.

So a group's rounds are bracketed by readings of a probe (:data:`ENV` chooses which):

- ``join`` (the default): :func:`join_rate` (:data:`JOIN_ADDS` such adds through PyTorch's
  own intra-op pool, the faster of :data:`PASSES`: ~2 ms), adds per second, read by a
  process of its own that is stopped between readings (``run/isolation.py``): the
  coordinator never imports PyTorch, and in a measured worker the pool's threads spun on
  into that worker's next window;
- ``memory``: the coordinator's own sum over :data:`MEMORY_MB` MB (GB/s): other tenants'
  traffic on the shared cache and memory; it did not track the attention block here;
- ``off``: no reading.

A round's reading is the lower of the two around it. A round read under :data:`SLOW` of the
host's fast state (:data:`REFERENCE_Q` of every reading this process took: the runner's whole
run, not one group) met the slow state; the rounds (:mod:`~mlflow_ngraph.measure.rounds`)
compare each figure over the slow rounds with the rest, and a figure that differs beyond
both intervals is UNSTABLE and names the cause.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)

#: a round read under this share of the host's fast state met the slow state (the attention
#: block's two states: the join 0.61x, the memory 0.6-0.7x; each state's own readings spread
#: 0.84-1.1 of their median)
SLOW = 0.75
#: the host's fast state: this quantile of the readings the process took so far
REFERENCE_Q = 0.9
#: readings before a fast state is named (fewer: no round is judged slow)
REFERENCE_MIN = 12
#: readings kept for the reference (a long run's oldest drop out)
KEEP = 4096
#: passes of a reading; the fastest counts (a pass the scheduler interrupted reads slow)
PASSES = 2
#: the memory probe sums this many MB of float64 (past a 32 MB L3: each pass streams memory)
MEMORY_MB = 64
#: the join probe: adds of two tensors of this many floats (past ATen's grain size of 32,768,
#: so two threads share each add and meet at its end), this many a pass
JOIN_FLOATS = 65536
JOIN_ADDS = 200
ENV = "MLFLOW_NGRAPH_HOST_PROBE"
KINDS = ("join", "memory", "off")
#: what each probe reads, for the words of a verdict: (the reading's name, its state's cause)
WORDS = {
    "join": (
        "the two threads' meeting",
        "the vCPUs' placement: threads that join at every operator pay for it",
    ),
    "memory": ("the memory's speed", "other tenants' traffic on a shared cache and memory"),
}
#: the metric each probe's median reading is logged as (its unit in the name)
READING_METRIC = {"join": "host_join_rate", "memory": "memory_speed_gbs"}


class Probe:
    """Readings of one kind of the host's state, kept for the host's fast state."""

    kind = ""

    def __init__(self) -> None:
        self.readings: list[float] = []

    def read(self) -> float | None:
        value = self._read()
        if value is not None and value > 0:
            self.readings = [*self.readings[-(KEEP - 1) :], value]
            return value
        return None

    def _read(self) -> float | None:
        raise NotImplementedError

    def reference(self) -> float | None:
        """The host's fast state as this process has seen it (None: too few readings)."""
        if len(self.readings) < REFERENCE_MIN:
            return None
        return float(np.quantile(self.readings, REFERENCE_Q))


class MemoryProbe(Probe):
    """The memory's speed (GB/s), read in this process."""

    kind = "memory"

    def __init__(self, mb: int = MEMORY_MB, passes: int = PASSES) -> None:
        super().__init__()
        self.mb, self.passes = mb, passes
        self._data: np.ndarray | None = None

    def _read(self) -> float | None:
        if self._data is None:
            try:
                self._data = np.ones(self.mb * 2**20 // 8)
            except MemoryError:
                return None
            self._data.sum()  # its pages faulted in: not a reading
        best = min(self._pass() for _ in range(self.passes))
        return self._data.nbytes / best / 1e9 if best > 0 else None

    def _pass(self) -> float:
        began = time.perf_counter()
        self._data.sum()
        return time.perf_counter() - began


class JoinProbe(Probe):
    """The threads' meeting (adds per second), read through ``source`` (:meth:`through`):
    a call that has another process run :func:`join_rate`."""

    kind = "join"

    def __init__(self) -> None:
        super().__init__()
        self.source: Callable[[], float | None] | None = None

    def through(self, source: Callable[[], float | None] | None) -> JoinProbe:
        self.source = source
        return self

    def _read(self) -> float | None:
        return self.source() if self.source is not None else None


def join_rate(adds: int = JOIN_ADDS, passes: int = PASSES) -> float | None:
    """Adds per second of two :data:`JOIN_FLOATS`-float tensors through PyTorch's intra-op
    pool, the faster of ``passes``; None where PyTorch is not loaded in this process or its
    pool has one thread (nothing meets). It never imports PyTorch itself: the reading is for
    a process that has (the host reader), never the coordinator."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or torch.get_num_threads() < 2:
        return None
    a, b = _join_operands(torch)
    torch.add(a, b)  # the pool awake: not a reading
    best = float("inf")
    for _ in range(passes):
        began = time.perf_counter()
        for _ in range(adds):
            torch.add(a, b)
        best = min(best, time.perf_counter() - began)
    return adds / best if best > 0 else None


_operands: tuple | None = None


def _join_operands(torch):
    global _operands
    if _operands is None:
        _operands = (torch.ones(JOIN_FLOATS), torch.ones(JOIN_FLOATS))
    return _operands


def kind() -> str:
    """The probe :data:`ENV` chooses: ``join`` unless it says ``memory`` or ``off`` (any other
    value is said once, and read as the default)."""
    chosen = os.environ.get(ENV, "").strip().lower()
    if chosen in KINDS:
        return chosen
    if chosen and chosen not in _said:
        _said.add(chosen)
        log.warning(
            "%s=%s is not one of %s: reading the host's join (set it to one, or unset it)",
            ENV,
            "".join(c if c.isprintable() else "?" for c in chosen),
            ", ".join(KINDS),
        )
    return "join"


_said: set[str] = set()
_probes: dict[str, Probe] = {}


def coordinator_probe() -> Probe | None:
    """This process's probe of the chosen kind (one per process: its readings are the
    reference), ``None`` where :data:`ENV` is ``off``."""
    chosen = kind()
    if chosen == "off":
        return None
    if chosen not in _probes:
        _probes[chosen] = MemoryProbe() if chosen == "memory" else JoinProbe()
    return _probes[chosen]


def states(readings: list[float | None], reference: float | None) -> list[bool | None]:
    """Each round's state from its reading: True where it met the slow state, False where
    not, None where it has no reading or no reference is known yet."""
    if reference is None or reference <= 0:
        return [None] * len(readings)
    return [None if r is None else bool(r < SLOW * reference) for r in readings]
