"""Figures measured in several sittings (``benchmark --sittings N``), and the spread between
sittings that this run itself measured.

A sitting is one measurement of a model's engines in fresh worker processes with the
engines loaded again. A figure's own interval (its rounds) covers what the host did during
that sitting; the next sitting lands somewhere else (other processes, other memory, another
state of the host). With ``--sittings N`` each group is measured N times, each sitting to
a target √N times looser, a default cap N times shorter and 1/N of the ``--repetitions``
and ``--min-duration`` floors (so that the N sittings cost about what one did), and for
each engine and batch size:

- the **figure** is the geometric mean of its sittings' figures (throughput, and the paired
  speedup where every sitting paired it), and its **sitting interval** the one the
  sittings' own intervals give for that mean (log half-widths in quadrature, over N);
- the **spread between sittings** is estimated from this run's own sittings: every engine
  measured so far in the run (the variance components of
  :func:`mlflow_ngraph.measure.history.variance_components`, by model family where a family
  has enough degrees of freedom), never assumed; where the run has too few yet, the host's
  history gives it, as with one sitting;
- the **re-run interval** is the prediction interval of where another run with N sittings
  lands: t with the spread's degrees of freedom, over the variance of the difference of two
  such means, 2 (sd^2 + own^2) / N;
- the figure is STABLE when its combined interval is within ``--max-interval``, the
  screen did not move the mean beyond that interval, and no sitting was UNSTABLE for what
  the host did (contention, drift, a move against the history); a sitting UNSTABLE only
  for its own interval or its own screen's move counts through the mean, and a sitting is
  measured again for that only where a re-measure can change the mean's verdict, the
  sittings still to come counted at their target (:func:`mean_settles`).

Each sitting's figures also enter the host's history as they are measured, so later runs
with one sitting get a spread from them too. Pure: records in, a record out.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from mlflow_ngraph.measure.history import MIN_DF, Z95, Spread, pooled_spread, rerun_interval
from mlflow_ngraph.measure.hostprobe import READING_METRIC
from mlflow_ngraph.measure.stability import THROUGHPUT_WIDER, screen_move

#: (figure, its interval's ends, its relative half-width, its re-run interval's ends) in a
#: record's metrics, per kind of figure
FIELDS = {
    "throughput": (
        "throughput",
        ("throughput_ci_low", "throughput_ci_high"),
        "throughput_halfwidth",
        ("throughput_rerun_low", "throughput_rerun_high"),
    ),
    "speedup": (
        "speedup_paired",
        ("speedup_ci_low", "speedup_ci_high"),
        "speedup_halfwidth",
        ("speedup_rerun_low", "speedup_rerun_high"),
    ),
}


def figure(record: Mapping, what: str) -> tuple[float, float | None] | None:
    """(value, log half-width of its sitting interval or None) of ``what`` in a record's
    metrics; ``None`` where the record has no such figure."""
    name, (low_name, high_name), _, _ = FIELDS[what]
    metrics = record.get("metrics") or {}
    value, low, high = metrics.get(name), metrics.get(low_name), metrics.get(high_name)
    if not value or value <= 0 or not math.isfinite(value):
        return None
    return value, log_halfwidth(value, low, high)


def log_halfwidth(value: float, low: float | None, high: float | None) -> float | None:
    """The log half-width of ``value``'s interval [``low``, ``high``] (the wider side);
    None without one."""
    if not value or value <= 0 or low is None or high is None or low <= 0 or high <= 0:
        return None
    return max(math.log(high / value), math.log(value / low))


def engine_sittings(records: Sequence[Mapping], what: str, group: str = "") -> list[tuple] | None:
    """One engine's sittings as the variance components take them: (log figure, its own sd
    of the log, the occasion: this run, the ``group`` it was measured in: its model at the
    batch size) of each STABLE sitting with an interval; ``None`` with fewer than two."""
    out = []
    for record in records:
        if (record.get("stability") or {}).get("stable") is False:
            continue
        got = figure(record, what)
        if got is not None and got[1] is not None:
            out.append((math.log(got[0]), got[1] / Z95, "this run", group))
    return out if len(out) >= 2 else None


def run_spread(
    by_family: dict[str, list[list[tuple[float, float]]]], family: str | None, sittings: int
) -> Spread | None:
    """The spread between sittings this run measured (``by_family``: each engine's
    :func:`engine_sittings`), by ``family`` where it has enough of them."""
    return pooled_spread(by_family, family, f"this run's {sittings} sittings")


def with_runs(run: Spread | None, host: Spread | None) -> Spread | None:
    """The spread a run with several sittings uses: between its sittings, what the ``run``
    itself measured (else the ``host``'s history); between runs, what the ``host``'s
    history measured. Where it holds fewer than two runs of the same engines, the record's
    words say that the interval leaves the spread between runs out (measured on this host,
    two runs moved 2.4% apart beyond their sittings' 0.9%: docs/measurement.md)."""
    if run is None:
        return host
    if host is None or not host.between_df:
        return replace(run, source=f"{run.source}; {NO_RUNS}")
    return replace(
        run,
        source=f"{run.source}; between runs {host.source}",
        between=host.between,
        between_df=host.between_df,
    )


#: what a re-run interval built on a run's own sittings alone leaves out
NO_RUNS = (
    "the spread between runs is not in it: not yet measured on this host (a second run of "
    "these engines, or mlflow-ngraph calibrate, measures it)"
)

#: counts a combined record sums over its sittings: the rounds and paired rounds its
#: intervals rest on. The record's other metrics that describe windows (requests, windows,
#: seconds measured, their spread, the latency percentiles) stay the last sitting's, each
#: consistent with the others (compare's fallback interval reads throughput_std beside
#: windows); ``sittings`` says how many there were.
COUNTED = ("rounds", "speedup_rounds", "host_state_rounds", "host_slow_rounds")
#: what each sitting's interval was widened for (the lag-1 autocorrelation of its rounds): the
#: combined record keeps the largest, the sitting whose rounds said least about its centre
WIDENED = ("throughput_autocorr", "speedup_autocorr")
#: whether the drift between a sitting's halves could be judged (1) or not (0): the combined
#: figure's drift was checked only where every sitting's was
CHECKED = ("drift_checked",)


def combine(
    records: Sequence[Mapping],
    spreads: Mapping[str, Spread | None],
    max_interval: float,
) -> dict:
    """One record of an engine at a batch size from its sittings' ``records`` (in order; the
    last one's other metrics, tags and engine are kept): the figures and intervals of the
    module's rules, ``sittings``, each sitting's figure (``sittings_text``), re-run
    intervals from ``spreads`` (per kind of figure, the spread of one sitting: None where
    neither the run nor the host has one) and the combined stability."""
    n = len(records)
    out = copy.deepcopy(dict(records[-1]))
    metrics = out.setdefault("metrics", {})
    metrics["sittings"] = float(n)
    _rests_on(metrics, [r.get("metrics") or {} for r in records])
    said, halfwidths = [], {}
    for what, (_, _, _, rerun_names) in FIELDS.items():
        for key in rerun_names:
            metrics.pop(key, None)  # the last sitting's, from the history: replaced below
        got = [figure(r, what) for r in records]
        if any(g is None for g in got):
            continue
        value, h = _mean_of_sittings(metrics, what, got, [r.get("metrics") or {} for r in records])
        halfwidths[what] = h
        unit = "/s" if what == "throughput" else "x"
        said.append(f"{what} " + ", ".join(f"{v:.4g}{unit}" for v, _ in got))
        _rerun_of_mean(metrics, rerun_names, value, h, spreads.get(what), n)
    out["sittings_text"] = "; ".join(said)
    # the guard's word on each sitting (the last one's alone lost the first one's move)
    moves = [f"sitting {i}: {r['moved']}" for i, r in enumerate(records, 1) if r.get("moved")]
    out.pop("moved", None)
    if moves:
        out["moved"] = "; ".join(moves)
    paired = "speedup" in halfwidths
    compared = "speedup" if paired else "throughput"
    _rerun_source(out, spreads.get(compared))
    limit = max_interval if paired else THROUGHPUT_WIDER * max_interval
    out["stability"] = _stability(records, limit, compared)
    return out


def _rests_on(metrics: dict, sittings_metrics: Sequence[Mapping]) -> None:
    """Write into ``metrics`` what the combined intervals rest on, from every sitting's
    (the last sitting's alone said less than was so): the rounds summed, the largest
    autocorrelation, and the drift checked only where every sitting's was (a sitting that
    did not say is taken as not checked)."""

    def of(key: str) -> list:
        return [m.get(key) for m in sittings_metrics]

    for key in COUNTED:
        if all(v is not None for v in of(key)):
            metrics[key] = float(sum(of(key)))
    for key in WIDENED:
        known = [v for v in of(key) if v is not None and math.isfinite(v)]
        if known:
            metrics[key] = float(max(known))
    for key in CHECKED:
        if any(v is not None for v in of(key)):
            metrics[key] = float(min(0.0 if v is None else v for v in of(key)))
    for reading in READING_METRIC.values():
        _weighted_by_rounds(metrics, reading, of(reading), of("host_state_rounds"))
    moved = [m for m in of("host_state_moved") if m is not None and math.isfinite(m)]
    metrics.pop("host_state_moved", None)
    if moved:  # the largest any sitting showed (its verdict names the sitting)
        metrics["host_state_moved"] = max(moved, key=abs)


def _weighted_by_rounds(metrics: dict, key: str, values: list, rounds: list) -> None:
    """The host probe's reading of the combined record: each sitting's median weighted by
    its rounds read (none where no sitting read one)."""
    known = [(v, n) for v, n in zip(values, rounds) if v is not None and n]
    if known:
        metrics[key] = sum(v * n for v, n in known) / sum(n for _, n in known)


def _mean_of_sittings(
    metrics: dict,
    what: str,
    got: list[tuple[float, float | None]],
    sittings_metrics: Sequence[Mapping],
) -> tuple[float, float | None]:
    """(value, log half-width or None) of the geometric mean of the sittings' figures
    ``got`` of ``what`` (each its value and log half-width), written into ``metrics`` with
    its sitting interval: the sittings' own half-widths in quadrature, over their number;
    and the mean of their unscreened figures (``sittings_metrics``: each sitting's; a
    sitting that left nothing out counts with its own figure), where any left one out."""
    n = len(got)
    name, (low_name, high_name), half_name, _ = FIELDS[what]
    centre = sum(math.log(v) for v, _ in got) / n
    h = None if any(g[1] is None for g in got) else math.sqrt(sum(g[1] ** 2 for g in got)) / n
    value = math.exp(centre)
    metrics[name] = value
    if what == "throughput":
        metrics["throughput_overall"] = value
    metrics[low_name] = value * math.exp(-h) if h is not None else None
    metrics[high_name] = value * math.exp(h) if h is not None else None
    metrics[half_name] = math.expm1(h) if h is not None else None
    # the mean with every window in it, each sitting's screen undone (Sitting.screened)
    if any(_unscreened(m, what) for m in sittings_metrics):
        screened = sum(Sitting.of({"metrics": m}, what).screened for m in sittings_metrics)
        metrics[f"{what}_unscreened"] = math.exp(centre - screened / n)
    else:
        metrics.pop(f"{what}_unscreened", None)
    return value, h


def _unscreened(metrics: Mapping, what: str) -> float | None:
    """A sitting's figure of ``what`` with every window in it (the screen's work undone)."""
    value = metrics.get(f"{what}_unscreened")
    return value if value and value > 0 and math.isfinite(value) else None


def _rerun_of_mean(
    metrics: dict, names, value: float, h: float | None, spread: Spread | None, n: int
) -> None:
    """Write into ``metrics`` (under ``names``) the re-run interval of the mean ``value`` of
    ``n`` sittings (log half-width ``h``), from ``spread``, the spread of one sitting;
    nothing where either is missing."""
    if spread is not None and h is not None:
        interval = rerun_interval(value, h, spread, n)
        if interval is not None:
            metrics[names[0]], metrics[names[1]] = interval[:2]


def _rerun_source(out: dict, chosen: Spread | None) -> None:
    """Say in ``out`` which spread between sittings its re-run intervals rest on
    (``rerun_sd``, ``rerun_df`` in its metrics, ``rerun`` in words), or why there is none."""
    metrics = out["metrics"]
    if chosen is not None:
        one = chosen.of_mean(int(metrics["sittings"]))
        metrics["rerun_sd"], metrics["rerun_df"] = one.sd, float(min(one.df, 10**6))
        out["rerun"] = chosen.words()
    else:
        metrics.pop("rerun_sd", None)
        metrics.pop("rerun_df", None)
        out["rerun"] = (
            f"none: fewer than {MIN_DF} degrees of freedom between sittings so far, in this "
            "run and in this host's history"
        )


def _stability(records: Sequence[Mapping], limit: float, what: str) -> dict:
    """STABLE when the mean of the sittings is (:func:`mean_causes`) and no sitting was
    UNSTABLE for what the host did (a sitting UNSTABLE only for its own interval or its own
    screen's move counts through the mean)."""
    causes = _host_causes(records)
    causes += mean_causes([Sitting.of(r, what) for r in records], limit, what)
    return {
        "stable": not causes,
        "reason": "; ".join(causes),
        "attempts": sum(int((r.get("stability") or {}).get("attempts", 1)) for r in records),
    }


@dataclass(frozen=True)
class Sitting:
    """One sitting's figure as the mean of several judges it."""

    #: the log half-width of its sitting interval (None: too few windows for one)
    h: float | None
    #: the log of the figure over the same figure with every window in it (the screen's
    #: change to it; 0 where not known)
    screened: float = 0.0
    #: windows left out as disturbed, and windows measured
    disturbed: int = 0
    windows: int = 0

    @classmethod
    def of(cls, record: Mapping, what: str) -> Sitting:
        """The sitting of ``record`` (a sitting's record) for the figure ``what``."""
        metrics = record.get("metrics") or {}
        got = figure(record, what)
        value, h = got if got is not None else (None, None)
        unscreened = _unscreened(metrics, what)
        return cls(
            h,
            math.log(value / unscreened) if value and unscreened else 0.0,
            int(metrics.get("windows_disturbed") or 0),
            int(metrics.get("windows") or 0),
        )


def mean_causes(sittings: Sequence[Sitting], limit: float, what: str) -> list[str]:
    """What makes the mean of ``sittings`` (of ``what``) UNSTABLE on its own: its interval
    (the sittings' log half-widths in quadrature, over their number) missing or wider than
    ``limit``, or the screen's change to it (the mean of theirs) beyond that interval with
    :data:`~mlflow_ngraph.measure.stability.SCREEN_DECIDES` of all their windows left out."""
    n = len(sittings)
    if any(s.h is None for s in sittings):
        return [f"too few windows for a {what} interval"]
    h = math.sqrt(sum(s.h * s.h for s in sittings)) / n
    causes = []
    if math.expm1(h) > limit:
        causes.append(
            f"the {n} sittings' {what} interval +-{100 * math.expm1(h):.1f}% is wider "
            f"than +-{100 * limit:.3g}%: measure on a quiet host"
        )
    shift = sum(s.screened for s in sittings) / n
    moved = screen_move(
        shift, h, sum(s.disturbed for s in sittings), sum(s.windows for s in sittings)
    )
    if moved is not None:
        causes.append(
            f"leaving out the disturbed windows moved the {what} {100 * moved:+.1f}% over "
            f"the {n} sittings, more than its interval: measure on a quiet host"
        )
    return causes


@dataclass(frozen=True)
class Earlier:
    """What a sitting of several is judged with (:func:`mean_settles`): per kind of figure,
    the earlier sittings' (in order), how many sittings are still to come, and what made an
    earlier sitting UNSTABLE for what the host did (``""``: none was), which makes their
    combined verdict UNSTABLE whatever this sitting gives (:func:`combine`)."""

    figures: dict[str, list[Sitting]] = field(default_factory=dict)
    to_come: int = 0
    host_unstable: str = ""


def mean_settles(
    earlier: Sequence[Sitting], now: Sitting, to_come: int, limit: float, best: float, what: str
) -> bool:
    """Whether measuring a sitting of several again can settle the verdict on their mean,
    when this sitting alone was UNSTABLE only for its own interval or its screen's move:
    not where the mean is STABLE with it as it is (:func:`mean_causes`), nor where this
    sitting measured again at ``best`` (its own target, nothing left out) would still leave
    the mean UNSTABLE. ``earlier``: the earlier sittings; ``to_come``: the sittings still to
    come, each counted at ``best``, as long as this one, nothing left out; ``limit`` and
    ``best`` relative half-widths. Where this sitting has no interval a re-measure may give
    one; where an earlier one had none, their mean has none whatever this one does."""
    if now.h is None:
        return True
    if any(s.h is None for s in earlier):
        return False
    at_best = Sitting(math.log1p(best), 0.0, 0, now.windows)  # as long as this one
    ahead = [at_best] * to_come
    if not mean_causes([*earlier, now, *ahead], limit, what):
        return False
    return not mean_causes([*earlier, at_best, *ahead], limit, what)


def earlier_sittings(records: Sequence[Mapping], to_come: int) -> Earlier:
    """What a sitting is judged with: the earlier sittings' ``records`` (in order), per kind
    of figure (a kind some sitting has no figure of is left out), the ``to_come``, and the
    earlier sittings UNSTABLE for what the host did, as the combined verdict says them."""
    figures = {}
    for what in FIELDS:
        if all(figure(r, what) is not None for r in records):
            figures[what] = [Sitting.of(r, what) for r in records]
    return Earlier(figures, to_come, "; ".join(_host_causes(records)))


def _host_causes(records: Sequence[Mapping]) -> list[str]:
    """Each of the sittings' ``records`` UNSTABLE for what the host did (not only for its
    own interval or its own screen's move, which count through the mean), as
    ``sitting i: reason``."""
    causes = []
    for i, record in enumerate(records, 1):
        stability = record.get("stability") or {}
        if stability.get("stable") is False and not stability.get("own_only"):
            causes.append(f"sitting {i}: {stability.get('reason', '')}".rstrip(": "))
    return causes
