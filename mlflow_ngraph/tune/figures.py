"""A trial's figures against the identity engine measured in its own group: what Optuna is
told, and after how many samples its compile pays for itself.

``references`` maps (group, batch size) to the identity's record of that group."""

from __future__ import annotations

from mlflow_ngraph.measure import metrics as M
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tune.trials import Trial

References = dict[tuple[int, int], dict]


def paired_values(
    trial: Trial, objectives: list[str], references: References
) -> list[float] | None:
    """The paired figure of each objective (``None``: nothing to rank: failed, invalid,
    or no identity paired with it)."""
    if trial.status != S.STATUS_OK:
        return None
    out = []
    for objective in objectives:
        if objective == "latency_p99_ms":
            reference = references.get((trial.group, trial.batch_size)) or {}
            mine = trial.metrics.get(S.M_LATENCY_P99)
            theirs = (reference.get("metrics") or {}).get(S.M_LATENCY_P99)
            if not mine or not theirs:
                return None
            out.append(mine / theirs)
        else:
            if trial.speedup is None:
                return None
            out.append(trial.speedup)
    return out


def payback(trial: Trial, compiled: Trial | None, references: References) -> float | None:
    """Samples until ``trial``'s compile is paid back against the identity of its group;
    ``compiled``: the trial whose cell built its engine (``None``: not known)."""
    if compiled is None:
        return None
    reference = references.get((trial.group, trial.batch_size)) or {}
    identity = (reference.get("metrics") or {}).get(S.M_THROUGHPUT)
    return M.payback(compiled.metrics.get(S.M_COMPILE), identity, trial.speedup, trial.batch_size)
