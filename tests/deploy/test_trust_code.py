"""The trust check asks the compiler that loads an engine what loading it runs, for the
manifest's format *and* flags: ONNX Runtime's loader picks its execution provider by the
``provider`` flag, and with tensorrt it loads TensorRT's engine cache (native code) whatever
the format says (unit level: manifest dicts, CPU only)."""

from __future__ import annotations

import sys
import types

import pytest

from mlflow_ngraph.compilers import registry
from mlflow_ngraph.compilers.base import Compiler, Flag
from mlflow_ngraph.deploy import trust
from mlflow_ngraph.errors import NgraphError

HOST = {"compiler_version": "1.0", "host_cpu": "CPU|2", "cpu_flags": ["sse2"]}


def ort(fmt: str, files=("model.ort.onnx",), **flags) -> dict:
    """The manifest of an ONNX Runtime engine of format ``fmt`` with ``flags``."""
    listed = [{"path": f, "bytes": 1, "sha256": "0" * 64} for f in files]
    return {"compiler": "onnxruntime", "format": fmt, "flags": flags, "files": listed, **HOST}


@pytest.fixture(autouse=True)
def _untrusted(monkeypatch):
    monkeypatch.delenv(trust.TRUST_ENV, raising=False)


def test_onnx_runtime_with_the_tensorrt_provider_needs_trust_whatever_the_format():
    for manifest in (
        ort("ort-optimized-onnx", provider="tensorrt"),  # a data format, the TRT provider
        ort("onnx+tensorrt-cache", provider="tensorrt"),
        ort("onnx+tensorrt-cache", provider="cpu"),  # a format that declares code still does
    ):
        with pytest.raises(NgraphError, match="runs on this machine when it is loaded") as no:
            trust.check_code(manifest, trust_code=None)
        assert "onnxruntime engine is serialized TensorRT engines" in str(no.value)
        assert "--trust-code" in str(no.value)
        trust.check_code(manifest, trust_code=True)
    manifest = ort("ort-optimized-onnx", provider="tensorrt")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(trust.TRUST_ENV, "1")
        trust.check_code(manifest, trust_code=None)
    with pytest.raises(NgraphError):  # an explicit refusal wins over the setting
        trust.check_code(manifest, trust_code=False)


def test_onnx_runtime_on_the_cpu_or_cuda_provider_loads_data():
    for manifest in (
        ort("ort-optimized-onnx"),  # the flags' defaults: provider=cpu
        ort("ort-optimized-onnx", provider="cpu"),
        ort("ort-optimized-onnx", provider="cuda", io_binding=True),
        ort("ort-optimized-onnx", provider=None),  # None: the default, as the loader reads it
    ):
        trust.check_code(manifest, trust_code=False)
        assert trust.runs_code(manifest) == ""


def test_the_compiler_declares_what_its_loader_reads_and_runs():
    compiler = registry.get_compiler("onnxruntime")
    trt = compiler.resolve_flags({"provider": "tensorrt"})
    cpu = compiler.resolve_flags({})
    assert compiler.runs_code("ort-optimized-onnx", cpu) == ""
    assert "TensorRT" in compiler.runs_code("ort-optimized-onnx", trt)
    assert compiler.loads("ort-optimized-onnx", cpu) == ("model.ort.onnx",)
    assert compiler.loads("onnx+tensorrt-cache", trt) == ("model.onnx",)
    assert set(compiler.loads("ort-optimized-onnx", trt)) == {"model.ort.onnx", "model.onnx"}
    # the others: what their formats declare
    assert "TorchScript" in registry.get_compiler("torchscript").runs_code("torchscript", {})


def test_the_manifest_lists_the_file_the_loader_reads_with_its_flags():
    trust.check_manifest(ort("ort-optimized-onnx", provider="cpu"))
    with pytest.raises(NgraphError, match="does not list model.onnx, the file the onnxruntime"):
        trust.check_manifest(ort("ort-optimized-onnx", provider="tensorrt"))


def test_flags_the_loader_would_not_take_are_refused_before_anything_loads():
    with pytest.raises(NgraphError, match="has no flag 'custom_op_library'"):
        trust.check_code(ort("ort-optimized-onnx", custom_op_library="x.so"), trust_code=False)
    with pytest.raises(NgraphError, match="provider"):
        trust.check_code(ort("ort-optimized-onnx", provider="openvino"), trust_code=False)


def test_an_engine_no_installed_compiler_declares_counts_as_code():
    with pytest.raises(NgraphError, match="no installed compiler declares"):
        trust.check_code({"compiler": "nope", "format": "nope-blob"}, trust_code=False)


class OpsCompiler(Compiler):
    """A plug-in whose loader loads a custom-operator library a flag names."""

    name = "ops"
    engine_formats = {"ops-graph": (("model.graph",), "")}
    flags = {"ops_library": Flag(str, "", help="a custom-operator library to load")}

    def runs_code(self, fmt, flags):
        if flags["ops_library"]:
            return f"a custom-operator library ({flags['ops_library']})"
        return super().runs_code(fmt, flags)

    def compile(self, model, flags, ctx):  # never built here
        raise NotImplementedError


def test_a_plug_in_declares_the_flags_that_make_its_loader_run_code(monkeypatch):
    module = types.ModuleType("ops_compiler_pkg")
    module.OpsCompiler = OpsCompiler
    monkeypatch.setitem(sys.modules, "ops_compiler_pkg", module)
    targets = {**registry._registered_targets(), "ops": "ops_compiler_pkg:OpsCompiler"}
    monkeypatch.setattr(registry, "_targets", lambda: targets)
    trust.check_code({"compiler": "ops", "format": "ops-graph", "flags": {}}, trust_code=False)
    loaded = {"compiler": "ops", "format": "ops-graph", "flags": {"ops_library": "evil.so"}}
    with pytest.raises(NgraphError, match=r"is a custom-operator library \(evil.so\), which"):
        trust.check_code(loaded, trust_code=False)
