"""Shared helpers of the fidelity benchmarks in ``bench/``.

Every script compares the tool's number with a reference measured in the same run, with the
two sides interleaved (A B, B A, A B ...) so that load from other processes and CPU-frequency
drift hit both alike, and reports the median of the paired ratios with their spread. Results
are printed as a table and written to a CSV file.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: where the benchmarks keep their ONNX exports and engines: the tool's own home, so that a
#: bench run and a ``mlflow-ngraph benchmark`` run share the export cache.
DEFAULT_HOME = Path(
    os.environ.get("MLFLOW_NGRAPH_HOME") or Path.home() / ".cache" / "mlflow-ngraph"
)
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def parser(description: str, duration_s: float, repetitions: int, csv_name: str) -> Any:
    """The options every script shares: window length, repetitions, output, cache home."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--duration", type=float, default=duration_s, help="seconds per measured window")
    p.add_argument(
        "--repetitions", type=int, default=repetitions, help="interleaved pairs per cell"
    )
    p.add_argument(
        "--warmup", type=int, default=1, help="harness warm-up steps (outside the window)"
    )
    p.add_argument("--csv", type=Path, default=RESULTS_DIR / csv_name, help="CSV output file")
    p.add_argument("--home", type=Path, default=DEFAULT_HOME, help="export/engine cache root")
    return p


# --- statistics ---------------------------------------------------------------------------
@dataclass
class Ratio:
    """Median and spread of paired ratios ``ours_i / reference_i``."""

    median: float
    q1: float
    q3: float
    low: float
    high: float
    count: int

    def text(self) -> str:
        return f"{self.median:.3f} [{self.low:.3f}-{self.high:.3f}]"


def paired_ratio(ours: list[float], reference: list[float]) -> Ratio:
    ratios = np.asarray(ours, dtype=float) / np.asarray(reference, dtype=float)
    q1, med, q3 = np.percentile(ratios, [25, 50, 75])
    return Ratio(
        float(med),
        float(q1),
        float(q3),
        float(ratios.min()),
        float(ratios.max()),
        int(ratios.size),
    )


def cv(values: list[float]) -> float:
    """Coefficient of variation (sample std / mean)."""
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0


def interleave(repetitions: int, *sides: Callable[[], dict]) -> list[list[dict]]:
    """Run every side ``repetitions`` times, rotating which goes first (A B C, B C A, ...)
    so that a slow drift in machine load favours none of them. Returns one list per side."""
    results: list[list[dict]] = [[] for _ in sides]
    for i in range(repetitions):
        for k in range(len(sides)):
            j = (i + k) % len(sides)
            results[j].append(sides[j]())
    return results


# --- output -------------------------------------------------------------------------------
def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def print_table(rows: list[dict], columns: list[str]) -> None:
    """A plain-text table of ``rows`` (the bench scripts' output layer)."""
    cells = [[_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    sys.stdout.flush()


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


def ratio_columns(prefix: str, ratio: Ratio) -> dict[str, Any]:
    return {
        f"{prefix}": round(ratio.median, 4),
        f"{prefix}_q1": round(ratio.q1, 4),
        f"{prefix}_q3": round(ratio.q3, 4),
        f"{prefix}_min": round(ratio.low, 4),
        f"{prefix}_max": round(ratio.high, 4),
        "pairs": ratio.count,
    }


def raw(name: str, values: list[float]) -> dict[str, str]:
    """The paired values themselves, ``;``-separated in one CSV cell, for pooled analysis."""
    return {name: ";".join(f"{v:.6g}" for v in values)}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- models and engines -------------------------------------------------------------------
def load(spec: str) -> Any:
    """A :class:`LoadedModel` from ``NAME[:key=value,...]`` as on the command line."""
    from mlflow_ngraph.models.registry import load_model
    from mlflow_ngraph.plan.config import split_name_args

    name, params = split_name_args(spec, "model")
    return load_model(name, params)


def engine(
    compiler_name: str,
    model: Any,
    batch_size: int,
    home: Path,
    scenario: str = "throughput",
    flags: dict | None = None,
) -> Any:
    """Compile ``model`` with the tool's compiler and prepare it on the measured input."""
    from mlflow_ngraph.compilers.base import CompileContext
    from mlflow_ngraph.compilers.registry import get_compiler

    compiler = get_compiler(compiler_name)
    ctx = CompileContext(
        workdir=home / "work" / "bench",
        device="cpu",
        batch_size=batch_size,
        cache_dir=home,
        scenario=scenario,
    )
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    built = compiler.compile(model, compiler.resolve_flags(flags or {}), ctx)
    built.prepare(model.random_input(batch_size))
    return built


def harness(
    built: Any, batch_size: int, scenario: str, duration_s: float, warmup: int
) -> dict[str, float]:
    """One measurement through the tool's shared harness; the window is ``duration_s``."""
    from mlflow_ngraph.measure.harness import measure
    from mlflow_ngraph.measure.rounds import RoundPolicy
    from mlflow_ngraph.measure.settings import MeasureSettings
    from mlflow_ngraph.measure.stability import assess

    # repetitions=1 and a cap at the floor: the duration alone decides the measured time, as
    # in benchmark_app -t (in 100 ms windows back to back)
    settings = MeasureSettings(
        scenario=scenario, warmup=warmup, repetitions=1, min_duration_s=duration_s
    )
    policy = RoundPolicy(min_rounds=1, precision=0.0, max_s=duration_s)
    result = measure(built, batch_size, settings, policy=policy)
    return {
        "stable": assess(result.throughput_halfwidth, result.host_other_cpu_percent).stable,
        "ci_low": result.throughput_ci_low,
        "ci_high": result.throughput_ci_high,
        "host_other_cpu_percent": result.host_other_cpu_percent,
        "throughput": result.throughput,
        "throughput_overall": result.throughput_overall,
        "latency_p50_ms": result.latency_p50_ms,
        "repetitions": result.repetitions,
        "requests_per_repetition": result.requests_per_repetition,
        "cv": result.cv,
    }
