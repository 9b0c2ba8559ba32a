"""``compare --scenario NAME``: the loadgen results of one scenario across devices,
models and compilers, each with its speedup over eager (identity) on the same device, model,
bound and target. An INVALID or FAILED result is a row with its verdict, never a figure."""

from __future__ import annotations

from typing import Any

from mlflow_ngraph.loadgen.record import reason_tag, validity_tag
from mlflow_ngraph.tracking import schema as S

#: each scenario's headline figure, and whether higher is better
HEADLINE = {
    "singlestream": ("singlestream.p90_ms", False),
    "multistream": ("multistream.p99_ms", False),
    "offline": ("offline.samples_per_s", True),
    "server": ("server.qps", True),
}


def loadgen_rows(client, experiment_ids: list[str], scenario: str) -> list[dict[str, Any]]:
    """One row per loadgen cell run that ran ``scenario``."""
    runs = client.search_runs(experiment_ids, filter_string=f"tags.`{S.T_ROLE}` = 'loadgen'",
                              max_results=5000)  # fmt: skip
    metric, _ = HEADLINE[scenario]
    rows = []
    for run in runs:
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        validity = tags.get(validity_tag(scenario))
        if validity is None:
            continue
        rows.append({
            "device": tags.get(S.T_DEVICE, "-"), "model": params.get("model", "-"),
            "compiler": params.get("compiler", "-"),
            "target": params.get("loadgen.driven", "engine"),
            "bound": params.get("loadgen.latency_bound_ms", "-"), "validity": validity,
            "reason": tags.get(reason_tag(scenario), ""),
            "value": metrics.get(metric) if validity == "VALID" else None,
            "p99": metrics.get(f"{scenario}.p99_ms") if validity == "VALID" else None,
        })  # fmt: skip
    return rows


def with_speedups(rows: list[dict[str, Any]], scenario: str) -> list[dict[str, Any]]:
    """Each VALID row's speedup over the identity row of its device, model, bound and target
    (for latencies: eager's latency over its own)."""
    _, higher = HEADLINE[scenario]
    eager = {(r["device"], r["model"], r["bound"], r["target"]): r["value"]
             for r in rows if r["compiler"] == "identity" and r["value"]}  # fmt: skip
    for row in rows:
        base = eager.get((row["device"], row["model"], row["bound"], row["target"]))
        value = row["value"]
        row["speedup"] = None
        if base and value:
            row["speedup"] = value / base if higher else base / value
    return rows


def format_rows(rows: list[dict[str, Any]], scenario: str, width: int | None = None) -> str:
    from mlflow_ngraph.table import format_table

    metric, _ = HEADLINE[scenario]
    headers = ["device", "model", "compiler", "target", "bound ms", metric, "p99 ms",
               "speedup vs eager", "LoadGen"]  # fmt: skip
    body = []
    for r in sorted(rows, key=lambda r: (r["device"], r["model"], r["target"], -(r["value"] or 0))):
        verdict = r["validity"] if r["validity"] == "VALID" else f"{r['validity']}: {r['reason']}"
        body.append([
            r["device"], r["model"], r["compiler"], r["target"], r["bound"],
            _figure(r["value"]), f"{r['p99']:.3g}" if r["p99"] else "-",
            f"{r['speedup']:.2f}x" if r["speedup"] else "-", verdict[:120],
        ])  # fmt: skip
    return format_table(headers, body, width=width)


def _figure(value: float | None) -> str:
    if not value:
        return "-"
    return f"{value:.1f}" if value >= 100 else f"{value:.3f}"
