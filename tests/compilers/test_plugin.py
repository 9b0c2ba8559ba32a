"""Adding a compiler is one module and one registration line: a toy compiler in a package
of its own (one module, one entry point in the ``mlflow_ngraph.compilers`` group), with
nothing of this package changed, runs through ``benchmark`` (compiled, measured, paired
with identity, its engine logged), the MLflow view (its declared colour), ``compare`` and
``pull`` (its declared engine format, loaded back by its own ``load``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._support import copy_empty_store

REPO = Path(__file__).resolve().parents[2]
MODEL = "conv_block:width=8,depth=1,image_size=32"
COLOUR = "#0a7e8c"

TOY = '''
"""A toy compiler: TorchScript tracing, saved as its own format."""

import io
from pathlib import Path

import numpy as np
import torch

from mlflow_ngraph.compilers.base import Compiler, Engine, EngineFiles

FILE = "toy.pt"


class ToyEngine(Engine):
    def __init__(self, module, data):
        self.module, self.data, self.x = module, data, None

    def prepare(self, inputs):
        self.x = torch.from_numpy(np.ascontiguousarray(inputs))

    def infer(self):
        with torch.inference_mode():
            self.module(self.x)

    def outputs(self, inputs):
        with torch.inference_mode():
            out = self.module(torch.from_numpy(np.ascontiguousarray(inputs)))
        return out.numpy().astype(np.float32)

    def save(self, directory):
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / FILE).write_bytes(self.data)
        return EngineFiles(files=[FILE], format="toy-torchscript")


class ToyCompiler(Compiler):
    name = "toy"
    packages = ("torch",)
    color = "COLOUR"
    compile_allowance_s = 5.0
    engine_formats = {"toy-torchscript": ((FILE,), "a TorchScript program")}

    def compile(self, model, flags, ctx):
        example = torch.from_numpy(model.random_input(ctx.batch_size))
        with torch.no_grad():
            traced = torch.jit.trace(model.module.eval(), example, check_trace=False)
        buffer = io.BytesIO()
        torch.jit.save(traced, buffer)
        return ToyEngine(traced, buffer.getvalue())

    def load(self, model, flags, ctx, directory):
        path = Path(directory) / FILE
        if not path.is_file():
            return None
        data = path.read_bytes()
        return ToyEngine(torch.jit.load(io.BytesIO(data)), data)
'''.replace("COLOUR", COLOUR)


@pytest.fixture(scope="module")
def toy(tmp_path_factory, empty_store):
    """The toy's package on a path of its own, and a command line that sees it."""
    tmp = tmp_path_factory.mktemp("toy")
    site = tmp / "site"
    (site / "toy_compiler-0.1.dist-info").mkdir(parents=True)
    (site / "toy_compiler.py").write_text(TOY)
    info = site / "toy_compiler-0.1.dist-info"
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-compiler\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[mlflow_ngraph.compilers]\ntoy = toy_compiler:ToyCompiler\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    env["MLFLOW_NGRAPH_HOME"] = str(tmp / "home")
    uri = copy_empty_store(empty_store, tmp / "mlflow.db")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "mlflow_ngraph", *args], capture_output=True, text=True,
            env=env, cwd=tmp, timeout=600,
        )  # fmt: skip

    done = cli(
        "benchmark", "--model", MODEL, "--compiler", "identity", "--compiler", "toy",
        "--batch-sizes", "2", "--warmup", "1", "--repetitions", "3", "--min-duration", "0",
        "--max-duration", "0.5", "--experiment", "toy", "--tracking-uri", uri,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return cli, uri, tmp


def test_the_toy_is_listed_and_benchmarked_with_its_colour(toy):
    from mlflow.tracking import MlflowClient

    cli, uri, _ = toy
    listed = cli("compilers", "--device", "cpu")
    assert listed.returncode == 0 and "toy" in listed.stdout
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("toy")
    runs = client.search_runs([experiment.experiment_id], "params.compiler = 'toy'")
    assert len(runs) == 1
    run = runs[0]
    assert run.data.tags["mlflow.runColor"] == COLOUR  # the MLflow view reads the class
    assert run.data.params["engine.bs2.manifest_sha256"]  # its engine logged, pinned
    assert run.data.metrics["valid.bs2"] == 1.0 and run.data.metrics["speedup.bs2"] > 0


def test_compare_and_pull_take_the_toy_like_any_compiler(toy):
    cli, uri, tmp = toy
    compared = cli("compare", "-e", "toy", "--tracking-uri", uri, "--format", "json")
    assert compared.returncode == 0, compared.stderr[-2000:]
    data = json.loads(compared.stdout)
    rows = data if isinstance(data, list) else data["cells"]
    assert {r["compiler"] for r in rows} == {"identity", "toy"}
    out = tmp / "engine"
    pulled = cli(
        "pull", "-e", "toy", "--device", "cpu", "--model", "conv_block", "--compiler", "toy",
        "--batch-size", "2", "-o", str(out), "--tracking-uri", uri,
    )  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr[-2000:]
    assert json.loads((out / "manifest.json").read_text())["format"] == "toy-torchscript"
    refused = cli("run-engine", str(out), "--repetitions", "2")
    assert refused.returncode != 0 and "a TorchScript program" in refused.stderr  # its code
    ran = cli("run-engine", str(out), "--repetitions", "2", "--trust-code")
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "output: (2, 8, 32, 32)" in ran.stdout
