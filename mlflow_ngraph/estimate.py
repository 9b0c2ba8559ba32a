"""How long a run will take, said before it starts.

Each finished (model, compiler, flags, batch size) records the wall seconds it took on this
host (compile or cache load, output check, warm-up and measurement) in ``<home>/timings.json``.
A run's estimate sums, over the batch sizes it still has to measure, the recorded seconds
where they exist and a per-compiler allowance otherwise; it says how much of it is known.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TIMINGS_FILE = "timings.json"
#: seconds to get an engine for one batch size of a mid-sized model (ResNet-18, DeiT-S) on a
#: 2-core host, when nothing was recorded yet; unknown compilers get the largest
COMPILE_ALLOWANCE_S = {
    "identity": 2.0,
    "torchscript": 8.0,
    "onnxruntime": 6.0,
    "openvino": 6.0,
    "inductor": 45.0,
    "tvm": 90.0,
    "tensorrt": 60.0,
}
#: output check, first inference and model build per batch size, besides the measured window
OVERHEAD_S = 2.0


def timing_key(model: str, compiler: str, flags: dict[str, Any], batch_size: int) -> str:
    return json.dumps([model, compiler, sorted(flags.items()), batch_size], default=str)


class Timings:
    """The seconds each (model, compiler, flags, batch size) took on this host."""

    def __init__(self, home: Path) -> None:
        self.path = Path(home) / TIMINGS_FILE
        try:
            self.data: dict[str, float] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}

    def get(self, key: str) -> float | None:
        value = self.data.get(key)
        return float(value) if isinstance(value, (int, float)) else None

    def record(self, key: str, seconds: float) -> None:
        """Keep the latest time (atomically replaced: a kill never leaves half a file)."""
        self.data[key] = round(float(seconds), 3)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as handle:
                json.dump(self.data, handle)
            os.replace(tmp, self.path)
        except OSError as exc:  # an estimate is never worth failing a run
            log.debug("could not record timings: %s", exc)


def estimate(items, measure, timings: Timings) -> tuple[float, int, int]:
    """(seconds, items with a recorded time, items) for ``items`` of (model, compiler,
    flags, batch size) still to measure with ``measure`` (MeasureSettings)."""
    total, known = 0.0, 0
    window = measure.min_duration_s
    if measure.max_duration_s is not None:
        window = min(window, measure.max_duration_s)
    items = list(items)
    for model, compiler, flags, b in items:
        seconds = timings.get(timing_key(model, compiler, flags, b))
        if seconds is not None:
            known += 1
            total += seconds
            continue
        allowance = COMPILE_ALLOWANCE_S.get(compiler, max(COMPILE_ALLOWANCE_S.values()))
        if compiler == "tvm":
            allowance += 3.0 * float(flags.get("trials") or 0)
        # the warm-up and the window: warm-up repetitions take about what measured ones do
        warmup_share = measure.warmup / max(measure.repetitions, 1)
        total += allowance + OVERHEAD_S + window * (1 + warmup_share)
    return total, known, len(items)


def describe(seconds: float, known: int, count: int) -> str:
    """``about 12 min for 48 batch sizes to measure (31 timed on this host before)``."""
    minutes = seconds / 60
    when = f"{seconds:.0f} s" if seconds < 90 else f"{minutes:.0f} min"
    basis = (
        "from earlier runs on this host"
        if known == count
        else f"{known} of them timed on this host before, the rest rough"
    )
    return f"estimated time: about {when} for {count} batch size(s) to measure ({basis})"
