"""`mlflow run . -e benchmark` from a fresh shell: an experiment parameter that disagrees
with the run's is one clear line. (The entry point run twice from a fresh shell, with the
interpreter of `mlflow run` and the experiment it names: test_resume.py.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests._support import PYTHON, REPO

TINY_PARAMS = [
    "-P",
    "models=conv_block:width=8,depth=1,image_size=32",
    "-P",
    "compilers=identity",
    "-P",
    "batch_sizes=1",
    "-P",
    "warmup=1",
    "-P",
    "repetitions=2",
    "-P",
    "min_duration=0",
]


def _mlflow_run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(
        # a fresh shell: no virtual environment on PATH, so `python` is not the project's
        PATH="/usr/bin:/bin",
        MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}",
        MLFLOW_NGRAPH_HOME=str(tmp_path / "home"),
    )
    mlflow_bin = str(Path(PYTHON).parent / "mlflow")
    command = [mlflow_bin, "run", str(REPO), "-e", "benchmark", "--env-manager", "local"]
    return subprocess.run(
        [*command, *extra, *TINY_PARAMS],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.usefixtures("tracking_uri")  # the store _mlflow_run names, made
def test_experiment_param_that_disagrees_with_the_run_is_one_clear_line(tmp_path):
    result = _mlflow_run(tmp_path, "--experiment-name", "chosen", "-P", "experiment=other")
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert "'other'" in errors[0] and "--experiment-name other" in errors[0]
    assert "Traceback" not in result.stderr.split("=== Run")[0]
