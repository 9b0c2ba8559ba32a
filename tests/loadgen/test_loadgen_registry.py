"""The bound a deployed engine held: `loadgen` Server results in a real store, read back by
the selection of `register` / `pull` (--min-qps, --latency-bound) and as a version's tags."""

from __future__ import annotations

import pytest

from mlflow_ngraph.deploy.bound import check_wanted, held, server_bounds, set_aside
from mlflow_ngraph.deploy.select import Candidate, rank
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.loadgen.drive import LoadgenCell, LoadgenRun
from mlflow_ngraph.loadgen.settings import LoadgenSettings
from mlflow_ngraph.loadgen.summary import ScenarioResult
from mlflow_ngraph.plan.config import ModelSpec
from tests._support import copy_empty_store

MODEL = ModelSpec("conv_block", {"width": 8, "depth": 1, "image_size": 32})


def loadgen_run(uri, home, compiler, flags, qps, valid=True, bound=50.0, max_batch=2, s=30.0):
    settings = LoadgenSettings(("server",), bound, min_duration_s=s, max_batch=max_batch)
    job = LoadgenRun(settings, home, uri, "lg", True, print)
    cell = LoadgenCell(MODEL, compiler, flags, "cpu", settings)
    record = job.open(cell)
    figures = {"server.qps": qps, "server.p99_ms": bound * 0.8}
    record.result("server", ScenarioResult("server", valid, "" if valid else "no", figures))
    record.finish()
    return record.run_id


def candidate(compiler, flags="", batch=2):
    return Candidate("r", "0", "cpu", MODEL.label, compiler, flags, batch,
                     metrics={"throughput": 100.0, "valid": 1.0})  # fmt: skip


@pytest.fixture(scope="module")
def client(tmp_path_factory, empty_store):
    import mlflow

    root = tmp_path_factory.mktemp("bound")
    uri = copy_empty_store(empty_store, root / "mlflow.db")
    loadgen_run(uri, root, "openvino", {"PERFORMANCE_HINT": "THROUGHPUT"}, 120.0)
    loadgen_run(
        uri, root, "openvino", {"PERFORMANCE_HINT": "THROUGHPUT"}, 400.0, valid=False, s=5.0
    )
    loadgen_run(uri, root, "openvino", {"PERFORMANCE_HINT": "LATENCY"}, 300.0)  # other engine
    loadgen_run(uri, root, "openvino", {"PERFORMANCE_HINT": "THROUGHPUT"}, 90.0, bound=20.0)
    loadgen_run(uri, root, "onnxruntime", {}, 500.0, max_batch=1)  # bs1's, not bs2's
    return mlflow.MlflowClient(uri)


def test_the_bound_an_engine_held_is_read_from_its_valid_loadgen_runs(client):
    ov = candidate("openvino", "PERFORMANCE_HINT=THROUGHPUT")
    bounds = server_bounds(client, ov)
    assert [(b.qps, b.bound_ms) for b in bounds] == [(120.0, 50.0), (90.0, 20.0)]
    best = held(bounds, None, None)
    assert best.text().startswith("server: 120 QPS at p99 <= 50 ms on cpu, 20")
    tags = best.tags()
    assert tags["ngraph.server"] == best.text() and tags["ngraph.server.qps"] == "120"
    assert held(bounds, 30.0, None).qps == 90.0  # only the 20 ms result is that tight
    assert held(bounds, 30.0, 100.0) is None


def test_min_qps_and_latency_bound_set_aside_what_did_not_hold_them(client):
    ov = candidate("openvino", "PERFORMANCE_HINT=THROUGHPUT")
    ort, slow = candidate("onnxruntime"), candidate("openvino", "PERFORMANCE_HINT=THROUGHPUT")
    set_aside(client, [ov, ort], 50.0, 100.0)
    set_aside(client, [slow], 50.0, 150.0)
    assert ov.server.qps == 120.0 and not ov.bound_problem
    assert "no VALID loadgen Server result" in ort.bound_problem
    assert "150 QPS at p99 <= 50 ms not measured (best: server: 120 QPS" in slow.bound_problem
    selection = rank([ov, ort, slow])
    assert selection.ranked == [ov]
    assert {c.reason for c in selection.excluded} == {ort.bound_problem, slow.bound_problem}
    assert check_wanted(100.0, None) == 50.0 and check_wanted(None, None) is None
    with pytest.raises(NgraphError, match="--min-qps must be above 0"):
        check_wanted(0.0, None)
    with pytest.raises(NgraphError, match="--latency-bound must be above 0"):
        check_wanted(None, -1.0)


def test_the_mlflow_view_shows_each_scenario_s_figure_and_verdict(client):
    import json

    from mlflow_ngraph.loadgen.view import write_view

    experiment = client.get_experiment_by_name("lg")
    key = write_view(client, experiment.experiment_id, "cpu", ("offline", "server"))
    assert key == "ngraph-loadgen-cpu"
    tag = client.get_experiment(experiment.experiment_id).tags
    state = json.loads(json.loads(tag["mlflow.sharedViewState.ngraph-loadgen-cpu"])["state"])
    assert state["selectedColumns"] == [
        "params.`model`", "params.`compiler`", "params.`loadgen.driven`",
        "metrics.`offline.samples_per_s`", "tags.`ngraph.loadgen.offline.validity`",
        "metrics.`server.qps`", "metrics.`server.p99_ms`", "params.`loadgen.latency_bound_ms`",
        "tags.`ngraph.loadgen.server.validity`", "params.`device`",
    ]  # fmt: skip
    # the view's filter finds the loadgen runs (MLflow's own search)
    found = client.search_runs([experiment.experiment_id], state["searchFilter"])
    assert len(found) == 5 and state["orderByKey"] == "metrics.`offline.samples_per_s`"
    # a later invocation of one scenario keeps the columns of those measured before
    write_view(client, experiment.experiment_id, "cpu", ("offline",))
    tag = client.get_experiment(experiment.experiment_id).tags
    again = json.loads(json.loads(tag["mlflow.sharedViewState.ngraph-loadgen-cpu"])["state"])
    assert again["selectedColumns"] == state["selectedColumns"]
