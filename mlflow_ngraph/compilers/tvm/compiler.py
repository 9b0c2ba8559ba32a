"""The ``tvm`` compiler: import the ONNX export, tune with MetaSchedule, build, load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlflow_ngraph.compilers.base import CompileContext, Compiler, Engine, Flag, HostLimits, Knob
from mlflow_ngraph.compilers.tvm.build import tune_and_build
from mlflow_ngraph.compilers.tvm.database import database_source
from mlflow_ngraph.compilers.tvm.engine import TvmEngine, first_line
from mlflow_ngraph.compilers.tvm.measurers import prestart_measurers
from mlflow_ngraph.compilers.tvm.onnx_import import import_onnx
from mlflow_ngraph.compilers.tvm.settings import DEFAULT_TRIALS, MANIFEST_FILE
from mlflow_ngraph.compilers.tvm.target import configure_threads, make_target
from mlflow_ngraph.errors import CompileFailed, NgraphError


class TvmCompiler(Compiler):
    """Apache TVM with MetaSchedule tuning (``llvm`` on the CPU, ``cuda`` on NVIDIA GPUs)."""

    name = "tvm"
    uses_onnx = True
    packages = ("tvm", "onnx")
    distribution = "apache-tvm"
    extra = "tvm"
    devices = ("cpu", "cuda")
    exact_version = True
    cpu_rule = "refuse"  # native code for the build CPU's instruction set
    gpu_rule = "warn"
    compile_allowance_s = 90.0
    #: seconds a MetaSchedule trial adds to a build on a 2-core host (estimate.py)
    trial_s = 3.0
    engine_formats = {
        "tvm-relax-vm": (
            ("model.so", "params.bin", "tvm_engine.json"),
            "a TVM library (native code)",
        )
    }
    color = "#2ca02c"
    flags = {
        "trials": Flag(
            int,
            DEFAULT_TRIALS,
            minimum=0,
            help="total MetaSchedule trial budget over all tasks; 0 builds untuned",
        ),
        "trials_per_task": Flag(
            int, None, minimum=1, help="trial cap per tuning task (default: no cap)"
        ),
        "early_stopping": Flag(
            int,
            None,
            minimum=1,
            help="stop tuning a task after this many trials without improvement (paper: 150)",
        ),
        "timeout": Flag(float, None, minimum=1, help="wall-clock budget of the tuning, seconds"),
        "database": Flag(
            str, None, help="directory of an existing tuning database (JSON) to reuse"
        ),
        "opt_level": Flag(int, 3, choices=(0, 1, 2, 3), help="TVM PassContext opt_level"),
    }

    @classmethod
    def compile_allowance(cls, flags: dict[str, Any]) -> float:
        """The build's allowance plus the MetaSchedule trials it tunes."""
        return cls.compile_allowance_s + cls.trial_s * float(flags.get("trials") or 0)

    def search_space(self, host: HostLimits) -> list[Knob]:
        """The tuning budget: untuned, the default, and four times it (each trial of the
        tune pays its own tuning, so the budget of the tune bounds how far this goes)."""
        return [Knob("trials", (0, DEFAULT_TRIALS, 4 * DEFAULT_TRIALS))]

    def availability(self, device: str = "cpu") -> tuple[bool, str]:
        ok, reason = super().availability(device)
        if ok and device == "cuda":
            import tvm

            if not tvm.runtime.enabled("cuda"):
                return False, "this TVM build has no CUDA support (tvm.runtime.enabled('cuda'))"
        return ok, reason

    def compile(self, model: Any, flags: dict[str, Any], ctx: CompileContext) -> Engine:
        """Import the ONNX export, tune (unless ``trials`` is 0 or a database covers it), build.

        Raises:
            CompileFailed: the import, the tuning or the build failed.
            NgraphError: the ``database`` flag names a directory without a tuning database.
        """
        from mlflow_ngraph.compilers._export import export_onnx

        if ctx.math != "fp32":
            raise CompileFailed(
                f"tvm compiles the ONNX graph's own FP32; it does not apply --math {ctx.math} "
                "(measure it in a run with --math fp32)"
            )
        configure_threads()
        database_source(flags.get("database"))  # user errors first, before the slow steps
        target = make_target(ctx.device)
        if flags["trials"]:
            prestart_measurers()
        onnx_path = export_onnx(model, ctx.cache_dir)
        try:
            mod, params = import_onnx(
                onnx_path, model.input_name, model.input_shape(ctx.batch_size)
            )
            build = tune_and_build(model, mod, target, flags, ctx)
        except (CompileFailed, NgraphError):
            raise
        except Exception as exc:  # TVM raises many kinds (TVMError, ValueError, InternalError)
            raise CompileFailed(f"TVM failed on {model.label}: {first_line(exc)}") from exc
        return TvmEngine(build, params, ctx.device, model.input_shape(ctx.batch_size))

    def load(
        self, model: Any, flags: dict[str, Any], ctx: CompileContext, directory: Path
    ) -> Engine | None:
        """Read back an engine written by :meth:`TvmEngine.save` (no tuning, no build)."""
        directory = Path(directory)
        if not (directory / MANIFEST_FILE).is_file():
            return None
        configure_threads()
        return TvmEngine.load(directory, ctx.device)
