"""Each CPU compiler's search space, its exclusions, pins and the bad inputs of a space."""

from __future__ import annotations

import pytest

from mlflow_ngraph.compilers.base import HostLimits
from mlflow_ngraph.compilers.registry import get_compiler
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.tune.space import build_space

FOUR = HostLimits(cores=4)


def space_of(name: str, host=FOUR, pins=None, allow_precision=False):
    return build_space([(get_compiler(name), {}, pins or {})], host, allow_precision)


def test_host_limits_count_in_powers_of_two_up_to_the_cores():
    assert HostLimits(cores=1).counts() == (1,)
    assert HostLimits(cores=6).counts() == (1, 2, 4, 6)
    assert HostLimits(cores=8).counts() == (1, 2, 4, 8)


def test_onnxruntime_inter_op_threads_only_with_parallel_execution():
    grid = [flags for _, flags in space_of("onnxruntime").grid()]
    sequential = [f for f in grid if f["execution_mode"] == "sequential"]
    parallel = [f for f in grid if f["execution_mode"] == "parallel"]
    assert {f["inter_op_num_threads"] for f in sequential} == {0}  # never searched there
    assert {f["inter_op_num_threads"] for f in parallel} == {0, 1, 2, 4}
    assert {f["intra_op_num_threads"] for f in grid} == {0, 1, 2, 4}
    # 3 levels x 4 intra-op counts x (sequential + parallel x 4 inter-op counts)
    assert len(grid) == 3 * 4 * (1 + 4)


def test_onnxruntime_io_binding_is_searched_on_a_gpu_only():
    cpu = get_compiler("onnxruntime").search_space(FOUR)
    cuda = get_compiler("onnxruntime").search_space(HostLimits(4, device="cuda"))
    assert "io_binding" not in {k.name for k in cpu}
    assert "io_binding" in {k.name for k in cuda}


def test_thread_counts_never_exceed_the_cores_of_the_host():
    for name in ("onnxruntime", "openvino"):
        for _, flags in space_of(name, HostLimits(cores=2)).grid():
            for key in ("intra_op_num_threads", "inter_op_num_threads", "NUM_STREAMS",
                        "INFERENCE_NUM_THREADS"):  # fmt: skip
                assert flags.get(key) in (None, 0, 1, 2), (name, key, flags)


def test_openvino_requests_only_with_the_throughput_hint_and_precision_only_when_allowed():
    grid = [flags for _, flags in space_of("openvino").grid()]
    latency = [f for f in grid if f["PERFORMANCE_HINT"] == "LATENCY"]
    assert {f["PERFORMANCE_HINT_NUM_REQUESTS"] for f in latency} == {None}
    assert {f["INFERENCE_PRECISION_HINT"] for f in grid} == {"f32"}
    wide = [flags for _, flags in space_of("openvino", allow_precision=True).grid()]
    assert {f["INFERENCE_PRECISION_HINT"] for f in wide} == {"f32", "bf16", "f16"}
    assert len(wide) == 3 * len(grid)


def test_torchscript_never_builds_the_rewrite_without_freezing():
    grid = [flags for _, flags in space_of("torchscript").grid()]
    assert {(f["freeze"], f["optimize_for_inference"]) for f in grid} == {
        (True, True),
        (True, False),
        (False, False),
    }


def test_inductor_and_tvm_spaces():
    assert [f["mode"] for _, f in space_of("inductor").grid()] == [
        "default",
        "max-autotune-no-cudagraphs",
    ]
    assert [f["trials"] for _, f in space_of("tvm").grid()] == [0, 64, 256]


def test_a_pinned_flag_is_not_searched_and_every_configuration_has_it():
    space = space_of("onnxruntime", pins={"execution_mode": "parallel"})
    grid = [flags for _, flags in space.grid()]
    assert {f["execution_mode"] for f in grid} == {"parallel"}
    assert len(grid) == 3 * 4 * 4


def test_defaults_are_the_first_trials_and_map_back_to_optuna_params():
    space = space_of("onnxruntime")
    [(name, flags, params)] = space.defaults()
    assert flags == get_compiler("onnxruntime").resolve_flags({})
    assert params == {
        "compiler": "onnxruntime",
        "onnxruntime.graph_optimization_level": "all",
        "onnxruntime.intra_op_num_threads": 0,
        "onnxruntime.execution_mode": "sequential",
    }


def test_optuna_suggests_only_configurations_of_the_space():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = build_space(
        [(get_compiler(n), {}, {}) for n in ("identity", "onnxruntime", "torchscript")], FOUR
    )
    grid = {(n, tuple(sorted(f.items()))) for n, f in space.grid()}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(60):
        trial = study.ask()
        name, flags = space.suggest(trial)
        assert (name, tuple(sorted(flags.items()))) in grid
        study.tell(trial, 1.0)
    assert "identity" not in space.compilers  # the baseline, never a candidate


@pytest.mark.parametrize(
    ("compilers", "pins", "allow", "message"),
    [
        (["onnxruntime"], {"no_such_knob": 1}, False, "has no flag 'no_such_knob'"),
        (["onnxruntime"], {"inter_op_num_threads": 2}, False, "only exists with execution_mode"),
        (["identity"], {}, False, "nothing to search"),
        (
            ["onnxruntime", "torchscript"],
            {},
            True,
            "none of onnxruntime, torchscript has a precision",
        ),
        (["inductor"], {"mode": "default"}, False, "is one configuration"),
    ],
)
def test_bad_spaces_are_one_line(compilers, pins, allow, message):
    entries = [(get_compiler(n), {}, pins if i == 0 else {}) for i, n in enumerate(compilers)]
    with pytest.raises(NgraphError, match=message):
        build_space(entries, FOUR, allow)


def test_unknown_compiler_is_one_line():
    with pytest.raises(NgraphError, match="nosuch"):
        get_compiler("nosuch")
