"""Benchmark runs with known throughputs, and how to log them into a real MLflow store.

Runs follow ``mlflow_ngraph.tracking.schema`` exactly: one parent run per device (tag
``ngraph.role=benchmark``), one child run per cell (tags ``ngraph.role=cell``,
``ngraph.status``, ``mlflow.parentRunId``), params device/model/compiler/family/scenario/
model.<param>/flag.<flag>, per-batch metrics stepped by batch size and flat as
``<metric>.bs<b>``. Logged relative metrics are deliberately wrong (999): compare must
recompute them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from mlflow_ngraph.tracking import index
from mlflow_ngraph.tracking import schema as S

EXPERIMENT = "paper"
OTHER_EXPERIMENT = "gpu-lab"


@dataclass
class Cell:
    """One child run: device x model x compiler (x flags), with per-batch values."""

    device: str
    model: str
    family: str
    compiler: str
    throughput: dict[int, float]
    model_params: dict[str, str] = field(default_factory=dict)
    flags: dict[str, str] = field(default_factory=dict)
    status: str = S.STATUS_OK
    cpu: dict[int, float] = field(default_factory=dict)
    compile_s: dict[int, float] = field(default_factory=dict)
    cache_hit: bool = False
    start_time: int | None = None
    scenario: str = "throughput"
    #: logged 95% intervals of the throughput, by batch size
    ci: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: ``ngraph.stability.bs<b>`` tags, by batch size
    stability: dict[int, str] = field(default_factory=dict)
    #: repetitions behind every batch size's throughput (``None``: not logged, as before)
    repetitions: int | None = 100
    #: the std of one repetition, as a share of the throughput
    rep_cv: float = 0.01
    #: windows behind every batch size's throughput (``None``: not logged, as before windows)
    windows: int | None = None
    #: logged 95% intervals of the speedup (paired rounds), by batch size
    speedup_ci: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: logged re-run intervals of the speedup, by batch size
    speedup_rerun: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: logged re-run intervals of the throughput, by batch size
    rerun: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: logged paired speedups (measured in rounds with identity), by batch size
    speedup_paired: dict[int, float] = field(default_factory=dict)
    #: further tags of the cell's run (``ngraph.moved.bs<b>``: the guard's word)
    tags: dict[str, str] = field(default_factory=dict)


def _per_batch(cell: Cell) -> dict[str, dict[int, float]]:
    values = {
        S.M_THROUGHPUT: cell.throughput,
        S.M_THROUGHPUT_STD: {b: t * cell.rep_cv for b, t in cell.throughput.items()},
        S.M_LATENCY_P50: {b: 1000 * b / t for b, t in cell.throughput.items()},
        S.M_LATENCY_P99: {b: 1500 * b / t for b, t in cell.throughput.items()},
        S.M_CPU: cell.cpu,
        S.M_COMPILE: cell.compile_s,
        S.M_VALID: {b: float(cell.status != S.STATUS_INVALID) for b in cell.throughput},
        S.M_MAX_ABS_ERROR: {b: 1e-6 for b in cell.throughput},
        S.M_SPEEDUP: {b: 999.0 for b in cell.throughput},  # wrong on purpose
        S.M_BSR: {b: 999.0 for b in cell.throughput},
    }
    if cell.repetitions is not None:
        values[S.M_REPETITIONS] = {b: cell.repetitions for b in cell.throughput}
    if cell.windows is not None:
        values[S.M_WINDOWS] = {b: cell.windows for b in cell.throughput}
    if cell.ci:
        values[S.M_THROUGHPUT_CI_LOW] = {b: low for b, (low, _) in cell.ci.items()}
        values[S.M_THROUGHPUT_CI_HIGH] = {b: high for b, (_, high) in cell.ci.items()}
    if cell.speedup_ci:
        values[S.M_SPEEDUP_CI_LOW] = {b: low for b, (low, _) in cell.speedup_ci.items()}
        values[S.M_SPEEDUP_CI_HIGH] = {b: high for b, (_, high) in cell.speedup_ci.items()}
    if cell.speedup_paired:
        values[S.M_SPEEDUP_PAIRED] = dict(cell.speedup_paired)
    if cell.speedup_rerun:
        values[S.M_SPEEDUP_RERUN_LOW] = {b: lo for b, (lo, _) in cell.speedup_rerun.items()}
        values[S.M_SPEEDUP_RERUN_HIGH] = {b: hi for b, (_, hi) in cell.speedup_rerun.items()}
    if cell.rerun:
        values[S.M_THROUGHPUT_RERUN_LOW] = {b: lo for b, (lo, _) in cell.rerun.items()}
        values[S.M_THROUGHPUT_RERUN_HIGH] = {b: hi for b, (_, hi) in cell.rerun.items()}
    if cell.compile_s:
        values[S.M_CACHE_HIT] = {b: float(cell.cache_hit) for b in cell.compile_s}
    return values


def cell_metrics(cell: Cell, now: int) -> list[Metric]:
    """Stepped (step = batch size) and flat (``<metric>.bs<b>``) metrics of one cell."""
    out = []
    for name, series in _per_batch(cell).items():
        for batch, value in series.items():
            out.append(Metric(name, float(value), now, batch))
            out.append(Metric(S.flat_key(name, batch), float(value), now, 0))
    return out


def cell_params(cell: Cell) -> list[Param]:
    params = {
        S.P_DEVICE: cell.device,
        S.P_MODEL: cell.model,
        S.P_COMPILER: cell.compiler,
        S.P_FAMILY: cell.family,
        S.P_SCENARIO: cell.scenario,
        S.P_PARAMETER_COUNT: "1000",
    }
    params.update({f"{S.P_MODEL_PARAM_PREFIX}{k}": v for k, v in cell.model_params.items()})
    params.update({f"{S.P_FLAG_PREFIX}{k}": v for k, v in cell.flags.items()})
    return [Param(k, str(v)) for k, v in params.items()]


def new_store(root: Path, experiment: str) -> tuple[str, MlflowClient, str]:
    """A fresh sqlite store in ``root`` with ``experiment``: (uri, client, experiment id)."""
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    return uri, client, client.create_experiment(experiment, artifact_location=str(root / "art"))


def log_benchmark(
    client: MlflowClient,
    experiment_id: str,
    device: str,
    cells: list[Cell],
    indexed: bool = True,
    finish: bool = True,
    sweep: str | None = None,
) -> str:
    """A parent run for ``device`` and one child run per cell; returns the parent's id.
    With ``indexed``, the parent gets its results index as the runner writes it; unless
    ``finish``, the parent is left RUNNING (an invocation killed or still going)."""
    swept = {S.T_SWEEP: sweep} if sweep else {}
    parent = client.create_run(
        experiment_id, tags={S.T_ROLE: "benchmark", S.T_DEVICE: device, **swept}
    )
    parent_id = parent.info.run_id
    run_ids = []
    for cell in cells:
        tags = {S.T_ROLE: "cell", S.T_PARENT: parent_id, S.T_STATUS: cell.status, **swept}
        if cell.status == S.STATUS_FAILED:
            tags[S.T_ERROR] = "compile failed: unsupported op"
        tags.update(cell.tags)
        for b, verdict in cell.stability.items():
            tags[f"{S.T_STABILITY}.bs{b}"] = verdict
        if cell.stability:
            unstable = S.STABILITY_UNSTABLE in cell.stability.values()
            tags[S.T_STABILITY] = S.STABILITY_UNSTABLE if unstable else S.STABILITY_STABLE
        run = client.create_run(experiment_id, start_time=cell.start_time, tags=tags)
        now = int(time.time() * 1000)
        metrics = [] if cell.status == S.STATUS_FAILED else cell_metrics(cell, now)
        client.log_batch(run.info.run_id, metrics=metrics, params=cell_params(cell))
        client.set_terminated(run.info.run_id)
        run_ids.append(run.info.run_id)
    if indexed:
        index.write(client, parent_id, index.snapshot(client, run_ids))
    if finish:
        client.set_terminated(parent_id)
    return parent_id


# --- the data set: small enough to compute every value by hand --------------------------
R18, R50, EFF, DEIT = "resnet18", "resnet50", "efficientnet_b3", "deit3_small_patch16_224"
IDENTITY_T = {
    R18: {1: 100, 2: 160, 4: 240, 8: 320},
    R50: {1: 50, 2: 80, 4: 120, 8: 160},
    EFF: {1: 60, 2: 100, 4: 160, 8: 250},
    DEIT: {1: 50, 2: 90, 4: 150, 8: 200},
}
OPENVINO_T = {
    R18: {1: 200, 2: 360, 4: 640, 8: 960},
    R50: {1: 100, 2: 180, 4: 320, 8: 400},
    EFF: {1: 120, 2: 200, 4: 400, 8: 700},
    DEIT: {1: 150, 2: 270, 4: 480, 8: 1000},
}
FAMILY = {R18: "resnet", R50: "resnet", EFF: "efficientnet", DEIT: "deit"}
IDENTITY_CPU = {1: 50.0, 2: 50.0, 4: 50.0, 8: 50.0}
OPENVINO_CPU = {1: 80.0, 2: 80.0, 4: 90.0, 8: 100.0}
OPENVINO_COMPILE = {1: 2.0, 2: 2.5, 4: 3.0, 8: 3.5}

#: conv_block speedups of openvino over identity, by depth, at batch 8 and 16
BLOCK_SPEEDUP_8 = {1: 2.0, 2: 3.0, 4: 4.0}
BLOCK_SPEEDUP_16 = {1: 1.5, 2: 1.5, 4: 1.5}
BLOCK_IDENTITY_T = {1: 20.0, 8: 100.0, 16: 120.0}


def model_cells() -> list[Cell]:
    cells = []
    for model, family in FAMILY.items():
        cells.append(Cell("cpu", model, family, "identity", IDENTITY_T[model], cpu=IDENTITY_CPU))
        cells.append(
            Cell(
                "cpu",
                model,
                family,
                "openvino",
                OPENVINO_T[model],
                cpu=OPENVINO_CPU,
                flags={"hint": "throughput"},
                compile_s=OPENVINO_COMPILE,
            )
        )
    # an older openvino run of resnet18, superseded by the newer one above
    cells.append(
        Cell(
            "cpu",
            R18,
            "resnet",
            "openvino",
            {1: 1.0, 8: 1.0},
            flags={"hint": "throughput"},
            start_time=1_000,
        )
    )
    # an engine whose outputs were wrong: shown, never aggregated or ranked
    cells.append(Cell("cpu", R18, "resnet", "tvm", {1: 5000, 8: 9000}, status=S.STATUS_INVALID))
    cells.append(Cell("cpu", DEIT, "deit", "tvm", {}, status=S.STATUS_FAILED))
    return cells


def block_cells() -> list[Cell]:
    cells = []
    for depth in (1, 2, 4):
        params = {"width": "64", "depth": str(depth)}
        ident = BLOCK_IDENTITY_T
        ov = {1: 40.0, 8: 100.0 * BLOCK_SPEEDUP_8[depth], 16: 120.0 * BLOCK_SPEEDUP_16[depth]}
        cells.append(Cell("cpu", "conv_block", "conv_block", "identity", ident, params))
        cells.append(
            Cell(
                "cpu",
                "conv_block",
                "conv_block",
                "openvino",
                ov,
                params,
                flags={"hint": "throughput"},
            )
        )
    for depth in (2, 4):  # width 96 without a one-block run: no retention
        params = {"width": "96", "depth": str(depth)}
        cells.append(
            Cell("cpu", "conv_block", "conv_block", "identity", {1: 10.0, 8: 50.0}, params)
        )
        cells.append(
            Cell(
                "cpu",
                "conv_block",
                "conv_block",
                "openvino",
                {1: 20.0, 8: 50.0 * depth, 16: 60.0 * depth},  # identity has no batch 16
                params,
                flags={"hint": "throughput"},
            )
        )
    return cells


def gpu_cells() -> list[Cell]:
    """A device with a compiled run and no identity baseline, and one without batch 1."""
    return [
        Cell("gpu", R18, "resnet", "tensorrt", {1: 1000, 8: 6000}, compile_s={1: 11.0, 8: 16.0}),
        Cell(
            "gpu", EFF, "efficientnet", "tensorrt", {8: 3000}, compile_s={8: 50.0}, cache_hit=True
        ),
    ]


def records_of(result) -> list[dict] | dict:
    """The JSON that ``compare --format json`` printed (stdout only)."""
    import json

    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def one(records: list[dict], **match) -> dict:
    """The single record whose keys equal ``match``."""
    found = [r for r in records if all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, found)
    return found[0]
