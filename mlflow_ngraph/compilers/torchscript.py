"""torchscript: ``torch.jit.trace`` + ``torch.jit.freeze`` + ``torch.jit.optimize_for_inference``.

The module is traced at the batch's shape, frozen (weights and attributes inlined as
constants, Conv+BatchNorm folded) and optimized for inference (on CPU: MKL-DNN weights and
kernels). ``optimize_for_inference`` bakes in build-specific MKL-DNN tensors that
``torch.jit.load`` cannot read back, so the engine file ``model.pt`` holds the frozen module
and :meth:`TorchScriptCompiler.load` re-applies that pass, a graph rewrite of well under a
second.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlflow_ngraph.compilers._torch import (
    TorchCallableEngine,
    example_input,
    module_on,
    torch_device,
)
from mlflow_ngraph.compilers.base import (
    CompileContext,
    Compiler,
    EngineFiles,
    Flag,
    HostLimits,
    Knob,
)
from mlflow_ngraph.errors import CompileFailed, NgraphError

log = logging.getLogger(__name__)

ENGINE_FILE = "model.pt"

#: the profiling executor records shapes on its first call and optimizes on the next; two
#: calls inside compile() put that specialisation in the compile time, not in the warm-up.
_PROFILING_RUNS = 2


class TorchScriptEngine(TorchCallableEngine):
    """A TorchScript module on one batch shape.

    Args:
        fn: the module to run (optimized for inference when the flag is on).
        serialized: ``torch.jit.save`` bytes of the module before ``optimize_for_inference``
            (that pass rewrites the module in place into a form that cannot be loaded back).
        device_kind: ``cpu`` or ``cuda``.
    """

    def __init__(self, fn: Any, serialized: bytes, device_kind: str, math: str = "fp32") -> None:
        super().__init__(fn, device_kind, math)
        self.serialized = serialized

    def save(self, directory: Path) -> EngineFiles:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / ENGINE_FILE).write_bytes(self.serialized)
        return EngineFiles(files=[ENGINE_FILE], format="torchscript")

    def runtime_settings(self) -> dict[str, Any]:
        import torch

        settings = super().runtime_settings()
        settings["torchscript_profiling_executor"] = torch._C._get_graph_executor_optimize()
        settings["torchscript_mkldnn"] = "mkldnn" in str(self.fn.graph).lower()
        return settings


class TorchScriptCompiler(Compiler):
    """TorchScript tracing, freezing and inference optimization, one engine per batch size."""

    name = "torchscript"
    packages = ("torch",)
    distribution = "torch"
    devices = ("cpu", "cuda")
    compile_allowance_s = 8.0
    engine_formats = {"torchscript": (("model.pt",), "a TorchScript program")}
    color = "#d62728"
    flags = {
        # both default on: the paper's TorchScript configuration is the full inference recipe
        "freeze": Flag(bool, True, help="torch.jit.freeze the traced module"),
        "optimize_for_inference": Flag(
            bool,
            True,
            help="torch.jit.optimize_for_inference (needs freeze; MKL-DNN kernels on CPU)",
        ),
    }
    # traced at the batch's shape, and the profiling executor specializes on it
    batch_agnostic = False

    def search_space(self, host: HostLimits) -> list[Knob]:
        """The inference rewrite, and (without it, which needs a frozen module) freezing."""
        return [
            Knob("optimize_for_inference", (True, False)),
            Knob("freeze", (True, False), when=(("optimize_for_inference", False),)),
        ]

    def resolve_flags(self, given: dict[str, Any]) -> dict[str, Any]:
        """Validate the flags; ``optimize_for_inference`` without ``freeze`` is rejected
        because PyTorch would freeze the module anyway."""
        resolved = super().resolve_flags(given)
        if resolved["optimize_for_inference"] and not resolved["freeze"]:
            raise NgraphError(
                "compiler 'torchscript': optimize_for_inference=true freezes the module, so it "
                "needs freeze=true (or set optimize_for_inference=false)"
            )
        return resolved

    def compile(self, model: Any, flags: dict[str, Any], ctx: CompileContext) -> TorchScriptEngine:
        import torch

        module = module_on(model, self.name, ctx.device, ctx.math)
        example = example_input(model, ctx.batch_size, ctx.device, ctx.math)
        try:
            with torch.no_grad(), _quiet_deprecations():
                # check_trace=False: the harness compares every engine's outputs to identity
                traced = torch.jit.trace(module, example, check_trace=False)
                saveable = torch.jit.freeze(traced) if flags["freeze"] else traced
        except Exception as exc:  # tracing fails on data-dependent or untraceable code
            raise CompileFailed(f"torch.jit.trace failed: {_first_line(exc)}") from exc
        # the engine runs the module read back from model.pt's bytes: what is measured is
        # exactly what load() rebuilds from the engine cache
        engine = self._engine(_serialize(saveable), flags, ctx)
        with torch.inference_mode():
            for _ in range(_PROFILING_RUNS):
                engine.fn(example)
        engine.synchronize()
        return engine

    def load(
        self, model: Any, flags: dict[str, Any], ctx: CompileContext, directory: Path
    ) -> TorchScriptEngine | None:
        path = Path(directory) / ENGINE_FILE
        if not path.is_file():
            return None
        return self._engine(path.read_bytes(), flags, ctx)

    def _engine(
        self, serialized: bytes, flags: dict[str, Any], ctx: CompileContext
    ) -> TorchScriptEngine:
        """Load ``serialized`` and apply ``optimize_for_inference`` when the flag asks."""
        import torch

        from mlflow_ngraph.compilers.precision import apply_torch

        apply_torch(ctx.math, ctx.device)  # a cache hit runs in the run's arithmetic too
        with _quiet_deprecations():
            module = torch.jit.load(io.BytesIO(serialized), map_location=torch_device(ctx.device))
            if flags["optimize_for_inference"]:
                try:
                    module = torch.jit.optimize_for_inference(module)
                except Exception as exc:
                    raise CompileFailed(
                        f"optimize_for_inference failed: {_first_line(exc)}"
                    ) from exc
        return TorchScriptEngine(module, serialized, ctx.device, ctx.math)


def _serialize(module: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    with _quiet_deprecations():
        torch.jit.save(module, buffer)
    return buffer.getvalue()


@contextlib.contextmanager
def _quiet_deprecations() -> Iterator[None]:
    """TorchScript APIs warn that they are deprecated on every call; once is in the docs."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*deprecated.*")
        yield


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
