"""pull, load_engine and run-engine on the engines a real benchmark measured."""

from __future__ import annotations

import json
import shutil

import mlflow
import numpy as np
import pytest
from deploy_support import EXPERIMENT, cli

from mlflow_ngraph import load_engine
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.models.registry import load_model

ENGINE_COMPILERS = ["torchscript", "inductor", "onnxruntime", "openvino", "tvm"]


def pull(uri, out, *extra):
    args = ["pull", "-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block"]
    return cli(*args, *extra, "-o", str(out), "--tracking-uri", uri)


def _reference(x):
    import torch

    model = load_model("conv_block", {"width": 8, "depth": 1, "image_size": 32})
    with torch.inference_mode():
        return model.module(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("compiler", ENGINE_COMPILERS)
def test_pulled_engine_runs_and_matches_the_model(store, tmp_path, compiler):
    uri, _ = store
    out = tmp_path / "engine"
    result = pull(uri, out, "--compiler", compiler, "--batch-size", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "candidates by throughput" in result.stdout and "chose" in result.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["compiler"] == compiler and manifest["batch_size"] == 2
    x = np.random.default_rng(3).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with load_engine(out, trust_code=True) as engine:  # TVM, TorchScript, AOTI run code
        y = engine.predict(x)
        with pytest.raises(NgraphError, match="input shape"):
            engine.predict(x[:1])
    ref = _reference(x)
    assert np.max(np.abs(y - ref)) / np.max(np.abs(ref)) <= 1e-3
    ran = cli("run-engine", str(out), "--repetitions", "3", "--trust-code")
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "output: (2, 8, 32, 32)" in ran.stdout and "latency over 3 call(s)" in ran.stdout


def test_best_by_throughput_and_identity_set_aside(store, tmp_path):
    uri, _ = store
    result = pull(uri, tmp_path / "best")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "identity is PyTorch eager: no compiled engine to deploy" in result.stdout
    client = mlflow.tracking.MlflowClient(uri)
    source = json.loads((tmp_path / "best" / "source.json").read_text())
    run = client.get_run(source["run_id"])
    best = run.data.metrics[f"throughput.bs{source['batch_size']}"]
    experiment = client.get_experiment_by_name(EXPERIMENT)
    for other in client.search_runs([experiment.experiment_id], "tags.`ngraph.role` = 'cell'"):
        if other.data.params["compiler"] == "identity":
            continue
        for b in (1, 2):
            assert other.data.metrics[f"throughput.bs{b}"] <= best


def _artifact_file(uri, compiler, name):
    client = mlflow.tracking.MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    (run,) = [
        r
        for r in client.search_runs([experiment.experiment_id], "tags.`ngraph.role` = 'cell'")
        if r.data.params["compiler"] == compiler
    ]
    root = run.info.artifact_uri.removeprefix("file://")
    return f"{root}/engines/bs1/{name}"


@pytest.mark.parametrize("damage", ["tamper", "truncate"])
def test_damaged_engine_is_refused_and_nothing_left(store, tmp_path, damage):
    uri, _ = store
    path = _artifact_file(uri, "openvino", "model.blob")
    backup = tmp_path / "backup"
    shutil.copyfile(path, backup)
    try:
        data = bytearray(open(path, "rb").read())
        if damage == "tamper":
            data[len(data) // 2] ^= 0xFF
        else:
            data = data[: len(data) // 2]
        open(path, "wb").write(bytes(data))
        out = tmp_path / "out"
        result = pull(uri, out, "--compiler", "openvino", "--batch-size", "1")
        assert result.returncode == 2
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "model.blob" in errors[0], result.stderr[-2000:]
        assert "Traceback" not in result.stderr
        assert not out.exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pull-")]
    finally:
        shutil.copyfile(backup, path)


def test_non_empty_output_needs_force(store, tmp_path):
    uri, _ = store
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    refused = pull(uri, out, "--compiler", "onnxruntime")
    assert refused.returncode == 2 and "is not empty" in refused.stderr
    assert (out / "keep.txt").exists()
    forced = pull(uri, out, "--compiler", "onnxruntime", "--force")
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert not (out / "keep.txt").exists() and (out / "model.ort.onnx").exists()


def test_load_refuses_a_bad_manifest_and_another_runtime_version(store, tmp_path):
    uri, _ = store
    out = tmp_path / "ov"
    assert pull(uri, out, "--compiler", "openvino").returncode == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["compiler_version"] = "1999.0.0"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(NgraphError, match="its manifest is not the one .* signed"):
        load_engine(out)
    with pytest.raises(NgraphError, match="built with openvino 1999.0.0"):
        load_engine(out, allow_unsigned=True)
    (out / "manifest.json").write_text("{not json")
    with pytest.raises(NgraphError, match="does not parse"):
        load_engine(out)
    ran = cli("run-engine", str(out))
    assert ran.returncode == 2 and ran.stderr.startswith("error:") and "Traceback" not in ran.stderr


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["-e", "nope", "--device", "cpu", "--model", "conv_block"], "nope"),
        (["-e", EXPERIMENT, "--device", "orin", "--model", "conv_block"], "no runs match"),
        (["-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block", "--compiler", "identity"],
         "no deployable engine"),
        (["-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block", "--batch-size", "64"],
         "no cell measured at batch size 64"),
        (["-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block", "--max-latency-ms",
          "0.000001"], "over the cap"),
    ],
)  # fmt: skip
def test_bad_selection_is_one_line(store, tmp_path, args, fragment, run_cli):
    """Refused before anything is downloaded: in this process (a traceback would fail the
    test here), the command's own exit and one line."""
    uri, _ = store
    code, out, err = run_cli("pull", *args, "-o", str(tmp_path / "x"), "--tracking-uri", uri)
    assert code == 2, out + err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and fragment in errors[0], err[-2000:]
    assert "Traceback" not in err
    assert not (tmp_path / "x").exists()
