"""``mlflow-ngraph gate`` end to end, as a user runs it: tiny conv blocks on ONNX Runtime,
the challenger's worker in a second environment (a venv made here that reuses this one's
packages through a .pth file), one short gate shared by the checks; bad input in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from mlflow_ngraph.errors import NgraphError
from tests._support import PYTHON

MODEL = "conv_block:width=8,depth=1,image_size=32"
SPEC = f"{MODEL}@onnxruntime"


def gate(root: Path, *args: str, timeout: int = 300):
    env = {**os.environ, "MLFLOW_NGRAPH_HOME": str(root / "home")}
    command = [PYTHON, "-m", "mlflow_ngraph", "gate", "--tracking-uri", f"sqlite:///{root}/m.db"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=root
    )


@pytest.fixture(scope="module")
def other_python(tmp_path_factory) -> str:
    """A second environment: its own interpreter, this one's packages through a .pth."""
    pytest.importorskip("onnxruntime")
    venv = tmp_path_factory.mktemp("venv") / "other"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "main.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return str(venv / "bin" / "python")


@pytest.fixture(scope="module")
def aa(tmp_path_factory, other_python):
    """One A/A gate: the same spec on both sides, the challenger in the other venv."""
    root = tmp_path_factory.mktemp("gate")
    args = ["--champion", SPEC, "--challenger", SPEC, "--challenger-python", other_python]
    result = gate(root, *args, "--budget", "4s", "--format", "json")
    return root, other_python, result


def test_an_aa_gate_reports_its_verdict_as_its_exit_status(aa):
    _, _, result = aa
    report = json.loads(result.stdout)
    assert (
        result.returncode == {"faster": 0, "same": 0, "slower": 1, "unsure": 2}[report["verdict"]]
    ), result.stderr[-2000:]
    assert report["verdict"] != "slower"  # the same engine on both sides
    assert report["outputs"]["valid"] and report["rounds"] >= 6
    if report["low"] is None:  # too few undisturbed rounds on a busy host for an interval
        assert report["verdict"] == "unsure" and report["interval_kind"] is None
    else:
        assert report["low"] <= report["ratio"] <= report["high"]
    # MLflow's own store lines stay off the terminal; the log file is named on stderr
    assert "Creating initial MLflow database tables" not in result.stderr
    assert "-gate.log (every step" in result.stderr


def test_the_record_names_both_environments(aa):
    root, other_python, result = aa
    report = json.loads(result.stdout)
    assert report["challenger"]["versions"]["executable"] == other_python
    assert report["champion"]["versions"]["executable"] == sys.executable
    from mlflow.tracking import MlflowClient

    run = MlflowClient(f"sqlite:///{root}/m.db").get_run(report["run_id"])
    assert run.data.tags["ngraph.role"] == "gate"
    assert run.data.tags["ngraph.gate.verdict"] == report["verdict"]
    assert run.data.params["challenger.executable"] == other_python
    assert run.data.metrics["gate.ratio"] == pytest.approx(report["ratio"])
    # the record is signed as the benchmark's are, and names its run
    from mlflow_ngraph.keys import trusted_keys
    from mlflow_ngraph.tracking.provenance import verify_files

    client = MlflowClient(f"sqlite:///{root}/m.db")
    files = [Path(client.download_artifacts(run.info.run_id, name, str(root)))
             for name in ("gate.json", "gate.sig")]  # fmt: skip
    signed = verify_files(*files, trusted_keys(root / "home"), None, None)
    assert signed.record["run_id"] == run.info.run_id
    assert signed.record["verdict"] == report["verdict"]
    assert run.data.tags["ngraph.gate.signed_by"] == signed.signer.fingerprint
    edited = "slower" if report["verdict"] != "slower" else "faster"  # another verdict
    files[0].write_text(files[0].read_text().replace(report["verdict"], edited, 1))
    with pytest.raises(NgraphError, match="altered after signing"):
        verify_files(*files, trusted_keys(root / "home"), None, None)


def test_a_challenger_with_other_outputs_fails_whatever_its_speed(tmp_path):
    other = "conv_block:width=8,depth=2,image_size=32@onnxruntime"
    result = gate(tmp_path, "--champion", SPEC, "--challenger", other)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "\ninvalid: the challenger's outputs differ" in result.stdout
    assert "rounds" not in result.stdout  # not measured: it fails whatever its speed


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--champion", "models:/nope@cpu", "--challenger", SPEC], "models:/nope@cpu"),
        (
            ["--champion", SPEC, "--challenger", "conv_block:width=8,image_size=64@onnxruntime"],
            "a gate compares two engines of one model",
        ),
    ],
)
def test_bad_input_is_one_line_and_status_3(tmp_path, args, words):
    result = gate(tmp_path, *args)
    assert result.returncode == 3, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and words in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_a_gate_on_a_host_the_look_found_busy_reads_unsure_not_a_small_slowdown(
    tmp_path, monkeypatch
):
    """The look said busy and the gate measured anyway (--busy-ok): a planted 1.2x slowdown
    (ratio ~0.83, slower on a quiet host) reads unsure, with the host's load in its notes.
    The host's load is the one fake here: a busy host cannot be had on demand."""
    pytest.importorskip("onnxruntime")
    from mlflow_ngraph.gate.gate import GateSettings, run_gate
    from mlflow_ngraph.measure.quiet import HostCheck, HostLoad
    from mlflow_ngraph.variables import ENV_GATE_PLANTED_DELAY

    busy = HostLoad(other_percent=90.0, cores=2, load_avg=5.2, top=(("hog", 4242, 90.0),))
    check = HostCheck(25.0, busy_ok=True, sampler=lambda seconds: busy)
    monkeypatch.setenv(ENV_GATE_PLANTED_DELAY, "0.2")
    settings = GateSettings(
        SPEC, SPEC, f"sqlite:///{tmp_path}/m.db", tmp_path / "home", budget_s=4.0,
        host_check=check,
    )  # fmt: skip
    result = run_gate(settings, lambda line: None)
    from mlflow_ngraph.gate.verdict import decide

    if decide(result["low"], result["high"], 0.03) != "slower" or result["high"] < 0.75:
        seen = f"{result['low']:.3f}-{result['high']:.3f}"
        pytest.skip(f"the host's noise left the planted slowdown at {seen}: no small slower")
    assert result["verdict"] == "unsure", result
    (note,) = [n for n in result["notes"] if n.startswith("unsure, not slower")]
    assert "load 5.2, other processes 90% of the CPU: hog (pid 4242) 90%" in note
