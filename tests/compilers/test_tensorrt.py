"""The tensorrt compiler: flags, availability and clear failures everywhere; the engine
build, run, CUDA graph and plan round trip on a CUDA host with TensorRT."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from mlflow_ngraph.compilers.base import CompileContext
from mlflow_ngraph.compilers.registry import get_compiler
from mlflow_ngraph.devices import check_profile_runs_here, cuda_status, get_profile
from mlflow_ngraph.errors import CompileFailed, CompilerUnavailable, NgraphError

CUDA_OK, CUDA_REASON = cuda_status()
HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
RUNS_HERE = CUDA_OK and HAS_TENSORRT
NOT_HERE_REASON = CUDA_REASON if not CUDA_OK else "Python package 'tensorrt' is not installed"


@pytest.fixture(scope="module")
def compiler():
    return get_compiler("tensorrt")


def _ctx(tmp_path, batch_size=2, device="cuda"):
    return CompileContext(
        workdir=tmp_path / "work", device=device, batch_size=batch_size, cache_dir=tmp_path
    )


def _tiny_model():
    from mlflow_ngraph.models.registry import load_model

    return load_model("conv_block", {"width": 8, "depth": 2, "image_size": 16})


# --- everywhere -------------------------------------------------------------------------


def test_listing_the_compiler_does_not_import_tensorrt():
    code = (
        "import sys\n"
        "from mlflow_ngraph.compilers.registry import get_compiler\n"
        "c = get_compiler('tensorrt')\n"
        "c.resolve_flags({'fp16': 'true'})\n"
        "assert 'tensorrt' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_declares_package_extra_and_device(compiler):
    assert compiler.name == "tensorrt"
    assert compiler.packages == ("tensorrt",)
    assert compiler.extra == "gpu"
    assert compiler.devices == ("cuda",)


def test_flag_defaults(compiler):
    assert compiler.resolve_flags({}) == {
        "workspace_mb": None,
        "tf32": False,  # strict FP32 unless the run's --math says otherwise
        "fp16": False,
        "cuda_graph": False,
        "builder_optimization_level": 3,
        "timing_cache": None,
    }


def test_flags_parse_command_line_strings(compiler):
    flags = compiler.resolve_flags(
        {
            "workspace_mb": "1024",
            "tf32": "true",
            "fp16": "yes",
            "cuda_graph": "on",
            "builder_optimization_level": "5",
            "timing_cache": "/tmp/trt.cache",
        }
    )
    assert flags == {
        "workspace_mb": 1024,
        "tf32": True,
        "fp16": True,
        "cuda_graph": True,
        "builder_optimization_level": 5,
        "timing_cache": "/tmp/trt.cache",
    }


def test_unknown_flag_names_the_known_ones(compiler):
    with pytest.raises(NgraphError, match=r"no flag 'int8' \(its flags: builder_opt"):
        compiler.resolve_flags({"int8": True})


@pytest.mark.parametrize("level", [-1, 6, "9"])
def test_optimization_level_out_of_range(compiler, level):
    with pytest.raises(NgraphError, match="builder_optimization_level=.* is not one of: 0, 1"):
        compiler.resolve_flags({"builder_optimization_level": level})


def test_workspace_must_be_positive(compiler):
    with pytest.raises(NgraphError, match=r"workspace_mb=0 must be >= 1"):
        compiler.resolve_flags({"workspace_mb": 0})


def test_bool_flag_rejects_other_words(compiler):
    with pytest.raises(NgraphError, match="flag cuda_graph='sometimes' is not a valid bool"):
        compiler.resolve_flags({"cuda_graph": "sometimes"})


def test_gpu_and_orin_profiles_are_cuda_and_run_tensorrt():
    for name in ("gpu", "orin"):
        profile = get_profile(name)
        assert profile.kind == "cuda"
        assert "tensorrt" in profile.compilers


# --- on a host without TensorRT or without a CUDA device (this CI) ------------------------

not_here = pytest.mark.skipif(RUNS_HERE, reason="TensorRT and a CUDA device are present")


@not_here
def test_availability_says_what_is_missing(compiler):
    ok, reason = compiler.availability("cuda")
    assert not ok
    if not HAS_TENSORRT:
        assert reason == (
            "Python package 'tensorrt' is not installed (pip install 'mlflow-ngraph[gpu]')"
        )
    else:
        assert reason == CUDA_REASON


@not_here
def test_availability_on_the_cpu_kind_is_refused(compiler):
    ok, reason = compiler.availability("cpu")
    assert not ok
    assert "tensorrt" in reason or "does not target device kind 'cpu'" in reason


@not_here
def test_compile_here_fails_up_front_with_one_line(compiler, tmp_path):
    flags = compiler.resolve_flags({})
    with pytest.raises(CompilerUnavailable) as info:
        compiler.compile(_tiny_model(), flags, _ctx(tmp_path))
    message = str(info.value)
    assert message.startswith("compiler 'tensorrt' is not available: ")
    assert "\n" not in message
    assert ("pip install 'mlflow-ngraph[gpu]'" in message) or (CUDA_REASON in message)
    # refused before any work: nothing was exported
    assert not (tmp_path / "exports").exists()


@not_here
def test_load_here_fails_up_front(compiler, tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "model.plan").write_bytes(b"not a plan")
    with pytest.raises(CompilerUnavailable, match="compiler 'tensorrt' is not available"):
        compiler.load(_tiny_model(), compiler.resolve_flags({}), _ctx(tmp_path), tmp_path)


@pytest.mark.skipif(CUDA_OK, reason="this host has a CUDA device")
@pytest.mark.parametrize("name", ["gpu", "orin"])
def test_cuda_profiles_refused_here_naming_the_device(name):
    with pytest.raises(NgraphError) as info:
        check_profile_runs_here(get_profile(name))
    message = str(info.value)
    assert f"device profile {name!r} needs a CUDA device" in message
    assert CUDA_REASON in message
    assert "use --device cpu or xeon" in message


# --- on a CUDA host with TensorRT -------------------------------------------------------


def _identity_outputs(model, batch):
    import copy

    import torch

    module = copy.deepcopy(model.module).to("cuda").eval()  # the loaded model stays put
    with torch.inference_mode():
        out = module(torch.from_numpy(batch).to("cuda"))
    return out.float().cpu().numpy()


@pytest.mark.gpu
@pytest.mark.skipif(not RUNS_HERE, reason=NOT_HERE_REASON)
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_builds_runs_and_matches_eager(compiler, tmp_path, cuda_graph):
    model = _tiny_model()
    # tf32 off: the comparison with FP32 eager can then be tight
    flags = compiler.resolve_flags({"tf32": False, "cuda_graph": cuda_graph})
    engine = compiler.compile(model, flags, _ctx(tmp_path, batch_size=2))
    batch = model.random_input(2)
    try:
        engine.prepare(batch)
        engine.infer()
        engine.run_many(3)
        got = engine.outputs(batch)
        assert got.shape[0] == 2
        np.testing.assert_allclose(got, _identity_outputs(model, batch), rtol=1e-3, atol=1e-3)
        assert engine.runtime_settings()["cuda_graph"] is cuda_graph
    finally:
        engine.close()


@pytest.mark.gpu
@pytest.mark.skipif(not RUNS_HERE, reason=NOT_HERE_REASON)
def test_plan_round_trip_and_timing_cache(compiler, tmp_path):
    model = _tiny_model()
    cache = tmp_path / "caches" / "trt.timing"
    flags = compiler.resolve_flags(
        {"timing_cache": str(cache), "workspace_mb": 256, "builder_optimization_level": 1}
    )
    ctx = _ctx(tmp_path, batch_size=4)
    built = compiler.compile(model, flags, ctx)
    files = built.save(tmp_path / "engine")
    assert files.files == ["model.plan"] and files.format == "tensorrt-plan"
    assert cache.is_file() and cache.stat().st_size > 0
    loaded = compiler.load(model, flags, ctx, tmp_path / "engine")
    batch = model.random_input(4)
    try:
        np.testing.assert_array_equal(loaded.outputs(batch), built.outputs(batch))
    finally:
        built.close()
        loaded.close()


@pytest.mark.gpu
@pytest.mark.skipif(not RUNS_HERE, reason=NOT_HERE_REASON)
def test_engine_refuses_a_batch_it_was_not_built_for(compiler, tmp_path):
    model = _tiny_model()
    engine = compiler.compile(model, compiler.resolve_flags({}), _ctx(tmp_path, batch_size=2))
    try:
        with pytest.raises(CompileFailed, match="not built for input shape"):
            engine.prepare(model.random_input(3))
    finally:
        engine.close()


@pytest.mark.gpu
@pytest.mark.skipif(not RUNS_HERE, reason=NOT_HERE_REASON)
def test_fp16_builds_on_tensorrt_10_and_is_refused_clearly_on_11(compiler, tmp_path):
    import tensorrt as trt

    model = _tiny_model()
    flags = compiler.resolve_flags({"fp16": True})
    if hasattr(trt.BuilderFlag, "FP16"):
        engine = compiler.compile(model, flags, _ctx(tmp_path))
        batch = model.random_input(2)
        engine.prepare(batch)
        np.testing.assert_allclose(
            engine.outputs(batch), _identity_outputs(model, batch), rtol=5e-2, atol=5e-2
        )
        engine.close()
    else:
        with pytest.raises(CompileFailed, match="fp16=true needs TensorRT 10"):
            compiler.compile(model, flags, _ctx(tmp_path))


@pytest.mark.parametrize(
    ("version", "offered"), [("10.13.3.9", True), ("11.0.0.11", False), ("not installed", False)]
)
def test_tune_offers_fp16_only_where_the_installed_tensorrt_builds_it(
    compiler, monkeypatch, version, offered
):
    monkeypatch.setattr(compiler, "version", lambda: version)
    names = [knob.name for knob in compiler.search_space(None)]
    assert ("fp16" in names) is offered and "cuda_graph" in names


@pytest.mark.gpu
@pytest.mark.skipif(not RUNS_HERE, reason=NOT_HERE_REASON)
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_a_deployed_plan_predicts_what_was_measured(compiler, tmp_path, cuda_graph):
    from mlflow_ngraph.deploy.engine import load_engine
    from mlflow_ngraph.run.supply import EngineSupply

    model = _tiny_model()
    supply = EngineSupply(tmp_path / "home", "gpu", "cuda", "latency")
    got = supply.get(compiler, compiler.resolve_flags({"cuda_graph": cuda_graph}), model, 2, "t")
    batch = model.random_input(2)
    try:
        measured = got.engine.outputs(batch)
    finally:
        got.engine.close()
    with load_engine(got.engine_dir, trust_code=True) as deployed:
        np.testing.assert_allclose(deployed.predict(batch), measured, rtol=1e-5, atol=1e-5)
