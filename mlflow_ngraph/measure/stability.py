"""Whether a measurement can be trusted, judged on the figure the user compares.

A measurement is UNSTABLE when

- the 95% interval of its speedup over identity (paired rounds) is wider than
  ``max_interval`` of the speedup (relative half-width; default +-5%); identity itself, and
  an engine measured without a baseline, on their throughput against twice that
  (:data:`THROUGHPUT_WIDER`: +-10%);
- it has too few windows for an interval (fewer than 3);
- other processes used more than ``other_cpu_threshold`` percent of the machine's CPU time
  during its windows;
- its process lost CPU (to another process or the hypervisor) in more than
  :data:`MAX_DISTURBED` of its windows: those windows are left out of the figures
  (:func:`mlflow_ngraph.measure.rounds.screened`), but with half of them disturbed the
  median window the screen judges by may be a disturbed one itself;
- or the host drifted beyond what its rounds cover: the speedup of the rounds' first half
  and that of their second half have 95% intervals that do not overlap (the pairing did
  not cancel what the host did). The host's drift itself (the baseline's spread across
  rounds) is shown beside the figures, not judged: the intervals are as wide as it makes
  them, and a paired ratio cancels most of it.

It is not judged on the spread of single requests: a 1 ms request's CV measures timer and
scheduler jitter, not the number the user reads. Pure: it names no MLflow key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: default of ``--max-interval``: the widest relative half-width of a STABLE figure's 95%
#: interval
MAX_INTERVAL = 0.05
#: an absolute throughput's interval may be this many times wider than a speedup's (the
#: stop rule's target and the UNSTABLE limit alike): on a drifting host a paired ratio is
#: known far better than an absolute speed (a quiet 2-core VM: the per-round ratio's median
#: deviation 3%, the windows' own rates 1.9x from slowest to fastest within a minute)
THROUGHPUT_WIDER = 2.0
#: default of ``--max-other-cpu``, percent of all logical cores
OTHER_CPU_THRESHOLD = 25.0
#: the largest share of an engine's windows that may be disturbed (left out because its
#: process lost CPU) in a STABLE measurement: the screen judges each window against the
#: engine's median window, which is an undisturbed one only while fewer than half are
#: disturbed. (It was a quarter: a host whose kernel or hypervisor takes a core now and then
#: disturbed 20-40% of every engine's windows for spells of tens of minutes, the windows
#: left were clean, and the mark sent every group back to be measured again:
#: docs/measurement.md)
MAX_DISTURBED = 0.5


@dataclass(frozen=True)
class Stability:
    stable: bool
    reason: str = ""  # why not, with the fix, when unstable
    #: whether measuring again after a pause may settle it: not when the interval alone is
    #: too wide after the rounds already went past the cap to narrow it (more of the same
    #: host gives the same spread)
    retry: bool = True
    #: unstable only for what the mean of several sittings judges again, nothing the host
    #: did: its interval too wide (or missing), or the change leaving its disturbed windows
    #: out made to it. One of several sittings so marked may still give a mean known well
    #: enough (measure/sittings.py)
    own_only: bool = False
    #: what a gross move against the same engine measured earlier on this host said, where
    #: that marked it, and the move (now over then): a baseline's, the speedups paired with
    #: it rest on it
    history: str | None = None
    history_ratio: float | None = None


def _given(value: float | None) -> bool:
    return value is not None and not math.isnan(value)


def assess(
    halfwidth: float | None,
    other_cpu_percent: float | None,
    moved: float | None = None,
    max_interval: float = MAX_INTERVAL,
    other_cpu_threshold: float = OTHER_CPU_THRESHOLD,
    what: str = "throughput",
    stretched: bool = False,
    disturbed: tuple[int, int] | None = None,
    history: str | None = None,
    screen_moved: float | None = None,
    state: tuple[float, int, int, str] | None = None,
) -> Stability:
    """Judge one measurement. ``halfwidth`` is the relative half-width of the 95% interval
    of ``what`` (``speedup`` or ``throughput``), ``None`` when there was too little to
    make one; ``moved`` the speedup's change between the halves of the rounds where their
    intervals part (:func:`mlflow_ngraph.measure.rounds.moved_between_halves`);
    ``disturbed`` (windows left out as disturbed, windows measured); ``state`` (the
    change, rounds in the host's slow state, rounds read, the probe's kind) where the figure
    in the rounds that met the host's slow state parted from the rest
    (:func:`mlflow_ngraph.measure.rounds.moved_with_state`); ``history`` what a
    gross move against the same engine measured earlier on this host says
    (:func:`mlflow_ngraph.measure.history.check`); ``screen_moved`` the change leaving the
    disturbed windows out made to the figure, where it exceeds the figure's interval. A
    host quantity that was not measured (None/NaN) is not held against it."""
    causes = _width_causes(halfwidth, max_interval, what)
    own = len(causes) + _given(screen_moved)
    causes += _contention_causes(other_cpu_percent, other_cpu_threshold, disturbed)
    causes += _move_causes(moved, screen_moved, what)
    if state is not None and _given(state[0]):
        causes.append(state_cause(what, *state))
    if history:
        causes.append(history)
    if not causes:
        return Stability(True)
    wide_only = len(causes) == 1 and _given(halfwidth) and halfwidth > max_interval
    return Stability(
        False,
        "; ".join(causes) + ": measure on a quiet host",
        not (wide_only and stretched),
        own_only=len(causes) == own,
        history=history,
    )


#: the share of its windows the screen must have left out before the change it made marks a
#: figure (:func:`screen_move`)
SCREEN_DECIDES = 0.25


def screen_move(
    log_change: float | None, log_halfwidth: float | None, disturbed: int, windows: int
) -> float | None:
    """The relative change the screen made to a figure (``log_change``: the log of the figure
    over the one with every window in it) where the figure rests on its judgement: the
    change exceeds the figure's own interval (``log_halfwidth``) and at least
    :data:`SCREEN_DECIDES` of the ``windows`` were left out as ``disturbed``. One window
    left out (the first after a pause, whose threads woke on cold cores: seen at half the
    rate of the rest on an idle host) moves a narrow figure more than its interval without
    the figure resting on the screen; else None."""
    if log_change is None or log_halfwidth is None or windows <= 0:
        return None
    if disturbed < SCREEN_DECIDES * windows or abs(log_change) <= log_halfwidth:
        return None
    return math.expm1(log_change)


def _width_causes(halfwidth: float | None, max_interval: float, what: str) -> list[str]:
    """What makes the interval of ``what`` fail the check: missing, or wider than
    ``max_interval``."""
    if not _given(halfwidth):
        return [f"too few windows for a {what} interval"]
    if halfwidth > max_interval:
        return [
            f"{what} interval +-{100 * halfwidth:.1f}% is wider than +-{100 * max_interval:.3g}%"
        ]
    return []


def _contention_causes(
    other_cpu_percent: float | None,
    other_cpu_threshold: float,
    disturbed: tuple[int, int] | None,
) -> list[str]:
    """How other processes took the host from the measurement: more than
    ``other_cpu_threshold`` percent of its CPU, or a core in more than :data:`MAX_DISTURBED`
    of the windows."""
    causes = []
    if _given(other_cpu_percent) and other_cpu_percent > other_cpu_threshold:
        causes.append(
            f"other processes used {other_cpu_percent:.1f}% of the CPU (> {other_cpu_threshold:g}%)"
        )
    if disturbed and disturbed[1] > 0 and disturbed[0] > MAX_DISTURBED * disturbed[1]:
        causes.append(
            f"the host was contended: the process's threads waited for a core in "
            f"{disturbed[0]} of {disturbed[1]} windows (> {100 * MAX_DISTURBED:g}%)"
        )
    return causes


def _move_causes(moved: float | None, screen_moved: float | None, what: str) -> list[str]:
    """How the figure moved beyond its interval: between the halves of the rounds, or when
    the disturbed windows were left out."""
    causes = []
    if _given(moved):
        causes.append(
            f"the host drifted beyond what the rounds cover: the {what} moved "
            f"{100 * moved:+.1f}% between the first and second half of the rounds"
        )
    if _given(screen_moved):
        causes.append(
            f"leaving out the disturbed windows moved the {what} {100 * screen_moved:+.1f}%, "
            "more than its interval"
        )
    return causes


def state_cause(what: str, change: float, slow: int, rounds: int, kind: str = "join") -> str:
    """The words of a figure that parted between the host's two states."""
    from mlflow_ngraph.measure.hostprobe import SLOW, WORDS

    reading, cause = WORDS.get(kind, WORDS["join"])
    return (
        f"the host ran in two states: the {what} was {100 * change:+.1f}% in the {slow} of "
        f"{rounds} rounds where {reading} read under {100 * SLOW:.0f}% of its fast state "
        f"({cause}), beyond both intervals"
    )


#: each cause :func:`assess` (and the history check) words, and its few words on a cell's
#: line: (pattern, short form from the pattern's groups)
_SHORT = (
    (r"^(?:\w+) interval \+-([\d.]+)% is wider", "interval +-{0}%"),
    (r"^too few windows", "too few windows"),
    (r"^other processes used ([\d.]+)% of the CPU", "other processes {0}% CPU"),
    (r"^the host was contended", "host contended"),
    (r"^the host drifted .* moved ([+-][\d.]+%)", "host drifted {0}"),
    (r"^leaving out the disturbed windows moved the \w+ ([+-][\d.]+%)", "disturbed {0}"),
    (r"^the host ran in two states: the \w+ was ([+-][\d.]+%)", "host slow state {0}"),
    (r"^the \w+ moved (\S+(?: lower)?) against this engine", "moved {0} against an earlier run"),
    (r"^its baseline (\S+): the \w+ moved (\S+(?: lower)?) against", "baseline {0} moved {1}"),
    (
        r"^the \w+ moved (\S+(?: lower)?) against this run's earlier sitting",
        "moved {0} against this run's earlier sitting",
    ),
)


def short_reason(reason: str) -> str:
    """An UNSTABLE verdict's ``reason`` (or a STABLE figure's move against its history) in a
    few words a cause, for a cell's one line on the terminal: ``interval +-101.6%, other
    processes 30.2% CPU, host contended``. The full text is the log file's and the run's."""
    import re

    causes = reason.strip().removesuffix(": measure on a quiet host").split("; ")
    short = []
    for cause in filter(None, causes):
        # a figure combined from sittings names the sitting each cause came from
        sitting, cause = re.match(r"^(sitting \d+: )?(.*)$", cause, re.S).groups()
        for pattern, form in _SHORT:
            found = re.match(pattern, cause)
            if found:
                short.append((sitting or "") + form.format(*found.groups()))
                break
        else:
            head = cause.split(":")[0]
            short.append((sitting or "") + (head if len(head) <= 40 else head[:39] + "…"))
    return ", ".join(short)
