"""inductor compiler: one torch.compile JIT engine and one AOTInductor package, both tiny.

Each compile of a tiny block costs 5-30 s on 2 cores (C++ code generation and build), so the
module compiles exactly twice and every test inspects those two engines.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mlflow_ngraph.compilers.base import CompileContext
from mlflow_ngraph.compilers.registry import get_compiler
from mlflow_ngraph.errors import CompileFailed, NgraphError
from mlflow_ngraph.models.base import LoadedModel
from mlflow_ngraph.models.registry import load_model
from tests._support import assert_matches

COMPILER = "inductor"

BATCH = 2


def _case(name, params, tmp_path_factory):
    model = load_model(name, params)
    ctx = CompileContext(
        workdir=tmp_path_factory.mktemp("work"),
        device="cpu",
        batch_size=BATCH,
        cache_dir=tmp_path_factory.mktemp("cache"),
    )
    inputs = model.random_input(BATCH)
    reference = get_compiler("identity").compile(model, {}, ctx).outputs(inputs)
    return model, ctx, inputs, reference


@pytest.fixture(scope="module")
def jit(compiler, tmp_path_factory):
    model, ctx, inputs, reference = _case(
        "conv_block", {"width": 8, "depth": 1, "image_size": 16}, tmp_path_factory
    )
    flags = compiler.resolve_flags({})
    engine = compiler.compile(model, flags, ctx)
    return engine, model, flags, ctx, inputs, reference


@pytest.fixture(scope="module")
def package(compiler, tmp_path_factory):
    model, ctx, inputs, reference = _case("mha_block", {"width": 32, "depth": 1}, tmp_path_factory)
    flags = compiler.resolve_flags({"package": True})
    engine = compiler.compile(model, flags, ctx)
    return engine, model, flags, ctx, inputs, reference


def test_available_with_a_cxx_compiler(compiler):
    assert compiler.availability("cpu") == (True, "available")


def test_jit_engine_matches_identity(jit):
    engine, _, _, _, inputs, reference = jit
    assert_matches(engine.outputs(inputs), reference)
    assert engine.parallel_requests == 1


def test_jit_compile_happens_in_compile_not_in_first_call(jit):
    from torch._dynamo.utils import counters

    engine, _, _, _, inputs, reference = jit
    before = dict(counters["stats"])
    engine.prepare(inputs)
    engine.infer()
    engine.run_many(3)
    assert dict(counters["stats"]) == before  # no new frame was traced or compiled
    settings = engine.runtime_settings()
    assert settings["inductor_engine"] == "jit"
    assert settings["inductor_fxgraph_cache_hits"] + settings["inductor_fxgraph_cache_misses"] >= 1


def test_jit_engine_does_not_serialize(compiler, jit, tmp_path):
    engine, model, flags, ctx, _, _ = jit
    files = engine.save(tmp_path)
    assert files.files == [] and not any(tmp_path.iterdir())
    assert compiler.load(model, flags, ctx, tmp_path) is None


def test_package_engine_is_the_loaded_pt2(compiler, package, tmp_path):
    engine, model, flags, ctx, inputs, reference = package
    assert type(engine.fn).__name__ == "AOTICompiledModel"
    assert_matches(engine.outputs(inputs), reference)
    engine.prepare(inputs)
    engine.infer()
    engine.run_many(3)

    files = engine.save(tmp_path)
    assert files.files == ["model.pt2"] and files.format == "aoti-package"
    assert (tmp_path / "model.pt2").stat().st_size > 0
    loaded = compiler.load(model, flags, ctx, tmp_path)
    assert loaded is not None and loaded.runtime_settings()["inductor_engine"] == "aoti-package"
    np.testing.assert_array_equal(loaded.outputs(inputs), engine.outputs(inputs))

    # the package lives in this compile's own folder, removed once the engine is closed
    scratch = engine.scratch
    assert scratch.parent == ctx.workdir and (scratch / "model.pt2").is_file()
    engine.close()
    assert not scratch.exists()


class _GraphBreak(torch.nn.Module):
    def forward(self, x):
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2


def test_fullgraph_graph_break_fails_the_cell(compiler, tmp_path):
    module = _GraphBreak().eval()
    model = LoadedModel("graph_break", "custom", {}, (4,), module=module, content_hash="gb")
    ctx = CompileContext(tmp_path, "cpu", BATCH, tmp_path)
    with pytest.raises(CompileFailed, match="inductor failed"):
        compiler.compile(model, compiler.resolve_flags({"fullgraph": True}), ctx)


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"backend": "eager"}, "has no flag 'backend'"),
        ({"mode": "fast"}, "not one of"),
        ({"dynamic": "sometimes"}, "not a valid bool"),
        ({"package": 2}, "not a valid bool"),
    ],
)
def test_flag_validation(compiler, flags, message):
    with pytest.raises(NgraphError, match=message):
        compiler.resolve_flags(flags)


def test_default_flags(compiler):
    assert compiler.resolve_flags({}) == {
        "mode": "default",
        "dynamic": False,
        "fullgraph": False,
        "package": False,
    }
