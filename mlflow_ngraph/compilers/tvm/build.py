"""Fuse, tune (see :mod:`.tuning`), apply the tuning database and build the Relax VM
executable, in a work directory of its own."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow_ngraph.compilers.base import CompileContext
from mlflow_ngraph.compilers.tvm.database import (
    cache_dir_for,
    open_database,
    seed_database,
    store_in_cache,
)
from mlflow_ngraph.compilers.tvm.settings import (
    DATABASE_DIR,
    LIBRARY_FILE,
)
from mlflow_ngraph.compilers.tvm.target import is_gpu
from mlflow_ngraph.compilers.tvm.tuning import TuningReport, run_tuning


@dataclass
class BuildResult:
    executable: Any
    target: Any
    report: TuningReport
    transform_params: bool
    opt_level: int
    #: the linked ``model.so`` the executable was loaded from
    library_file: Path | None = None
    #: the compile's own work directory (tuning logs, database, library), removed when the
    #: engine is closed; ``None`` for an engine loaded from a saved engine directory
    work_dir: Path | None = None


def tune_and_build(
    model: Any, mod: Any, target: Any, flags: dict[str, Any], ctx: CompileContext
) -> BuildResult:
    import tvm

    work = Path(tempfile.mkdtemp(prefix="tvm-", dir=_ensure_dir(ctx.workdir)))
    database_dir = work / DATABASE_DIR
    cache_dir = cache_dir_for(model, target, flags, ctx)
    reused = seed_database(database_dir, flags.get("database"), cache_dir)
    with tvm.transform.PassContext(opt_level=flags["opt_level"]):
        fused = _fuse(mod, target)
        report = run_tuning(fused, target, flags, work, database_dir, reused)
        lowered, applied = _apply_database(fused, target, database_dir)
        report.tuned = applied > 0
        executable = tvm.compile(lowered, target=target)
    # link once: the VM would link a temporary copy itself, and save() a second one
    library_file = work / LIBRARY_FILE
    executable.export_library(str(library_file))
    if report.trials_used and cache_dir is not None:
        store_in_cache(database_dir, cache_dir)
    report.database_dir = database_dir
    return BuildResult(
        executable=tvm.runtime.load_module(str(library_file)),
        target=target,
        report=report,
        transform_params=not is_gpu(target),
        opt_level=flags["opt_level"],
        library_file=library_file,
        work_dir=work,
    )


def _ensure_dir(path: Path) -> str:
    Path(path).mkdir(parents=True, exist_ok=True)
    return str(path)


def _fuse(mod: Any, target: Any) -> Any:
    """Legalize and fuse the graph into the TIR functions MetaSchedule tunes (the first half of
    ``relax.pipeline.static_shape_tuning_pipeline``)."""
    import tvm
    from tvm import relax

    passes = [
        relax.transform.DecomposeOpsForInference(),
        relax.transform.CanonicalizeBindings(),
        relax.pipeline.zero_pipeline(),
    ]
    if not is_gpu(target):
        # weights are marked layout-free so tuned kernels may pre-pack them (done once at load)
        passes.append(relax.transform.AttachAttrLayoutFreeBuffers())
    with target:
        return tvm.transform.Sequential(passes)(mod)


def _apply_database(mod: Any, target: Any, database_dir: Path) -> tuple[Any, int]:
    """Apply the tuned schedules; the rest keeps TVM's default lowering. Returns the module
    and the number of TIR functions that got a tuned schedule."""
    import tvm
    from tvm import relax

    database = open_database(database_dir)
    with target, database:
        mod = relax.transform.MetaScheduleApplyDatabase()(mod)
    applied = sum(
        1
        for func in mod.functions.values()
        if func.attrs is not None and bool(func.attrs.get("tirx.is_scheduled", False))
    )
    with target:
        if is_gpu(target):
            from tvm.s_tir import dlight as dl

            # GPU kernels must bind threads: dlight schedules whatever tuning did not cover
            mod = dl.ApplyDefaultSchedule(
                dl.gpu.Matmul(),
                dl.gpu.GEMV(),
                dl.gpu.Reduction(),
                dl.gpu.GeneralReduction(),
                dl.gpu.Fallback(),
            )(mod)
        else:
            mod = tvm.transform.Sequential(
                [
                    relax.transform.SplitLayoutRewritePreproc(),
                    relax.transform.LiftTransformParams(),
                    relax.transform.FoldConstant(),
                ]
            )(mod)
    return mod, applied
