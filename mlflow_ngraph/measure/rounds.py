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
  ratio estimator's (the delta method: the windows' samples less the throughput times their
  seconds, over their mean seconds), a Student-t interval on the log scale centred on the
  same throughput it describes;
- speedup over the baseline: the Hodges-Lehmann estimate of the per-round log ratios (the
  median of their pairwise means; paired: the host's drift cancels within a round), its
  95% interval the Wilcoxon signed-rank test's. It keeps the median's robustness (a
  preempted window's stray ratio moves it little) at 95% of the mean's efficiency, where
  the median and its sign-test interval have 64%: the same precision in two thirds of the
  rounds;
- dependence: rounds seconds apart are not independent draws when the host drifts slowly.
  The lag-1 autocorrelation of the values behind each interval is logged; where it is
  positive beyond what chance gives at that many rounds (above 1.96 / sqrt(k)), the
  interval is widened by the AR(1) variance factor sqrt((1 + r) / (1 - r)) (and a t
  interval takes the effective number of rounds for its degrees of freedom);
- these are the **sitting's** intervals: what this run's rounds say of the figure on this
  host now. Where a re-run will land is wider (other processes, engines loaded again,
  another state of the host): :mod:`mlflow_ngraph.measure.history` builds that interval
  from the spread between sittings this host has shown;
- host drift: the spread (sd of log rate) of the baseline's windows across rounds: what the
  host did during the measurement, shown beside the figures it affects;
- disturbed windows: a window whose process got less of the CPU than its engine's windows
  usually get (its CPU seconds over its wall seconds below :data:`DISTURBED_SHARE` of the
  median window's) lost cores to another process or the hypervisor while it ran, and is
  slowed by that alone (a 2-thread engine waits at every barrier for the thread that lost
  its core). It gives no figure: it is left out of the throughput, and its round gives no
  ratio for that engine; the rounds go on until the figure is known without it. The count
  is logged (``windows_disturbed``), and many of them mark the figure UNSTABLE;
- moved: the rounds' first and second halves give speedups whose intervals do not overlap
  (the host changed in a way the pairing did not cancel); the relative change, else None;
- the host's two states: given a probe (:mod:`~mlflow_ngraph.measure.hostprobe`), its
  reading around each round names the rounds that met the host's slow state, and a
  figure computed over those rounds and over the rest with intervals that do not overlap
  is the state's (``state_moved``: the relative change, else None).

Stop rule (per engine; widths are the sitting's own): the
floors (``--repetitions`` requests, ``--min-duration`` seconds, :data:`MIN_ROUNDS` rounds
the figure rests on: for a paired speedup, rounds where neither window was left out) are
met and the figure the user compares is known to ``precision`` (the relative half-width
of the speedup's interval; for the baseline and an engine measured alone, the throughput's
against twice that), or the engine has been measured for ``max_s`` seconds. Where the cap
leaves the figure wider than the UNSTABLE limit (``enough``), the engine goes on past the
cap while the spread seen so far says the limit is within reach of ``stretch`` times the cap
(the interval narrows as one over the square root of the rounds), and stops once it is
reached. An engine that is done takes no more windows; the baseline takes its window while
any engine paired with it is not done. The stop reason is recorded: ``precision``,
``max_interval`` (reached the limit past the cap), ``max_duration``.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from mlflow_ngraph.measure.hostprobe import states
from mlflow_ngraph.measure.stability import MAX_DISTURBED, THROUGHPUT_WIDER

#: a window lasts at least this long (pyperf: a value of at least 100 ms); the choice and its
#: measured effect are in docs/measurement.md
WINDOW_S = 0.1
#: rounds before the stop rule may end a measurement: the signed-rank 95% interval needs 6
#: values (then it spans the smallest to the largest ratio)
MIN_ROUNDS = 6
#: default target of the stop rule: the figure's 95% interval within +-2%
PRECISION = 0.02
#: an engine is measured for at most this many seconds (or ``--max-duration``) unless its
#: floors need longer
MAX_S = 4.0
#: where the cap leaves a figure wider than the UNSTABLE limit, an engine may go on to this
#: many times the cap when its spread says the limit is within reach (docs/measurement.md)
STRETCH = 3.0
CONFIDENCE = 0.95
#: the normal law's two-sided 95% quantile
Z95 = 1.959963984540054
#: a window whose process had less than this share of the CPU its engine's median window had
#: was disturbed (the choice and its measured effect are in docs/measurement.md)
DISTURBED_SHARE = 0.95
#: windows with a CPU reading before the screen judges any (a median of fewer says little)
SCREEN_MIN = 5
#: an engine whose median window used less than this many CPU seconds per second mostly
#: waits (a device, a sleep, I/O): its share does not govern its rate, so it is not screened
SCREEN_MIN_SHARE = 0.5
#: a window shorter than this is not judged: its CPU share is scheduler jitter (a policy
#: with windows of a few ms, as in tests), the reason windows last 100 ms
SCREEN_MIN_WINDOW_S = 0.05
#: a window in which the process's threads together waited to run for more than this share
#: of its wall time beyond the engine's usual wait was disturbed (:func:`disturbed_marks`;
#: the choice and its measured effect are in docs/measurement.md)
WAIT_SHARE = 0.1
#: a window during which other processes and the hypervisor took more than this share of
#: the machine was disturbed (tick-grained: on 2 cores a 100 ms window reads in steps of 5%)
OTHER_SHARE = 0.25
#: drift is judged between the rounds' halves only when each half has a signed-rank interval
DRIFT_MIN_ROUNDS = 2 * MIN_ROUNDS
#: the largest lag-1 autocorrelation an interval is widened for (beyond it the rounds say
#: too little about the centre to widen by a formula: the figure is wide anyway)
MAX_AUTOCORR = 0.8
#: values before an autocorrelation is estimated at all
AUTOCORR_MIN = 8


class Windowed(Protocol):
    """What the rounds need of an engine: one window of at least ``seconds``."""

    def window(self, seconds: float): ...


@dataclass
class RoundPolicy:
    window_s: float = WINDOW_S
    min_rounds: int = MIN_ROUNDS
    precision: float = PRECISION
    max_s: float | None = None  # None: MAX_S or the settings' max_duration_s
    #: the widest STABLE relative half-width of a speedup (``--max-interval``; a throughput
    #: :data:`THROUGHPUT_WIDER` times that); None: never measure past the cap
    enough: float | None = None
    stretch: float = STRETCH
    #: leave out disturbed windows (:func:`screened`); off for a GPU engine, whose host
    #: thread's CPU share says nothing of the device's speed
    screen: bool = True


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
    moved: float | None = None  # moved_between_halves
    rounds: int = 0  # the engine's own windows the throughput rests on
    #: the paired rounds the speedup rests on: rounds where neither the engine's nor the
    #: baseline's window was left out (fewer than ``rounds`` where the baseline's were)
    speedup_rounds: int | None = None
    #: measured past the cap because the figure was wider than the UNSTABLE limit: more
    #: rounds at once were already tried, so re-measuring after a pause may not help
    stretched: bool = False
    #: windows left out as disturbed (:func:`screened`)
    disturbed: int = 0
    #: the lag-1 autocorrelation of the windows' rates and of the per-round log ratios
    throughput_autocorr: float | None = None
    speedup_autocorr: float | None = None
    #: whether the drift between the rounds' halves could be judged (each half needs
    #: :data:`MIN_ROUNDS` paired rounds)
    drift_checked: bool = False
    #: the figures with the disturbed windows kept in (where the screen left some out)
    throughput_unscreened: float | None = None
    speedup_unscreened: float | None = None
    #: the indexes of the windows the figures rest on (the rest were disturbed)
    kept: list[int] | None = None
    #: the probe's reading around each round (:mod:`~mlflow_ngraph.measure.hostprobe`;
    #: the group's, the same for every engine of it), None where it was not read
    state_readings: list | None = None
    #: the median reading over the rounds the figure rests on, those rounds with a reading
    #: and those of them that met the host's slow state
    state_reading: float | None = None
    state_rounds: int = 0
    state_slow_rounds: int = 0
    #: the figure over the slow rounds against the rest (relative), where their intervals
    #: part (:func:`moved_with_state`)
    state_moved: float | None = None
    #: the probe that read them (``join``, ``memory``), None where none did
    state_kind: str | None = None


def _relative(h: float | None) -> float | None:
    """A log-scale half-width as the relative half-width of the interval's wider side."""
    return None if h is None else math.expm1(h)


def lag1(values) -> float | None:
    """The lag-1 autocorrelation of ``values`` in their order (``None`` with fewer than
    :data:`AUTOCORR_MIN` or no spread)."""
    data = np.asarray(values, dtype=np.float64)
    data = data[np.isfinite(data)]
    if data.size < AUTOCORR_MIN:
        return None
    centred = data - data.mean()
    denominator = float(np.dot(centred, centred))
    if denominator <= 0:
        return None
    return float(np.dot(centred[:-1], centred[1:]) / denominator)


def inflation(r: float | None, n: int) -> float:
    """How much wider an interval over ``n`` values with lag-1 autocorrelation ``r`` must be
    than one that takes them as independent: the AR(1) factor sqrt((1 + r) / (1 - r)) where
    ``r`` is positive beyond chance (1.96 / sqrt(n)), else 1."""
    if r is None or n < AUTOCORR_MIN or r <= Z95 / math.sqrt(n):
        return 1.0
    r = min(r, MAX_AUTOCORR)
    return math.sqrt((1 + r) / (1 - r))


def throughput_figures(windows) -> tuple[float, tuple[float, float] | None, float | None, float]:
    """(throughput, its 95% interval, relative half-width, cv of window rates) of
    ``windows``: the throughput is their samples over their seconds, its interval the
    ratio estimator's (:func:`throughput_details`)."""
    throughput, ci, halfwidth, cv, _ = throughput_details(windows)
    return throughput, ci, halfwidth, cv


def throughput_details(windows):
    """:func:`throughput_figures` and the windows' lag-1 autocorrelation.

    The interval is centred on the figure it describes: the throughput R = sum s / sum t is
    a ratio estimator, whose standard error is sqrt(sum (s_i - R t_i)^2 / (k (k - 1))) / mean
    t (the delta method); the interval is R exp(+-q se / R), q Student's t with k - 1 degrees
    of freedom (fewer where the windows are autocorrelated: :func:`inflation`)."""
    samples = np.array([w.samples for w in windows], dtype=np.float64)
    seconds = np.array([w.seconds for w in windows], dtype=np.float64)
    total_s = float(seconds.sum())
    throughput = float(samples.sum()) / total_s if total_s > 0 else math.nan
    rates = np.divide(samples, seconds, out=np.zeros_like(samples), where=seconds > 0)
    cv = float(rates.std(ddof=1) / rates.mean()) if rates.size > 1 and rates.mean() > 0 else 0.0
    k = samples.size
    if k < 3 or not math.isfinite(throughput) or throughput <= 0:
        return throughput, None, None, cv, None
    residuals = samples - throughput * seconds
    r = lag1(residuals / seconds.mean())
    factor = inflation(r, k)
    se = math.sqrt(float(np.dot(residuals, residuals)) / (k * (k - 1))) / float(seconds.mean())
    h = t_quantile(max(k / factor**2, 2.0)) * factor * se / throughput
    ci = (throughput * math.exp(-h), throughput * math.exp(h))
    return throughput, ci, _relative(h), cv, r


def t_quantile(n: float, confidence: float = CONFIDENCE) -> float:
    """Student's t quantile for the mean of ``n`` values (``n - 1`` degrees of freedom)."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2, n - 1))


#: the exact signed-rank law is used up to this many values, its normal approximation beyond
EXACT_SIGNED_RANK_N = 200


@functools.cache
def _signed_rank_k(n: int, confidence: float) -> int:
    """The largest k with P(T <= k) <= (1 - confidence) / 2 for the Wilcoxon signed-rank
    statistic T of ``n`` values (-1 when even k = 0 is too likely). Cached: the stop rule
    asks for it after every round."""
    from scipy import stats

    alpha = (1 - confidence) / 2
    if n > EXACT_SIGNED_RANK_N:
        m = n * (n + 1) / 4
        sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
        return int(math.floor(m + stats.norm.ppf(alpha) * sd - 0.5))
    # the exact law: counts of each rank sum over the 2**n sign patterns
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for rank in range(1, n + 1):
        counts[rank:] = counts[rank:] + counts[:-rank].copy()
    cdf = np.cumsum(counts) / 2.0**n
    below = np.nonzero(cdf <= alpha)[0]
    return int(below[-1]) if below.size else -1


def location_interval(values, confidence: float = CONFIDENCE):
    """(Hodges-Lehmann estimate, its ``confidence`` interval) of the centre of ``values``:
    the median of the Walsh averages (x_i + x_j) / 2, i <= j, and the interval between two
    of them given by the Wilcoxon signed-rank law, which holds for any distribution
    symmetric about the centre. ``None`` for the interval when there are too few values
    for one (fewer than 6 at 95%)."""
    data = np.asarray(values, dtype=np.float64)
    data = data[np.isfinite(data)]
    if data.size == 0:
        return None, None
    i, j = np.triu_indices(data.size)
    walsh = np.sort((data[i] + data[j]) / 2.0)
    estimate = float(np.median(walsh))
    k = _signed_rank_k(data.size, confidence)
    if k < 0:
        return estimate, None
    return estimate, (float(walsh[k]), float(walsh[walsh.size - 1 - k]))


def _log_ratios(windows, base_windows) -> list[float]:
    return [
        math.log(w.rate / b.rate)
        for w, b in zip(windows, base_windows)
        if w is not None and b is not None and w.rate > 0 and b.rate > 0
    ]


def _speedup_of(logs):
    centre, interval = location_interval(logs)
    if centre is None:
        return None, None, None
    speedup = math.exp(centre)
    if interval is None:
        return speedup, None, None
    factor = inflation(lag1(logs), len(logs))
    low = math.exp(centre - factor * (centre - interval[0]))
    high = math.exp(centre + factor * (interval[1] - centre))
    return speedup, (low, high), max(high / speedup - 1, 1 - low / speedup)


def paired_figures(windows, base_windows):
    """(speedup, its 95% interval, relative half-width) from windows paired by round: the
    Hodges-Lehmann estimate of the per-round log ratios and the signed-rank interval around
    it. A window that a preemption slowed gives one stray ratio; it moves a mean and its t
    interval (seen: a quiet 2-core VM's per-round ratios spread with sd 11%, their median
    absolute deviation 3%), and the estimate only a little."""
    return _speedup_of(_log_ratios(windows, base_windows))


def moved_between_halves(windows, base_windows) -> float | None:
    """The relative change of the paired speedup from the first half of the rounds to the
    second when the two halves' 95% intervals do not overlap (the host changed in a way
    the pairing did not cancel), else ``None``."""
    logs = _log_ratios(windows, base_windows)
    half = len(logs) // 2
    return _parted(_speedup_of(logs[:half])[:2], _speedup_of(logs[half:])[:2])


def _parted(first, second) -> float | None:
    """The relative change from ``first`` to ``second`` (each a figure and its 95% interval)
    where both intervals are known and do not overlap, else None."""
    (a, a_ci), (b, b_ci) = first, second
    if a_ci is None or b_ci is None:
        return None
    if a_ci[1] < b_ci[0] or b_ci[1] < a_ci[0]:
        return b / a - 1
    return None


def moved_with_state(windows, base_windows, slow: list) -> float | None:
    """The relative change of the figure from the rounds that did not meet the host's
    slow state to those that did (``slow``: each round's state, None unknown), where each
    side has :data:`MIN_ROUNDS` rounds and their 95% intervals do not overlap: the paired
    speedup over ``base_windows``, or the throughput where that is None. Else None."""
    sides = []
    for state in (False, True):
        chosen = [w if s is state else None for w, s in zip(windows, slow)]
        if base_windows is not None:
            logs = _log_ratios(chosen, base_windows)
            enough, figures = len(logs) >= MIN_ROUNDS, _speedup_of(logs)
        else:
            own = [w for w in chosen if w is not None]
            enough, figures = len(own) >= MIN_ROUNDS, throughput_figures(own)
        if not enough:
            return None
        sides.append(figures[:2])
    return _parted(*sides)


def _add_state(figures: Figures, seen: list, base: list | None, readings: list, slow: list, kind):
    """Add to ``figures`` what the host probe read over the rounds its figure rests on."""
    figures.state_readings, figures.state_kind = list(readings), kind
    rests = [i for i, w in enumerate(seen) if w is not None and i < len(readings)]
    if base is not None:
        rests = [i for i in rests if i < len(base) and base[i] is not None]
    read = [readings[i] for i in rests if readings[i] is not None]
    if not read:
        return
    figures.state_reading = float(np.median(read))
    figures.state_rounds = len(read)
    figures.state_slow_rounds = sum(1 for i in rests if slow[i])
    figures.state_moved = moved_with_state(seen, base, slow)


def cpu_share(window) -> float | None:
    """The process's CPU seconds per wall second over ``window`` (None: not read, or the
    window too short to say: :data:`SCREEN_MIN_WINDOW_S`)."""
    if window is None or window.cpu_s is None or not window.seconds >= SCREEN_MIN_WINDOW_S:
        return None
    return window.cpu_s / window.seconds


def waited(window) -> float | None:
    """The seconds the process's threads together waited to run (runnable, no core free:
    the kernel's run delay) per wall second of ``window`` (None: not read, or the window too
    short to say: :data:`SCREEN_MIN_WINDOW_S`)."""
    wait = getattr(window, "wait_s", None) if window is not None else None
    if wait is None or not window.seconds >= SCREEN_MIN_WINDOW_S:
        return None
    return wait / window.seconds


def others(window) -> float | None:
    """The share of the machine (all its cores) other processes and the hypervisor took
    during ``window`` (None: not read, or the window too short to say)."""
    other = getattr(window, "other_s", None) if window is not None else None
    if other is None or not window.seconds >= SCREEN_MIN_WINDOW_S:
        return None
    return other / (window.seconds * (os.cpu_count() or 1))


def disturbed_marks(windows) -> list[bool]:
    """Which of ``windows`` were disturbed: other processes (or the hypervisor) took more
    than :data:`OTHER_SHARE` of the machine during it (/proc/stat, less this process's own
    CPU), or the process's threads waited to run (the kernel's run delay) for more than
    :data:`WAIT_SHARE` of the window beyond what the engine's threads usually wait for each
    other (its median window's: an engine that keeps more threads than cores, as OpenVINO's
    streams do, waits 20-30% of every window on an idle host, an eager PyTorch pool 1-4%).

    The first is an absolute bound: a host contended through the whole measurement (a
    2-thread eager attention block ran 15x slower beside one busy process, every window
    alike) has every window over it, however many there are. Where neither is read, the
    CPU-share rule of :func:`screened_by_share` judges instead."""
    shares = [others(w) for w in windows]
    waits = [waited(w) for w in windows]
    if all(v is None for v in shares) and all(v is None for v in waits):
        return [w is not None and s is None for w, s in zip(windows, screened_by_share(windows))]
    known = [v for v in waits if v is not None]
    usual = float(np.median(known)) if len(known) >= SCREEN_MIN else None
    marks = []
    for w, share, wait in zip(windows, shares, waits):
        busy = share is not None and share > OTHER_SHARE
        held = wait is not None and usual is not None and wait - usual > WAIT_SHARE
        marks.append(w is not None and (busy or held))
    return marks


def screened(windows) -> list:
    """``windows`` with each disturbed one (:func:`disturbed_marks`) replaced by ``None``
    (the hole a lost window leaves). Where more than :data:`MAX_DISTURBED` of them were
    disturbed the host was contended through the measurement: the windows are kept as they
    are (the figure describes that host), and the count marks the figure UNSTABLE."""
    marks = disturbed_marks(windows)
    measured = sum(w is not None for w in windows)
    if sum(marks) > MAX_DISTURBED * measured:
        return list(windows)
    return [None if mark else w for w, mark in zip(windows, marks)]


def screened_by_share(windows) -> list:
    """``windows`` with each one whose CPU share is below :data:`DISTURBED_SHARE` of the
    engine's median window's replaced by ``None``: the screen where no run delay is read. A
    CPU-bound engine's share is steady from window to window (a pool that waits spins, and
    spinning counts), so a share that drops says its threads were off their cores (a 2-core
    VM: a window's rate and its share correlate at 0.70-0.97 for most engines;
    docs/measurement.md). It cannot tell an engine whose share moves with its own speed
    from a disturbed one, nor see a disturbance that lasts more than half the windows.
    Nothing is judged before :data:`SCREEN_MIN` windows have a reading, nor for an engine
    that mostly waits (:data:`SCREEN_MIN_SHARE`)."""
    shares = [s for s in map(cpu_share, windows) if s is not None]
    if len(shares) < SCREEN_MIN:
        return list(windows)
    median = float(np.median(shares))
    if median < SCREEN_MIN_SHARE:
        return list(windows)
    floor = DISTURBED_SHARE * median
    out = []
    for w in windows:
        share = cpu_share(w)
        out.append(None if share is not None and share < floor else w)
    return out


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
    probe=None,
) -> dict[str, Figures]:
    """Measure ``meters`` (name -> engine) in rounds until every one is done, and return
    each one's figures. ``baseline`` names the engine speedups are paired with (``None``:
    no pairing). An engine whose window raises is dropped from the rounds and left out of
    the result (the caller reports its failure); the rest go on. ``probe``: a
    :class:`~mlflow_ngraph.measure.hostprobe.Probe` read before the first round and after
    each one, where the figures are to say which state of the host they met.

    ``settings`` is the :class:`~mlflow_ngraph.measure.settings.MeasureSettings`: its repetitions
    (requests) and min_duration_s are floors, its max_duration_s caps an engine's seconds.
    """
    cap = _cap(settings, policy)
    taking = _take_rounds(meters, settings, baseline, policy, cap, on_round, probe)
    windows, failed, reasons, view, readings = taking
    slow = states(readings, probe.reference() if probe is not None else None)
    interleaved = len(windows) > 1
    # ``view`` is the last round's: no window has been taken since
    base = view.get(baseline) if baseline and baseline not in failed else None
    drift = drift_of(base) if base is not None else None
    out: dict[str, Figures] = {}
    for name in windows:
        if name in failed:
            continue
        figures = _own_figures(
            view[name],
            windows[name],
            reasons.get(name) or "max_duration",
            policy,
            cap,
            interleaved=interleaved,
            drift=drift if name != baseline else drift_of(view[name]),
        )
        paired = base is not None and name != baseline
        if paired:
            _add_speedup(figures, view[name], base, windows[name], windows[baseline])
        if probe is not None:
            _add_state(figures, view[name], base if paired else None, readings, slow, probe.kind)
        out[name] = figures
    return out


def _cap(settings, policy: RoundPolicy) -> float:
    """The seconds an engine is measured for at most: the policy's, else the settings'
    max_duration_s, else :data:`MAX_S` (twice min_duration_s where that is longer)."""
    cap = policy.max_s
    if cap is None:
        cap = settings.max_duration_s or max(MAX_S, 2 * settings.min_duration_s)
    return cap


def _take_rounds(meters, settings, baseline, policy, cap, on_round, probe=None):
    """Take rounds until every engine is done: (each engine's windows as taken, ``None``
    where it took none; the engines whose window raised; each engine's stop reason; the
    windows as the figures see them after the last round; each round's probe reading, the
    lower of ``probe``'s before and after it, None without a probe)."""
    names = list(meters)
    windows: dict[str, list] = {name: [] for name in names}
    failed: dict[str, BaseException] = {}
    reasons: dict[str, str] = {}
    view = _view(windows, failed, policy)
    readings: list[float | None] = []
    last = probe.read() if probe is not None else None
    r = 0
    while True:
        live = _taking_turns(names, failed, reasons, baseline)
        if not live:
            break
        _take_round(meters, order(live, r), windows, failed, policy.window_s)
        if probe is not None:
            now = probe.read()
            known = [v for v in (last, now) if v is not None]
            readings.append(min(known) if known else None)
            last = now
        else:
            readings.append(None)
        r += 1
        _fill_holes(windows, failed, r)
        if on_round is not None:
            on_round(r)
        view = _view(windows, failed, policy)
        for name in names:
            if name not in failed and not reasons.get(name):
                reasons[name] = _stop(name, view, windows[name], baseline, settings, policy, cap)
    return windows, failed, reasons, view, readings


def _take_round(meters, turn: list[str], windows, failed, seconds: float) -> None:
    """One round: each engine of ``turn``, in that order, takes a window of ``seconds``;
    one whose window raises goes into ``failed`` instead."""
    for name in turn:
        try:
            windows[name].append(meters[name].window(seconds))
        except Exception as exc:  # noqa: BLE001 - the engine's failure, reported by the caller
            failed[name] = exc


def _fill_holes(windows, failed, rounds: int) -> None:
    """Pad each engine that has not failed to ``rounds`` windows with ``None``: a window
    lost to a failure, or not taken (the engine was done), leaves a hole; pairing skips it."""
    for name, taken in windows.items():
        if name in failed:
            continue
        while len(taken) < rounds:
            taken.append(None)


def _screened_out(seen: list, measured: list) -> bool:
    """Whether the screen left out any of an engine's windows: ``seen`` is the screened
    list, ``measured`` the one as taken."""
    own = [w for w in seen if w is not None]
    taken = [w for w in measured if w is not None]
    return len(own) < len(taken)


def _own_figures(
    seen: list,
    measured: list,
    reason: str,
    policy: RoundPolicy,
    cap: float,
    interleaved: bool,
    drift: float | None,
) -> Figures:
    """An engine's figures from its own windows (``seen`` the screened list, ``measured`` the
    one as taken), before any pairing (:func:`_add_speedup`)."""
    own = [w for w in seen if w is not None]
    taken = [w for w in measured if w is not None]
    throughput, ci, halfwidth, cv, autocorr = throughput_details(own)
    figures = Figures(
        throughput,
        ci,
        halfwidth,
        cv,
        reason,
        policy.window_s,
        interleaved=interleaved,
        drift=drift,
        rounds=len(own),
        stretched=sum(w.seconds for w in taken[:-1]) >= cap,
        disturbed=sum(disturbed_marks(measured)) if policy.screen else 0,
        throughput_autocorr=autocorr,
        kept=[i for i, w in enumerate(taken_of(seen, measured)) if w is not None],
    )
    if len(own) < len(taken):
        figures.throughput_unscreened = throughput_details(taken)[0]
    return figures


def _add_speedup(
    figures: Figures, seen: list, base: list, measured: list, base_measured: list
) -> None:
    """Add to ``figures`` the speedup over the baseline, paired by round: ``seen`` and
    ``base`` the engine's and the baseline's windows as the figures see them, ``measured``
    and ``base_measured`` as taken (the speedup with the disturbed windows kept in)."""
    logs = _log_ratios(seen, base)
    figures.speedup, figures.speedup_ci, figures.speedup_halfwidth = _speedup_of(logs)
    figures.speedup_rounds = len(logs)
    figures.speedup_autocorr = lag1(logs)
    figures.moved = moved_between_halves(seen, base)
    figures.drift_checked = len(logs) >= DRIFT_MIN_ROUNDS
    if _screened_out(seen, measured) or any(w is None for w in base):
        figures.speedup_unscreened = paired_figures(measured, base_measured)[0]


def taken_of(seen: list, measured: list) -> list:
    """The windows an engine took (holes where it took none), each ``None`` where the
    figures left it out: ``seen`` is the screened list, ``measured`` the one as taken."""
    return [s for s, m in zip(seen, measured) if m is not None]


def _view(windows, failed, policy) -> dict[str, list]:
    """Each engine's windows as the figures see them: the disturbed ones left out where
    the policy screens."""
    return {
        name: screened(ws) if policy.screen else ws
        for name, ws in windows.items()
        if name not in failed
    }


def _taking_turns(names, failed, reasons, baseline) -> list[str]:
    """The engines that take a window in the next round: those not done, and the baseline
    while an engine paired with it is not done."""
    pending = [n for n in names if n not in failed and not reasons.get(n)]
    if baseline in names and baseline not in failed and baseline not in pending:
        if any(n != baseline for n in pending):
            pending = [n for n in names if n == baseline or n in pending]
    return pending


def _width(name, windows, baseline, own, policy) -> tuple[float | None, float, float | None]:
    """(relative half-width of this sitting's interval of the figure the user compares, the
    stop rule's target for it, the widest it may be for the UNSTABLE limit or None)."""
    base = windows.get(baseline) if baseline else None
    if base is not None and name != baseline:
        width = paired_figures(windows[name], base)[2]
        return width, policy.precision, policy.enough
    limit = None if policy.enough is None else THROUGHPUT_WIDER * policy.enough
    return throughput_figures(own)[2], THROUGHPUT_WIDER * policy.precision, limit


def _reachable(width: float, limit: float, seconds: float, until: float) -> bool:
    """Whether narrowing ``width`` to ``limit`` fits in ``until`` seconds of this engine's
    windows, ``seconds`` of which gave ``width`` (an interval narrows as one over the square
    root of the rounds)."""
    return seconds * (math.log1p(width) / math.log1p(limit)) ** 2 <= until


def _rounds_it_rests_on(name, windows, baseline) -> int:
    """The rounds the figure of engine ``name`` rests on: for a speedup paired with the
    baseline, those where neither window was left out (an engine with six windows of its
    own had 3-5 pairs where the baseline's windows of other rounds were disturbed, and the
    cap left it without an interval: UNSTABLE, "too few windows"); else its own windows."""
    base = windows.get(baseline) if baseline and name != baseline else None
    if base is None:
        return sum(w is not None for w in windows[name])
    return len(_log_ratios(windows[name], base))  # the pairs the interval is made of


def _stop(name, windows, taken, baseline, settings, policy, cap) -> str:
    """Why engine ``name`` is done after the rounds so far (``""``: not yet). ``windows``
    are every engine's windows as the figures see them (disturbed ones left out), ``taken``
    this engine's windows as measured: the floors count what the figure rests on, the cap
    the seconds spent."""
    own = [w for w in windows[name] if w is not None]
    seconds = sum(w.seconds for w in own)
    spent = sum(w.seconds for w in taken if w is not None)
    requests = sum(w.requests for w in own)
    ready = (
        requests >= settings.repetitions
        and seconds >= settings.min_duration_s
        and _rounds_it_rests_on(name, windows, baseline) >= policy.min_rounds
    )
    width = limit = None
    if ready:
        width, target, limit = _width(name, windows, baseline, own, policy)
        if width is not None and width <= target:
            return "precision"
    # an explicit --max-duration caps everything; the default cap never cuts the floors,
    # nor the rounds an interval needs (an engine whose request outlasts a window)
    if settings.max_duration_s is not None:
        return "max_duration" if spent >= cap else ""
    if spent < cap or not ready:
        return ""
    if limit is None or width is None:
        return "max_duration"
    if width <= limit:
        # known well enough to be STABLE: at the cap, or once the stretch got it there
        before = sum(w.seconds for w in taken[:-1] if w is not None)
        return "max_interval" if before >= cap else "max_duration"
    until = policy.stretch * cap
    if spent >= until or not _reachable(width, limit, spent, until):
        return "max_duration"
    return ""
