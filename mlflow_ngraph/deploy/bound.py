"""The latency bound an engine was measured to hold: the VALID Server results of
``mlflow-ngraph loadgen`` on the same engine (device, model, compiler, batch size, flags),
read from the store's loadgen runs of any experiment. ``register`` tags a model version with
the best of them ("server: 183 QPS at p99 <= 50 ms on cpu, 2026-11-26"); ``register`` and
``pull`` set aside the candidates without one that meets ``--min-qps`` at ``--latency-bound``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.tracking import schema as S

#: a registered version's tags: the sentence, and its parts as numbers
T_SERVER = "ngraph.server"
T_SERVER_QPS = "ngraph.server.qps"
T_SERVER_BOUND = "ngraph.server.latency_bound_ms"
T_SERVER_RUN = "ngraph.server.run"
#: --latency-bound when only --min-qps is given (loadgen's default bound)
DEFAULT_BOUND_MS = 50.0
VALID_TAG = f"{S.T_LOADGEN}.server.validity"


@dataclass
class Bound:
    """One VALID Server result: ``qps`` held at p99 <= ``bound_ms``."""

    qps: float
    bound_ms: float
    p99_ms: float
    device: str
    date: str  # the day the loadgen run ended, YYYY-MM-DD
    run_id: str

    def text(self) -> str:
        return (
            f"server: {self.qps:.0f} QPS at p99 <= {self.bound_ms:g} ms on {self.device}, "
            f"{self.date}"
        )

    def tags(self) -> dict[str, str]:
        return {T_SERVER: self.text(), T_SERVER_QPS: f"{self.qps:.6g}",
                T_SERVER_BOUND: f"{self.bound_ms:g}", T_SERVER_RUN: self.run_id}  # fmt: skip


def check_wanted(min_qps: float | None, latency_bound: float | None) -> float | None:
    """The bound a choice asks for (None: no Server requirement); bad values are one line."""
    if min_qps is not None and not min_qps > 0:
        raise NgraphError(f"--min-qps must be above 0 (got {min_qps:g})")
    if latency_bound is not None and not latency_bound > 0:
        raise NgraphError(f"--latency-bound must be above 0 ms (got {latency_bound:g})")
    if latency_bound is None and min_qps is not None:
        return DEFAULT_BOUND_MS
    return latency_bound


def _quoted(value: str) -> str:
    if "'" in value:
        raise NgraphError(f"a quote in {value!r} cannot be searched for in the store")
    return f"'{value}'"


def server_bounds(client, candidate) -> list[Bound]:
    """Every VALID engine-driven Server result of the candidate's engine, best QPS first."""
    query = " and ".join([
        f"tags.`{S.T_ROLE}` = 'loadgen'", f"tags.`{VALID_TAG}` = 'VALID'",
        f"params.model = {_quoted(candidate.model)}",
        f"params.compiler = {_quoted(candidate.compiler)}",
        f"params.device = {_quoted(candidate.device)}",
        "params.`loadgen.driven` = 'engine'",
        f"params.`loadgen.max_batch` = '{int(candidate.batch_size)}'",
    ])  # fmt: skip
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids, query, max_results=1000) if ids else []
    flags = dict(item.partition("=")[::2] for item in candidate.flags.split(",") if item)
    out = []
    for run in runs:
        qps = run.data.metrics.get("server.qps")
        params = run.data.params
        if qps is None or not _same_flags(flags, params):
            continue
        ended = time.gmtime((run.info.end_time or run.info.start_time or 0) / 1000)
        bound = float(params.get("loadgen.latency_bound_ms", "nan"))
        p99 = run.data.metrics.get("server.p99_ms", math.nan)
        day = time.strftime("%Y-%m-%d", ended)
        out.append(Bound(qps, bound, p99, candidate.device, day, run.info.run_id))
    return sorted(out, key=lambda b: b.qps, reverse=True)


def _same_flags(flags: dict[str, str], params: dict[str, str]) -> bool:
    """The loadgen run's engine had the candidate's flags (a flag either leaves unset, or
    at its default, is not compared)."""
    unset = ("None", "", "default")
    for key, value in flags.items():
        theirs = params.get(f"flag.{key}")
        if theirs is not None and theirs not in unset and value not in unset and theirs != value:
            return False
    return True


def held(bounds: list[Bound], bound_ms: float | None, min_qps: float | None) -> Bound | None:
    """The highest-QPS result held at a bound no looser than ``bound_ms`` with at least
    ``min_qps`` (either None: any)."""
    for b in bounds:  # best first
        if (bound_ms is None or b.bound_ms <= bound_ms) and b.qps >= (min_qps or 0.0):
            return b
    return None


def set_aside(client, found: list, bound_ms: float | None, min_qps: float | None) -> None:
    """Each candidate's best Server result meeting the requirement as ``server``; where it
    has none, the reason as ``bound_problem`` (``select.rank`` sets it aside)."""
    for c in found:
        if not c.batch_size:
            continue
        bounds = server_bounds(client, c)
        c.server = held(bounds, bound_ms, min_qps)
        if c.server is not None or bound_ms is None:
            continue
        want = f"{min_qps:g} QPS" if min_qps else "a Server result"
        if not bounds:
            c.bound_problem = (
                f"no VALID loadgen Server result of this engine (run `mlflow-ngraph loadgen "
                f"--scenario server --latency-bound {bound_ms:g}` on it)"
            )
        else:
            best = bounds[0]
            c.bound_problem = f"{want} at p99 <= {bound_ms:g} ms not measured (best: {best.text()})"
