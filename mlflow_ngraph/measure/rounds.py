"""Engines measured in rounds, and the figures their windows give.

The host a benchmark runs on drifts: on a shared 2-core VM the same engine's throughput moves
by 1.2x-1.5x between one-second windows a few seconds apart, and by up to 2x between runs.
No window, however long, gives an absolute number that holds to a few percent on a re-run.
A ratio measured *interleaved* does: when identity and each compiler take turns window by
window, a slow spell of the host slows the windows on both sides of a ratio alike.

So the engines of one model at one batch size are measured in rounds: each round gives every
engine one window (:meth:`mlflow_ngraph.measure.harness.Meter.window`), in an order that
rotates from round to round (no engine always follows another). With one engine it is the
same loop without a partner: windows back to back (the sequential fallback).

Figures, each over the rounds (k windows per engine):

- throughput: the samples of every window over their seconds; its 95% interval is the
  Student-t interval of the windows' log rates (batch means: each window is one value,
  long enough that its own noise is not timer jitter), centred on the throughput;
- speedup over the baseline: the median of the per-round ratios (paired: the host's drift
  cancels within a round), its 95% interval the sign test's (distribution-free: a
  preempted window's stray ratio does not widen it);
- host drift: the spread (sd of log rate) of the baseline's windows across rounds: what the
  host did during the measurement, shown beside the figures it affects.

Stop rule (per engine; the rounds go on while any engine is not done): the floors
(``--repetitions`` requests, ``--min-duration`` seconds, :data:`MIN_ROUNDS` rounds) are met
and the figure the user compares is known to ``precision`` (the relative half-width of the
speedup's interval; for the baseline and an engine measured alone, the throughput's against
twice that), or
the engine has been measured for ``max_s`` seconds. The stop reason is recorded: ``precision``,
``max_duration``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from mlflow_ngraph.measure.stability import THROUGHPUT_WIDER

#: a window lasts at least this long (pyperf: a value of at least 100 ms); the choice and its
#: measured effect are in docs/measurement.md
WINDOW_S = 0.1
#: rounds before the stop rule may end a measurement: the sign test's 95% interval of a
#: median needs 6 values (then it spans all six; at 20, the 6th to the 15th)
MIN_ROUNDS = 6
#: default target of the stop rule: the figure's 95% interval within +-2%
PRECISION = 0.02
#: an engine is measured for at most this many seconds (or ``--max-duration``) unless its
#: floors need longer
MAX_S = 2.0
CONFIDENCE = 0.95


class Windowed(Protocol):
    """What the rounds need of an engine: one window of at least ``seconds``."""

    def window(self, seconds: float): ...


@dataclass
class RoundPolicy:
    window_s: float = WINDOW_S
    min_rounds: int = MIN_ROUNDS
    precision: float = PRECISION
    max_s: float | None = None  # None: MAX_S or the settings' max_duration_s


@dataclass
class Figures:
    """One engine's figures over its rounds."""

    throughput: float
    ci: tuple[float, float] | None
    halfwidth: float | None  # relative half-width of the throughput interval
    cv: float  # of the windows' rates
    stop_reason: str
    window_s: float
    interleaved: bool = False
    drift: float | None = None
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    speedup_halfwidth: float | None = None
    rounds: int = 0


def log_halfwidth(logs, confidence: float = CONFIDENCE) -> float | None:
    """Half-width, on the log scale, of the t interval of the mean of ``logs`` (``None``
    with fewer than 3 values: too few to say anything about the next)."""
    from scipy import stats

    data = np.asarray(logs, dtype=np.float64)
    data = data[np.isfinite(data)]
    if data.size < 3:
        return None
    sd = float(data.std(ddof=1))
    return float(stats.t.ppf(0.5 + confidence / 2, data.size - 1) * sd / math.sqrt(data.size))


def _relative(h: float | None) -> float | None:
    """A log-scale half-width as the relative half-width of the interval's wider side."""
    return None if h is None else math.expm1(h)


def throughput_figures(windows) -> tuple[float, tuple[float, float] | None, float | None, float]:
    """(throughput, its 95% interval, relative half-width, cv of window rates) of
    ``windows``."""
    samples = sum(w.samples for w in windows)
    seconds = sum(w.seconds for w in windows)
    throughput = samples / seconds if seconds > 0 else math.nan
    rates = np.array([w.rate for w in windows], dtype=np.float64)
    cv = float(rates.std(ddof=1) / rates.mean()) if rates.size > 1 and rates.mean() > 0 else 0.0
    h = log_halfwidth(np.log(rates[rates > 0]))
    if h is None or not math.isfinite(throughput):
        return throughput, None, None, cv
    return throughput, (throughput * math.exp(-h), throughput * math.exp(h)), _relative(h), cv


def median_interval(values, confidence: float = CONFIDENCE):
    """(median, its ``confidence`` interval) of ``values``: the interval between two order
    statistics chosen from the binomial(n, 1/2) law (the sign test's), which holds at least
    ``confidence`` whatever the values' distribution. ``None`` for the interval when there
    are too few values for one (fewer than 6 at 95%)."""
    from scipy import stats

    data = np.sort(np.asarray(values, dtype=np.float64))
    data = data[np.isfinite(data)]
    if data.size == 0:
        return None, None
    median = float(np.median(data))
    n = data.size
    # the largest j with P(B <= j - 1) <= alpha/2: [x_(j), x_(n+1-j)] covers >= confidence
    j = int(stats.binom.ppf((1 - confidence) / 2, n, 0.5))
    if stats.binom.cdf(j, n, 0.5) > (1 - confidence) / 2:
        j -= 1
    if j < 0:
        return median, None
    return median, (float(data[j]), float(data[n - 1 - j]))


def paired_figures(windows, base_windows):
    """(speedup, its 95% interval, relative half-width) from windows paired by round: the
    median of the per-round ratios and the sign test's interval around it. A window that
    a preemption slowed gives one stray ratio; it moves a mean and its t interval (seen: a
    quiet 2-core VM's per-round ratios spread with sd 11%, their median absolute deviation
    3%), not a median."""
    logs = [
        math.log(w.rate / b.rate)
        for w, b in zip(windows, base_windows)
        if w is not None and b is not None and w.rate > 0 and b.rate > 0
    ]
    if not logs:
        return None, None, None
    median, interval = median_interval(logs)
    speedup = math.exp(median)
    if interval is None:
        return speedup, None, None
    low, high = math.exp(interval[0]), math.exp(interval[1])
    return speedup, (low, high), max(high / speedup - 1, 1 - low / speedup)


def drift_of(windows) -> float | None:
    """The spread of an engine's window rates across rounds (sd of their logs)."""
    rates = [w.rate for w in windows if w is not None and w.rate > 0]
    if len(rates) < 3:
        return None
    return float(np.std(np.log(rates), ddof=1))


def order(names: list[str], round_index: int) -> list[str]:
    """The engines' order in a round: rotated by one each round."""
    if not names:
        return []
    k = round_index % len(names)
    return names[k:] + names[:k]


def run_rounds(
    meters: Mapping[str, Windowed],
    settings,
    baseline: str | None,
    policy: RoundPolicy,
    on_round=None,
) -> dict[str, Figures]:
    """Measure ``meters`` (name -> engine) in rounds until every one is done, and return
    each one's figures. ``baseline`` names the engine speedups are paired with (``None``:
    no pairing). An engine whose window raises is dropped from the rounds and left out of
    the result (the caller reports its failure); the rest go on.

    ``settings`` is the :class:`~mlflow_ngraph.config.MeasureSettings`: its repetitions
    (requests) and min_duration_s are floors, its max_duration_s caps an engine's seconds.
    """
    cap = policy.max_s
    if cap is None:
        cap = settings.max_duration_s or max(MAX_S, 2 * settings.min_duration_s)
    names = list(meters)
    windows: dict[str, list] = {name: [] for name in names}
    failed: dict[str, BaseException] = {}
    reasons: dict[str, str] = {}
    r = 0
    while True:
        live = [n for n in names if n not in failed]
        if not live:
            break
        for name in order(live, r):
            try:
                windows[name].append(meters[name].window(policy.window_s))
            except Exception as exc:  # noqa: BLE001 - the engine's failure, reported by the caller
                failed[name] = exc
        r += 1
        for name in names:
            if name in failed:
                continue
            # a window lost to a failure leaves a hole; pairing skips it
            while len(windows[name]) < r:
                windows[name].append(None)
        if on_round is not None:
            on_round(r)
        reasons = {n: _stop(n, windows, baseline, settings, policy, cap, r) for n in names}
        if all(reasons[n] for n in names if n not in failed):
            break
    interleaved = len(names) > 1
    base = windows.get(baseline) if baseline and baseline not in failed else None
    drift = drift_of(base) if base is not None else None
    out: dict[str, Figures] = {}
    for name in names:
        if name in failed:
            continue
        own = [w for w in windows[name] if w is not None]
        throughput, ci, halfwidth, cv = throughput_figures(own)
        figures = Figures(
            throughput,
            ci,
            halfwidth,
            cv,
            reasons.get(name) or "max_duration",
            policy.window_s,
            interleaved=interleaved,
            drift=drift if name != baseline else drift_of(windows[name]),
            rounds=r,
        )
        if base is not None and name != baseline:
            figures.speedup, figures.speedup_ci, figures.speedup_halfwidth = paired_figures(
                windows[name], base
            )
        out[name] = figures
    return out


def _stop(name, windows, baseline, settings, policy, cap, rounds) -> str:
    """Why engine ``name`` is done after ``rounds`` rounds (``""``: not yet)."""
    own = [w for w in windows[name] if w is not None]
    seconds = sum(w.seconds for w in own)
    requests = sum(w.requests for w in own)
    floors = requests >= settings.repetitions and seconds >= settings.min_duration_s
    if floors and rounds >= policy.min_rounds:
        base = windows.get(baseline) if baseline else None
        target = policy.precision
        if base is not None and name != baseline:
            _, _, width = paired_figures(windows[name], base)
        else:
            width, target = throughput_figures(own)[2], THROUGHPUT_WIDER * policy.precision
        if width is not None and width <= target:
            return "precision"
    # an explicit --max-duration caps everything; the default cap never cuts the floors
    if seconds >= cap and (floors or settings.max_duration_s is not None):
        return "max_duration"
    return ""
