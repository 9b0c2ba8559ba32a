"""tensorrt: a native TensorRT engine built from the cached ONNX export.

Build: ``Builder`` -> ``create_network`` (explicit batch, the only mode since TensorRT 10)
-> ``OnnxParser.parse_from_file`` -> ``BuilderConfig`` (workspace pool, TF32, optional FP16,
optimization level, timing cache, one optimization profile with min = opt = max = the batch
size) -> ``build_serialized_network``. The serialized plan is the engine file
(``model.plan``); :meth:`TensorRtCompiler.load` deserializes it with a ``Runtime``.

Run: input and output buffers are CUDA tensors of PyTorch (always installed) whose
addresses are bound once with ``set_tensor_address``; each request is one
``execute_async_v3`` on a private CUDA stream, or one replay of a CUDA graph captured from
it (``cuda_graph=true``). The stream is synchronized before the harness reads a clock.

``tensorrt`` is imported only inside functions: listing compilers never loads it.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from mlflow_ngraph.compilers._export import export_onnx
from mlflow_ngraph.compilers.base import (
    CompileContext,
    Compiler,
    Engine,
    EngineFiles,
    Flag,
    HostLimits,
    Knob,
)
from mlflow_ngraph.errors import CompileFailed

log = logging.getLogger(__name__)

PLAN_FILE = "model.plan"
ENGINE_FORMAT = "tensorrt-plan"
#: TensorRT's optimization levels (0 = fastest build, 5 = widest tactic search)
OPTIMIZATION_LEVELS = (0, 1, 2, 3, 4, 5)
_MB = 2**20


class TensorRtCompiler(Compiler):
    """Native TensorRT (10.x; 11.x works for everything but ``fp16``) on a CUDA device."""

    name = "tensorrt"
    uses_onnx = True
    packages = ("tensorrt",)
    distribution = "tensorrt"
    extra = "gpu"
    devices = ("cuda",)
    exact_version = True
    gpu_rule = "refuse"  # a plan runs only on the compute capability it was built for
    compile_allowance_s = 60.0
    engine_formats = {"tensorrt-plan": (("model.plan",), "a TensorRT plan (native code)")}
    color = "#8c564b"
    flags = {
        # None: TensorRT's own default (the device's total memory), so no tactic is refused
        # for lack of scratch space; set it on a shared GPU or to reproduce a small budget.
        "workspace_mb": Flag(int, None, help="workspace memory pool limit (MB)", minimum=1),
        # False: strict FP32, as every compiler under the default --math fp32; the run's
        # --math sets both (compilers/precision.py), a flag given overrides it
        "tf32": Flag(bool, False, help="allow TF32 for FP32 layers (Ampere and newer)"),
        "fp16": Flag(bool, False, help="allow FP16 kernels (TensorRT 10 weak typing only)"),
        # False: one enqueue per request is what most deployments do; graphs are opt-in.
        "cuda_graph": Flag(bool, False, help="replay a captured CUDA graph per request"),
        # 3 is TensorRT's default level.
        "builder_optimization_level": Flag(
            int, 3, choices=OPTIMIZATION_LEVELS, help="builder optimization level (0-5)"
        ),
        "timing_cache": Flag(str, None, help="timing cache file, read and updated per build"),
    }

    def math_flags(self, math: str) -> dict[str, Any]:
        """TF32 under tf32 and fp16, FP16 kernels under fp16 (compilers/precision.py)."""
        return {"tf32": math != "fp32", "fp16": math == "fp16"}

    def search_space(self, host: HostLimits) -> list[Knob]:
        """The builder's effort and CUDA graphs; FP16 only with ``--allow-precision`` and
        only where the installed TensorRT builds it (10: TensorRT 11 removed the flag, and
        every fp16 trial would fail)."""
        knobs = [Knob("builder_optimization_level", (3, 4, 5)), Knob("cuda_graph", (False, True))]
        if builds_fp16(self.version()):
            knobs.append(Knob("fp16", (False, True), precision=True))
        return knobs

    def version(self) -> str:
        version = super().version()
        if version != "not installed":
            return version
        # JetPack installs the bindings from a Debian package, without pip metadata
        try:
            import tensorrt

            return tensorrt.__version__
        except ImportError:
            return "not installed"

    def compile(self, model: Any, flags: dict[str, Any], ctx: CompileContext) -> Engine:
        """Build a plan for ``model`` at ``ctx.batch_size`` and wrap it in an engine.

        Raises:
            CompilerUnavailable: TensorRT or a CUDA device is missing on this host.
            CompileFailed: ONNX export, parsing or the engine build failed.
        """
        _require_here(self, ctx.device)
        onnx_path = export_onnx(model, ctx.cache_dir)
        plan = build_plan(onnx_path, model.input_shape(ctx.batch_size), flags)
        return TensorRtEngine(plan, flags)

    def load(
        self, model: Any, flags: dict[str, Any], ctx: CompileContext, directory: Path
    ) -> Engine | None:
        """Deserialize ``model.plan`` from ``directory`` (an engine cache hit)."""
        _require_here(self, ctx.device)
        path = Path(directory) / PLAN_FILE
        if not path.is_file():
            return None
        return TensorRtEngine(path.read_bytes(), flags)


def _require_here(compiler: Compiler, device: str) -> None:
    # one clear line instead of an ImportError or a CUDA error from deep inside TensorRT
    from mlflow_ngraph.compilers.registry import require_available

    require_available(compiler, device)


# --- build ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _logger() -> Any:
    """The process's one TensorRT logger; it keeps the errors of the current build.

    TensorRT keeps the first logger it is given for the whole process, so builder and
    runtime share this one.
    """
    import tensorrt as trt

    class _Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            level = int(severity)  # INTERNAL_ERROR 0, ERROR 1, WARNING 2, INFO 3, VERBOSE 4
            if level <= int(trt.ILogger.Severity.ERROR):
                self.errors.append(msg)
                log.error("TensorRT: %s", msg)
            elif level == int(trt.ILogger.Severity.WARNING):
                log.warning("TensorRT: %s", msg)
            else:
                log.debug("TensorRT: %s", msg)

    return _Logger()


def build_plan(onnx_path: Path, input_shape: tuple[int, ...], flags: dict[str, Any]) -> bytes:
    """Build a serialized TensorRT engine (a plan) from an ONNX file for one input shape.

    Args:
        onnx_path: the ONNX model (one input whose first dimension is the batch).
        input_shape: the full input shape, batch first; the optimization profile fixes
            min = opt = max to it.
        flags: resolved flags of :class:`TensorRtCompiler`.

    Raises:
        CompileFailed: the parser or the builder reported an error (its message is kept).
    """
    import tensorrt as trt

    logger = _logger()
    logger.errors.clear()
    builder = trt.Builder(logger)
    # 0: explicit batch is the only mode in TensorRT 10 (the flag is deprecated and
    # ignored there, and gone in 11)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise CompileFailed(f"TensorRT could not parse {onnx_path.name}: " + "; ".join(errors))
    config = builder.create_builder_config()
    _configure(trt, config, flags)
    config.add_optimization_profile(_profile(builder, network, input_shape))
    cache = _load_timing_cache(config, flags.get("timing_cache"))
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        detail = "; ".join(logger.errors) or "see the TensorRT log"
        raise CompileFailed(f"TensorRT engine build failed: {detail}")
    if cache is not None:
        _save_timing_cache(config, flags["timing_cache"])
    return bytes(plan)  # IHostMemory exposes the buffer protocol


def builds_fp16(version: str) -> bool:
    """Whether TensorRT ``version`` has the FP16 builder flag (weakly typed networks: 10
    and before); unknown or not installed: no."""
    major = version.split(".")[0]
    return major.isdigit() and int(major) <= 10


def _configure(trt: Any, config: Any, flags: dict[str, Any]) -> None:
    if flags.get("workspace_mb") is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, flags["workspace_mb"] * _MB)
    if not flags.get("tf32", True):
        config.clear_flag(trt.BuilderFlag.TF32)
    if flags.get("fp16"):
        if not hasattr(trt.BuilderFlag, "FP16"):
            raise CompileFailed(
                f"fp16=true needs TensorRT 10 (weakly typed networks); TensorRT "
                f"{trt.__version__} builds strongly typed networks only: export the model "
                "in FP16 instead"
            )
        config.set_flag(trt.BuilderFlag.FP16)
    level = flags.get("builder_optimization_level")
    if level is not None:
        config.builder_optimization_level = level


def _profile(builder: Any, network: Any, input_shape: tuple[int, ...]) -> Any:
    """One optimization profile, min = opt = max = ``input_shape`` (a static engine)."""
    if network.num_inputs != 1:
        names = [network.get_input(i).name for i in range(network.num_inputs)]
        raise CompileFailed(f"the benchmark feeds one input; the ONNX model has {names}")
    tensor = network.get_input(0)
    declared = tuple(tensor.shape)
    if len(declared) != len(input_shape) or any(
        d not in (-1, s) for d, s in zip(declared, input_shape, strict=True)
    ):
        raise CompileFailed(
            f"input {tensor.name!r} has shape {declared}; cannot bind {tuple(input_shape)}"
        )
    profile = builder.create_optimization_profile()
    profile.set_shape(tensor.name, input_shape, input_shape, input_shape)
    return profile


def _load_timing_cache(config: Any, path: str | None) -> Any | None:
    if not path:
        return None
    data = Path(path).read_bytes() if Path(path).is_file() else b""
    cache = config.create_timing_cache(data)
    # ignore_mismatch=False: a cache from another GPU or TensorRT version would pick tactics
    # timed elsewhere; it is refused and the build times everything itself
    if not config.set_timing_cache(cache, False):
        # a fresh cache in its place: this build's timings replace the refused file, which
        # would otherwise be refused by every build after it
        log.warning("timing cache %s does not match this device: timing afresh, replacing it", path)
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, False)
    return cache


def _save_timing_cache(config: Any, path: str) -> None:
    data = bytes(config.get_timing_cache().serialize())
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".timing-")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, target)  # atomic: a concurrent build never reads half a cache


# --- run --------------------------------------------------------------------------------


def _torch_dtype(trt_dtype: Any) -> Any:
    import torch

    table = {
        "FLOAT": torch.float32,
        "HALF": torch.float16,
        "BF16": torch.bfloat16,
        "INT8": torch.int8,
        "UINT8": torch.uint8,
        "INT32": torch.int32,
        "INT64": torch.int64,
        "BOOL": torch.bool,
    }
    if trt_dtype.name not in table:
        raise CompileFailed(f"TensorRT I/O tensor type {trt_dtype.name} is not supported")
    return table[trt_dtype.name]


class TensorRtEngine(Engine):
    """A deserialized TensorRT engine with device buffers bound for one input shape."""

    asynchronous_device = True

    def __init__(self, plan: bytes, flags: dict[str, Any]) -> None:
        import tensorrt as trt
        import torch

        self.plan = plan
        self.use_cuda_graph = bool(flags.get("cuda_graph"))
        self._runtime = trt.Runtime(_logger())
        self._engine = self._runtime.deserialize_cuda_engine(plan)
        if self._engine is None:
            raise CompileFailed(
                "TensorRT could not deserialize the plan (built by another TensorRT version "
                "or for another GPU?)"
            )
        self._context = self._engine.create_execution_context()
        if self._context is None:
            raise CompileFailed("TensorRT could not create an execution context (out of memory?)")
        self._stream = torch.cuda.Stream()
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        inputs = [n for n in names if self._engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        if len(inputs) != 1:
            raise CompileFailed(f"the benchmark feeds one input; the engine has {inputs}")
        self._input_name = inputs[0]
        self._output_names = [n for n in names if n != self._input_name]
        self._buffers: dict[str, Any] = {}
        self._graph = None

    def _bind(self, shape: tuple[int, ...]) -> None:
        """Allocate device buffers for ``shape`` and bind their addresses (once per shape)."""
        import torch

        current = self._buffers.get(self._input_name)
        if current is not None and tuple(current.shape) == shape:
            return
        if not self._context.set_input_shape(self._input_name, shape):
            raise CompileFailed(f"the engine was not built for input shape {shape}")
        self._graph = None  # a graph holds the old addresses
        self._buffers = {}
        for name in [self._input_name, *self._output_names]:
            dims = tuple(self._context.get_tensor_shape(name))
            dtype = _torch_dtype(self._engine.get_tensor_dtype(name))
            self._buffers[name] = torch.empty(dims, dtype=dtype, device="cuda")
            self._context.set_tensor_address(name, self._buffers[name].data_ptr())

    def _copy_in(self, inputs: np.ndarray) -> None:
        import torch

        self._bind(tuple(inputs.shape))
        host = torch.from_numpy(np.ascontiguousarray(inputs))
        with torch.cuda.stream(self._stream):
            self._buffers[self._input_name].copy_(host)
        self._stream.synchronize()

    def _enqueue(self) -> None:
        if not self._context.execute_async_v3(self._stream.cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log)")

    def _capture(self) -> None:
        """Capture one enqueue into a CUDA graph, after one plain run that lets TensorRT
        finish its lazy set-up (capture forbids allocations)."""
        import torch

        self._enqueue()
        self._stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=self._stream):
                self._enqueue()
        except RuntimeError as exc:
            raise CompileFailed(
                f"CUDA graph capture of the TensorRT engine failed ({exc}); "
                "run it with cuda_graph=false"
            ) from exc
        self._graph = graph

    def _launch(self) -> None:
        if self._graph is None:
            self._enqueue()
            return
        import torch

        with torch.cuda.stream(self._stream):  # replay() launches on the current stream
            self._graph.replay()

    def prepare(self, inputs: np.ndarray) -> None:
        self._copy_in(inputs)
        if self.use_cuda_graph and self._graph is None:
            self._capture()

    def infer(self) -> None:
        self._launch()
        self.synchronize()

    def run_many(self, count: int, stamps: list[float] | None = None) -> None:
        if stamps is None:  # requests pipeline on the stream: one synchronization at the end
            for _ in range(count):
                self._launch()
            self.synchronize()
            return
        # each request to its end (the harness never asks this of a device queue)
        for _ in range(count):
            self._launch()
            self.synchronize()
            stamps.append(time.perf_counter())

    def outputs(self, inputs: np.ndarray) -> np.ndarray:
        self._copy_in(inputs)
        if self.use_cuda_graph and self._graph is None:
            self._capture()  # what is checked (and deployed) is the graph that is measured
        self._launch()
        self.synchronize()
        # every output, in the network's output order (the ONNX graph's, which the eager
        # reference follows): the engine contract's tuple when the model has several
        found = tuple(
            self._buffers[name].detach().float().cpu().numpy() for name in self._output_names
        )
        return found[0] if len(found) == 1 else found

    def synchronize(self) -> None:
        self._stream.synchronize()

    def save(self, directory: Path) -> EngineFiles:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / PLAN_FILE).write_bytes(self.plan)
        return EngineFiles(files=[PLAN_FILE], format=ENGINE_FORMAT)

    def runtime_settings(self) -> dict[str, Any]:
        import tensorrt as trt

        return {
            "tensorrt_version": trt.__version__,
            "cuda_graph": self.use_cuda_graph,
            "plan_mb": round(len(self.plan) / _MB, 3),
        }

    def close(self) -> None:
        if hasattr(self, "_stream"):
            self._stream.synchronize()
        self._graph = None
        self._buffers = {}
        self._context = None
        self._engine = None
