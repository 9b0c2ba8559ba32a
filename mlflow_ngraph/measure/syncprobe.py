"""What it costs the host's cores to work together, read between rounds.

Every operator of an eager engine (and of TorchScript, and ONNX Runtime's intra-op pool)
starts a parallel region and joins it: its threads meet at the end of each one. On the
2-core VM this tool is developed on, that meeting runs at two speeds, about 1.6x apart, in
stretches of seconds that come and go over minutes, with no other process, no steal and
every core ours (the hypervisor placing the two vCPUs apart, or others sharing their
physical cores). An engine slows with it as far as it joins per operator: the attention
block at batch 8 ran 0.58-0.63x in the slow state in eager, TorchScript and ONNX Runtime,
0.78x in torch.compile (fewer, fused kernels) and not at all in OpenVINO (independent
streams), so every speedup over eager moved with it (docs/measurement.md). Neither the CPU
screen nor the pairing sees it; nor does a one-thread stream over memory (0.96x there).

So the coordinator of a group reads it before the first round and after each one: the best
of :data:`PROBE_PASSES` passes of :data:`PROBE_CALLS` additions of two 64K-float tensors
(just past ATen's grain size of 32,768: each call splits over the threads and joins them;
about 1.5 ms a pass here), in its own process while every worker is stopped, as thousands
of calls per second. A round's reading is the lower of the two around it. A round whose
reading is under :data:`SYNC_SLOW` of the host's fast speed (:data:`REFERENCE_Q` of every
reading this process took: the runner's whole run, not one group) met the slow state; the
rounds (:mod:`~mlflow_ngraph.measure.rounds`) compare each figure over the slow rounds with
the rest, and a figure that differs beyond both intervals is UNSTABLE and names the cause.

``MLFLOW_NGRAPH_SYNC_PROBE=0`` turns the reading off (no figure is then checked for it); a
process whose PyTorch runs one intra-op thread has nothing to join and reads nothing.
"""

from __future__ import annotations

import os
import time

import numpy as np

#: elements of each operand: past ATen's grain size (32,768), so the add runs in parallel
PROBE_ELEMENTS = 65536
#: additions a pass times (about 1.5 ms here)
PROBE_CALLS = 200
#: passes of a reading; the fastest counts (a pass the scheduler interrupted reads slow)
PROBE_PASSES = 2
#: a round read under this share of the host's fast speed met the slow state (here the two
#: states were about 1.6x apart, the fast state's own readings 0.85-1.1 of their median)
SYNC_SLOW = 0.75
#: the host's fast speed: this quantile of the readings the process took so far
REFERENCE_Q = 0.9
#: readings before a fast speed is named (fewer: no round is judged slow)
REFERENCE_MIN = 12
#: readings kept for the reference (a long run's oldest drop out)
KEEP = 4096
ENV = "MLFLOW_NGRAPH_SYNC_PROBE"


class SyncProbe:
    """Reads the cores' speed at joining (thousand parallel adds per second) on demand and
    keeps the readings for the reference."""

    def __init__(self, calls: int = PROBE_CALLS, passes: int = PROBE_PASSES) -> None:
        self.calls, self.passes = calls, passes
        self._operands = None
        self.readings: list[float] = []

    def read(self) -> float | None:
        """The fastest of the passes, in thousand calls a second (None where PyTorch runs
        one thread: nothing joins)."""
        import torch

        if torch.get_num_threads() < 2:
            return None
        if self._operands is None:
            self._operands = (torch.randn(PROBE_ELEMENTS), torch.randn(PROBE_ELEMENTS))
            self._pass()  # the pool's threads started: not a reading
        best = min(self._pass() for _ in range(self.passes))
        speed = self.calls / best / 1e3 if best > 0 else None
        if speed is not None:
            self.readings = [*self.readings[-(KEEP - 1) :], speed]
        return speed

    def _pass(self) -> float:
        import torch

        a, b = self._operands
        began = time.perf_counter()
        for _ in range(self.calls):
            torch.add(a, b)
        return time.perf_counter() - began

    def reference(self) -> float | None:
        """The host's fast speed as this process has seen it (None: too few readings)."""
        if len(self.readings) < REFERENCE_MIN:
            return None
        return float(np.quantile(self.readings, REFERENCE_Q))


_probe: SyncProbe | None = None


def coordinator_probe() -> SyncProbe | None:
    """This process's probe (one per process: its readings are the reference), ``None``
    where :data:`ENV` turns it off."""
    global _probe
    if os.environ.get(ENV, "1").strip().lower() in ("0", "off", "false", "no"):
        return None
    if _probe is None:
        _probe = SyncProbe()
    return _probe


def states(readings: list[float | None], reference: float | None) -> list[bool | None]:
    """Each round's state from its reading: True where it met the slow state, False where
    not, None where it has no reading or no reference is known yet."""
    if reference is None or reference <= 0:
        return [None] * len(readings)
    return [None if r is None else bool(r < SYNC_SLOW * reference) for r in readings]
