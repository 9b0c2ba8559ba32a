"""torchscript compiler: trace + freeze + optimize_for_inference on the tiny blocks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mlflow_ngraph.compilers.base import CompileContext
from mlflow_ngraph.compilers.registry import get_compiler
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.models.registry import load_model
from tests._support import assert_matches

COMPILER = "torchscript"

BATCH = 2
MODELS = {
    "conv_block": {"width": 8, "depth": 2, "image_size": 32},
    "mha_block": {"width": 32, "depth": 1},
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request, tmp_path_factory):
    model = load_model(request.param, MODELS[request.param])
    inputs = model.random_input(BATCH)
    ctx = CompileContext(
        workdir=tmp_path_factory.mktemp("work"),
        device="cpu",
        batch_size=BATCH,
        cache_dir=tmp_path_factory.mktemp("cache"),
    )
    reference = get_compiler("identity").compile(model, {}, ctx).outputs(inputs)
    return model, inputs, reference, ctx


def test_available_on_cpu(compiler):
    assert compiler.availability("cpu") == (True, "available")


@pytest.mark.parametrize(
    "flags",
    [{}, {"optimize_for_inference": False}, {"freeze": False, "optimize_for_inference": False}],
    ids=["optimized", "frozen", "traced"],
)
def test_outputs_match_identity_and_round_trip(compiler, case, flags, tmp_path):
    model, inputs, reference, ctx = case
    resolved = compiler.resolve_flags(flags)
    engine = compiler.compile(model, resolved, ctx)
    assert_matches(engine.outputs(inputs), reference)
    engine.prepare(inputs)
    engine.infer()
    engine.run_many(3)
    assert engine.parallel_requests == 1

    files = engine.save(tmp_path)
    assert files.files == ["model.pt"] and (tmp_path / "model.pt").stat().st_size > 0
    loaded = compiler.load(model, resolved, ctx, tmp_path)
    assert loaded is not None
    assert_matches(loaded.outputs(inputs), reference)
    np.testing.assert_array_equal(loaded.outputs(inputs), engine.outputs(inputs))


def test_optimize_for_inference_uses_mkldnn_on_conv(compiler, tmp_path):
    model = load_model("conv_block", MODELS["conv_block"])
    ctx = CompileContext(tmp_path / "w", "cpu", BATCH, tmp_path / "cache")
    engine = compiler.compile(model, compiler.resolve_flags({}), ctx)
    settings = engine.runtime_settings()
    assert settings["torch_num_threads"] >= 1
    assert settings["torchscript_mkldnn"] is True
    # after a load the pass is applied again: same kernels as the compiled engine
    engine.save(tmp_path / "saved")
    loaded = compiler.load(model, compiler.resolve_flags({}), ctx, tmp_path / "saved")
    assert loaded.runtime_settings()["torchscript_mkldnn"] is True


def test_load_without_file_returns_none(compiler, tmp_path):
    model = load_model("mha_block", MODELS["mha_block"])
    ctx = CompileContext(tmp_path, "cpu", BATCH, tmp_path)
    assert compiler.load(model, compiler.resolve_flags({}), ctx, tmp_path / "empty") is None


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"fuse": True}, "has no flag 'fuse'"),
        ({"freeze": "maybe"}, "not a valid bool"),
        ({"freeze": False}, "needs freeze=true"),
    ],
)
def test_flag_validation(compiler, flags, message):
    with pytest.raises(NgraphError, match=message):
        compiler.resolve_flags(flags)


def test_flags_parse_command_line_strings(compiler):
    assert compiler.resolve_flags({"optimize_for_inference": "false"}) == {
        "freeze": True,
        "optimize_for_inference": False,
    }


def test_onnx_model_is_a_compile_failure(compiler, tmp_path):
    from mlflow_ngraph.errors import CompileFailed
    from mlflow_ngraph.models.base import LoadedModel

    onnx_only = LoadedModel("m.onnx", "custom", {}, (3, 8, 8), onnx_file=Path("m.onnx"))
    with pytest.raises(CompileFailed, match="needs a PyTorch model"):
        compiler.compile(
            onnx_only, compiler.resolve_flags({}), CompileContext(tmp_path, "cpu", 1, tmp_path)
        )


def test_a_compile_for_another_device_leaves_the_shared_model_where_it_is(monkeypatch):
    """The loaded model is shared by the eager reference, the ONNX export and every compiler
    of a group: a compile for the GPU moved it there in place, so the export that followed
    traced a CUDA model with a CPU input. ``meta`` stands in for ``cuda`` (no GPU here)."""
    import torch

    from mlflow_ngraph.compilers import _torch

    model = load_model("conv_block", {"width": 8, "depth": 1, "image_size": 16})
    monkeypatch.setattr(_torch, "torch_device", lambda kind: torch.device("meta"))
    moved = _torch.module_on(model, "identity", "cuda")
    assert next(moved.parameters()).device.type == "meta"
    assert next(model.module.parameters()).device.type == "cpu"
    monkeypatch.undo()
    assert _torch.module_on(model, "identity", "cpu") is model.module  # no copy on the CPU
