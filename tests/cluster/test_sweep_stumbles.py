"""What a user meets at the edges of a sweep: Ray not installed, a SIGTERM mid-sweep, and
the progress written to a log rather than a terminal."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import yaml

from mlflow_ngraph.cluster.spec import parse_sweep
from mlflow_ngraph.cluster.sweep import DeviceState, SweepOutcome, progress, progress_lines
from tests._support import PYTHON, REPO

TINY = {"name": "conv_block", "params": {"width": 8, "depth": 1, "image_size": 32}}
SPEC = {
    "experiment": "stumbles",
    "devices": [{"name": "cpu-a", "profile": "cpu"}, {"name": "cpu-b", "profile": "cpu"}],
    "models": [TINY],
    "compilers": ["identity", "torchscript"],
    "batch_sizes": [1],
    "warmup": 1,
    "repetitions": 3,
    "min_duration": 0.05,
}

#: the sweep command, with ``import ray`` failing as it does where Ray is not installed
WITHOUT_RAY = (
    "import sys; sys.modules['ray'] = None; "
    "from mlflow_ngraph.commands.cli import main; main(sys.argv[1:])"
)


def test_without_ray_the_sweep_says_which_extra_to_install(tmp_path):
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(SPEC))
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_NGRAPH_HOME": str(tmp_path / "h")}
    done = subprocess.run(
        [PYTHON, "-c", WITHOUT_RAY, "sweep", str(tmp_path / "sweep.yaml"), "--local"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Ray" in lines[0] and "pip install 'mlflow-ngraph[cluster]'" in lines[0]


def _cell(client, exp: str, device: str, name: str, status: str) -> None:
    run = client.create_run(exp, run_name=name,
                            tags={"ngraph.role": "cell", "ngraph.device": device})  # fmt: skip
    client.set_terminated(run.info.run_id, status)


def test_in_a_log_each_finished_cell_is_one_line_not_the_table_again(tracking_uri):
    from mlflow_ngraph.tracking import mlflow_log as ml

    sweep = parse_sweep(SPEC)
    outcome = SweepOutcome("s", {d.name: DeviceState(d) for d in sweep.devices})
    for state in outcome.states.values():
        state.state, state.started = "running", time.time() - 30
    client = ml.connect(tracking_uri)
    exp = client.create_experiment("stumbles")
    first = progress(tracking_uri, sweep)
    shown = (first, [(s.state, s.reason) for s in outcome.states.values()])
    assert progress_lines(outcome, {}, first, None) == ["cpu-a: running", "cpu-b: running"]

    _cell(client, exp, "cpu-a", "conv_block/identity", "FINISHED")
    second = progress(tracking_uri, sweep)
    lines = progress_lines(outcome, first, second, shown)
    assert len(lines) == 1, lines
    assert lines[0].startswith("[cpu-a 1/2] conv_block/identity finished (")
    assert "elapsed" in lines[0] and "left" in lines[0]
    # nothing new: nothing written (a log grows by what happened, not every half minute)
    assert progress_lines(outcome, second, progress(tracking_uri, sweep), shown) == []

    _cell(client, exp, "cpu-a", "conv_block/torchscript", "FINISHED")
    outcome.states["cpu-a"].state = "done"
    third = progress(tracking_uri, sweep)
    lines = progress_lines(outcome, second, third, shown)
    assert lines == [lines[0], "cpu-a: done"]
    assert lines[0].startswith("[cpu-a 2/2] conv_block/torchscript finished")


def test_a_sigterm_stops_the_sweep_cleanly_and_says_how_to_resume(tmp_path, tracking_uri):
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({**SPEC, "devices": SPEC["devices"][:1]}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_NGRAPH_HOME": str(tmp_path / "h"),
           "MLFLOW_TRACKING_URI": tracking_uri}  # fmt: skip
    proc = subprocess.Popen(
        [PYTHON, "-m", "mlflow_ngraph", "sweep", str(tmp_path / "sweep.yaml"), "--local"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out = ""
    deadline = time.time() + 180
    while "sweep " not in out and time.time() < deadline and proc.poll() is None:
        out += proc.stdout.readline()  # the first line is written once Ray is up
    assert proc.poll() is None, "the sweep ended before it could be stopped"
    proc.send_signal(signal.SIGTERM)
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted: run the same command to resume" in err
    for dump in ("SIGTERM received", "*** ", "Traceback", "@ 0x"):
        assert dump not in err + rest, err[-3000:]
