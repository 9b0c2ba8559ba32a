"""Every output is checked, each with an absolute and a relative tolerance (Polygraphy's
``|out - ref| <= atol + rtol * |ref|``), against a reference the run names."""

from __future__ import annotations

import numpy as np
import torch
from mlflow.tracking import MlflowClient

from mlflow_ngraph.run.worker import compare_outputs
from mlflow_ngraph.tracking import schema as S
from tests._support import cell_runs

REF = (np.array([1.0, -2.0, 4.0], np.float32), np.array([0.5, 0.25], np.float32))


def test_every_output_is_compared_and_the_worst_is_reported():
    same = compare_outputs(tuple(r.copy() for r in REF), REF, 1e-3)
    assert same.valid and same.max_abs_error == 0 and len(same.per_output) == 2
    perturbed = (REF[0].copy(), REF[1] + np.float32(0.1))  # only the second output is off
    check = compare_outputs(perturbed, REF, 1e-3)
    assert not check.valid and "output 1 differs" in check.reason
    assert "output 0" not in check.reason
    assert np.isclose(check.max_abs_error, 0.1) and np.isclose(check.per_output[1][0], 0.1)
    assert check.metrics()[S.output_key(S.M_MAX_ABS_ERROR, 1)] == check.per_output[1][0]
    assert check.metrics()[S.M_OUTPUTS_CHECKED] == 2.0


def test_absolute_and_relative_tolerances_elementwise():
    ref = np.array([100.0, 0.01], np.float32)
    out = np.array([100.5, 0.0105], np.float32)
    assert not compare_outputs(out, ref, 1e-3, atol=0.0, rtol=1e-3).valid  # 0.5 > 0.1
    assert compare_outputs(out, ref, 1e-2, atol=0.0, rtol=0.06).valid  # 0.5 <= 6, 5e-4 <= 6e-4
    assert not compare_outputs(out, ref, 1e-2, atol=0.0, rtol=0.04).valid  # 5e-4 > 4e-4
    assert compare_outputs(out, ref, 1e-2, atol=0.6, rtol=0.0).valid
    # the default: tolerance x the largest reference magnitude, as --tolerance alone did
    assert compare_outputs(out, ref, 1e-2).valid and not compare_outputs(out, ref, 1e-3).valid
    assert not compare_outputs(out[:1], ref, 1.0).valid  # a shape mismatch never passes
    assert not compare_outputs((out, out), ref, 1.0).valid  # nor a count mismatch


def test_a_two_output_model_through_onnxruntime_and_openvino(run_cli, tracking_uri, tmp_path):
    from tests.fixtures.multi_output import two_heads

    path = tmp_path / "two.onnx"
    torch.onnx.export(
        two_heads(), (torch.zeros(1, 4),), str(path), dynamo=False, input_names=["x"],
        output_names=["a", "b"], dynamic_axes={"x": {0: "batch"}},
    )  # fmt: skip
    code, out, err = run_cli(
        "benchmark", "--model", str(path), "--compiler", "onnxruntime", "--compiler",
        "openvino", "--batch-sizes", "2", "--warmup", "1", "--repetitions", "3",
        "--min-duration", "0", "--experiment", "two", "--tracking-uri", tracking_uri,
        "--isolation", "none",
    )  # fmt: skip
    assert code == 0, err
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("two")
    cells = [
        r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get(S.T_ROLE) == "cell"
    ]
    assert {r.data.params["compiler"] for r in cells} == {"onnxruntime", "openvino"}
    for run in cells:
        metrics = run.data.metrics

        def at_bs2(name, run=run):  # diagnostics are stepped by batch size, not flat
            history = client.get_metric_history(run.info.run_id, name)
            return {m.step: m.value for m in history}.get(2)

        assert at_bs2("outputs_checked") == 2.0, run.data.params["compiler"]
        for i in (0, 1):
            assert at_bs2(S.output_key(S.M_COSINE, i)) is not None
        assert metrics["valid.bs2"] == 1.0
        assert run.data.tags[S.T_REFERENCE] == "onnxruntime-no-optimizations"
        runtime = {k for k in run.data.params if k.startswith("runtime.bs2.")}
        assert runtime, run.data.params  # what the runtime chose, per batch size


HEADS = "mlflow_ngraph.models.blocks:heads_block:input_shape=3x16x16"


def test_three_outputs_of_different_shapes_are_valid_through_every_cpu_compiler(
    run_cli, tracking_uri
):
    """Every engine returns every output, in order: TVM returned only the first (INVALID)."""
    compilers = ["identity", "torchscript", "onnxruntime", "openvino", "tvm:trials=0"]
    code, out, err = run_cli(
        "benchmark", "--model", HEADS, *(a for c in compilers for a in ("--compiler", c)),
        "--batch-sizes", "2", "--warmup", "1", "--repetitions", "3", "--min-duration", "0",
        "--experiment", "heads", "--tracking-uri", tracking_uri, "--isolation", "none",
    )  # fmt: skip
    assert code == 0, err
    client = MlflowClient(tracking_uri)
    cells = {r.data.params["compiler"]: r for r in cell_runs(tracking_uri, "heads")}
    assert set(cells) == {c.split(":")[0] for c in compilers}
    for name, run in cells.items():
        assert run.data.metrics["valid.bs2"] == 1.0, (name, run.data.tags)
        if name != "identity":  # the reference itself is not checked against itself
            checked = client.get_metric_history(run.info.run_id, "outputs_checked")
            assert {m.step: m.value for m in checked}[2] == 3.0, name
