"""identity: PyTorch eager under ``torch.inference_mode``, the baseline of every metric."""

from __future__ import annotations

from typing import Any

from mlflow_ngraph.compilers._torch import TorchCallableEngine, module_on
from mlflow_ngraph.compilers.base import CompileContext, Compiler, Engine


class IdentityCompiler(Compiler):
    name = "identity"

    def writes_engine(self, flags):
        return False  # the eager module itself: nothing compiled to deploy

    packages = ("torch",)
    distribution = "torch"
    devices = ("cpu", "cuda")
    compile_allowance_s = 2.0
    color = "#7f7f7f"  # grey: the baseline
    flags: dict = {}
    batch_agnostic = True

    def compile(self, model: Any, flags: dict[str, Any], ctx: CompileContext) -> Engine:
        module = module_on(model, self.name, ctx.device, ctx.math)
        return TorchCallableEngine(module, ctx.device, ctx.math)
