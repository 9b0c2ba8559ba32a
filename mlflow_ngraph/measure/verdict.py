"""Which engine won, and whether beyond noise: per model and batch size, the fastest valid
engine, its lead over the next one, judged on the re-run intervals where they exist, else
on the sitting's (the summary, the MLflow view and compare all read this one verdict).

The rules every output shares live here, so that no two places say different things:

- a lead (or any order of two figures) is judged "beyond noise" only where both figures
  are STABLE; a figure marked UNSTABLE is noise on this host, and an order built on it is
  "not judged" (:func:`noise_text` names which side);
- a lead is "beyond noise" when the re-run intervals separate (a re-run is expected to keep
  it); where the host has no spread between sittings yet, the sitting intervals judge it and
  the words say so: "beyond this run's noise" (a second process of the same engine can
  differ by more than one sitting sees);
- the speedup is one quantity: the paired estimate where the engines were measured in
  rounds with eager (the median of the per-round ratios: each ratio's two windows are
  seconds apart, so the host's drift cancels), else the ratio of the two throughputs; its
  interval follows one rule (:func:`speedup_interval`);
- the ratio of the two throughputs is shown beside the paired speedup only where the two
  part by more than their intervals (:func:`parted`), with the reason (:data:`PARTED_REASON`).
"""

from __future__ import annotations

import math
from typing import Any

#: why the ratio of two throughputs can part from the paired speedup of the same rounds:
#: each throughput is the samples over the seconds of its engine's own windows, and those
#: differ. Eager keeps taking windows while any engine paired with it is not done (rounds
#: the engine was not in), the screen leaves out different windows on each side, and a
#: window lasts at least one call, so a slow spell weighs by its length. The ratio compares
#: totals over different stretches of time; the paired estimate compares the two engines
#: inside each round.
PARTED_REASON = (
    "the throughputs were measured over different windows (eager's include rounds the "
    "engine was not in, and a slow window weighs by its length); the paired one compares "
    "the two inside each round and is the estimate"
)


#: which intervals a lead was judged on: the re-run intervals (where a re-run is expected to
#: land: the host's spread between sittings measured), or this sitting's alone
RERUN, SITTING = "re-run", "sitting"

#: a lead the sitting intervals separate where the host has no spread between sittings yet:
#: beyond the noise this run saw, not yet known to be beyond a re-run's
BEYOND_RUN = "beyond this run's noise"

#: why a figure has no re-run interval (the host has measured no spread between sittings
#: yet), said once under every table that shows the column empty
NO_RERUN = (
    "none yet: this host's spread needs measuring: mlflow-ngraph calibrate, a second run "
    "of the same engines, or --sittings 2; until then an order of two figures is judged "
    "on their 95% intervals alone"
)


def shown_rerun(row) -> tuple[float | None, float | None, bool]:
    """A row's re-run interval as every table's ``re-run CI`` column shows it: its
    speedup's (True); eager's row, and a row without a speedup, its throughput's (False),
    never a throughput's beside a speedup; ``(None, None, ...)`` where the host has no
    measured spread."""
    low, high = _rerun(row)
    if low is not None and high is not None:
        return low, high, True
    if row.compiler != "identity" and getattr(row, "speedup", None) is not None:
        return None, None, True
    return getattr(row, "rerun_low", None), getattr(row, "rerun_high", None), False


def winners(rows) -> list[dict[str, Any]]:
    """Per model and batch size, the fastest valid (status OK) row that is not the baseline,
    with its lead over the next-fastest valid row of any compiler (the baseline included):
    ``beyond`` is True when the two 95% intervals separate, False when they overlap and None
    when either was not measured, or when the winner or the next row is UNSTABLE (an order
    of noise is not judged); ``judged_on`` which intervals said it (:data:`RERUN`,
    :data:`SITTING`); ``noise`` says it in words (:func:`noise_text`); ``stable`` is
    the winner row's own mark at its batch size (the one the summary shows for that row: a
    paired speedup's mark already holds its baseline's noise); ``unstable`` names which of
    the winner, the next row and the baseline were judged UNSTABLE. Rows carry ``label``.

    Rows are ranked, and the lead is a ratio, on the paired speedups where every valid row
    of the group has one (identity's is 1): those come from the same rounds, so the host's
    drift cancels, and they are what ``beyond`` judges. Otherwise on the throughputs."""
    settle(rows)
    out = []
    for (model, b), valid in _valid_groups(rows).items():
        won = _winner(model, b, valid)
        if won is not None:
            out.append(won)
    return out


def _valid_groups(rows) -> dict[tuple[str, int], list[Any]]:
    """The valid rows (status OK, a throughput) by model and batch size, in their order."""
    groups: dict[tuple[str, int], list[Any]] = {}
    for r in rows:
        if r.status == "OK" and r.throughput is not None:
            groups.setdefault((r.model, r.batch_size), []).append(r)
    return groups


def _winner(model: str, b: int, valid: list[Any]) -> dict[str, Any] | None:
    """The verdict of :func:`winners` for one model and batch size from its ``valid`` rows
    (``None`` where only the baseline is among them)."""
    paired = all(_paired(r) is not None for r in valid)
    score = _paired if paired else (lambda r: r.throughput)
    ranked = sorted(valid, key=score, reverse=True)
    candidates = [r for r in ranked if r.compiler != "identity"]
    if not candidates:
        return None
    best = candidates[0]
    rest = [r for r in ranked if r is not best]
    second = rest[0] if rest else None
    baseline = next((r for r in ranked if r.compiler == "identity"), None)
    unstable = _unstable_roles(best, second, baseline)
    beyond, on = (None, None) if _not_judged(unstable) else _beyond(best, second)
    return {
        "model": model,
        "batch_size": b,
        "label": best.label,
        "throughput": best.throughput,
        "speedup": best.speedup,
        "next": second.label if second is not None else None,
        "lead": score(best) / score(second) if second is not None and score(second) else None,
        "beyond": beyond,
        "judged_on": on,
        "noise": noise_text(beyond, unstable, on),
        "stable": getattr(best, "stable", None),
        "unstable": unstable,
    }


def _unstable_roles(best, second, baseline) -> list[str]:
    """Which of the winner (``own``), the next row and the baseline were judged UNSTABLE."""
    return [
        role
        for role, r in (("own", best), ("next", second), ("baseline", baseline))
        if r is not None and getattr(r, "stable", None) is False
    ]


def _paired(row) -> float | None:
    """A row's speedup over identity (identity's own: 1)."""
    return 1.0 if row.compiler == "identity" else row.speedup


def _beyond(best, second) -> tuple[bool | None, str | None]:
    """Whether ``best`` leads ``second`` beyond noise, and which intervals said it
    (:data:`RERUN` or :data:`SITTING`): judged on the speedups' re-run intervals where the
    host has measured its spread between sittings (a lead a re-run keeps), else on their 95%
    intervals of this sitting as shown (:func:`speedup_interval`: paired with identity in
    the same rounds where they can be), the throughputs' where a speedup has none.
    ``(None, None)`` when neither can say."""
    if second is None:
        return None, None
    for interval, on in ((_rerun, RERUN), (_shown, SITTING)):
        low, high = interval(best)[0], interval(second)[1]
        if second.compiler == "identity" and low is not None:
            return low > 1.0, on
        if low is not None and high is not None:
            return low > high, on
    for low_name, high_name, on in (
        ("rerun_low", "rerun_high", RERUN),
        ("ci_low", "ci_high", SITTING),
    ):
        low, high = getattr(best, low_name, None), getattr(second, high_name, None)
        if low is not None and high is not None:
            return low > high, on
    return None, None


def _rerun(row) -> tuple[float | None, float | None]:
    return getattr(row, "speedup_rerun_low", None), getattr(row, "speedup_rerun_high", None)


def _shown(row) -> tuple[float | None, float | None]:
    """A row's speedup interval as every output shows it (:func:`settle`)."""
    return getattr(row, "speedup_interval", None) or (None, None)


def _not_judged(unstable) -> list[str]:
    """The sides of a lead that are UNSTABLE (the winner's, the next row's): an order of
    two figures is judged only where both are STABLE. The baseline's noise is in each
    paired speedup's own mark."""
    return [role for role in unstable if role in ("own", "next")]


def noise_text(beyond: bool | None, unstable=(), on: str | None = None) -> str:
    """The one wording of a lead's verdict: ``beyond noise`` (judged on the re-run
    intervals: a lead a re-run keeps), ``beyond this run's noise`` where the host has no
    spread between sittings yet and the sitting intervals said it (:data:`SITTING`: a
    re-run may not keep it), ``within noise``, ``not judged: winner UNSTABLE`` (``next``,
    ``winner and next``) where either side is noise on this host, ``-`` where no interval
    says."""
    sides = _not_judged(unstable)
    if sides:
        names = " and ".join("winner" if s == "own" else "next" for s in sides)
        return f"not judged: {names} UNSTABLE"
    if beyond and on == SITTING:
        return BEYOND_RUN
    return {True: "beyond noise", False: "within noise", None: "-"}[beyond]


def _log_halves(value, interval) -> tuple[float, float]:
    """The half-widths of ``interval`` around ``value`` on the log scale (below, above): NaN
    where either is missing or not positive."""
    if value is None or interval is None or None in interval or not value > 0:
        return math.nan, math.nan
    low, high = interval
    below = math.log(value) - math.log(low) if low and low > 0 else math.nan
    above = math.log(high) - math.log(value) if high and high > 0 else math.nan
    return below, above


def throughputs_interval(centre, own, own_ci, base, base_ci) -> tuple[float, float] | None:
    """A 95% interval around ``centre`` (a speedup) from the two throughputs' intervals,
    taken as independent measurements: ``log S = log T_c - log T_i``, so each side's log
    half-widths (below and above: the intervals need not be symmetric) add in quadrature.
    Interval arithmetic (``low_c / high_i`` to ``high_c / low_i``) would assume both ends at
    once and is about 1.4x too wide. ``None`` where an interval is missing."""
    below_c, above_c = _log_halves(own, own_ci)
    below_i, above_i = _log_halves(base, base_ci)
    down, up = math.hypot(below_c, above_i), math.hypot(above_c, below_i)
    if centre is None or math.isnan(centre) or math.isnan(down) or math.isnan(up):
        return None
    return centre * math.exp(-down), centre * math.exp(up)


def speedup_interval(speedup, paired_ci, own, own_ci, base, base_ci):
    """The one rule for a speedup's 95% interval, wherever it is shown: the interval of the
    paired rounds where it holds the speedup (the host's drift cancels within a round);
    else (too few rounds for a signed-rank interval, or the engines measured apart) the one
    the two throughputs' intervals give around the speedup (:func:`throughputs_interval`);
    else ``None``."""
    if speedup is None or speedup != speedup:
        return None
    if paired_ci is not None and None not in paired_ci and paired_ci[0] <= speedup <= paired_ci[1]:
        return paired_ci
    return throughputs_interval(speedup, own, own_ci, base, base_ci)


def parted(speedup_ci, ratio_ci) -> bool:
    """Whether the speedup and the ratio of the throughputs part by more than their
    intervals (the two do not overlap); False where either is missing."""
    if speedup_ci is None or ratio_ci is None:
        return False
    return speedup_ci[1] < ratio_ci[0] or ratio_ci[1] < speedup_ci[0]


def settle(rows) -> None:
    """Give each row the speedup figures every output shows, by the rules above:
    ``speedup_interval`` (low, high or None), and where the speedup is paired and the ratio
    of the throughputs parts from it, ``ratio_parted`` (the ratio and its interval; else
    None). The baseline is the identity row of the same model and batch size."""
    base = {(r.model, r.batch_size): r for r in rows if r.compiler == "identity"}
    for r in rows:
        r.speedup_interval, r.ratio_parted = None, None
        ident = base.get((r.model, r.batch_size))
        if r.compiler == "identity" or ident is None:
            continue
        own_ci = (getattr(r, "ci_low", None), getattr(r, "ci_high", None))
        base_ci = (getattr(ident, "ci_low", None), getattr(ident, "ci_high", None))
        paired_ci = (getattr(r, "speedup_ci_low", None), getattr(r, "speedup_ci_high", None))
        r.speedup_interval = speedup_interval(
            r.speedup, paired_ci, r.throughput, own_ci, ident.throughput, base_ci
        )
        ratio = getattr(r, "speedup_ratio", None)
        if ratio is None or not getattr(r, "paired", False):
            continue
        ratio_ci = throughputs_interval(ratio, r.throughput, own_ci, ident.throughput, base_ci)
        if parted(r.speedup_interval, ratio_ci):
            r.ratio_parted = (ratio, ratio_ci)
