"""The gate's verdict from the ratio of the challenger's throughput over the champion's and
its 95% interval: pure functions, the one rule every output reads.

With ``t`` the tolerance and [lo, hi] the interval:

- **same**: the interval lies inside [1 - t, 1 + t];
- **slower**: the whole interval lies below 1 - t (slower beyond the tolerance, beyond noise);
- **faster**: the whole interval lies above 1 and reaches past 1 + t (faster beyond noise;
  it cannot be slower at all);
- **unsure**: anything else: the interval reaches below 1 - t without lying wholly below
  it (it may or may not be a regression), or it straddles 1 and reaches past 1 + t.

A gate fails (``slower``) only on evidence beyond the tolerance; an interval that merely
reaches below it is ``unsure``, and the gate measures longer, up to its budget, before it
says so. The asymmetry is deliberate: a false alarm switches a CI gate off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FASTER, SAME, SLOWER, UNSURE = "faster", "same", "slower", "unsure"
#: the exit status of each verdict (3: an error, said in one line)
EXIT_STATUS = {FASTER: 0, SAME: 0, SLOWER: 1, UNSURE: 2}
EXIT_ERROR = 3
#: the verdict as a number for MLflow's charts and search: +1 faster, 0 same, -1 slower,
#: NaN unsure (no order to plot)
VERDICT_VALUE = {FASTER: 1.0, SAME: 0.0, SLOWER: -1.0, UNSURE: math.nan}
#: the default tolerance: +-3%, about what a quiet 2-core VM's re-runs of one engine spread
#: over (docs/measurement.md); a tighter one costs rounds (the interval narrows as one over
#: the square root of the time)
TOLERANCE = 0.03


#: on a host that was busy when the gate measured (``--busy-ok``), how far below 1 the whole
#: interval must lie for ``slower``: two processes of one engine part by up to about this
#: much there for the few seconds a gate measures (an A/A gate beside the test suite read
#: 0.789 [0.707, 0.899], load 5.2), which no round-to-round interval sees; the guard's
#: gross move (measure/history.py)
BUSY_MARGIN = 0.25


def on_a_busy_host(verdict: str, high: float | None, said: str) -> tuple[str, str | None]:
    """The verdict of a gate that measured on a busy host (``said``: the host's load as the
    look said it), and the note that says why it changed (None: it did not). ``slower``
    stands only where the whole interval lies below ``1 - BUSY_MARGIN``; otherwise
    ``unsure``: a busy runner costs a verdict, not a false alarm."""
    if verdict != SLOWER or (high is not None and high < 1 - BUSY_MARGIN):
        return verdict, None
    return UNSURE, (
        f"unsure, not slower: the host was busy when the gate measured ({said}), and there "
        f"two processes of one engine can part by up to {100 * BUSY_MARGIN:.0f}%, which its "
        "rounds cannot see; run it again on a quieter runner"
    )


def decide(low: float | None, high: float | None, tolerance: float = TOLERANCE) -> str:
    """The verdict of an interval [``low``, ``high``] of the ratio (``None``: no interval,
    ``unsure``)."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return UNSURE
    if low >= 1 - tolerance and high <= 1 + tolerance:
        return SAME
    if high < 1 - tolerance:
        return SLOWER
    if low > 1 and high > 1 + tolerance:
        return FASTER
    return UNSURE


@dataclass(frozen=True)
class Interval:
    """The ratio's interval and what it rests on."""

    low: float
    high: float
    #: ``sitting`` (this gate's rounds alone) or ``sitting + spread`` (widened by the host's
    #: spread between sittings of a ratio, from its history or ``--rerun-sd``)
    kind: str
    source: str = ""


def widened(ratio: float, sitting: tuple[float, float], spread_sd: float | None, df: float = 0):
    """The interval of the true ratio on this host: this gate's rounds say where the ratio
    of *this sitting* lies (``sitting``, a 95% interval); a sitting's ratio itself sits off
    the host's long-run one by the spread between sittings (sd ``spread_sd`` of the log,
    ``df`` degrees of freedom). Both add on the log scale: a Student-t interval with the
    spread's degrees of freedom. Returns (low, high); ``sitting`` as is without a spread."""
    low, high = sitting
    if not spread_sd or ratio <= 0 or low <= 0:
        return low, high
    from scipy import stats

    z = 1.959963984540054
    own_sd = max(math.log(high / ratio), math.log(ratio / low)) / z
    q = float(stats.t.ppf(0.975, max(df, 1)))
    width = q * math.sqrt(spread_sd**2 + own_sd**2)
    return ratio * math.exp(-width), ratio * math.exp(width)


def percent(value: float | None) -> str:
    """A ratio as a signed change: 0.912 -> ``-8.8%``."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{100 * (value - 1):+.1f}%"
