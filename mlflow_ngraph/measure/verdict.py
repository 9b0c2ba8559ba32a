"""Which engine won, and whether beyond noise: per model and batch size, the fastest valid
engine, its lead over the next one, judged on the re-run intervals where they exist, else
on the sitting's (the summary, the MLflow view and compare all read this one verdict)."""

from __future__ import annotations

from typing import Any


def winners(rows) -> list[dict[str, Any]]:
    """Per model and batch size, the fastest valid (status OK) row that is not the baseline,
    with its lead over the next-fastest valid row of any compiler (the baseline included):
    ``beyond`` is True when the two 95% intervals separate, False when they overlap and None
    when either was not measured; ``stable`` is the winner row's own mark (the one the
    summary shows for that row: a paired speedup's mark already holds its baseline's noise);
    ``unstable`` names which of the winner, the next row and the baseline were judged
    UNSTABLE. Rows carry ``label``.

    Rows are ranked, and the lead is a ratio, on the paired speedups where every valid row
    of the group has one (identity's is 1): those come from the same rounds, so the host's
    drift cancels, and they are what ``beyond`` judges. Otherwise on the throughputs."""
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
    return {
        "model": model,
        "batch_size": b,
        "label": best.label,
        "throughput": best.throughput,
        "speedup": best.speedup,
        "next": second.label if second is not None else None,
        "lead": score(best) / score(second) if second is not None and score(second) else None,
        "beyond": _beyond(best, second),
        "stable": getattr(best, "stable", None),
        "unstable": _unstable_roles(best, second, baseline),
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


def _beyond(best, second) -> bool | None:
    """Whether ``best`` leads ``second`` beyond noise: judged on the speedups' re-run
    intervals where the host has measured its spread between sittings (a lead a re-run
    keeps), else on their 95% intervals of this sitting (paired with identity in the same
    rounds: the host's drift cancels), the throughputs' where a speedup has none. ``None``
    when neither can say."""
    if second is None:
        return None
    for low_name, high_name in (
        ("speedup_rerun_low", "speedup_rerun_high"),
        ("speedup_ci_low", "speedup_ci_high"),
    ):
        low = getattr(best, low_name, None)
        if second.compiler == "identity" and low is not None:
            return low > 1.0
        high = getattr(second, high_name, None)
        if low is not None and high is not None:
            return low > high
    for low_name, high_name in (("rerun_low", "rerun_high"), ("ci_low", "ci_high")):
        low, high = getattr(best, low_name, None), getattr(second, high_name, None)
        if low is not None and high is not None:
            return low > high
    return None
