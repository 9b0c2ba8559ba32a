"""Fixtures: one real sqlite MLflow store with the runs of report_data, and the command."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from report_data import (
    EXPERIMENT,
    OTHER_EXPERIMENT,
    block_cells,
    gpu_cells,
    log_benchmark,
    model_cells,
)

from tests._support import copy_empty_store


@pytest.fixture(scope="session")
def store(tmp_path_factory, empty_store) -> tuple[str, MlflowClient]:
    """A sqlite store with the data set above in two experiments; (uri, client). The cpu
    benchmark has a results index (compare reads it), the gpu one has none (searched)."""
    root = tmp_path_factory.mktemp("report-store")
    uri = copy_empty_store(empty_store, root / "mlflow.db")
    client = MlflowClient(uri)
    paper = client.create_experiment(EXPERIMENT, artifact_location=str(root / "artifacts"))
    gpu = client.create_experiment(OTHER_EXPERIMENT, artifact_location=str(root / "gpu-art"))
    log_benchmark(client, paper, "cpu", model_cells() + block_cells())
    log_benchmark(client, gpu, "gpu", gpu_cells(), indexed=False)  # read by a live search
    return uri, client


@pytest.fixture
def compare_cli(store, monkeypatch, tmp_path: Path):
    """Run ``compare ARGS`` against the store; returns click's Result."""
    from click.testing import CliRunner

    from mlflow_ngraph.commands.report import compare

    uri, _ = store
    monkeypatch.chdir(tmp_path)  # anything MLflow writes by default lands in tmp_path
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    def run(*args: str):
        return CliRunner().invoke(compare, ["--tracking-uri", uri, *args], catch_exceptions=False)

    return run
