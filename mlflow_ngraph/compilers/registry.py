"""The compiler registry: built-in compilers plus the ``mlflow_ngraph.compilers`` entry points.

Compilers are registered by import path, so listing them never imports torch, ONNX Runtime,
OpenVINO, TVM or TensorRT: each module imports its runtime inside its methods.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging

from mlflow_ngraph.compilers.base import Compiler
from mlflow_ngraph.errors import CompilerUnavailable, NgraphError

log = logging.getLogger(__name__)

#: name -> "module:Class". Adding a compiler is one module and one line here (or an entry
#: point in the ``mlflow_ngraph.compilers`` group of another package).
BUILTIN: dict[str, str] = {
    "identity": "mlflow_ngraph.compilers.identity:IdentityCompiler",
    "torchscript": "mlflow_ngraph.compilers.torchscript:TorchScriptCompiler",
    "inductor": "mlflow_ngraph.compilers.inductor:InductorCompiler",
    "onnxruntime": "mlflow_ngraph.compilers.onnxruntime:OnnxRuntimeCompiler",
    "openvino": "mlflow_ngraph.compilers.openvino:OpenVinoCompiler",
    "tvm": "mlflow_ngraph.compilers.tvm:TvmCompiler",
    "tensorrt": "mlflow_ngraph.compilers.tensorrt:TensorRtCompiler",
}


def _targets() -> dict[str, str]:
    return dict(_registered_targets())


@functools.cache
def _registered_targets() -> dict[str, str]:
    """Built-ins plus plug-ins, read once per process (a scan of every installed
    distribution's entry points takes ~10 ms, and a plan asks for several compilers)."""
    targets = dict(BUILTIN)
    for entry in importlib.metadata.entry_points(group="mlflow_ngraph.compilers"):
        if entry.name in targets:
            log.warning("compiler plug-in %s shadows a built-in compiler; ignored", entry.name)
            continue
        targets[entry.name] = entry.value
    return targets


def compiler_names() -> list[str]:
    return list(_targets())


def get_compiler(name: str) -> Compiler:
    """The compiler registered as ``name``.

    Raises:
        NgraphError: no such compiler (the message lists the registered names).
    """
    targets = _targets()
    if name not in targets:
        raise NgraphError(f"unknown compiler {name!r} (registered: {', '.join(targets)})")
    module_name, _, class_name = targets[name].partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except Exception as exc:  # a broken plug-in must not break the CLI
        raise NgraphError(f"compiler {name!r} failed to load from {targets[name]}: {exc}") from None
    return cls()


def declared(name: str) -> Compiler | None:
    """The compiler registered as ``name`` for what it declares of itself (its colour, its
    compile allowance), or None where this installation does not know it (a store can hold
    a plug-in's cells that are not installed here): the caller's default then."""
    try:
        return get_compiler(name)
    except NgraphError:
        return None


def require_available(compiler: Compiler, device_kind: str) -> None:
    """Raise a one-line error naming what is missing when ``compiler`` cannot run here."""
    ok, reason = compiler.availability(device_kind)
    if not ok:
        raise CompilerUnavailable(f"compiler {compiler.name!r} is not available: {reason}")


def reference_compiler(model) -> tuple[Compiler, dict, str]:
    """What a model's outputs are checked against: (compiler, flags, label). Eager PyTorch
    for PyTorch models; ONNX Runtime with every graph optimization off for ONNX files."""
    if model.is_torch:
        return get_compiler("identity"), {}, "pytorch-eager"
    ort = get_compiler("onnxruntime")
    require_available(ort, "cpu")
    flags = ort.resolve_flags({"graph_optimization_level": "disable"})
    return ort, flags, "onnxruntime-no-optimizations"
