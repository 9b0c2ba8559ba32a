"""One arithmetic for every compiler (``--math``): what each compiler is told, what a CPU
device refuses, the output check's tolerance and the strict FP32 reference. On a GPU the
same settings are checked end to end by tests/test_gpu_paths.py."""

from __future__ import annotations

import pytest

from mlflow_ngraph.compilers import precision
from mlflow_ngraph.compilers.base import CompileContext
from mlflow_ngraph.compilers.registry import get_compiler
from mlflow_ngraph.errors import CompileFailed, NgraphError
from mlflow_ngraph.models.registry import load_model
from mlflow_ngraph.plan.config import build_spec

BLOCK = {"width": 8, "depth": 1, "image_size": 16}


def _spec(**extra):
    data = {"models": ["conv_block"], "compilers": ["identity"], **extra}
    return build_spec(data)


def test_strict_fp32_by_default_and_a_gpu_setting_is_refused_on_a_cpu_device():
    spec = _spec()
    assert spec.math == "fp32" and spec.tolerance == 1e-3
    assert "math" not in spec.to_dict()  # an fp32 spec keeps the hash earlier runs had
    for math in ("tf32", "fp16"):
        with pytest.raises(NgraphError, match=f"--math {math} is a GPU setting"):
            _spec(math=math)
    with pytest.raises(NgraphError, match="not one of: fp32, tf32, fp16"):
        precision.check_math("bf16", "cuda")


def test_the_output_check_tolerance_follows_the_math_unless_given():
    tf32 = _spec(device="gpu", math="tf32")
    assert tf32.math == "tf32" and tf32.tolerance == precision.TOLERANCE["tf32"] == 1e-2
    assert _spec(device="gpu", math="fp16").tolerance == 2e-2
    assert _spec(device="gpu", math="fp16", tolerance=0.5).tolerance == 0.5
    assert _spec(device="gpu", math="tf32").to_dict()["math"] == "tf32"


def test_each_compiler_is_told_the_same_arithmetic():
    trt = get_compiler("tensorrt")
    assert trt.math_flags("fp32") == {"tf32": False, "fp16": False}
    assert trt.math_flags("tf32") == {"tf32": True, "fp16": False}
    assert trt.math_flags("fp16") == {"tf32": True, "fp16": True}
    assert get_compiler("onnxruntime").math_flags("tf32") == {}  # told through the context
    assert get_compiler("tensorrt").resolve_flags({})["tf32"] is False  # strict by itself


def test_a_math_in_the_cell_key_only_where_it_is_not_fp32():
    from mlflow_ngraph.devices import get_profile
    from mlflow_ngraph.run.runner import _cell_key

    profile = get_profile("gpu")
    compiler = get_compiler("identity")
    keys = {
        math: _cell_key(_spec(device="gpu", math=math), profile, _spec().models[0], compiler, {})
        for math in ("fp32", "tf32", "fp16")
    }
    assert len(set(keys.values())) == 3  # a tf32 run never resumes the fp32 run's cells


def test_pytorch_half_precision_runs_a_half_copy_and_the_shared_model_stays_fp32():
    import torch

    from mlflow_ngraph.compilers._torch import example_input, module_on

    model = load_model("conv_block", BLOCK)
    half = module_on(model, "identity", "cpu", "fp16")
    assert next(half.parameters()).dtype == torch.float16
    assert next(model.module.parameters()).dtype == torch.float32
    assert example_input(model, 2, "cpu", "fp16").dtype == torch.float16
    assert module_on(model, "identity", "cpu") is model.module


def test_the_tf32_switches_are_set_and_the_reference_block_restores_them(monkeypatch):
    import torch

    precision._set_tf32(True)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the switches only
    with precision.strict_fp32():
        assert not torch.backends.cuda.matmul.allow_tf32
        assert not torch.backends.cudnn.allow_tf32
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    precision._set_tf32(False)


@pytest.mark.parametrize(("compiler", "flags"), [("tvm", {"trials": 0}), ("onnxruntime", {})])
def test_a_compiler_that_cannot_apply_the_math_fails_its_cell_with_the_reason(
    compiler, flags, tmp_path
):
    if compiler == "tvm":
        pytest.importorskip("tvm")
    model = load_model("conv_block", BLOCK)
    c = get_compiler(compiler)
    ctx = CompileContext(tmp_path / "w", "cpu", 1, tmp_path, math="fp16")
    with pytest.raises(CompileFailed, match="FP32"):
        c.compile(model, c.resolve_flags(flags), ctx)


def test_a_gpu_math_on_a_cpu_device_is_one_line(run_cli):
    code, out, err = run_cli("benchmark", "--model", "conv_block", "--math", "tf32")
    assert code != 0 and "--math tf32 is a GPU setting" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_another_arithmetic_is_another_engine_in_the_history():
    """Seen on an H200: an fp16 engine was judged against the tf32 engine measured a minute
    before (the throughput 'moved -23%'): the history key ignored the arithmetic."""
    from dataclasses import replace

    from mlflow_ngraph.measure.settings import MeasureSettings
    from mlflow_ngraph.run import worker

    task = worker.CellTask(
        name="c", model_name="conv_block", model_params={}, compiler="identity", flags={},
        batch_sizes=[8], device="gpu", device_kind="cuda", home="/nonexistent",
        measure=MeasureSettings(), tolerance=1e-3,
    )  # fmt: skip
    keys = {worker._history_key(replace(task, math=m), 8) for m in ("fp32", "tf32", "fp16")}
    assert len(keys) == 3


def test_a_pulled_engine_runs_in_the_arithmetic_it_was_measured_in(tmp_path):
    """An FP16 TorchScript engine (the CPU runs FP16 convolutions, so this needs no GPU)
    loads from its manifest as FP16: loaded as FP32 it took an FP32 input into FP16 weights."""
    import numpy as np

    from mlflow_ngraph.deploy.engine import load_engine
    from mlflow_ngraph.run.supply import EngineSupply

    model = load_model("conv_block", BLOCK)
    supply = EngineSupply(tmp_path / "home", "cpu", "cpu", "latency", math="fp16")
    compiler = get_compiler("torchscript")
    got = supply.get(compiler, compiler.resolve_flags({}), model, 2, "ts")
    x = model.random_input(2)
    measured = got.engine.outputs(x)
    got.engine.close()
    with load_engine(got.engine_dir, trust_code=True, check_signature=False) as deployed:
        assert deployed.manifest["math"] == "fp16"
        np.testing.assert_array_equal(deployed.predict(x), measured)
