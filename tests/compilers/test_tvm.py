"""tvm compiler: real TVM builds and MetaSchedule tunings with tiny budgets.

The tuned compiles share the module's export cache and TVM's warm build/run workers, so the
whole file runs in a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mlflow_ngraph.compilers.base import CompileContext
from mlflow_ngraph.compilers.registry import get_compiler
from mlflow_ngraph.errors import CompileFailed, NgraphError
from mlflow_ngraph.models.registry import load_model

pytest.importorskip("tvm")

BATCH = 2
#: trials of a tuned test compile: enough for every task of these blocks to get a measured
#: schedule, few enough to keep a compile to seconds
TRIALS = 6
MODELS = {
    "conv_block": {"width": 8, "depth": 1, "image_size": 32},
    "mha_block": {"width": 32, "depth": 1},
}
#: relative tolerance against PyTorch eager: float32 kernels with reordered reductions
RTOL = 1e-3


def max_rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    assert out.shape == ref.shape
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-12))


@pytest.fixture(scope="module")
def compiler():
    return get_compiler("tvm")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")  # one ONNX export per model for the module


@pytest.fixture(scope="module")
def cases(cache_dir):
    """model name -> (model, inputs, identity outputs)."""
    out = {}
    for name, params in MODELS.items():
        model = load_model(name, params)
        inputs = model.random_input(BATCH)
        ctx = CompileContext(cache_dir / "identity", "cpu", BATCH, cache_dir)
        out[name] = (
            model,
            inputs,
            get_compiler("identity").compile(model, {}, ctx).outputs(inputs),
        )
    return out


def _ctx(tmp_path, cache_dir, device="cpu"):
    return CompileContext(tmp_path / "work", device, BATCH, cache_dir)


@pytest.fixture(scope="module")
def tuned_conv(compiler, cases, cache_dir, tmp_path_factory):
    """conv_block tuned with a tiny budget: (engine, saved engine directory)."""
    model, _, _ = cases["conv_block"]
    ctx = _ctx(tmp_path_factory.mktemp("tuned"), cache_dir)
    engine = compiler.compile(model, compiler.resolve_flags({"trials": TRIALS}), ctx)
    saved = tmp_path_factory.mktemp("saved")
    files = engine.save(saved)
    return engine, saved, files


def test_registry_does_not_import_tvm():
    code = (
        "import sys\n"
        "from mlflow_ngraph.compilers.registry import get_compiler\n"
        "c = get_compiler('tvm'); c.resolve_flags({'trials': 3})\n"
        "assert 'tvm' not in sys.modules, 'tvm imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_available_on_cpu_and_cuda_reason(compiler):
    assert compiler.availability("cpu") == (True, "available")
    ok, reason = compiler.availability("cuda")
    if not ok:
        assert "CUDA" in reason or "cuda" in reason


def test_cuda_compile_without_gpu_is_a_clear_error(compiler, cases, cache_dir, tmp_path):
    import tvm

    if tvm.runtime.enabled("cuda") and tvm.cuda(0).exist:
        pytest.skip("a CUDA device is present")
    model, _, _ = cases["conv_block"]
    with pytest.raises(CompileFailed, match="cuda"):
        compiler.compile(model, compiler.resolve_flags({}), _ctx(tmp_path, cache_dir, "cuda"))


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"trials": -1}, "must be >= 0"),
        ({"trials": "many"}, "not a valid int"),
        ({"trials_per_task": 0}, "must be >= 1"),
        ({"early_stopping": 0}, "must be >= 1"),
        ({"timeout": 0}, "must be >= 1"),
        ({"opt_level": 4}, "not one of"),
        ({"trails": 3}, "has no flag 'trails'"),
    ],
)
def test_flag_validation(compiler, flags, message):
    with pytest.raises(NgraphError, match=message):
        compiler.resolve_flags(flags)


def test_flag_defaults(compiler):
    flags = compiler.resolve_flags({"trials": "0", "timeout": "30"})
    assert flags["trials"] == 0 and flags["timeout"] == 30.0
    assert flags["opt_level"] == 3 and flags["database"] is None


def test_missing_database_dir_is_a_user_error(compiler, cases, cache_dir, tmp_path):
    model, _, _ = cases["conv_block"]
    flags = compiler.resolve_flags({"database": str(tmp_path / "nowhere")})
    with pytest.raises(NgraphError, match="database"):
        compiler.compile(model, flags, _ctx(tmp_path, cache_dir))


def test_host_target_names_the_cpu():
    from mlflow_ngraph.compilers.tvm import host_cpu_target_spec, physical_cores

    spec = host_cpu_target_spec()
    assert spec["kind"] == "llvm" and spec["num-cores"] == physical_cores()
    assert spec.get("mcpu") not in ("native", "")


def test_untuned_build_says_so(compiler, cases, cache_dir, tmp_path):
    model, inputs, reference = cases["conv_block"]
    engine = compiler.compile(
        model, compiler.resolve_flags({"trials": 0}), _ctx(tmp_path, cache_dir)
    )
    assert max_rel_error(engine.outputs(inputs), reference) < RTOL
    assert not engine.tuned and engine.trials_used == 0
    settings = engine.runtime_settings()
    assert settings["tuned"] is False and settings["trials_used"] == 0
    assert settings["tuning_stop_reason"] == "untuned"
    # closing the engine removes its work directory; the saved engine stands on its own
    work = engine.build.work_dir
    assert work is not None and work.is_dir()
    engine.save(tmp_path / "saved")
    engine.close()
    assert not work.exists()
    loaded = compiler.load(
        model, compiler.resolve_flags({"trials": 0}), _ctx(tmp_path, cache_dir), tmp_path / "saved"
    )
    assert max_rel_error(loaded.outputs(inputs), reference) < RTOL
    loaded.close()
    assert (tmp_path / "saved" / "model.so").is_file()  # a loaded engine owns no work dir


def test_tvm_internals_the_tuning_patches_are_checked(monkeypatch):
    import tvm.ir.utils

    from mlflow_ngraph.compilers.tvm import tuning
    from mlflow_ngraph.errors import CompileFailed

    tuning.check_tvm_internals.cache_clear()
    tuning.check_tvm_internals()  # the installed TVM has them all
    monkeypatch.delattr(tvm.ir.utils, "derived_object")
    tuning.check_tvm_internals.cache_clear()
    with pytest.raises(CompileFailed, match="tvm.ir.utils.derived_object.*trials=0"):
        tuning.check_tvm_internals()
    tuning.check_tvm_internals.cache_clear()


def test_tuned_conv_matches_identity(tuned_conv, cases):
    engine, _, _ = tuned_conv
    _, inputs, reference = cases["conv_block"]
    assert max_rel_error(engine.outputs(inputs), reference) < RTOL
    assert engine.tuned
    assert 0 < engine.trials_used <= TRIALS
    assert engine.tuning_seconds > 0
    settings = engine.runtime_settings()
    assert settings["trials_used"] == engine.trials_used
    assert settings["tuning_seconds"] == pytest.approx(engine.tuning_seconds, abs=1e-3)
    assert settings["tasks_tuned"] >= 1 and settings["num_threads"] >= 1
    engine.prepare(inputs)
    engine.infer()
    engine.run_many(2)


def test_tvm_does_not_pin_the_process(tuned_conv):
    # TVM's default thread pool pins the calling thread to core 0 on this kind of VM
    assert os.environ.get("TVM_NUM_THREADS")
    if hasattr(os, "sched_getaffinity"):
        assert len(os.sched_getaffinity(0)) == len(os.sched_getaffinity(os.getppid()))


def test_save_load_round_trip(compiler, tuned_conv, cases, cache_dir, tmp_path):
    engine, saved, files = tuned_conv
    model, inputs, reference = cases["conv_block"]
    assert files.format == "tvm-relax-vm"
    for name in files.files:
        assert (saved / name).is_file(), name
    assert {"model.so", "params.bin", "database/database_tuning_record.json"} <= set(files.files)
    manifest = json.loads((saved / "tvm_engine.json").read_text())
    assert manifest["trials_used"] == engine.trials_used and manifest["tuned"]

    loaded = compiler.load(model, compiler.resolve_flags({}), _ctx(tmp_path, cache_dir), saved)
    assert loaded is not None
    assert np.allclose(loaded.outputs(inputs), engine.outputs(inputs), rtol=1e-5, atol=1e-6)
    assert loaded.tuned and loaded.trials_used == engine.trials_used
    loaded.prepare(inputs)
    loaded.infer()
    again = loaded.save(tmp_path / "again")  # a loaded engine saves its files again
    assert (tmp_path / "again" / "model.so").is_file() and len(again.files) == len(files.files)
    assert compiler.load(model, {}, _ctx(tmp_path, cache_dir), tmp_path / "empty") is None


def test_database_reuse_spends_no_trials(compiler, tuned_conv, cases, tmp_path):
    _, saved, _ = tuned_conv
    model, inputs, reference = cases["conv_block"]
    # a fresh cache, so only the database flag can provide the tuning
    ctx = CompileContext(tmp_path / "work", "cpu", BATCH, tmp_path / "fresh-cache")
    flags = compiler.resolve_flags({"trials": TRIALS, "database": str(saved / "database")})
    engine = compiler.compile(model, flags, ctx)
    assert engine.trials_used == 0 and engine.tuned
    settings = engine.runtime_settings()
    assert settings["database_reused"] and settings["tuning_stop_reason"] == "database"
    assert max_rel_error(engine.outputs(inputs), reference) < RTOL


def test_same_tuning_twice_hits_the_database_cache(
    compiler, tuned_conv, cases, cache_dir, tmp_path
):
    model, _, _ = cases["conv_block"]
    engine = compiler.compile(
        model, compiler.resolve_flags({"trials": TRIALS}), _ctx(tmp_path, cache_dir)
    )
    assert engine.trials_used == 0 and engine.tuned
    assert engine.runtime_settings()["database_reused"]


def test_tuned_mha_matches_identity(compiler, cases, cache_dir, tmp_path):
    model, inputs, reference = cases["mha_block"]
    flags = compiler.resolve_flags({"trials": TRIALS, "trials_per_task": 2})
    engine = compiler.compile(model, flags, _ctx(tmp_path, cache_dir))
    assert max_rel_error(engine.outputs(inputs), reference) < RTOL
    assert engine.tuned and 0 < engine.trials_used <= TRIALS


def test_timeout_stops_tuning(compiler, cases, cache_dir, tmp_path):
    model, inputs, reference = cases["mha_block"]
    flags = compiler.resolve_flags({"trials": 500, "timeout": 1})
    engine = compiler.compile(model, flags, _ctx(tmp_path, cache_dir))
    assert engine.runtime_settings()["tuning_stop_reason"] == "timeout"
    assert engine.trials_used < 500
    assert max_rel_error(engine.outputs(inputs), reference) < RTOL


def test_monitor_early_stopping_and_counting():
    from types import SimpleNamespace

    from mlflow_ngraph.compilers.tvm.tuning import _TuningMonitor

    def result(seconds):
        return SimpleNamespace(error_msg=None, run_secs=[seconds])

    monitor = _TuningMonitor(budget=10, n_tasks=2, early_stopping=2, deadline=None, start=0.0)
    monitor.record("a", [result(3.0), result(2.0)])
    assert not monitor.should_stop("a")
    monitor.record("a", [result(2.5), SimpleNamespace(error_msg="boom", run_secs=None)])
    assert monitor.should_stop("a") and not monitor.should_stop("b")
    assert monitor.trials == 4 and monitor.best_s["a"] == 2.0
    monitor.record("b", [result(1.0), result(1.0), result(1.0)])
    assert monitor.should_stop("b") and monitor.stop_reason() == "early_stopping"


def test_search_settings_follow_the_budget():
    from mlflow_ngraph.compilers.tvm.tuning import _search_settings

    small = _search_settings(budget=64, per_task=64, per_round=16, warmup_samples=100)
    assert small["genetic_num_iters"] == 0 and small["population_size"] == 32
    large = _search_settings(budget=1500, per_task=1500, per_round=64, warmup_samples=100)
    assert large == {"population_size": 512}
