"""openvino: the OpenVINO runtime on the cached ONNX export (or a direct PyTorch conversion).

The model is reshaped to the batch's static shape before compiling, as ``benchmark_app``
does. The performance hint follows the scenario unless a flag sets it: ``THROUGHPUT`` for the
throughput scenario (several streams), ``LATENCY`` for the latency one (one stream). The
precision hint defaults to f32: some CPUs would otherwise run in bf16 and the comparison with
the other compilers would no longer be like for like.

In the throughput scenario :meth:`OpenVinoEngine.run_many` is ``benchmark_app``'s inference
loop: an :class:`openvino.AsyncInferQueue` with the compiled model's optimal number of infer
requests, every request's input tensor filled once in :meth:`OpenVinoEngine.prepare`, then
``start_async()`` without inputs so that no call copies or allocates. :meth:`infer` is one
synchronous request, for the latency scenario.

The engine file is the compiled blob (``CompiledModel.export_model``, ``model.blob``), read
back with ``Core.import_model`` on the same device and OpenVINO version. No ``CACHE_DIR`` is
set: OpenVINO's own model cache would make compile times depend on earlier runs.
"""

from __future__ import annotations

import logging
import time
import warnings
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

BLOB_FILE = "model.blob"

HINTS = ("THROUGHPUT", "LATENCY", "CUMULATIVE_THROUGHPUT")
#: the hint each scenario gets when PERFORMANCE_HINT is not given
SCENARIO_HINTS = {"throughput": "THROUGHPUT", "latency": "LATENCY"}
#: flags passed to OpenVINO as compile properties when they are set
PROPERTY_FLAGS = (
    "PERFORMANCE_HINT",
    "INFERENCE_PRECISION_HINT",
    "NUM_STREAMS",
    "INFERENCE_NUM_THREADS",
    "PERFORMANCE_HINT_NUM_REQUESTS",
    "ENABLE_HYPER_THREADING",
    "ENABLE_CPU_PINNING",
)
#: properties read back from the compiled model for runtime_settings()
_READ_BACK = (
    "PERFORMANCE_HINT",
    "NUM_STREAMS",
    "OPTIMAL_NUMBER_OF_INFER_REQUESTS",
    "INFERENCE_NUM_THREADS",
    "INFERENCE_PRECISION_HINT",
    "ENABLE_HYPER_THREADING",
    "ENABLE_CPU_PINNING",
    "EXECUTION_DEVICES",
)
#: OpenVINO devices that dispatch to others and so are never in ``available_devices``
_VIRTUAL_DEVICES = ("AUTO", "HETERO", "MULTI", "BATCH")


class OpenVinoEngine(Engine):
    """A compiled OpenVINO model on one static batch shape.

    Args:
        compiled: the :class:`openvino.CompiledModel`.
        device: the OpenVINO device it was compiled for (``CPU``, ``GPU``...).
    """

    def __init__(self, compiled: Any, device: str) -> None:
        self.compiled = compiled
        self.device = device
        self.parallel_requests = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        self.input_shape = tuple(compiled.input(0).get_shape())
        self.queue: Any = None  # AsyncInferQueue, built in prepare()
        self.request: Any = None  # the synchronous InferRequest of infer()
        #: ids of the queue's requests started since the window began (reset_latencies):
        #: only their previous inference is one of the window's
        self._started: set[int] = set()

    def prepare(self, inputs: np.ndarray) -> None:
        from openvino import AsyncInferQueue

        self._check_shape(inputs)
        if self.queue is None:
            self.queue = AsyncInferQueue(self.compiled, self.parallel_requests)
            self.request = self.compiled.create_infer_request()
        # as benchmark_app: copy the data into each request's own input tensor, once
        for request in [self.request, *self.queue]:
            request.get_input_tensor(0).data[:] = inputs
        self.reset_latencies()

    def reset_latencies(self) -> None:
        """Begin a measured window: :meth:`start_many` reads no latency of an inference
        that ran before this call (in the warm-up, or never: a request that has not run
        reads 0.0 ms). :meth:`synchronize` calls it, so the harness's sync after the
        warm-up begins the window; with nothing in flight then, no window's inference is
        lost."""
        self._started.clear()

    def infer(self) -> None:
        self.request.infer()

    def infer_in(self, slot: int) -> None:
        """One synchronous inference on the async queue's request ``slot`` (its input
        filled in :meth:`prepare`): a server's dispatcher threads each drive their own
        request, as many at once as the compiled model's optimal number of requests."""
        self.queue[slot].infer()

    def start_many(self, count: int, latencies: list[float] | None = None, every: int = 1) -> None:
        """Start ``count`` requests; return once the last is started (earlier ones may still
        run). The harness calls it repetition after repetition so the queue never drains
        between repetitions, as in ``benchmark_app``'s loop; :meth:`synchronize` waits.

        Given ``latencies``, every ``every``-th start first reads the seconds the idle
        request's previous inference took (OpenVINO's own per-request timer): per-request
        latencies under full load, as ``benchmark_app`` reports them. A Python completion
        callback would do the same at the cost of the GIL on every completion: it halved
        the throughput of a 30 us model; reading one request in eight cost about 3%.
        Only an inference started in this window is read (see :meth:`reset_latencies`):
        each request's first start in it is not, its previous inference being older.
        """
        queue = self.queue
        started = self._started
        if latencies is None:  # nothing read: nothing tracked (a later read is skipped)
            for _ in range(count):
                queue.start_async()  # blocks until a request is idle; inputs already in place
            return
        for k in range(count):
            # the request start_async takes next (the same idle list, one starting thread)
            idle = queue.get_idle_request_id()
            if k % every == 0 and idle in started:
                latencies.append(queue[idle].latency / 1000.0)
            started.add(idle)
            queue.start_async()

    def run_many(self, count: int, stamps: list[float] | None = None) -> None:
        if stamps is None:
            self.start_many(count)
            self.queue.wait_all()
            return
        # one slot (the latency hint): requests one after another, each stamped as it ends
        request, clock, stamp = self.request, time.perf_counter, stamps.append
        for _ in range(count):
            request.infer()
            stamp(clock())

    def synchronize(self) -> None:
        if self.queue is not None:
            self.queue.wait_all()
        self.reset_latencies()  # nothing in flight: what follows is a new window

    def outputs(self, inputs: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        """Every output, in the model's order (one array when there is one)."""
        self._check_shape(inputs)
        result = self.compiled.create_infer_request().infer({0: inputs})
        count = len(self.compiled.outputs)
        arrays = tuple(np.array(result[i], dtype=np.float32, copy=True) for i in range(count))
        return arrays[0] if count == 1 else arrays

    def save(self, directory: Path) -> EngineFiles:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        blob = self.compiled.export_model()  # bytes, or io.BytesIO since OpenVINO 2025
        (directory / BLOB_FILE).write_bytes(blob.getvalue() if hasattr(blob, "getvalue") else blob)
        return EngineFiles(files=[BLOB_FILE], format="openvino-compiled-blob")

    def runtime_settings(self) -> dict[str, Any]:
        supported = self.compiled.get_property("SUPPORTED_PROPERTIES")
        settings = {"openvino_device": self.device}
        for key in _READ_BACK:
            if key in supported:
                settings[f"openvino_{key.lower()}"] = _plain(self.compiled.get_property(key))
        return settings

    def close(self) -> None:
        if self.queue is not None:
            self.queue.wait_all()
        self.queue = self.request = self.compiled = None

    def _check_shape(self, inputs: np.ndarray) -> None:
        if tuple(inputs.shape) != self.input_shape:
            raise ValueError(
                f"OpenVINO engine compiled for input shape {self.input_shape}, got {inputs.shape}"
            )


class OpenVinoCompiler(Compiler):
    """OpenVINO ``Core.compile_model`` with static shapes and scenario-driven hints."""

    name = "openvino"
    uses_onnx = True
    packages = ("openvino",)
    distribution = "openvino"
    extra = "cpu"
    # an Intel GPU or NPU is reached through the `device` flag on a host of kind cpu
    devices = ("cpu",)
    exact_version = True
    compile_allowance_s = 6.0
    engine_formats = {"openvino-compiled-blob": (("model.blob",), "")}
    color = "#1f77b4"
    flags = {
        # onnx: the same graph every ONNX-based compiler starts from
        "source": Flag(str, "onnx", ("onnx", "pytorch"), help="ONNX export or convert_model"),
        "device": Flag(str, "CPU", help="OpenVINO device: CPU, GPU, GPU.1, AUTO..."),
        # None: THROUGHPUT in the throughput scenario, LATENCY in the latency one
        "PERFORMANCE_HINT": Flag(str, None, HINTS, help="performance hint"),
        # f32: never let the runtime switch to bf16/f16 behind the benchmark's back
        "INFERENCE_PRECISION_HINT": Flag(
            str, "f32", ("f32", "bf16", "f16"), help="inference precision"
        ),
        "NUM_STREAMS": Flag(int, None, minimum=1, help="parallel streams (overrides the hint)"),
        "INFERENCE_NUM_THREADS": Flag(int, None, minimum=1, help="total inference threads"),
        "PERFORMANCE_HINT_NUM_REQUESTS": Flag(
            int, None, minimum=1, help="cap on the requests the hint plans for"
        ),
        "ENABLE_HYPER_THREADING": Flag(bool, None, help="use both threads of a core (CPU)"),
        "ENABLE_CPU_PINNING": Flag(bool, None, help="pin inference threads to cores (CPU)"),
    }
    batch_agnostic = False

    def search_space(self, host: HostLimits) -> list[Knob]:
        """The hint, and what it would otherwise choose itself: streams, threads and the
        requests a THROUGHPUT hint plans for. bf16/f16 only with ``--allow-precision``."""
        return [
            Knob("PERFORMANCE_HINT", ("THROUGHPUT", "LATENCY")),
            Knob("NUM_STREAMS", (None, *host.counts())),
            Knob("INFERENCE_NUM_THREADS", (None, *host.counts())),
            Knob(
                "PERFORMANCE_HINT_NUM_REQUESTS",
                (None, *HostLimits(host.cores * 2).counts()),
                when=(("PERFORMANCE_HINT", "THROUGHPUT"),),
            ),
            Knob("INFERENCE_PRECISION_HINT", ("f32", "bf16", "f16"), precision=True),
        ]

    def compile(self, model: Any, flags: dict[str, Any], ctx: CompileContext) -> OpenVinoEngine:
        import openvino

        core = openvino.Core()
        config = _properties(core, flags, ctx.scenario)
        ov_model = _read(core, model, flags, ctx)
        port = ov_model.inputs[0]
        try:
            ov_model.reshape({port: openvino.PartialShape(list(model.input_shape(ctx.batch_size)))})
            compiled = core.compile_model(ov_model, flags["device"], config)
        except Exception as exc:  # unsupported operator or shape inference failure
            raise CompileFailed(f"OpenVINO compile failed: {_first_line(exc)}") from exc
        return OpenVinoEngine(compiled, flags["device"])

    def load(
        self, model: Any, flags: dict[str, Any], ctx: CompileContext, directory: Path
    ) -> OpenVinoEngine | None:
        import openvino

        path = Path(directory) / BLOB_FILE
        if not path.is_file():
            return None
        core = openvino.Core()
        config = _properties(core, flags, ctx.scenario)
        try:
            compiled = core.import_model(path.read_bytes(), flags["device"], config)
        except Exception as exc:  # a blob from another OpenVINO version or device
            log.warning("OpenVINO blob %s does not import (%s): recompiling", path, exc)
            return None
        return OpenVinoEngine(compiled, flags["device"])


def _properties(core: Any, flags: dict[str, Any], scenario: str) -> dict[str, Any]:
    """The compile properties for ``flags`` (the hint from the scenario when unset)."""
    device = flags["device"]
    _check_device(core, device)
    config = {key: flags[key] for key in PROPERTY_FLAGS if flags.get(key) is not None}
    config.setdefault("PERFORMANCE_HINT", SCENARIO_HINTS.get(scenario, "THROUGHPUT"))
    if device.split(".")[0].split(":")[0] not in _VIRTUAL_DEVICES:
        supported = core.get_property(device, "SUPPORTED_PROPERTIES")
        unsupported = sorted(key for key in config if key not in supported)
        if unsupported:
            raise NgraphError(
                f"compiler 'openvino': device {device} does not support {', '.join(unsupported)}"
            )
    return config


def _check_device(core: Any, device: str) -> None:
    if device.split(".")[0].split(":")[0] in _VIRTUAL_DEVICES:
        return
    available = core.available_devices
    if device not in available and not any(d.startswith(device + ".") for d in available):
        raise CompilerUnavailable(
            f"OpenVINO device {device!r} is not available here (available: "
            f"{', '.join(available)}); GPU and NPU need their drivers installed"
        )


def _read(core: Any, model: Any, flags: dict[str, Any], ctx: CompileContext) -> Any:
    """The OpenVINO model from the ONNX export or from ``openvino.convert_model``."""
    try:
        if flags["source"] == "onnx":
            return core.read_model(str(export_onnx(model, ctx.cache_dir)))
        if model.module is None:
            raise CompileFailed(
                f"openvino source=pytorch needs a PyTorch model; {model.name} is ONNX"
            )
        import openvino
        import torch

        example = torch.from_numpy(model.random_input(ctx.batch_size))
        with warnings.catch_warnings():  # convert_model traces with deprecated TorchScript
            warnings.simplefilter("ignore", FutureWarning)
            return openvino.convert_model(model.module.eval(), example_input=example)
    except CompileFailed:
        raise
    except Exception as exc:  # the frontend rejects an operator
        raise CompileFailed(f"OpenVINO could not read the model: {_first_line(exc)}") from exc


def _plain(value: Any) -> Any:
    """A property value as a loggable scalar (``f32`` rather than ``<Type: 'float32'>``)."""
    if hasattr(value, "get_type_name"):
        return value.get_type_name()
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
