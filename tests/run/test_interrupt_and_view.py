"""Ctrl-C ends a run cleanly (exit 130, journal intact, runs KILLED); without a terminal the
progress is one plain line per finished cell."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from mlflow_ngraph import faultpoint
from mlflow_ngraph.tracking import schema as S
from tests._support import PYTHON, REPO, TINY


def _as_from_a_terminal() -> None:
    """The benchmark starts as a terminal starts it, with SIGINT at its default: a suite run
    as a background job (or under nohup) passes SIGINT on ignored, and Python then leaves
    Ctrl-C to the OS, which ignores it (the run went on to its end, exit 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _measured(home: Path) -> int:
    """Results the journal holds: written as each arrives, before the store hears of it
    (on a busy host the store's writes can lag the measuring by the whole run)."""
    return sum(p.read_text().count('"measured"') for p in (home / "journals").glob("*.jsonl"))


def test_ctrl_c_ends_with_exit_130_and_the_same_command_resumes(tmp_path, tracking_uri):
    home = tmp_path / "home"
    uri = tracking_uri
    args = [PYTHON, "-m", "mlflow_ngraph", "benchmark", "--compiler", "identity",
            "--batch-sizes", "1,2", "--warmup", "1", "--repetitions", "3",
            "--min-duration", "0", "--experiment", "ctrlc", "--tracking-uri", uri,
            "--home", str(home)]  # fmt: skip
    for depth in range(1, 4):
        args += ["--model", f"conv_block:width=8,depth={depth},image_size=32"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # the run waits just after its first result is journaled until the interrupt lands, so
    # that it still has work left however fast or busy the host is
    (tmp_path / "gate").touch()
    held = {**env, faultpoint.ENV: f"journal_measured:hold={tmp_path / 'gate'}"}
    proc = subprocess.Popen(
        args, cwd=tmp_path, env=held, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True, preexec_fn=_as_from_a_terminal,
    )  # fmt: skip
    deadline = time.time() + 240
    while _measured(home) < 1 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted: run the same command to resume" in err
    assert "Traceback" not in err, err[-6000:]
    measured = _measured(home)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("ctrlc")
    runs = client.search_runs([exp.experiment_id])
    parent = next(r for r in runs if r.data.tags.get(S.T_ROLE) == "benchmark")
    assert parent.info.status == "KILLED"
    assert not [r for r in runs if r.info.status == "RUNNING"]

    result = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("(resumed)") >= measured


def test_without_a_terminal_each_finished_cell_is_one_line(run_cli, tracking_uri):
    code, out, err = run_cli(
        "benchmark", *TINY, "--compiler", "identity", "--compiler", "torchscript",
        "--tracking-uri", tracking_uri, "-q",
    )  # fmt: skip
    assert code == 0, err
    assert "2 cells to run; estimated time: about" in err and "batch size(s) to measure" in err
    assert err.count("estimated time") == 1  # one line says it
    # -q: the cells' lines and the opening, no log line and no machinery (the file has both)
    assert "log: " not in err and "compiling" not in err and "building or loading" not in err
    lines = [line for line in err.splitlines() if re.match(r"\[\d+/\d+\] ", line)]
    assert lines[0].startswith("[1/2] conv_block") and "identity" in lines[0]
    assert lines[1].startswith("[2/2] ") and "torchscript" in lines[1] and "bs2 " in lines[1]
    # named as its run is (model in short, the compiler), not by every resolved flag
    assert re.match(r"\[2/2\] conv_block( \S+)+ torchscript: ", lines[1]), lines[1]
