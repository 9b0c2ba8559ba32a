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
