"""The ONNX export as a Relax module at a static batch shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def import_onnx(path: Path, input_name: str, shape: tuple[int, ...]) -> tuple[Any, list[Any]]:
    """The Relax module at a static ``shape`` and its weights, kept as separate inputs."""
    import onnx
    from tvm.relax.frontend import detach_params
    from tvm.relax.frontend.onnx import from_onnx

    proto = onnx.load(str(path))
    graph_inputs = [i.name for i in proto.graph.input]
    name = input_name if input_name in graph_inputs else graph_inputs[0]
    mod = from_onnx(proto, shape_dict={name: list(shape)}, keep_params_in_input=True)
    mod, params = detach_params(mod)
    return mod, list(params.get("main", []))
