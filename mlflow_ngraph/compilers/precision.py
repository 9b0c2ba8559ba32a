"""The arithmetic every compiler runs, one policy for all of them (``--math``).

A speedup is a comparison of like with like only where both engines compute in the same
precision. Left to themselves they do not: PyTorch eager keeps matmuls in strict FP32 but
lets cuDNN convolutions use TF32, TensorRT lets every FP32 layer use TF32, ONNX Runtime's
CUDA provider decides for itself. So the run says which arithmetic it measures, and every
compiler applies it the same way:

- ``fp32`` (the default): strict IEEE FP32. TF32 off in PyTorch (matmuls and cuDNN), in
  TensorRT's builder (``tf32=false``) and in ONNX Runtime's CUDA provider (``use_tf32``).
- ``tf32``: FP32 tensors, TF32 tensor-core math allowed everywhere (Ampere and later).
- ``fp16``: half precision: the PyTorch module and its input in FP16, TensorRT's FP16
  kernels (``fp16=true``: TensorRT 10), ONNX Runtime's TensorRT provider in FP16.

A compiler that cannot apply a setting fails its cell with the reason (ONNX Runtime's CUDA
provider and TVM run the ONNX graph's own FP32; they do not lower it to FP16); nothing is
run at another precision than the one the run names. ``tf32`` and ``fp16`` are GPU
settings: on a CPU device only ``fp32``, with the compilers' own precision flags (OpenVINO's
``INFERENCE_PRECISION_HINT``) for a deliberate exception. The output check's default
tolerance follows (:data:`TOLERANCE`), and the reference it checks against is always strict
FP32 (:func:`strict_fp32`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from mlflow_ngraph.errors import NgraphError

MATH = ("fp32", "tf32", "fp16")
DEFAULT_MATH = "fp32"
#: the output check's default tolerance per setting: FP32 kernels that reorder reductions
#: land around 1e-6..1e-4; TF32 keeps 10 mantissa bits (about 1e-3 a product, more
#: through a network); FP16 also rounds every activation to 10 bits
TOLERANCE = {"fp32": 1e-3, "tf32": 1e-2, "fp16": 2e-2}


def check_math(math: str, device_kind: str) -> str:
    """``math`` when it is a setting this device kind runs, else a clear error."""
    if math not in MATH:
        raise NgraphError(f"math {math!r} is not one of: {', '.join(MATH)}")
    if math != "fp32" and device_kind != "cuda":
        raise NgraphError(
            f"--math {math} is a GPU setting; a CPU device runs fp32 (for a deliberate "
            "exception use a compiler's own flag, e.g. openvino:INFERENCE_PRECISION_HINT=bf16)"
        )
    return math


def apply_torch(math: str, device_kind: str) -> None:
    """PyTorch's TF32 switches for ``math`` (process-wide: a worker measures one setting).
    On the CPU there is nothing to switch."""
    if device_kind != "cuda":
        return
    _set_tf32(math != "fp32")


@contextlib.contextmanager
def strict_fp32() -> Iterator[None]:
    """Strict FP32 in PyTorch for the block (the reference outputs), the switches restored
    after it."""
    import torch

    if not torch.cuda.is_available():
        yield
        return
    saved = _tf32_state()
    _set_tf32(False)
    try:
        yield
    finally:
        _restore_tf32(saved)


def torch_dtype(math: str) -> Any:
    """The dtype a PyTorch engine's module and input run in."""
    import torch

    return torch.float16 if math == "fp16" else torch.float32


def _set_tf32(allowed: bool) -> None:
    # the switches PyTorch 2.x reads everywhere (Inductor included); its newer
    # fp32_precision properties are not mixed in: a mix makes the old getters raise
    import torch

    torch.backends.cuda.matmul.allow_tf32 = allowed
    torch.backends.cudnn.allow_tf32 = allowed


def _tf32_state() -> tuple[bool, bool]:
    import torch

    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def _restore_tf32(saved: tuple[bool, bool]) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
