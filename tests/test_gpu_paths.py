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
    from mlflow_ngraph import gpucheck

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
    exp = client.get_experiment_by_name("gpu-group")
    cells = [
        r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get(S.T_ROLE) == "cell"
    ]
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
    from mlflow_ngraph import gpucheck

    assert gpucheck.main([]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu-check: ") and "docs/gpu.md" in err[0]


def test_the_gpu_check_table_reads_a_benchmark_store(run_cli, tracking_uri):
    """The table's rows from a store (here a CPU run of the same experiment name)."""
    from mlflow_ngraph import gpucheck

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
