"""``mlflow-ngraph tune`` end to end on a tiny model, real compilers and a real store: its
trials are cells under the tune's run that ``compare`` reads, the winner is registered,
a crashing candidate is a failed trial, unmeetable constraints are one line, a ``kill -9``
resumes, and the MLproject entry point runs from a fresh shell."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests._support import PYTHON, REPO, copy_empty_store

MODEL = "conv_block:width=8,depth=1,image_size=32"
EXPERIMENT = "tuned"


def tune_args(uri: str, home: Path, *extra: str) -> list[str]:
    return [
        PYTHON, "-m", "mlflow_ngraph", "tune", "--model", MODEL, "--batch-sizes", "1",
        "--experiment", EXPERIMENT, "--tracking-uri", uri, "--home", str(home),
        "--finalists", "2", *extra,
    ]  # fmt: skip


def run(args: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def measured_records(home: Path) -> list[dict]:
    out = []
    for path in (home / "journals").glob("*.jsonl"):
        out += [json.loads(line) for line in path.read_text().splitlines() if '"measured"' in line]
    return out


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, empty_store):
    """One tune, as the MLproject's entry point from a fresh shell (no virtualenv on PATH,
    no PYTHONPATH): ONNX Runtime and TorchScript, four trials, the winner registered."""
    tmp = tmp_path_factory.mktemp("tune")
    uri = copy_empty_store(empty_store, tmp / "mlflow.db")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(PATH="/usr/bin:/bin", MLFLOW_TRACKING_URI=uri, MLFLOW_NGRAPH_HOME=str(tmp / "home"))
    # the experiment's artifacts in the test's folder (by default ./mlruns of the project)
    MlflowClient(uri).create_experiment(EXPERIMENT, artifact_location=(tmp / "art").as_uri())
    command = [
        str(Path(PYTHON).parent / "mlflow"), "run", str(REPO), "-e", "tune",
        "--env-manager", "local", "--experiment-name", EXPERIMENT, "-P", f"model={MODEL}",
        "-P", "compilers=onnxruntime torchscript", "-P", "batch_sizes=1", "-P", "trials=4",
        "-P", "register=tiny-conv",
    ]  # fmt: skip
    result = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True,
                            timeout=900)  # fmt: skip
    return result, uri, tmp


def test_a_tune_ends_with_its_table_its_winner_and_a_spec(tuned):
    result, _, _ = tuned
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "[tune] 2 of 4 trial(s) | bs1" in out and "[tune] 4 of 4 trial(s)" in out
    assert "winner: " in out and " over eager" in out
    assert any(w in out for w in ("beyond noise", "beyond this run's noise", "tie within noise",
                                  "not judged"))  # fmt: skip
    assert "stability" in out and "phase" in out and "finalist" in out
    assert "speedup [95%]" in out and "payback" in out
    assert "Pareto front" in out
    fragment = out[out.index("the winner as a spec") :]
    assert "compilers:" in fragment and "batch_sizes:" in fragment
    assert "stopped by --trials" in out
    assert "registered tiny-conv version 1" in out


def test_every_trial_is_a_cell_under_the_tune_run(tuned):
    result, uri, _ = tuned
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    [parent] = client.search_runs([experiment.experiment_id], "tags.`ngraph.role` = 'tune'")
    assert parent.info.status == "FINISHED"
    tags = parent.data.tags
    # the project run is the tune run: its trials nest under it
    assert tags.get("mlflow.project.entryPoint") == "tune"
    assert tags["ngraph.tune.winner"].split("{")[0] in ("onnxruntime", "torchscript")
    lead = tags["ngraph.tune.lead"]
    leads = ("beyond noise", "beyond this run's noise", "tie within noise")
    assert lead in leads or lead.startswith("not judged: "), lead
    assert "winner:" in tags["mlflow.note.content"]
    cells = client.search_runs([experiment.experiment_id], "tags.`ngraph.role` = 'cell'")
    assert cells and all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in cells)
    assert all(c.data.tags["ngraph.tune"] == parent.info.run_id for c in cells)
    assert tags["ngraph.tune.winner_run"] in {c.info.run_id for c in cells}
    compilers = {c.data.params["compiler"] for c in cells}
    assert compilers == {"identity", "onnxruntime", "torchscript"}
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"trials.json", "summary.txt", "winner.yaml", "pareto_front.png"} <= artifacts
    trials = json.loads(
        Path(client.download_artifacts(parent.info.run_id, "trials.json")).read_text()
    )
    assert sum(t["stage"] == "search" for t in trials) == 4
    assert all(t["run_id"] for t in trials)
    # payback: logged on every compiled cell whose engine was built in its run
    built = [c for c in cells if c.data.params["compiler"] != "identity"]
    assert any("payback_inferences.bs1" in c.data.metrics for c in built)


def test_compare_reads_the_trials_like_any_cell(tuned):
    _, uri, tmp = tuned
    result = run(
        [PYTHON, "-m", "mlflow_ngraph", "compare", "-e", EXPERIMENT, "--tracking-uri", uri,
         "--format", "json"],
        tmp,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(result.stdout)
    rows = data if isinstance(data, list) else data["cells"]
    assert {r["compiler"].split("[")[0] for r in rows} >= {"onnxruntime", "torchscript"}


def test_the_winner_is_registered_with_the_device_alias(tuned):
    _, uri, _ = tuned
    client = MlflowClient(uri, registry_uri=uri)
    version = client.get_model_version_by_alias("tiny-conv", "cpu")
    assert version.tags["model"].startswith("conv_block")
    assert version.tags["batch_size"] == "1"


def test_a_candidate_that_fails_to_compile_is_a_failed_trial_and_the_search_goes_on(
    tmp_path, tracking_uri
):
    uri = tracking_uri
    args = tune_args(
        uri, tmp_path / "home", "--compiler", "openvino:device=NO_SUCH_DEVICE",
        "--compiler", "onnxruntime", "--trials", "4",
    )  # fmt: skip
    result = run(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "failed or invalid trials (never chosen)" in result.stdout
    assert "FAILED" in result.stdout
    assert "winner: onnxruntime" in result.stdout


def test_unmeetable_constraints_are_one_line_naming_the_closest_candidate(tmp_path, tracking_uri):
    uri = tracking_uri
    args = tune_args(
        uri, tmp_path / "home", "--compiler", "onnxruntime", "--trials", "1",
        "--per-group", "1", "--max-latency-ms", "0.000001",
    )  # fmt: skip
    result = run(args, tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: no configuration meets the constraints: the closest")
    assert "against --max-latency-ms" in lines[-1] and "over)" in lines[-1]
    assert "Traceback" not in result.stderr


def test_a_tune_killed_with_kill_9_is_resumed_by_two_copies_one_after_the_other(
    tmp_path, tracking_uri
):
    """A tune killed in its second group, then the same command twice at once (1 s apart):
    one copy resumes it (nothing measured twice), the other says it waits, then takes what
    the first left; one winner, never tied with itself; every trial, group and cell in the
    journals once; the groups measured before the kill keep their identity reference."""
    home = tmp_path / "home"
    uri = tracking_uri
    args = tune_args(uri, home, "--compiler", "onnxruntime", "--trials", "4")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None:
        # the first group is measured (identity + two trials): kill in the second
        if len(measured_records(home)) >= 3 if (home / "journals").exists() else False:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the tune ended before it could be killed"
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {(m["cell"], m["batch_size"]) for m in measured_records(home)}

    first = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(1.0)
    second = run(args, tmp_path)
    out, err = first.communicate(timeout=900)
    assert first.returncode == 0, err[-3000:]
    assert second.returncode == 0, second.stderr[-3000:]
    said = out + second.stdout
    assert "[tune] resuming:" in said
    assert "another copy of this tune is running" in said, said[-2000:]
    keys = [(m["cell"], m["batch_size"]) for m in measured_records(home)]
    assert len(keys) == len(set(keys)), "a trial was measured twice"
    assert before <= set(keys)
    (journal,) = (home / "tunes").glob("*.jsonl")
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    numbers = [r["number"] for r in lines if r["kind"] == "trial"]
    assert len(numbers) == len(set(numbers)), numbers
    spent = [r["group"] for r in lines if r["kind"] == "spent"]
    assert len(spent) == len(set(spent)), spent  # each group's seconds count once

    def winner(text):
        return [line for line in text.splitlines() if line.startswith("winner: ")]

    assert winner(out) == winner(second.stdout) and len(winner(out)) == 1
    (line,) = winner(out)
    label = line[len("winner: ") : line.index(" at bs")]
    assert f"with {label} (" not in line, line  # never a tie with itself
    # the copy that waited resumed exactly the trials asked, each once
    waited = second.stdout if "another copy" in second.stdout else out
    assert f"[tune] resuming: {len(numbers)} trial(s)" in waited
    # the groups measured before the kill keep their identity reference: their trials'
    # paybacks (and latency ratios) are still computed
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    [parent] = client.search_runs([experiment.experiment_id], "tags.`ngraph.role` = 'tune'")
    table = json.loads(Path(client.download_artifacts(parent.info.run_id, "trials.json",
                                                      str(tmp_path))).read_text())  # fmt: skip
    group0 = [t for t in table if t["group"] == 0 and t["status"] == "OK" and t["compile_s"]]
    assert group0 and all(t["payback_inferences"] is not None for t in group0), group0
