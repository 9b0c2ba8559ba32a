"""The MLflow contract of a benchmark, on a tiny real model with every CPU compiler."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from mlflow_ngraph.tracking import schema as S
from tests._support import TINY, copy_empty_store

COMPILERS = ["identity", "torchscript", "inductor", "onnxruntime", "openvino"]
#: compilers whose engines serialize, and the file each writes
ENGINE_FILES = {
    "torchscript": "model.pt",
    "onnxruntime": "model.ort.onnx",
    "openvino": "model.blob",
}


@pytest.fixture(scope="module")
def benchmarked(tmp_path_factory, empty_store):
    """One real benchmark run shared by the contract tests below."""
    from mlflow_ngraph.commands.cli import main

    tmp = tmp_path_factory.mktemp("bench")
    uri = copy_empty_store(empty_store, tmp / "mlflow.db")
    args = [
        "benchmark",
        *TINY,
        "--experiment",
        "contract",
        "--tracking-uri",
        uri,
        "--home",
        str(tmp / "home"),
    ]
    for name in COMPILERS:
        args += ["--compiler", name]
    main(args)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("contract")
    runs = client.search_runs([experiment.experiment_id])
    return client, runs


def _cells(runs):
    return {r.data.params["compiler"]: r for r in runs if r.data.tags.get(S.T_ROLE) == "cell"}


def test_one_parent_and_one_nested_child_per_compiler(benchmarked):
    _, runs = benchmarked
    parents = [r for r in runs if r.data.tags.get(S.T_ROLE) == "benchmark"]
    assert len(parents) == 1
    cells = _cells(runs)
    assert sorted(cells) == sorted(COMPILERS)
    for run in cells.values():
        assert run.data.tags[S.T_PARENT] == parents[0].info.run_id
        assert run.data.tags[S.T_LAST_PARENT] == parents[0].info.run_id
        assert run.info.status == "FINISHED"
        assert run.data.tags[S.T_DEVICE] == "cpu" and run.data.tags[S.T_HOST]
        assert run.data.tags["ngraph.version.torch"]
    parent = parents[0]
    assert parent.data.tags[S.T_SPEC_HASH]
    assert "env.cpu_model" in parent.data.tags and "env.version.torch" in parent.data.tags


def test_params_have_the_contract_keys(benchmarked):
    _, runs = benchmarked
    for name, run in _cells(runs).items():
        params = run.data.params
        assert params["device"] == "cpu"
        assert params["model"] == "conv_block"
        assert params["compiler"] == name
        assert params["family"] == "conv_block"
        assert int(params["parameter_count"]) > 0
        assert params["model.width"] == "8"
        assert params["scenario"] == "throughput"
    assert _cells(runs)["torchscript"].data.params["flag.freeze"] == "True"


def test_metrics_are_stepped_by_batch_size_and_flat(benchmarked):
    client, runs = benchmarked
    for name, run in _cells(runs).items():
        metrics = run.data.metrics
        for b in (1, 2):
            assert metrics[f"throughput.bs{b}"] > 0, name
            assert f"latency_p50_ms.bs{b}" in metrics
            assert 0 < metrics[f"cpu_percent.bs{b}"] <= 100.0 + 1e-6
            assert metrics[f"valid.bs{b}"] == 1.0, name
            assert metrics[f"speedup.bs{b}"] > 0
        history = client.get_metric_history(run.info.run_id, "throughput")
        assert sorted(m.step for m in history) == [1, 2]
        assert {m.step: m.value for m in history}[2] == metrics["throughput.bs2"]
        # diagnostics are one chart over batch size each, not one single point per batch
        cosine = client.get_metric_history(run.info.run_id, "cosine_similarity")
        assert sorted(m.step for m in cosine) == [1, 2]
        assert all(m.value > 0.999 for m in cosine)
        flat = {S.parse_flat_key(k)[0] for k in metrics if S.parse_flat_key(k)}
        assert flat <= S.FLAT_METRICS, flat - S.FLAT_METRICS
        assert "cosine_similarity.bs1" not in metrics
        assert run.data.tags[S.T_STATUS] == S.STATUS_OK
    identity = _cells(runs)["identity"].data.metrics
    assert identity["speedup.bs2"] == pytest.approx(1.0)
    assert identity["ase.bs1"] == pytest.approx(1.0)


def test_every_logged_metric_is_named_in_the_schema(benchmarked):
    _, runs = benchmarked
    for name, run in _cells(runs).items():
        unnamed = [k for k in run.data.metrics if not S.is_schema_metric(k)]
        assert not unnamed, (name, unnamed)
        # the intervals and what the host did are there for every batch size
        for b in (1, 2):
            assert S.flat_key(S.M_THROUGHPUT_CI_LOW, b) in run.data.metrics, name
        assert S.M_HOST_LOAD in run.data.metrics and S.M_PARALLEL_REQUESTS in run.data.metrics
    assert not S.is_schema_metric("made_up.bs2") and S.is_schema_metric("max_abs_error_out3")


def test_engine_artifacts_with_manifest(benchmarked, tmp_path):
    client, runs = benchmarked
    for name, run in _cells(runs).items():
        for b in (1, 2):
            local = client.download_artifacts(
                run.info.run_id, f"engines/bs{b}", str(tmp_path / name / str(b))
            )
            manifest = json.load(open(f"{local}/manifest.json"))
            assert manifest["compiler"] == name
            assert manifest["input_shape"] == [b, 3, 32, 32]
            assert manifest["versions"]["torch"]
            if name in ENGINE_FILES:
                paths = [f["path"] for f in manifest["files"]]
                assert ENGINE_FILES[name] in paths, (name, paths)
                assert all(len(f["sha256"]) == 64 for f in manifest["files"])


def test_parent_has_resolved_spec_artifact(benchmarked, tmp_path):
    client, runs = benchmarked
    parent = next(r for r in runs if r.data.tags.get(S.T_ROLE) == "benchmark")
    path = client.download_artifacts(parent.info.run_id, "spec.json", str(tmp_path))
    spec = json.load(open(path))
    assert spec["batch_sizes"] == [1, 2]
    assert [c["name"] for c in spec["compilers"]] == COMPILERS


def test_parent_holds_a_results_index_of_every_cell_run(benchmarked):
    """The index is what the store holds: each record equals the cell run read back."""
    from mlflow_ngraph.tracking import index

    client, runs = benchmarked
    parent = next(r for r in runs if r.data.tags.get(S.T_ROLE) == "benchmark")
    current = client.get_run(parent.info.run_id)
    assert index.is_current(current.info.status, current.data.tags)
    assert parent.data.tags[S.T_INDEX_RUNS] == str(len(COMPILERS))
    records = {r["run_id"]: r for r in index.read(client, parent.info.run_id)}
    cells = _cells(runs)
    assert set(records) == {run.info.run_id for run in cells.values()}
    for run in cells.values():
        assert records[run.info.run_id] == index.run_record(client.get_run(run.info.run_id))
    assert all(r["metrics"]["throughput.bs2"] > 0 for r in records.values())
