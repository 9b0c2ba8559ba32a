"""openvino compiler: static shapes, scenario hints, AsyncInferQueue and blob round trips."""

from __future__ import annotations

import numpy as np
import pytest

from mlflow_ngraph.compilers.base import CompileContext
from mlflow_ngraph.compilers.registry import get_compiler
from mlflow_ngraph.errors import CompilerUnavailable, NgraphError
from mlflow_ngraph.models.registry import load_model
from tests._support import assert_matches

openvino = pytest.importorskip("openvino", reason="OpenVINO is in the cpu extra")

COMPILER = "openvino"

BATCH = 2
MODELS = {
    "conv_block": {"width": 16, "depth": 1, "image_size": 32},
    "mha_block": {"width": 64, "depth": 1},
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request, cache_dir):
    model = load_model(request.param, MODELS[request.param])
    inputs = model.random_input(BATCH)
    ctx = CompileContext(cache_dir / "identity", "cpu", BATCH, cache_dir)
    reference = get_compiler("identity").compile(model, {}, ctx).outputs(inputs)
    return model, inputs, reference


def _ctx(tmp_path, cache_dir, scenario="throughput"):
    return CompileContext(tmp_path / "work", "cpu", BATCH, cache_dir, scenario=scenario)


def test_available_on_cpu(compiler):
    assert compiler.availability("cpu") == (True, "available")


def test_throughput_scenario_uses_the_async_infer_queue(compiler, case, cache_dir, tmp_path):
    model, inputs, reference = case
    engine = compiler.compile(model, compiler.resolve_flags({}), _ctx(tmp_path, cache_dir))
    optimal = engine.compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")
    assert engine.parallel_requests == optimal >= 1
    assert_matches(engine.outputs(inputs), reference)

    engine.prepare(inputs)
    assert isinstance(engine.queue, openvino.AsyncInferQueue)
    assert len(engine.queue) == engine.parallel_requests
    engine.run_many(2 * engine.parallel_requests)
    for request in engine.queue:  # every request of the queue ran, on the prepared input
        assert request.latency > 0
        assert_matches(np.array(request.get_output_tensor(0).data), reference)
    engine.infer()
    assert_matches(np.array(engine.request.get_output_tensor(0).data), reference)

    settings = engine.runtime_settings()
    assert settings["openvino_performance_hint"] == "THROUGHPUT"
    assert settings["openvino_optimal_number_of_infer_requests"] == engine.parallel_requests
    assert settings["openvino_inference_precision_hint"] == "f32"
    assert settings["openvino_num_streams"] >= 1 and settings["openvino_inference_num_threads"] >= 1
    engine.close()


def test_static_shape_of_the_batch(compiler, case, cache_dir, tmp_path):
    model, inputs, _ = case
    engine = compiler.compile(model, compiler.resolve_flags({}), _ctx(tmp_path, cache_dir))
    assert engine.input_shape == model.input_shape(BATCH)
    assert not engine.compiled.input(0).get_partial_shape().is_dynamic
    with pytest.raises(ValueError, match="compiled for input shape"):
        engine.outputs(model.random_input(BATCH + 1))


def test_latency_scenario_gets_the_latency_hint(compiler, case, cache_dir, tmp_path):
    model, inputs, reference = case
    engine = compiler.compile(
        model, compiler.resolve_flags({}), _ctx(tmp_path, cache_dir, scenario="latency")
    )
    settings = engine.runtime_settings()
    assert settings["openvino_performance_hint"] == "LATENCY"
    assert settings["openvino_num_streams"] == 1
    assert engine.parallel_requests == 1
    engine.prepare(inputs)
    engine.infer()
    assert_matches(np.array(engine.request.get_output_tensor(0).data), reference)


def test_explicit_hint_overrides_the_scenario(compiler, cache_dir, tmp_path):
    model = load_model("mha_block", MODELS["mha_block"])
    flags = compiler.resolve_flags({"PERFORMANCE_HINT": "THROUGHPUT"})
    engine = compiler.compile(model, flags, _ctx(tmp_path, cache_dir, scenario="latency"))
    assert engine.runtime_settings()["openvino_performance_hint"] == "THROUGHPUT"


def test_low_level_properties_are_applied(compiler, cache_dir, tmp_path):
    model = load_model("conv_block", MODELS["conv_block"])
    flags = compiler.resolve_flags(
        {"NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": 1, "ENABLE_CPU_PINNING": False}
    )
    settings = compiler.compile(model, flags, _ctx(tmp_path, cache_dir)).runtime_settings()
    assert settings["openvino_num_streams"] == 1
    assert settings["openvino_inference_num_threads"] == 1
    assert settings["openvino_enable_cpu_pinning"] is False


def test_blob_round_trip(compiler, case, cache_dir, tmp_path):
    model, inputs, reference = case
    flags = compiler.resolve_flags({})
    ctx = _ctx(tmp_path, cache_dir)
    engine = compiler.compile(model, flags, ctx)
    files = engine.save(tmp_path / "saved")
    assert files.files == ["model.blob"] and (tmp_path / "saved" / "model.blob").stat().st_size > 0
    loaded = compiler.load(model, flags, ctx, tmp_path / "saved")
    assert loaded is not None
    assert_matches(loaded.outputs(inputs), reference)
    np.testing.assert_array_equal(loaded.outputs(inputs), engine.outputs(inputs))
    assert loaded.parallel_requests == engine.parallel_requests
    assert loaded.runtime_settings() == engine.runtime_settings()
    loaded.prepare(inputs)
    loaded.run_many(loaded.parallel_requests)


def test_load_without_blob_returns_none(compiler, cache_dir, tmp_path):
    model = load_model("mha_block", MODELS["mha_block"])
    assert (
        compiler.load(model, compiler.resolve_flags({}), _ctx(tmp_path, cache_dir), tmp_path)
        is None
    )


def test_pytorch_source(compiler, cache_dir, tmp_path):
    model = load_model("mha_block", MODELS["mha_block"])
    inputs = model.random_input(BATCH)
    reference = (
        get_compiler("identity").compile(model, {}, _ctx(tmp_path, cache_dir)).outputs(inputs)
    )
    flags = compiler.resolve_flags({"source": "pytorch"})
    engine = compiler.compile(model, flags, _ctx(tmp_path, cache_dir))
    assert_matches(engine.outputs(inputs), reference)


def test_missing_device_is_a_clear_error(compiler, cache_dir, tmp_path):
    if any(d.startswith("NPU") for d in openvino.Core().available_devices):
        pytest.skip("this host has an NPU")
    model = load_model("mha_block", MODELS["mha_block"])
    with pytest.raises(CompilerUnavailable, match="'NPU' is not available here"):
        compiler.compile(
            model, compiler.resolve_flags({"device": "NPU"}), _ctx(tmp_path, cache_dir)
        )


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"PERFORMANCE_HINT_NUM_REQUEST": 2}, "has no flag 'PERFORMANCE_HINT_NUM_REQUEST'"),
        ({"PERFORMANCE_HINT": "FAST"}, "not one of"),
        ({"INFERENCE_PRECISION_HINT": "int8"}, "not one of"),
        ({"NUM_STREAMS": 0}, "must be >= 1"),
        ({"NUM_STREAMS": "AUTO"}, "not a valid int"),
        ({"source": "tensorflow"}, "not one of"),
    ],
)
def test_flag_validation(compiler, flags, message):
    with pytest.raises(NgraphError, match=message):
        compiler.resolve_flags(flags)


def test_latencies_are_read_only_from_the_windows_own_requests(compiler, case, cache_dir, tmp_path):
    """start_many reads the previous latency of the request it restarts: at a window's
    start that is a warm-up inference, or 0.0 ms for a request that never ran. Only the
    window's own inferences are read: each request's first start in it is not."""
    model, inputs, _ = case
    engine = compiler.compile(model, compiler.resolve_flags({}), _ctx(tmp_path, cache_dir))
    engine.prepare(inputs)
    slots = engine.parallel_requests
    count = 4 * slots

    # a fresh queue: no request has run yet, none may be read as 0.0 ms
    fresh: list[float] = []
    engine.start_many(count, fresh, 1)
    engine.queue.wait_all()
    assert len(fresh) == count - slots
    assert all(latency > 0 for latency in fresh)

    # as the harness: warm-up, synchronize, then the window (its first round reads nothing)
    warmup: list[float] = []
    engine.start_many(count, warmup, 1)
    engine.synchronize()
    window: list[float] = []
    engine.start_many(count, window, 1)
    engine.start_many(count, window, 1)  # a second repetition reads every start
    engine.synchronize()
    assert len(window) == 2 * count - slots
    assert all(latency > 0 for latency in window)

    # an explicit reset begins a window too
    engine.reset_latencies()
    again: list[float] = []
    engine.start_many(count, again, 2)  # every second start is read
    engine.close()
    assert len(again) == len([k for k in range(slots, count) if k % 2 == 0])
