"""onnxruntime compiler: CPU sessions from the cached export; the GPU providers' errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnxruntime
import pytest

from mlflow_ngraph.compilers.base import CompileContext
from mlflow_ngraph.compilers.registry import get_compiler
from mlflow_ngraph.errors import CompilerUnavailable, NgraphError
from mlflow_ngraph.models.registry import load_model
from tests._support import assert_matches

COMPILER = "onnxruntime"

BATCH = 3
MODELS = {
    "conv_block": {"width": 8, "depth": 2, "image_size": 32},
    "mha_block": {"width": 32, "depth": 1},
}
HAS_CUDA_EP = "CUDAExecutionProvider" in onnxruntime.get_available_providers()


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request, cache_dir):
    model = load_model(request.param, MODELS[request.param])
    inputs = model.random_input(BATCH)
    ctx = CompileContext(cache_dir / "identity", "cpu", BATCH, cache_dir)
    reference = get_compiler("identity").compile(model, {}, ctx).outputs(inputs)
    return model, inputs, reference


def _ctx(tmp_path, cache_dir, device="cpu"):
    return CompileContext(tmp_path / "work", device, BATCH, cache_dir)


def test_available_on_cpu(compiler):
    assert compiler.availability("cpu") == (True, "available")
    assert compiler.version() == onnxruntime.__version__


@pytest.mark.parametrize(
    "flags",
    [
        {},
        {"graph_optimization_level": "disable"},
        {"execution_mode": "parallel", "intra_op_num_threads": 1, "inter_op_num_threads": 2},
    ],
    ids=["all", "disable", "parallel"],
)
def test_outputs_match_identity_and_round_trip(compiler, case, cache_dir, flags, tmp_path):
    model, inputs, reference = case
    resolved = compiler.resolve_flags(flags)
    ctx = _ctx(tmp_path, cache_dir)
    engine = compiler.compile(model, resolved, ctx)
    assert_matches(engine.outputs(inputs), reference)
    engine.prepare(inputs)
    engine.infer()
    engine.run_many(3)
    assert engine.parallel_requests == 1 and not engine.asynchronous_device

    files = engine.save(tmp_path / "saved")
    assert files.files == ["model.ort.onnx"]
    assert (tmp_path / "saved" / "model.ort.onnx").stat().st_size > 0
    loaded = compiler.load(model, resolved, ctx, tmp_path / "saved")
    assert loaded is not None
    np.testing.assert_allclose(loaded.outputs(inputs), engine.outputs(inputs), atol=1e-6)
    # the saved graph is already optimized: the loaded session does not optimize it again
    level = loaded.session.get_session_options().graph_optimization_level
    assert level == onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    engine.close()


def test_session_is_built_once(compiler, case, cache_dir, tmp_path):
    model, inputs, _ = case
    engine = compiler.compile(model, compiler.resolve_flags({}), _ctx(tmp_path, cache_dir))
    session = engine.session
    engine.prepare(inputs)
    engine.run_many(2)
    engine.outputs(inputs)
    assert engine.session is session


def test_runtime_settings_record_providers_and_threads(compiler, case, cache_dir, tmp_path):
    model, _, _ = case
    flags = compiler.resolve_flags(
        {"intra_op_num_threads": "1", "execution_mode": "parallel", "inter_op_num_threads": 2}
    )
    settings = compiler.compile(model, flags, _ctx(tmp_path, cache_dir)).runtime_settings()
    assert settings["ort_providers"] == "CPUExecutionProvider"
    assert settings["ort_intra_op_threads"] == 1
    assert settings["ort_inter_op_threads"] == 2
    assert settings["ort_io_binding"] is False

    default = compiler.compile(model, compiler.resolve_flags({}), _ctx(tmp_path, cache_dir))
    assert default.runtime_settings()["ort_intra_op_threads"] >= 1  # ORT's own choice
    assert default.runtime_settings()["ort_inter_op_threads"] == "unused"


@pytest.mark.skipif(HAS_CUDA_EP, reason="this host has the CUDA execution provider")
@pytest.mark.parametrize(
    "provider, missing",
    [("cuda", "CUDAExecutionProvider"), ("tensorrt", "TensorrtExecutionProvider")],
)
def test_gpu_provider_on_a_cpu_host_is_a_clear_error(
    compiler, cache_dir, tmp_path, provider, missing
):
    model = load_model("mha_block", MODELS["mha_block"])
    flags = compiler.resolve_flags({"provider": provider})
    assert flags["io_binding"] is True  # GPU best practice is the default
    for device in ("cpu", "cuda"):
        with pytest.raises(CompilerUnavailable, match=missing) as info:
            compiler.compile(model, flags, _ctx(tmp_path, cache_dir, device))
        assert "onnxruntime-gpu" in str(info.value)
    ok, reason = compiler.availability("cuda")
    assert not ok and "CUDAExecutionProvider" in reason


def test_io_binding_defaults_per_provider(compiler):
    assert compiler.resolve_flags({})["io_binding"] is False
    assert compiler.resolve_flags({"provider": "cuda"})["io_binding"] is True
    assert compiler.resolve_flags({"provider": "cuda", "io_binding": "no"})["io_binding"] is False


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"optimization": "all"}, "has no flag 'optimization'"),
        ({"graph_optimization_level": "max"}, "not one of"),
        ({"provider": "rocm"}, "not one of"),
        ({"intra_op_num_threads": -1}, "must be >= 0"),
        ({"intra_op_num_threads": "two"}, "not a valid int"),
        ({"copy_inputs": "sometimes"}, "not a valid bool"),
    ],
)
def test_flag_validation(compiler, flags, message):
    with pytest.raises(NgraphError, match=message):
        compiler.resolve_flags(flags)


def test_registry_does_not_import_the_runtimes():
    code = (
        "import sys\n"
        "from mlflow_ngraph.compilers.registry import get_compiler\n"
        "for name in ('onnxruntime', 'openvino', 'torchscript', 'inductor'):\n"
        "    compiler = get_compiler(name)\n"
        "    compiler.resolve_flags({})\n"
        "print(sorted(m for m in ('onnxruntime', 'openvino') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_compiles_sharing_a_workdir_keep_their_own_engine_files(compiler, cache_dir, tmp_path):
    model = load_model("mha_block", MODELS["mha_block"])
    flags = compiler.resolve_flags({})
    engines = {}
    for batch in (1, 4):  # the runner gives every cell the same workdir
        ctx = CompileContext(tmp_path / "work", "cpu", batch, cache_dir)
        engines[batch] = compiler.compile(model, flags, ctx)
    for batch, engine in engines.items():
        engine.save(tmp_path / f"bs{batch}")
        ctx = CompileContext(tmp_path / "work", "cpu", batch, cache_dir)
        loaded = compiler.load(model, flags, ctx, tmp_path / f"bs{batch}")
        inputs = model.random_input(batch)
        np.testing.assert_allclose(loaded.outputs(inputs), engine.outputs(inputs), atol=1e-6)
    for engine in engines.values():
        engine.close()
    assert not any((tmp_path / "work").iterdir())  # close() removed each compile's folder
