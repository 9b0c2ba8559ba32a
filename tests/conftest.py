"""Shared fixtures: an isolated cache/journal home and a fresh local MLflow store per test."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def tracking_uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def run_cli(home: Path, capsys, monkeypatch):
    """Run ``mlflow-ngraph ARGS`` in-process; returns (exit code, stdout, stderr)."""
    from mlflow_ngraph.cli import main

    monkeypatch.setenv("MLFLOW_NGRAPH_HOME", str(home))

    def run(*args: str) -> tuple[int, str, str]:
        code = 0
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    return run


os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
