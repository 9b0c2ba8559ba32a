"""What every model source produces: a :class:`LoadedModel`."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: seed for random weights and inputs: models are built with ``pretrained=False``, so a fixed
#: seed makes their weights, content hash and outputs the same on every device.
SEED = 0


@dataclass
class LoadedModel:
    """A model ready to compile.

    Attributes:
        name: the registered name (``resnet18``, ``conv_block``, a factory path, a file).
        family: resnet, efficientnet, deit, swin, convnext, conv_block, mha_block or custom.
        params: the init params it was built with.
        sample_shape: shape of one sample, without the batch dimension.
        module: the PyTorch module in eval mode, or ``None`` for an ONNX file.
        onnx_file: the ONNX file for ONNX models.
        parameter_count: number of parameters.
        content_hash: sha256 of the architecture and weights (the export and engine caches
            key on it).
    """

    name: str
    family: str
    params: dict[str, Any]
    sample_shape: tuple[int, ...]
    module: Any = None
    onnx_file: Path | None = None
    parameter_count: int = 0
    content_hash: str = ""
    input_name: str = "input"
    dtype: str = "float32"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_torch(self) -> bool:
        return self.module is not None

    def input_shape(self, batch_size: int) -> tuple[int, ...]:
        return (batch_size, *self.sample_shape)

    def random_input(self, batch_size: int, seed: int = SEED) -> np.ndarray:
        """A reproducible random batch (standard normal, float32)."""
        rng = np.random.default_rng(seed)
        return rng.standard_normal(self.input_shape(batch_size), dtype=np.float32)

    @property
    def label(self) -> str:
        """``name`` plus its init params, as written on the command line."""
        if not self.params:
            return self.name
        args = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.name}:{args}"


def torch_content_hash(module: Any) -> str:
    """sha256 over the module's structure and every parameter and buffer."""
    digest = hashlib.sha256(repr(module).encode())
    for key, tensor in module.state_dict().items():
        digest.update(key.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
