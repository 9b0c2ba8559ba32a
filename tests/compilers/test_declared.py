"""What the code knows of a compiler it reads from the compiler's class: a toy compiler's
declarations reach the MLflow view's colours, the run estimate, deploy's checks and the
run's --math without a line elsewhere."""

from __future__ import annotations

import sys
import types

import pytest

from mlflow_ngraph.compilers import registry
from mlflow_ngraph.compilers.base import Compiler
from mlflow_ngraph.errors import NgraphError


class ToyCompiler(Compiler):
    name = "toy"
    devices = ("cpu", "cuda")
    exact_version = True
    cpu_rule = "refuse"
    gpu_rule = "refuse"
    compile_allowance_s = 12.5
    color = "#123456"
    engine_formats = {"toy-blob": (("model.toy",), "a toy program")}

    def math_flags(self, math):
        return {"half": math == "fp16"}

    def compile(self, model, flags, ctx):  # never built here
        raise NotImplementedError

    def version(self):
        return "1.0"


@pytest.fixture
def toy(monkeypatch):
    module = types.ModuleType("toy_compiler_pkg")
    module.ToyCompiler = ToyCompiler
    monkeypatch.setitem(sys.modules, "toy_compiler_pkg", module)
    targets = {**registry._registered_targets(), "toy": "toy_compiler_pkg:ToyCompiler"}
    monkeypatch.setattr(registry, "_targets", lambda: targets)
    return registry.get_compiler("toy")


def test_a_compiler_declares_its_colour_allowance_and_math(toy):
    from mlflow_ngraph.plan.estimate import _allowance
    from mlflow_ngraph.tracking.ui import OTHER_COLOR, run_color

    assert run_color("toy") == "#123456"
    assert run_color("not-installed-here") == OTHER_COLOR
    assert _allowance("toy", {}) == 12.5 and _allowance("not-installed-here", {}) == 90.0
    # a tuner declares what its trials add to a build (none of it is in the estimate)
    assert _allowance("tvm", {"trials": 10}) == _allowance("tvm", {}) + 30.0
    assert toy.math_flags("fp16") == {"half": True}


def test_deploy_reads_the_rules_a_compiler_declares(toy, monkeypatch):
    from mlflow_ngraph.deploy import engine, trust

    fmt = trust.engine_format("toy-blob")
    assert (fmt.compiler, fmt.loads, fmt.code) == ("toy", ("model.toy",), "a toy program")
    assert trust.engine_format("no-such-format") is None
    with pytest.raises(NgraphError, match="runs on this machine when it is loaded"):
        trust.check_code({"format": "toy-blob"}, trust_code=False)

    monkeypatch.setattr(engine, "_host_cpu", lambda: "Other CPU|2")
    monkeypatch.setattr(engine, "_cpu_flags", lambda: ["sse2"])  # whatever this host has
    manifest = {"compiler": "toy", "compiler_version": "0.9", "device_kind": "cpu"}
    with pytest.raises(NgraphError, match="loads only into the version that built it"):
        engine.check_host(manifest)
    manifest.update(compiler_version="1.0", host_cpu="Build CPU|8", cpu_flags=["avx512f"])
    with pytest.raises(NgraphError, match="generated machine code for that CPU"):
        engine.check_host(manifest)


def test_every_builtin_compiler_declares_a_colour_of_its_own():
    colours = [registry.get_compiler(n).color for n in registry.BUILTIN]
    assert all(colours) and len(set(colours)) == len(colours)
