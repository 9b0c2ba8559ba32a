"""compare reads the benchmarks' results indexes: same answers as a live search, no per-run
search where an index is current, and a live search where it is not."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient
from report_data import (
    EXPERIMENT,
    OTHER_EXPERIMENT,
    gpu_cells,
    log_benchmark,
    model_cells,
    records_of,
)

from mlflow_ngraph.report import runsource
from mlflow_ngraph.tracking import schema as S

QUERIES = [
    (),
    ("--device", "cpu"),
    ("--compiler", "openvino"),
    ("--family", "resnet,deit"),
    ("--valid-only",),
    ("--where", "model.width=64"),
    ("--experiment", EXPERIMENT, "--batch-size", "1,8"),
    ("--experiment", OTHER_EXPERIMENT),
]


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: " ".join(q) or "all")
def test_index_and_live_search_give_the_same_tables(compare_cli, query):
    args = ["--format", "json", "--table", "all", *query]
    from_index = records_of(compare_cli(*args))
    live = records_of(compare_cli(*args, "--live"))
    assert from_index == live
    assert from_index["cells"]


@pytest.fixture
def cell_searches(monkeypatch):
    """The filter strings of every search, recorded."""
    seen: list[str] = []
    original = runsource.Searcher.search

    def search(self, experiment_ids, filter_string):
        seen.append(filter_string)
        return original(self, experiment_ids, filter_string)

    monkeypatch.setattr(runsource.Searcher, "search", search)
    return seen


def _cell_filters(seen: list[str]) -> list[str]:
    return [f for f in seen if "'cell'" in f]


def _compare(uri: str, *args: str) -> list[dict]:
    from click.testing import CliRunner

    from mlflow_ngraph.commands.report import compare

    result = CliRunner().invoke(
        compare, ["--tracking-uri", uri, "--format", "json", *args], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return records_of(result)


def _fresh_store(tmp_path) -> tuple[str, MlflowClient, str]:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("idx", artifact_location=str(tmp_path / "art"))
    return uri, client, experiment


def test_a_current_index_is_read_without_searching_cells(tmp_path, cell_searches):
    uri, client, experiment = _fresh_store(tmp_path)
    log_benchmark(client, experiment, "cpu", model_cells())
    cells = _compare(uri)
    assert {r["device"] for r in cells} == {"cpu"} and len(cells) > 20
    assert _cell_filters(cell_searches) == []
    assert _compare(uri, "--live") == cells
    assert _cell_filters(cell_searches)


def test_benchmarks_without_a_current_index_are_searched_live(tmp_path, cell_searches):
    uri, client, experiment = _fresh_store(tmp_path)
    indexed = log_benchmark(client, experiment, "cpu", model_cells())
    running = log_benchmark(client, experiment, "gpu", gpu_cells(), indexed=False, finish=False)
    cells = _compare(uri)
    assert {r["device"] for r in cells} == {"cpu", "gpu"}
    searched = _cell_filters(cell_searches)
    assert searched and all(f"= '{running}'" in f for f in searched)
    assert _compare(uri, "--live") == cells

    # the cpu benchmark is resumed (RUNNING again) and a cell's throughput changes: its index
    # is no longer current, so the live value is read
    client.update_run(indexed, status="RUNNING")
    cell = next(
        r
        for r in client.search_runs([experiment], f"tags.`{S.T_PARENT}` = '{indexed}'")
        if r.data.params[S.P_COMPILER] == "openvino" and r.data.params[S.P_MODEL] == "resnet18"
    )
    client.log_metric(cell.info.run_id, S.flat_key(S.M_THROUGHPUT, 8), 12345.0)
    now = _compare(uri, "--model", "resnet18", "--compiler", "openvino", "--batch-size", "8")
    assert [r["throughput"] for r in now if r["compiler"] == "openvino"] == [12345.0]


def test_device_filter_reads_only_that_devices_indexes(tmp_path, monkeypatch):
    from mlflow_ngraph.tracking import index

    uri, client, experiment = _fresh_store(tmp_path)
    cpu = log_benchmark(client, experiment, "cpu", model_cells())
    log_benchmark(client, experiment, "gpu", gpu_cells())
    read: list[str] = []
    original = index.read
    monkeypatch.setattr(index, "read", lambda c, pid, *a: read.append(pid) or original(c, pid, *a))
    cells = _compare(uri, "--device", "cpu")
    assert read == [cpu] and {r["device"] for r in cells} == {"cpu"}


def test_cells_a_running_benchmark_extended_are_read_live(tmp_path):
    """A resumed invocation (a new spec: its own parent) logs to cells of an earlier,
    indexed benchmark and is killed: those cells carry its id and are read live."""
    uri, client, experiment = _fresh_store(tmp_path)
    indexed = log_benchmark(client, experiment, "cpu", model_cells())
    running = log_benchmark(client, experiment, "cpu", [], indexed=False, finish=False)
    cell = next(
        r
        for r in client.search_runs([experiment], f"tags.`{S.T_PARENT}` = '{indexed}'")
        if r.data.params[S.P_COMPILER] == "openvino" and r.data.params[S.P_MODEL] == "resnet18"
    )
    client.set_tag(cell.info.run_id, S.T_LAST_PARENT, running)
    client.log_metric(cell.info.run_id, S.flat_key(S.M_THROUGHPUT, 8), 4321.0)
    now = _compare(uri, "--model", "resnet18", "--compiler", "openvino", "--batch-size", "8")
    assert [r["throughput"] for r in now if r["compiler"] == "openvino"] == [4321.0]
