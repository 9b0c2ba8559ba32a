"""Resume: finished cells are skipped, a kill -9 loses nothing, no duplicate runs appear."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from mlflow_ngraph.tracking import schema as S
from tests._support import PYTHON, REPO, TINY, copy_empty_store, last_log


def _cell_runs(uri: str, experiment: str):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    return [r for r in runs if r.data.tags.get(S.T_ROLE) == "cell"], runs


def test_rerun_of_a_finished_indexed_spec_does_not_open_the_store(
    run_cli, tmp_path, monkeypatch, home, empty_store
):
    """Every cell logged and the results index written, nothing since: the re-run skips
    every finished cell (compiles nothing, creates no run, logs no metric again), answers
    from the journal (with speedups) and never opens the store with MLflow (the journal only
    checks, with sqlite itself, that the store is still the one it recorded)."""
    from mlflow_ngraph.tracking import mlflow_log

    uri = copy_empty_store(empty_store, tmp_path / "store.db")
    args = ["benchmark", *TINY, "--compiler", "identity", "--compiler", "torchscript",
            "--experiment", "fast", "--tracking-uri", uri]  # fmt: skip
    code, first, err = run_cli(*args)
    assert code == 0, err
    assert "compiling" in last_log(home)  # the log file holds what the second run lacks
    cells, runs = _cell_runs(uri, "fast")
    assert len(cells) == 2 and len(runs) == 3

    def never(*_args, **_kwargs):
        raise AssertionError("the store was opened")

    monkeypatch.setattr(mlflow_log, "connect", never)
    code, second, err = run_cli(*args)
    assert code == 0, err
    assert "compiling" not in last_log(home)
    assert second.count("(resumed)") == 4
    cells2, runs2 = _cell_runs(uri, "fast")
    assert sorted(r.info.run_id for r in runs2) == sorted(r.info.run_id for r in runs)
    # the throughput history has one value per batch size, not one per invocation
    history = MlflowClient(uri).get_metric_history(cells2[0].info.run_id, "throughput")
    assert len(history) == 2
    # the same table as the first run printed (speedups included), marked as resumed
    rows = [line.split() for line in second.splitlines() if "(resumed)" in line]
    # the rows (not the header, the counts or the winners)
    table = [line for line in first.split("\n\n")[0].splitlines() if line.startswith("conv_block")]
    assert [r[:-1] for r in rows] == [line.split() for line in table]
    assert all(float(r[7].rstrip("*")) > 0 for r in rows)  # speedup column, from the journal


def test_new_batch_size_extends_the_same_runs(run_cli, tracking_uri):
    base = [
        "benchmark",
        "--model",
        "conv_block:width=8,depth=1,image_size=32",
        "--compiler",
        "identity",
        "--warmup",
        "0",
        "--repetitions",
        "2",
        "--min-duration",
        "0",
        "--experiment",
        "extend",
        "--tracking-uri",
        tracking_uri,
    ]
    assert run_cli(*base, "--batch-sizes", "1")[0] == 0
    assert run_cli(*base, "--batch-sizes", "1,2")[0] == 0
    cells, _ = _cell_runs(tracking_uri, "extend")
    assert len(cells) == 1
    assert {"throughput.bs1", "throughput.bs2"} <= set(cells[0].data.metrics)


def _journal_logged(home: Path) -> int:
    total = 0
    for path in (home / "journals").glob("*.jsonl"):
        total += sum(1 for line in path.read_text().splitlines() if '"logged"' in line)
    return total


def test_kill_9_mid_run_then_resume_finishes_the_rest(tmp_path, tracking_uri):
    home = tmp_path / "home"
    uri = tracking_uri
    models = [f"conv_block:width=8,depth={d},image_size=32" for d in (1, 2, 3)]
    args = [
        PYTHON,
        "-m",
        "mlflow_ngraph",
        "benchmark",
        "--batch-sizes",
        "1,2",
        "--warmup",
        "1",
        "--repetitions",
        "3",
        "--min-duration",
        "0.3",
        "--compiler",
        "identity",
        "--compiler",
        "torchscript",
        "--experiment",
        "killed",
        "--tracking-uri",
        uri,
        "--home",
        str(home),
    ]
    for model in models:
        args += ["--model", model]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        args,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.time() + 240
    while _journal_logged(home) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = _journal_logged(home)
    assert 3 <= done_before < 12

    result = subprocess.run(
        args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    cells, runs = _cell_runs(uri, "killed")
    assert len(cells) == 6, [
        r.info.run_name for r in cells
    ]  # 3 models x 2 compilers, no duplicates
    for run in cells:
        assert {"throughput.bs1", "throughput.bs2"} <= set(run.data.metrics), run.info.run_name
        assert run.info.status == "FINISHED"
    assert result.stdout.count("(resumed)") >= done_before - 1
    journal = next((home / "journals").glob("*.jsonl")).read_text().splitlines()
    measured = [json.loads(line) for line in journal if '"measured"' in line]
    keys = {(m["cell"], m["batch_size"]) for m in measured}
    assert len(keys) == 12


def test_warm_engine_cache_skips_compilation_in_a_new_store(run_cli, tmp_path, home, empty_store):
    args = ["benchmark", *TINY, "--compiler", "onnxruntime", "--experiment", "cache"]
    first = copy_empty_store(empty_store, tmp_path / "first.db")
    second = copy_empty_store(empty_store, tmp_path / "second.db")
    assert run_cli(*args, "--tracking-uri", first)[0] == 0
    code, _, err = run_cli(*args, "--tracking-uri", second)
    assert code == 0, err
    assert "engine cache hit" in last_log(home) and "engine cache hit" not in err
    cells, _ = _cell_runs(second, "cache")
    ort = next(r for r in cells if r.data.params["compiler"] == "onnxruntime")
    assert ort.data.metrics["cache_hit.bs1"] == 1.0
    assert ort.data.metrics["cache_hit.bs2"] == 1.0


def test_mlflow_run_entry_point(tmp_path, tracking_uri):
    """`mlflow run . -e benchmark` from the repository root, as the README says, from a
    fresh shell (no virtual environment on PATH, so `python` is not the project's: the entry
    point runs with the interpreter of `mlflow run`), twice: the second resumes."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(
        PATH="/usr/bin:/bin",
        MLFLOW_TRACKING_URI=tracking_uri,
        MLFLOW_NGRAPH_HOME=str(tmp_path / "home"),
    )
    bin_dir = Path(PYTHON).parent
    command = [
        str(bin_dir / "mlflow"),
        "run",
        str(REPO),
        "-e",
        "benchmark",
        "--env-manager",
        "local",
        "--experiment-name",
        "project",
        "-P",
        "device=cpu",
        "-P",
        "models=conv_block:width=8,depth=1,image_size=32",
        "-P",
        "compilers=identity",
        "-P",
        "batch_sizes=1,2",
        "-P",
        "warmup=1",
        "-P",
        "repetitions=2",
        "-P",
        "min_duration=0",
    ]
    for _ in range(2):  # the second invocation resumes: nothing measured, its run still filled
        result = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert "No module named" not in result.stderr
        # the summary names the experiment the results are in
        assert "experiment 'project'" in result.stdout
    cells, runs = _cell_runs(env["MLFLOW_TRACKING_URI"], "project")
    assert len(cells) == 1
    # experiments the tool logs into open on the runs table in MLflow's UI
    experiment = MlflowClient(env["MLFLOW_TRACKING_URI"]).get_experiment_by_name("project")
    assert experiment.tags.get("mlflow.experimentKind") == "custom_model_development"
    first, second = sorted(
        (r for r in runs if r.data.tags.get("mlflow.project.entryPoint") == "benchmark"),
        key=lambda r: r.info.start_time,
    )
    assert cells[0].data.tags[S.T_PARENT] == first.info.run_id
    assert cells[0].data.metrics["throughput.bs2"] > 0
    assert second.data.params["device"] == "cpu"
    assert second.data.tags[S.T_INDEX_RUNS] == "1"


def test_relative_metrics_use_an_identity_measured_in_an_earlier_run(run_cli, tracking_uri):
    common = [*TINY, "--experiment", "later", "--tracking-uri", tracking_uri]
    assert run_cli("benchmark", *common, "--compiler", "torchscript")[0] == 0
    cells, _ = _cell_runs(tracking_uri, "later")
    assert "speedup.bs1" not in cells[0].data.metrics  # no baseline yet: nothing guessed
    assert "no identity baseline" in cells[0].data.tags["ngraph.relative"]
    assert run_cli("benchmark", *common, "--compiler", "identity")[0] == 0
    assert run_cli("benchmark", *common, "--compiler", "torchscript")[0] == 0
    cells, _ = _cell_runs(tracking_uri, "later")
    by_compiler = {r.data.params["compiler"]: r.data.metrics for r in cells}
    ts, ident = by_compiler["torchscript"], by_compiler["identity"]
    assert ts["speedup.bs2"] == ts["throughput.bs2"] / ident["throughput.bs2"]
    expected_bsr = (ts["throughput.bs2"] / (2 * ts["throughput.bs1"])) / (
        ident["throughput.bs2"] / (2 * ident["throughput.bs1"])
    )
    assert abs(ts["bsr.bs2"] - expected_bsr) < 1e-9
    history = MlflowClient(tracking_uri).get_metric_history(
        next(r for r in cells if r.data.params["compiler"] == "torchscript").info.run_id, "speedup"
    )
    assert sorted(m.step for m in history) == [1, 2]  # logged once per batch size


def test_the_same_relative_store_uri_in_two_directories_is_two_journals(tmp_path, monkeypatch):
    from mlflow_ngraph.tracking.journal import Journal

    home = tmp_path / "home"
    paths = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        paths.append(Journal.for_target(home, "sqlite:///mlflow.db", "e", "cpu").path)
    assert paths[0] != paths[1]
    absolute = f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}"
    assert Journal.for_target(home, absolute, "e", "cpu").path == paths[1]
