"""Every GPU path end to end on a CUDA host (``make gpu-check`` runs them): the torch
compilers, ONNX Runtime's CUDA provider and TVM on ``cuda``, the harness with a GPU engine,
and a worker group of a benchmark on the GPU. Skipped, with the reason, without a CUDA
device; what can be checked without one is checked here too."""

from __future__ import annotations

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from mlflow_ngraph.compilers.base import CompileContext
from mlflow_ngraph.compilers.registry import get_compiler
from mlflow_ngraph.devices import cuda_status
from mlflow_ngraph.models.registry import load_model
from mlflow_ngraph.tracking import schema as S
from tests._support import cell_runs

CUDA_OK, CUDA_REASON = cuda_status()
needs_gpu = pytest.mark.skipif(not CUDA_OK, reason=CUDA_REASON)
HEADS = ("mlflow_ngraph.models.blocks:heads_block", {"input_shape": "3x16x16"})
#: float32 kernels against PyTorch eager on the CPU: reordered reductions, fused kernels
RTOL = 2e-3


def _close(out, ref) -> None:
    out = out if isinstance(out, tuple) else (out,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert len(out) == len(ref)
    for a, b in zip(out, ref):
        assert a.shape == b.shape
        assert np.abs(a - b).max() <= RTOL * max(np.abs(b).max(), 1.0)


def _cpu_reference(model, inputs, tmp_path):
    ctx = CompileContext(tmp_path / "ref", "cpu", inputs.shape[0], tmp_path)
    return get_compiler("identity").compile(model, {}, ctx).outputs(inputs)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", ["identity", "torchscript", "inductor"])
def test_a_torch_compiler_on_cuda_returns_every_output_and_leaves_the_model_on_the_cpu(
    name, tmp_path
):
    model = load_model(*HEADS)
    inputs = model.random_input(4)
    reference = _cpu_reference(model, inputs, tmp_path)
    compiler = get_compiler(name)
    ctx = CompileContext(tmp_path / "work", "cuda", 4, tmp_path)
    engine = compiler.compile(model, compiler.resolve_flags({}), ctx)
    engine.prepare(inputs)
    engine.infer()
    _close(engine.outputs(inputs), reference)
    assert next(model.module.parameters()).device.type == "cpu"  # a copy went to the GPU


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("math", ["fp32", "tf32", "fp16"])
@pytest.mark.parametrize("name", ["identity", "torchscript"])
def test_the_run_math_reaches_the_torch_compilers_on_cuda(name, math, tmp_path):
    from mlflow_ngraph.compilers.precision import TOLERANCE

    model = load_model(*HEADS)
    inputs = model.random_input(4)
    reference = _cpu_reference(model, inputs, tmp_path)
    compiler = get_compiler(name)
    ctx = CompileContext(tmp_path / "work", "cuda", 4, tmp_path, math=math)
    engine = compiler.compile(model, compiler.resolve_flags({}), ctx)
    settings = engine.runtime_settings()
    tf32 = math != "fp32"
    assert settings["tf32_matmul"] is tf32 and settings["tf32_cudnn"] is tf32
    out = engine.outputs(inputs)
    for a, b in zip(out, reference):
        assert a.dtype == np.float32  # outputs come back as FP32 whatever ran
        assert np.abs(a - b).max() <= TOLERANCE[math] * max(np.abs(b).max(), 1.0)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("provider", ["cuda", "tensorrt"])
def test_onnxruntime_gpu_providers_compile_and_match(provider, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    wanted = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}
    if wanted[provider] not in ort.get_available_providers():
        pytest.skip(f"this onnxruntime has no {wanted[provider]}")
    model = load_model(*HEADS)
    inputs = model.random_input(4)
    reference = _cpu_reference(model, inputs, tmp_path)
    compiler = get_compiler("onnxruntime")
    ctx = CompileContext(tmp_path / "work", "cuda", 4, tmp_path)
    engine = compiler.compile(model, compiler.resolve_flags({"provider": provider}), ctx)
    engine.prepare(inputs)
    engine.infer()
    _close(engine.outputs(inputs), reference)


@pytest.mark.gpu
@needs_gpu
def test_tvm_on_cuda_returns_every_output(tmp_path):
    tvm = pytest.importorskip("tvm")
    if not tvm.cuda(0).exist:
        pytest.skip("this TVM was built without CUDA")
    model = load_model(*HEADS)
    inputs = model.random_input(2)
    reference = _cpu_reference(model, inputs, tmp_path)
    compiler = get_compiler("tvm")
    ctx = CompileContext(tmp_path / "work", "cuda", 2, tmp_path)
    engine = compiler.compile(model, compiler.resolve_flags({"trials": 0}), ctx)
    engine.prepare(inputs)
    _close(engine.outputs(inputs), reference)


@pytest.mark.gpu
@needs_gpu
def test_the_harness_waits_for_the_device_and_would_catch_one_that_does_not():
    from mlflow_ngraph.commands import gpucheck

    lines: list[str] = []
    assert gpucheck._harness_check(lines), "\n".join(lines)
    assert "caught" in lines[-1]


@pytest.mark.gpu
@needs_gpu
def test_a_worker_group_on_the_gpu_measures_and_logs_gpu_figures(run_cli, tracking_uri):
    code, out, err = run_cli(
        "benchmark", "--device", "gpu", "--model", "conv_block:width=8,depth=1,image_size=16",
        "--compiler", "identity", "--compiler", "torchscript", "--batch-sizes", "1,4",
        "--warmup", "2", "--repetitions", "10", "--min-duration", "0.2",
        "--experiment", "gpu-group", "--tracking-uri", tracking_uri,
    )  # fmt: skip
    assert code == 0, err
    client = MlflowClient(tracking_uri)
    cells = cell_runs(tracking_uri, "gpu-group")
    assert len(cells) == 2
    for run in cells:
        assert run.data.tags[S.T_STATUS] == "OK", run.data.tags.get(S.T_ERROR)
        assert run.data.metrics["valid.bs4"] == 1.0
        memory = client.get_metric_history(run.info.run_id, S.M_GPU_MEM)
        device = client.get_metric_history(run.info.run_id, S.M_GPU_DEVICE_MEM)
        if memory:  # NVML attributes memory to this process (not inside a PID namespace)
            assert 0 < memory[0].value <= device[0].value


def test_gpu_check_without_cuda_is_one_line_and_exit_1(capsys):
    if CUDA_OK:
        pytest.skip("this host has a CUDA device")
    from mlflow_ngraph.commands import gpucheck

    assert gpucheck.main([]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu-check: ") and "docs/gpu.md" in err[0]


def test_the_gpu_check_table_reads_a_benchmark_store(run_cli, tracking_uri):
    """The table's rows from a store (here a CPU run of the same experiment name)."""
    from mlflow_ngraph.commands import gpucheck

    code, _, err = run_cli(
        "benchmark", "--model", "conv_block:width=8,depth=1,image_size=16",
        "--compiler", "identity", "--compiler", "onnxruntime", "--batch-sizes", "1,8",
        "--warmup", "1", "--repetitions", "3", "--min-duration", "0",
        "--experiment", "gpu-check", "--tracking-uri", tracking_uri, "--isolation", "none",
    )  # fmt: skip
    assert code == 0, err
    rows, ok = gpucheck._rows(tracking_uri, {"identity", "onnxruntime:cpu"})
    assert ok and len(rows) == 4
    assert {r[1] for r in rows} == {"identity", "onnxruntime:cpu"}
    assert {r[2] for r in rows} == {"1", "8"}
    assert all(r[3] == "yes" and r[4] == "VALID" for r in rows)
    assert not gpucheck._rows(tracking_uri, {"identity", "tensorrt"})[1]  # a compiler missing
    table = gpucheck._table(rows)
    assert len(table) == 5 and "samples/s" in table[0]

    assert gpucheck._spec_label("onnxruntime:provider=tensorrt") == "onnxruntime:tensorrt"
    assert gpucheck._spec_label("tvm:trials=0") == "tvm"


# --- what ties a GPU engine to its card: checked here with the facts given ---------------


def _supply(tmp_path, kind="cuda"):
    from mlflow_ngraph.run.supply import EngineSupply

    return EngineSupply(tmp_path, "gpu" if kind == "cuda" else "cpu", kind, "throughput")


def test_the_engine_cache_key_names_the_gpu_and_a_cpu_key_does_not(tmp_path, monkeypatch):
    from mlflow_ngraph.run import supply

    model = load_model("conv_block", {"width": 8, "depth": 1, "image_size": 16})
    compiler = get_compiler("onnxruntime")
    flags = compiler.resolve_flags({})
    cpu_key = _supply(tmp_path, "cpu").key(compiler, flags, model, 1)
    keys = set()
    for card in ("NVIDIA H100|sm90|cuda13.0|cudnn91300|driver580", "NVIDIA A10|sm86|cuda13.0"):
        monkeypatch.setattr(supply, "gpu_fingerprint", lambda card=card: card)
        keys.add(_supply(tmp_path).key(compiler, flags, model, 1))
        assert _supply(tmp_path, "cpu").key(compiler, flags, model, 1) == cpu_key
    assert len(keys) == 2  # a plan tuned on one card is not another card's cache hit


def test_a_cached_engine_that_does_not_load_is_rebuilt_not_failed(tmp_path, monkeypatch, caplog):
    from mlflow_ngraph.errors import CompileFailed

    model = load_model("conv_block", {"width": 8, "depth": 1, "image_size": 16})
    compiler = get_compiler("onnxruntime")
    flags = compiler.resolve_flags({})
    engines = _supply(tmp_path, "cpu")
    first = engines.get(compiler, flags, model, 1, "cell")
    assert not first.cache_hit and first.engine_dir is not None

    def foreign(*args):  # a TensorRT plan of another TensorRT or driver: no such plan here
        raise CompileFailed("TensorRT could not deserialize the plan")

    monkeypatch.setattr(compiler, "load", foreign)
    with caplog.at_level("WARNING"):
        again = engines.get(compiler, flags, model, 1, "cell")
    assert not again.cache_hit and again.engine is not None
    assert "does not load (TensorRT could not deserialize the plan): rebuilding" in caplog.text


def test_engine_builds_on_one_gpu_take_turns(tmp_path):
    import threading
    import time

    spans = []

    def build(engines):
        with engines._build_lock():
            start = time.perf_counter()
            time.sleep(0.2)
            spans.append((start, time.perf_counter()))

    threads = [threading.Thread(target=build, args=(_supply(tmp_path),)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans.sort()
    assert len(spans) == 3 and all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    cpu = _supply(tmp_path, "cpu")  # the CPU's builds are not serialised
    with cpu._build_lock():
        with cpu._build_lock():
            pass


@pytest.mark.parametrize(
    ("compiler", "here", "outcome"),
    [
        ("tensorrt", "NVIDIA A10|sm86|cuda13.0|cudnn9|driver580", "refused"),
        ("inductor", "NVIDIA A10|sm86|cuda13.0|cudnn9|driver580", "slower"),
        ("tensorrt", "NVIDIA H100|sm90|cuda13.0|cudnn9|driver590", "driver590"),
        ("tensorrt", "NVIDIA H100|sm90|cuda13.0|cudnn9|driver580", None),
    ],
)
def test_deploy_checks_the_gpu_an_engine_was_built_on(compiler, here, outcome, monkeypatch):
    from mlflow_ngraph.deploy import engine
    from mlflow_ngraph.errors import NgraphError
    from mlflow_ngraph.measure import nvml

    monkeypatch.setattr(nvml, "gpu_fingerprint", lambda: here)
    built = "NVIDIA H100|sm90|cuda13.0|cudnn9|driver580"
    rule = get_compiler(compiler).gpu_rule  # what the compiler declares of its engines
    if outcome == "refused":
        with pytest.raises(NgraphError, match="runs only on the GPU it was built for"):
            engine._gpu_differs(compiler, rule, built)
        return
    warns = engine._gpu_differs(compiler, rule, built)
    assert (outcome is None and warns == []) or (len(warns) == 1 and outcome in warns[0])
