"""Helpers shared by the PyTorch-based compilers (identity, TorchScript, inductor)."""

from __future__ import annotations

import copy
import time
from typing import Any

import numpy as np

from mlflow_ngraph.compilers.base import Engine
from mlflow_ngraph.errors import CompileFailed


def torch_device(device_kind: str) -> Any:
    import torch

    return torch.device("cuda" if device_kind == "cuda" else "cpu")


def require_module(model: Any, compiler: str) -> Any:
    if model.module is None:
        raise CompileFailed(f"{compiler} needs a PyTorch model; {model.name} is an ONNX file")
    return model.module


def module_on(model: Any, compiler: str, device_kind: str, math: str = "fp32") -> Any:
    """The model's module on ``device_kind`` in eval mode, in the run's arithmetic
    (:mod:`~mlflow_ngraph.compilers.precision`: PyTorch's TF32 switches set, FP16 weights
    for ``fp16``). On the CPU in FP32, where the loaded model lives, the module itself;
    else a copy moved there: the shared model never moves, so the ONNX export, the eager
    reference and the next compiler of the group still find it (and trace it with a CPU
    input) on the CPU, in FP32."""
    from mlflow_ngraph.compilers.precision import apply_torch, torch_dtype

    module = require_module(model, compiler)
    device = torch_device(device_kind)
    apply_torch(math, device_kind)
    if device.type != "cpu" or math != "fp32":
        module = copy.deepcopy(module)
    return module.to(device=device, dtype=torch_dtype(math)).eval()


def example_input(model: Any, batch_size: int, device_kind: str, math: str = "fp32") -> Any:
    """A random input of ``batch_size`` as the module of :func:`module_on` takes it."""
    import torch

    from mlflow_ngraph.compilers.precision import torch_dtype

    tensor = torch.from_numpy(model.random_input(batch_size))
    return tensor.to(device=torch_device(device_kind), dtype=torch_dtype(math))


class TorchCallableEngine(Engine):
    """Runs a callable (eager module, TorchScript module, compiled function) on one tensor
    under ``torch.inference_mode``; on CUDA it synchronizes before the harness reads a clock."""

    def __init__(self, fn: Any, device_kind: str, math: str = "fp32") -> None:
        self.fn = fn
        self.device = torch_device(device_kind)
        self.asynchronous_device = device_kind == "cuda"
        self.math = math
        self._input = None

    def _tensor(self, inputs: np.ndarray) -> Any:
        import torch

        from mlflow_ngraph.compilers.precision import torch_dtype

        tensor = torch.from_numpy(np.ascontiguousarray(inputs))
        return tensor.to(device=self.device, dtype=torch_dtype(self.math))

    def prepare(self, inputs: np.ndarray) -> None:
        self._input = self._tensor(inputs)

    def infer(self) -> None:
        import torch

        with torch.inference_mode():
            self.fn(self._input)
        self.synchronize()

    def run_many(self, count: int, stamps: list[float] | None = None) -> None:
        import torch

        fn, tensor = self.fn, self._input
        with torch.inference_mode():
            if stamps is None:
                for _ in range(count):
                    fn(tensor)
            else:  # the host runs each request to its end: stamp it (Engine.run_many)
                clock, stamp = time.perf_counter, stamps.append
                for _ in range(count):
                    fn(tensor)
                    stamp(clock())
        self.synchronize()

    def outputs(self, inputs: np.ndarray) -> np.ndarray:
        import torch

        tensor = self._tensor(inputs)
        with torch.inference_mode():
            out = self.fn(tensor)
        self.synchronize()
        return all_outputs(out)

    def synchronize(self) -> None:
        if self.asynchronous_device:
            import torch

            torch.cuda.synchronize(self.device)

    def runtime_settings(self) -> dict[str, Any]:
        import torch

        settings: dict[str, Any] = {"torch_num_threads": torch.get_num_threads()}
        if self.asynchronous_device:  # what PyTorch's switches say, as measured
            settings["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
            settings["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
        return settings


def first_output(out: Any) -> np.ndarray:
    """The first tensor of a model's output (tensor, tuple, list or dict) as float32."""
    if isinstance(out, dict):
        out = next(iter(out.values()))
    while isinstance(out, (tuple, list)):
        out = out[0]
    if hasattr(out, "detach"):
        out = out.detach().float().cpu().numpy()
    return np.asarray(out, dtype=np.float32)


def all_outputs(out: Any) -> np.ndarray | tuple[np.ndarray, ...]:
    """Every tensor of a model's output (tensor, tuple, list or dict, nested) as float32, in
    order; one array when there is one. Non-tensor outputs (a label string) are skipped."""
    found: list[np.ndarray] = []

    def walk(item: Any) -> None:
        if isinstance(item, dict):
            for value in item.values():
                walk(value)
        elif isinstance(item, (tuple, list)):
            for value in item:
                walk(value)
        elif hasattr(item, "detach"):
            found.append(np.asarray(item.detach().float().cpu().numpy(), dtype=np.float32))
        elif isinstance(item, np.ndarray):
            found.append(np.asarray(item, dtype=np.float32))

    walk(out)
    if not found:
        return first_output(out)
    return found[0] if len(found) == 1 else tuple(found)
