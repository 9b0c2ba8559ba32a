"""onnxruntime: ONNX Runtime on the cached ONNX export, with the CPU, CUDA or TensorRT EP.

One :class:`onnxruntime.InferenceSession` is built at compile time and reused for every call.
Its graph optimizations are written out with ``SessionOptions.optimized_model_filepath``;
that file (``model.ort.onnx``) is the engine, and :meth:`OnnxRuntimeCompiler.load` builds a
session from it with optimizations disabled, since they were already applied.

On CUDA and TensorRT the engine follows ONNX Runtime's GPU best practice: the input lives on
the device as an ``OrtValue`` bound with IO binding, outputs are bound on the device, and a
call is ``run_with_iobinding`` followed by ``synchronize_outputs``. ``copy_inputs=true`` puts
the host-to-device copy of the input inside every call.

The TensorRT EP compiles subgraphs into TensorRT engines that ONNX Runtime cannot write into
an ONNX file, so its engine is the source ONNX plus TensorRT's engine cache directory.
"""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
import tempfile
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
from mlflow_ngraph.errors import CompileFailed, CompilerUnavailable, NgraphError

log = logging.getLogger(__name__)

OPTIMIZED_FILE = "model.ort.onnx"
SOURCE_FILE = "model.onnx"
TRT_CACHE_DIR = "trt_cache"

#: the flag value -> ``onnxruntime.GraphOptimizationLevel`` member
_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",  # ONNX Runtime >= 1.22
    "all": "ORT_ENABLE_ALL",
}
_MODES = {"sequential": "ORT_SEQUENTIAL", "parallel": "ORT_PARALLEL"}
_EXECUTION_PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}
#: the process benchmarks one GPU; CUDA_VISIBLE_DEVICES picks which one
_CUDA_DEVICE_ID = 0
#: the dimension name :func:`export_onnx` gives the batch axis
_EXPORT_BATCH_DIM = "batch"


class OnnxRuntimeEngine(Engine):
    """One ONNX Runtime session bound to one batch size.

    Args:
        session: the session, built once.
        flags: the resolved flags (``io_binding`` already decided for the provider).
        provider: ``cpu``, ``cuda`` or ``tensorrt``.
        files: engine files by name (what :meth:`save` copies).
        scratch: the compile's own directory under the workdir, removed by :meth:`close`
            (``None`` for an engine loaded from the engine cache).
    """

    def __init__(
        self,
        session: Any,
        flags: dict[str, Any],
        provider: str,
        files: dict[str, Path],
        scratch: Path | None = None,
    ) -> None:
        self.session = session
        self.flags = flags
        self.provider = provider
        self.files = files
        self.scratch = scratch
        self.asynchronous_device = provider != "cpu"
        self.input_name = session.get_inputs()[0].name
        self.output_names = [o.name for o in session.get_outputs()]
        self._binding: Any = None
        self._device_input: Any = None
        self._host_input: np.ndarray | None = None
        self._feed: dict[str, np.ndarray] = {}

    @property
    def uses_io_binding(self) -> bool:
        return self.provider != "cpu" and bool(self.flags["io_binding"])

    def prepare(self, inputs: np.ndarray) -> None:
        self._host_input = np.ascontiguousarray(inputs)
        if not self.uses_io_binding:
            self._feed = {self.input_name: self._host_input}
            return
        from onnxruntime import OrtValue

        self._device_input = OrtValue.ortvalue_from_numpy(self._host_input, "cuda", _CUDA_DEVICE_ID)
        self._binding = self.session.io_binding()
        self._binding.bind_ortvalue_input(self.input_name, self._device_input)
        for name in self.output_names:
            # ORT allocates the outputs on the device from its arena: no device->host copy
            self._binding.bind_output(name, "cuda", _CUDA_DEVICE_ID)

    def infer(self) -> None:
        if self._binding is None:
            self.session.run(self.output_names, self._feed)
            return
        if self.flags["copy_inputs"]:
            self._device_input.update_inplace(self._host_input)
        self.session.run_with_iobinding(self._binding)
        self._binding.synchronize_outputs()

    def outputs(self, inputs: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        """Every output, in the graph's order (one array when there is one)."""
        results = self.session.run(self.output_names, {self.input_name: inputs})
        arrays = tuple(np.asarray(r, dtype=np.float32) for r in results)
        return arrays[0] if len(arrays) == 1 else arrays

    def synchronize(self) -> None:
        if self._binding is not None:
            self._binding.synchronize_outputs()

    def save(self, directory: Path) -> EngineFiles:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        for name, source in self.files.items():
            target = directory / name
            if source.is_dir():
                if target.resolve() != source.resolve():
                    shutil.copytree(source, target, dirs_exist_ok=True)
                written += [str(p.relative_to(directory)) for p in target.rglob("*") if p.is_file()]
            else:
                if target.resolve() != source.resolve():
                    shutil.copyfile(source, target)
                written.append(name)
        fmt = "onnx+tensorrt-cache" if self.provider == "tensorrt" else "ort-optimized-onnx"
        return EngineFiles(files=sorted(written), format=fmt)

    def runtime_settings(self) -> dict[str, Any]:
        options = self.session.get_session_options()
        parallel = self.flags["execution_mode"] == "parallel"
        return {
            "ort_providers": ",".join(self.session.get_providers()),
            "ort_intra_op_threads": _effective_threads(options.intra_op_num_threads),
            "ort_inter_op_threads": (
                _effective_threads(options.inter_op_num_threads) if parallel else "unused"
            ),
            "ort_execution_mode": self.flags["execution_mode"],
            "ort_io_binding": self.uses_io_binding,
            **_provider_math(self.session),
        }

    def close(self) -> None:
        self._binding = None
        self._device_input = None
        self.session = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


class OnnxRuntimeCompiler(Compiler):
    """ONNX Runtime on the cached ONNX export, one session per batch size."""

    name = "onnxruntime"
    uses_onnx = True
    packages = ("onnxruntime",)
    distribution = "onnxruntime"
    extra = "cpu"
    devices = ("cpu", "cuda")
    cpu_rule = "warn"  # the optimized graph may hold kernels chosen for the build CPU
    gpu_rule = "warn"  # the TensorRT provider's cached engines are the build GPU's
    engine_formats = {
        "ort-optimized-onnx": (("model.ort.onnx",), ""),
        "onnx+tensorrt-cache": (("model.onnx",), "serialized TensorRT engines (native code)"),
    }
    compile_allowance_s = 6.0
    color = "#ff7f0e"
    flags = {
        # "all" is ONNX Runtime's own default and what a deployment would use
        "graph_optimization_level": Flag(str, "all", tuple(_LEVELS), help="graph optimizations"),
        # 0 lets ONNX Runtime choose (one thread per physical core)
        "intra_op_num_threads": Flag(int, 0, minimum=0, help="threads inside an operator"),
        "inter_op_num_threads": Flag(
            int, 0, minimum=0, help="threads across operators (execution_mode=parallel)"
        ),
        # sequential is ONNX Runtime's default; parallel only pays off on branchy graphs
        "execution_mode": Flag(str, "sequential", tuple(_MODES), help="operator scheduling"),
        # cpu: the device profiles for GPUs set provider=cuda themselves
        "provider": Flag(str, "cpu", tuple(_EXECUTION_PROVIDERS), help="execution provider"),
        # None: on for cuda/tensorrt (ORT's GPU best practice), meaningless on cpu
        "io_binding": Flag(bool, None, help="bind input/output on the GPU (cuda, tensorrt)"),
        # False: the paper times inference, not PCIe transfers of an input already on the GPU
        "copy_inputs": Flag(
            bool, False, help="time the host->device input copy (GPU with io_binding)"
        ),
    }
    batch_agnostic = False

    def search_space(self, host: HostLimits) -> list[Knob]:
        """Olive's ONNX Runtime space: thread counts, execution mode and graph
        optimizations; inter-op threads only with parallel execution, IO binding only on a
        GPU (on the CPU provider it binds nothing)."""
        threads = (0, *host.counts())  # 0: ONNX Runtime's own choice
        knobs = [
            Knob("graph_optimization_level", ("basic", "extended", "all")),
            Knob("intra_op_num_threads", threads),
            Knob("execution_mode", ("sequential", "parallel")),
            Knob("inter_op_num_threads", threads, when=(("execution_mode", "parallel"),)),
        ]
        if host.device == "cuda":
            knobs.append(Knob("io_binding", (True, False)))
        return knobs

    def version(self) -> str:
        for distribution in ("onnxruntime", "onnxruntime-gpu"):
            try:
                return importlib.metadata.version(distribution)
            except importlib.metadata.PackageNotFoundError:
                continue
        return "not installed"

    def availability(self, device: str = "cpu") -> tuple[bool, str]:
        try:
            import onnxruntime
        except ImportError as exc:
            return False, f"onnxruntime does not import ({exc}): pip install 'mlflow-ngraph[cpu]'"
        if device not in self.devices:
            return False, f"does not target device kind {device!r} (targets {self.devices})"
        if (
            device == "cuda"
            and "CUDAExecutionProvider" not in onnxruntime.get_available_providers()
        ):
            return False, _missing_provider_message("cuda", onnxruntime.get_available_providers())
        return super().availability(device)

    def resolve_flags(self, given: dict[str, Any]) -> dict[str, Any]:
        resolved = super().resolve_flags(given)
        if resolved["io_binding"] is None:
            resolved["io_binding"] = resolved["provider"] != "cpu"
        return resolved

    def compile(self, model: Any, flags: dict[str, Any], ctx: CompileContext) -> OnnxRuntimeEngine:
        provider = self._check_provider(flags, ctx)
        source = export_onnx(model, ctx.cache_dir)
        workdir = _scratch_dir(ctx)
        options = _session_options(flags, _batch_dim_name(model), ctx.batch_size)
        files: dict[str, Path]
        if provider == "tensorrt":
            shutil.copyfile(source, workdir / SOURCE_FILE)
            files = {SOURCE_FILE: workdir / SOURCE_FILE, TRT_CACHE_DIR: workdir / TRT_CACHE_DIR}
            model_path = workdir / SOURCE_FILE
        else:
            options.optimized_model_filepath = str(workdir / OPTIMIZED_FILE)
            files = {OPTIMIZED_FILE: workdir / OPTIMIZED_FILE}
            model_path = source
        session = _session(model_path, options, provider, workdir / TRT_CACHE_DIR, ctx.math)
        batch = session.get_inputs()[0].shape[0] if session.get_inputs()[0].shape else None
        if isinstance(batch, int) and batch != ctx.batch_size:
            raise CompileFailed(f"the ONNX model has a static batch size of {batch}")
        return OnnxRuntimeEngine(session, flags, provider, files, scratch=workdir)

    def load(
        self, model: Any, flags: dict[str, Any], ctx: CompileContext, directory: Path
    ) -> OnnxRuntimeEngine | None:
        provider = self._check_provider(flags, ctx)
        directory = Path(directory)
        name = SOURCE_FILE if provider == "tensorrt" else OPTIMIZED_FILE
        if not (directory / name).is_file():
            return None
        options = _session_options(flags, _batch_dim_name(model), ctx.batch_size)
        if provider != "tensorrt":
            import onnxruntime

            # the file already holds the optimized graph: do not optimize it a second time
            options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = _session(directory / name, options, provider, directory / TRT_CACHE_DIR, ctx.math)
        files = {name: directory / name}
        if provider == "tensorrt":
            files[TRT_CACHE_DIR] = directory / TRT_CACHE_DIR
        return OnnxRuntimeEngine(session, flags, provider, files)

    def loads(self, fmt: str, flags: dict[str, Any]) -> tuple[str, ...]:
        """:meth:`load` reads the file of its ``provider`` flag, whatever the format says:
        the source ONNX (and TensorRT's engine cache) for tensorrt, else the optimized ONNX."""
        read = SOURCE_FILE if flags.get("provider") == "tensorrt" else OPTIMIZED_FILE
        return tuple(dict.fromkeys((*super().loads(fmt, flags), read)))

    def runs_code(self, fmt: str, flags: dict[str, Any]) -> str:
        """:meth:`load` picks the execution provider by the ``provider`` flag, not by the
        format: with tensorrt it loads TensorRT's engine cache (serialized TensorRT engines,
        native code) whatever the format says; a format that declares code still does."""
        if flags.get("provider") == "tensorrt":
            return self.engine_formats["onnx+tensorrt-cache"][1]
        return super().runs_code(fmt, flags)

    def _check_provider(self, flags: dict[str, Any], ctx: CompileContext) -> str:
        """The provider to use; raises when this host or ``ctx.device`` cannot run it."""
        import onnxruntime

        provider = flags["provider"]
        if ctx.math == "fp16" and provider != "tensorrt":
            raise CompileFailed(
                f"onnxruntime's {provider} provider runs the ONNX graph's own FP32: --math fp16 "
                "needs provider=tensorrt (its FP16 kernels) or an FP16 model"
            )
        available = onnxruntime.get_available_providers()
        if _EXECUTION_PROVIDERS[provider] not in available:
            raise CompilerUnavailable(_missing_provider_message(provider, available))
        if provider != "cpu" and ctx.device != "cuda":
            raise NgraphError(
                f"compiler 'onnxruntime': provider={provider} runs on a CUDA device, but this "
                f"cell's device kind is {ctx.device!r} (use a CUDA device profile)"
            )
        if provider == "cpu" and ctx.device == "cuda":
            log.warning("onnxruntime provider=cpu on a CUDA device: ORT runs on the CPU")
        return provider


def _scratch_dir(ctx: CompileContext) -> Path:
    """A directory of this compile's own: the workdir is shared by every cell of a run."""
    Path(ctx.workdir).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"onnxruntime-bs{ctx.batch_size}-", dir=ctx.workdir))


def _missing_provider_message(provider: str, available: list[str]) -> str:
    needed = _EXECUTION_PROVIDERS[provider]
    install = {
        "cpu": "pip install onnxruntime",
        "cuda": "pip install 'mlflow-ngraph[gpu]' (onnxruntime-gpu, with CUDA and cuDNN) "
        "on a host with an NVIDIA GPU",
        "tensorrt": "pip install 'mlflow-ngraph[gpu]' (onnxruntime-gpu and TensorRT) on a "
        "host with an NVIDIA GPU",
    }[provider]
    return (
        f"onnxruntime provider={provider} needs {needed}, which this onnxruntime build does "
        f"not have (it has: {', '.join(available)}); {install}"
    )


def _session_options(flags: dict[str, Any], batch_dim: str | None, batch_size: int) -> Any:
    import onnxruntime

    level = getattr(
        onnxruntime.GraphOptimizationLevel, _LEVELS[flags["graph_optimization_level"]], None
    )
    if level is None:
        raise NgraphError(
            f"compiler 'onnxruntime': graph_optimization_level={flags['graph_optimization_level']}"
            f" needs a newer onnxruntime than {onnxruntime.__version__}"
        )
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = level
    options.intra_op_num_threads = flags["intra_op_num_threads"]
    options.inter_op_num_threads = flags["inter_op_num_threads"]
    options.execution_mode = getattr(onnxruntime.ExecutionMode, _MODES[flags["execution_mode"]])
    if batch_dim:
        # a static batch, as OpenVINO's reshape: ORT plans memory once and fuses more
        options.add_free_dimension_override_by_name(batch_dim, batch_size)
    return options


def _session(
    model_path: Path, options: Any, provider: str, trt_cache: Path, math: str = "fp32"
) -> Any:
    import onnxruntime

    providers: list[Any] = ["CPUExecutionProvider"]
    if provider in ("cuda", "tensorrt"):
        _load_gpu_libraries(onnxruntime, provider)
        # the run's --math: TF32 only where it allows it (the CUDA provider's own default
        # is on), compilers/precision.py
        cuda_options = {"device_id": _CUDA_DEVICE_ID, "use_tf32": "0" if math == "fp32" else "1"}
        providers.insert(0, ("CUDAExecutionProvider", cuda_options))
    if provider == "tensorrt":
        trt_cache.mkdir(parents=True, exist_ok=True)
        trt_options = {
            "device_id": _CUDA_DEVICE_ID,
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(trt_cache),
            "trt_timing_cache_enable": True,
            "trt_timing_cache_path": str(trt_cache),
            # the run's --math: FP16 kernels only for fp16 (TensorRT's FP32 layers may use
            # TF32: ONNX Runtime has no switch for it, said in the runtime settings)
            "trt_fp16_enable": math == "fp16",
        }
        providers.insert(0, ("TensorrtExecutionProvider", trt_options))
    try:
        session = onnxruntime.InferenceSession(str(model_path), options, providers=providers)
    except Exception as exc:  # unsupported operator, invalid graph, EP failure
        raise CompileFailed(f"onnxruntime session failed: {_first_line(exc)}") from exc
    wanted = _EXECUTION_PROVIDERS[provider]
    if session.get_providers()[0] != wanted:
        # ORT falls back to the CPU EP with only a log line when a GPU EP fails to start
        raise CompileFailed(
            f"onnxruntime could not start {wanted} (session providers: "
            f"{', '.join(session.get_providers())})"
        )
    return session


def _provider_math(session: Any) -> dict[str, Any]:
    """What the GPU providers were told of the arithmetic, as the session holds it."""
    options = session.get_provider_options()
    out: dict[str, Any] = {}
    if "CUDAExecutionProvider" in options:
        out["ort_cuda_use_tf32"] = options["CUDAExecutionProvider"].get("use_tf32", "default")
    if "TensorrtExecutionProvider" in options:
        trt = options["TensorrtExecutionProvider"]
        out["ort_trt_fp16"] = trt.get("trt_fp16_enable", "default")
        out["ort_trt_tf32"] = "TensorRT's default (ONNX Runtime has no switch)"
    return out


def _load_gpu_libraries(onnxruntime: Any, provider: str) -> None:
    """The shared libraries a GPU provider dlopens, loaded the ways their docs say: CUDA and
    cuDNN from the nvidia-* wheels (``onnxruntime.preload_dlls``, 1.21 and later), and for
    the TensorRT provider TensorRT's own, which ``import tensorrt`` loads from the wheel's
    ``tensorrt_libs`` (outside the loader's path): the provider then finds libnvinfer by
    name. ONNX Runtime's GPU builds link TensorRT 10."""
    preload = getattr(onnxruntime, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception as exc:  # the libraries may come from the system instead
            log.debug("onnxruntime.preload_dlls: %s", exc)
    if provider != "tensorrt":
        return
    try:
        import tensorrt
    except ImportError as exc:
        raise CompileFailed(
            f"ONNX Runtime's TensorRT provider needs TensorRT 10's libraries ({exc}): "
            "pip install 'mlflow-ngraph[gpu]'"
        ) from None
    if not tensorrt.__version__.startswith("10."):
        raise CompileFailed(
            f"ONNX Runtime's TensorRT provider is built against TensorRT 10; this host has "
            f"TensorRT {tensorrt.__version__}: pip install 'tensorrt>=10,<11'"
        )


def _batch_dim_name(model: Any) -> str | None:
    """The symbolic name of the input's batch dimension, or ``None`` when it is static."""
    if model.onnx_file is None:
        return _EXPORT_BATCH_DIM
    import onnx

    proto = onnx.load(str(model.onnx_file), load_external_data=False)
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    if not dims:
        return None
    return dims[0].dim_param or None


def _effective_threads(requested: int) -> int:
    """The thread count ONNX Runtime uses: ``requested``, or one per physical core for 0."""
    if requested:
        return requested
    import psutil

    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
