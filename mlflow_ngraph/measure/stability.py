"""Whether a measurement can be trusted: its own spread and what the host did meanwhile.

A measurement is UNSTABLE when the coefficient of variation of its repetitions exceeds
``cv_threshold`` or other processes used more than ``other_cpu_threshold`` percent of the
machine's CPU time during its window. Pure: it names no MLflow key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: defaults of ``--cv-threshold`` and ``--max-other-cpu``
CV_THRESHOLD = 0.10
OTHER_CPU_THRESHOLD = 25.0  # percent of all logical cores


@dataclass(frozen=True)
class Stability:
    stable: bool
    reason: str = ""  # why not, with the fix, when unstable


def assess(
    cv: float | None,
    other_cpu_percent: float | None,
    cv_threshold: float = CV_THRESHOLD,
    other_cpu_threshold: float = OTHER_CPU_THRESHOLD,
) -> Stability:
    """Judge one measurement; a quantity that was not measured (None/NaN) is not held
    against it."""
    causes = []
    if cv is not None and not math.isnan(cv) and cv > cv_threshold:
        causes.append(f"CV {cv:.2f} > {cv_threshold:g}")
    if (
        other_cpu_percent is not None
        and not math.isnan(other_cpu_percent)
        and other_cpu_percent > other_cpu_threshold
    ):
        causes.append(
            f"other processes used {other_cpu_percent:.0f}% of the CPU (> {other_cpu_threshold:g}%)"
        )
    if not causes:
        return Stability(True)
    return Stability(
        False,
        "; ".join(causes) + ": measure on a quiet host, or re-measure with --stable-retries K",
    )
