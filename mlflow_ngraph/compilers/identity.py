"""identity: PyTorch eager under ``torch.inference_mode``, the baseline of every metric."""

from __future__ import annotations

from typing import Any

from mlflow_ngraph.compilers._torch import TorchCallableEngine, require_module, torch_device
from mlflow_ngraph.compilers.base import CompileContext, Compiler, Engine


class IdentityCompiler(Compiler):
    name = "identity"

    def writes_engine(self, flags):
        return False  # the eager module itself: nothing compiled to deploy

    packages = ("torch",)
    distribution = "torch"
    devices = ("cpu", "cuda")
    flags: dict = {}
    batch_agnostic = True

    def compile(self, model: Any, flags: dict[str, Any], ctx: CompileContext) -> Engine:
        module = require_module(model, self.name).to(torch_device(ctx.device)).eval()
        return TorchCallableEngine(module, ctx.device)
