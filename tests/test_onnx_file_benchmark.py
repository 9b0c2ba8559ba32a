"""An ONNX file benchmarks with the ONNX compilers; the torch-only ones fail with the reason."""

import torch

from mlflow_ngraph.models.registry import load_model


def test_onnx_file_through_the_runner(run_cli, tracking_uri, tmp_path):
    block = load_model("conv_block", {"width": 4, "depth": 1, "image_size": 16})
    path = tmp_path / "block.onnx"
    torch.onnx.export(
        block.module,
        (torch.zeros(1, 3, 16, 16),),
        str(path),
        dynamo=False,
        input_names=["x"],
        dynamic_axes={"x": {0: "batch"}},
    )
    code, out, err = run_cli(
        "benchmark",
        "--model",
        str(path),
        "--compiler",
        "identity",
        "--compiler",
        "onnxruntime",
        "--compiler",
        "openvino",
        "--batch-sizes",
        "1,2",
        "--warmup",
        "1",
        "--repetitions",
        "3",
        "--min-duration",
        "0",
        "--tracking-uri",
        tracking_uri,
    )
    assert code == 0, err
    rows = {
        (line.split()[1], line.split()[2]): line
        for line in out.splitlines()
        if line.split() and line.split()[0].endswith("block.onnx")
    }
    assert "OK" in rows[("onnxruntime", "2")] and "OK" in rows[("openvino", "2")]
    assert (
        "FAILED" in rows[("identity", "1")] and "needs a PyTorch model" in rows[("identity", "1")]
    )


def _external_data_model(folder):
    """A conv block saved as model.onnx + weights.bin (every tensor outside the graph)."""
    import onnx

    block = load_model("conv_block", {"width": 4, "depth": 1, "image_size": 16})
    folder.mkdir(parents=True, exist_ok=True)
    inline = folder / "inline.onnx"
    torch.onnx.export(
        block.module, (torch.zeros(1, 3, 16, 16),), str(inline), dynamo=False,
        input_names=["x"], dynamic_axes={"x": {0: "batch"}},
    )  # fmt: skip
    proto = onnx.load(str(inline))
    inline.unlink()
    path = folder / "model.onnx"
    onnx.save_model(
        proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
        location="weights.bin", size_threshold=0,
    )  # fmt: skip
    assert (folder / "weights.bin").stat().st_size > 0
    return path


def test_external_data_is_found_from_any_folder(run_cli, tracking_uri, tmp_path, monkeypatch):
    path = _external_data_model(tmp_path / "models")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not the model's folder
    code, out, err = run_cli(
        "benchmark", "--model", str(path), "--compiler", "onnxruntime", "--compiler",
        "openvino", "--batch-sizes", "2", "--warmup", "1", "--repetitions", "3",
        "--min-duration", "0", "--tracking-uri", tracking_uri,
    )  # fmt: skip
    assert code == 0, err
    rows = [r.split() for r in out.splitlines() if r.split() and r.split()[0].endswith(".onnx")]
    assert {row[1] for row in rows if "OK" in row} == {"onnxruntime", "openvino"}, out


def test_external_data_is_part_of_the_model_hash(tmp_path):
    path = _external_data_model(tmp_path)
    before = load_model(str(path), {}).content_hash
    weights = tmp_path / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[0] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert load_model(str(path), {}).content_hash != before


def test_missing_external_data_is_one_clear_error(tmp_path):
    import pytest

    from mlflow_ngraph.errors import NgraphError

    path = _external_data_model(tmp_path)
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(NgraphError, match="weights.bin.*does not exist"):
        load_model(str(path), {})
