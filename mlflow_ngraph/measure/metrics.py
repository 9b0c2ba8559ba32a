"""The paper's metrics, as pure functions of throughputs (samples/s).

With T_c(b) the throughput of compiler c at batch size b, and identity the eager baseline on
the same device and model:

- speedup_c(b) = T_c(b) / T_identity(b)
- RTR_c(b) = T_c(b) / T_c(1)                 relative throughput rate
- ASE_c(b) = T_c(b) / (b * T_c(1))           absolute scaling efficiency
- BSR_c(b) = ASE_c(b) / ASE_identity(b)      batch scaling resilience
- payback_c(b) = compile_c / (1/T_identity(b) - 1/T_c(b)) / b   inferences (requests of b
  samples) after which the compile time is paid back against eager (infinite when c is
  not faster)
- depth slope: least-squares slope of speedup against depth; retention: speedup at the
  deepest stack / speedup at depth 1.

Each returns ``None`` when an input it needs is missing: nothing is ever divided by a guess.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

Throughputs = Mapping[int, float]  # batch size -> samples/s


def _ok(value: float | None) -> bool:
    return value is not None and value == value and value > 0  # rejects None, NaN, <= 0


def speedup(compiled: float | None, identity: float | None) -> float | None:
    return compiled / identity if _ok(compiled) and _ok(identity) else None


def rtr(throughputs: Throughputs, batch_size: int) -> float | None:
    t_b, t_1 = throughputs.get(batch_size), throughputs.get(1)
    return t_b / t_1 if _ok(t_b) and _ok(t_1) else None


def ase(throughputs: Throughputs, batch_size: int) -> float | None:
    value = rtr(throughputs, batch_size)
    return value / batch_size if value is not None else None


def bsr(compiled: Throughputs, identity: Throughputs, batch_size: int) -> float | None:
    ase_c, ase_i = ase(compiled, batch_size), ase(identity, batch_size)
    return ase_c / ase_i if ase_c is not None and _ok(ase_i) else None


def depth_slope(depths: Sequence[float], speedups: Sequence[float]) -> float | None:
    """Least-squares slope of speedup against depth (``None`` with fewer than two depths)."""
    pairs = [(float(d), float(s)) for d, s in zip(depths, speedups) if s is not None]
    if len({d for d, _ in pairs}) < 2:
        return None
    mean_d = sum(d for d, _ in pairs) / len(pairs)
    mean_s = sum(s for _, s in pairs) / len(pairs)
    num = sum((d - mean_d) * (s - mean_s) for d, s in pairs)
    den = sum((d - mean_d) ** 2 for d, _ in pairs)
    return num / den


def retention(depth_speedups: Mapping[int, float]) -> float | None:
    """Speedup at the deepest stack divided by speedup at depth 1."""
    if 1 not in depth_speedups or len(depth_speedups) < 2:
        return None
    first, last = depth_speedups[1], depth_speedups[max(depth_speedups)]
    return last / first if _ok(first) and last is not None else None


def payback(
    compile_s: float | None,
    identity: float | None,
    ratio: float | None,
    batch_size: int = 1,
) -> float | None:
    """Inferences (requests of ``batch_size`` samples: the paper's unit, what
    ``payback_inferences`` names) after which ``compile_s`` is paid back against identity:
    ``compile_s / (1/T_identity - 1/T_c) / batch_size`` with ``T_c = ratio * T_identity``
    (throughputs in samples/s; ``ratio``: the speedup, paired where measured in rounds).
    ``inf`` when the compiler is not faster."""
    if compile_s is None or compile_s != compile_s or compile_s < 0:
        return None
    if not _ok(identity) or ratio is None or ratio != ratio:
        return None
    if ratio <= 1.0:
        return math.inf
    return compile_s * identity * ratio / (ratio - 1.0) / max(int(batch_size), 1)


def relative_metrics(
    compiled: Throughputs,
    identity: Throughputs | None,
    paired: Throughputs | None = None,
    compile_s: Mapping[int, float] | None = None,
) -> dict[int, dict[str, float | None]]:
    """speedup, speedup_ratio (T_c / T_identity, whatever stands in for the speedup), rtr,
    ase, bsr and payback for every batch size of ``compiled``. ``paired``:
    the speedups measured in rounds with the identity baseline (the Hodges-Lehmann estimate
    of the per-round ratios), which stand in for the ratio of throughputs where the baseline
    is there. ``compile_s``: the seconds each batch size's engine took to build (absent
    where it came from a cache: no payback then)."""
    out: dict[int, dict[str, float | None]] = {}
    for b in sorted(compiled):
        ident = identity or {}
        ratio = speedup(compiled[b], ident.get(b))
        value = (paired or {}).get(b, ratio) if ratio is not None else None
        out[b] = {
            "speedup": value,
            "speedup_ratio": ratio,
            "rtr": rtr(compiled, b),
            "ase": ase(compiled, b),
            "bsr": bsr(compiled, ident, b) if identity else None,
        }
        if compile_s is not None:
            out[b]["payback_inferences"] = payback(compile_s.get(b), ident.get(b), value, b)
    return out
