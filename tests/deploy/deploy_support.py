"""Helpers of the deployment tests: the CLI in its own process, a tiny real benchmark."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests._support import PYTHON

MODEL = "conv_block:width=8,depth=1,image_size=32"
COMPILERS = [
    "identity",
    "torchscript",
    "inductor:package=true",
    "onnxruntime",
    "openvino",
    "tvm:trials=0",
]
EXPERIMENT = "deploy"


def cli(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: int = 600):
    return subprocess.run(
        [PYTHON, "-m", "mlflow_ngraph", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=timeout,
    )


def benchmark(uri: str, home: Path, *extra: str, compilers=COMPILERS, experiment=EXPERIMENT):
    args = ["benchmark", "--model", MODEL, "--batch-sizes", "1,2", "--warmup", "1"]
    args += ["--repetitions", "3", "--min-duration", "0.05", "--experiment", experiment]
    for compiler in compilers:
        args += ["--compiler", compiler]
    env = {"MLFLOW_NGRAPH_HOME": str(home)}
    result = cli(*args, *extra, "--tracking-uri", uri, env=env, cwd=Path(home).parent)
    assert result.returncode == 0, result.stderr[-3000:]
    return result
