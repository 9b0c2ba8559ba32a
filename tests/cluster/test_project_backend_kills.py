"""``mlflow run . -e benchmark --backend ngraph-ray``: waited on, cancelled, its client and
its driver killed with ``kill -9``; the same command resumes each into the same project run,
nothing measured twice, nothing left running (a file of its own: under ``--dist loadscope``
a file is one unit of work, and these are the backend's longest tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from mlflow_ngraph import faultpoint
from tests._support import REPO, running
from tests.cluster.test_project_backend import (  # noqa: F401 (in_store: a fixture)
    DEVICES,
    LONGER,
    _assert_nested_once,
    _backend_config,
    _client,
    _command,
    _env,
    _release,
    _runs,
    in_store,
)
from tests.cluster.test_sweep_local import _descendants


# --- wait, status, cancel, synchronous: false --------------------------------------------------
def _first_result(tmp: Path, timeout: float = 480) -> None:
    """Wait until a cell has logged a result (and not every cell is done)."""
    deadline = time.time() + timeout
    while True:
        try:
            logged = [r for r in _runs(tmp, "cell") if "throughput.bs1" in r.data.metrics]
        except Exception:  # the store is being created by a device's benchmark
            logged = []
        if logged:
            return
        assert time.time() < deadline, f"no result logged in time: {_said(tmp)}"
        time.sleep(0.5)


def _unfinished(tmp: Path) -> bool:
    return any(r.info.status != "FINISHED" for r in _runs(tmp, "cell"))


def _said(tmp: Path) -> str:
    """What the client and the driver printed (the end of it)."""
    logs = [tmp / "client.out", *(tmp / "home" / "projects").glob("*/driver.log")]
    return "\n".join(p.read_text()[-2000:] for p in logs if p.exists())


def test_wait_status_and_cancel_then_the_same_run_resumes(tmp_path, in_store, monkeypatch):  # noqa: F811
    from mlflow_ngraph.cluster.backend import RayBackend

    uri, experiment_id = in_store
    monkeypatch.setenv(faultpoint.ENV, _env(tmp_path, held=True)[faultpoint.ENV])
    backend = RayBackend()
    started = time.time()
    submitted = backend.run(str(REPO), "benchmark", dict(LONGER), None,
                            _backend_config(synchronous=False), uri, experiment_id)  # fmt: skip
    assert time.time() - started < 120  # back once the device's task is submitted
    assert submitted.get_status() == "RUNNING"
    _first_result(tmp_path)
    submitted.cancel()
    assert submitted.get_status() == "KILLED"
    assert not submitted.wait()
    project = _client(tmp_path).get_run(submitted.run_id)
    assert project.info.status == "KILLED"
    cells = _runs(tmp_path, "cell")
    assert cells and len([r for r in cells if r.info.status == "FINISHED"]) < 3
    assert not [r for r in cells if r.info.status == "RUNNING"], "a cell was left RUNNING"
    _release(tmp_path)
    monkeypatch.delenv(faultpoint.ENV)
    # the same run again: into the same project run, the rest measured, nothing twice
    again = backend.run(str(REPO), "benchmark", dict(LONGER), None,
                        _backend_config(synchronous=True), uri, experiment_id)  # fmt: skip
    assert again.run_id == submitted.run_id
    assert again.wait() and again.get_status() == "FINISHED"
    _assert_nested_once(tmp_path, {"xeon-a": 3})


# --- kill -9 of the client ---------------------------------------------------------------------
def _make_store(tmp: Path) -> None:
    """The experiment, made in the store (``tracking_uri``, the one :func:`_env` names)
    before a command that the test watches the store of: two processes creating one sqlite
    store's tables at once break one of them."""
    _client(tmp).create_experiment("backend-test")


def test_a_client_killed_with_kill_9_is_picked_up_by_the_same_command(tmp_path, tracking_uri):
    _make_store(tmp_path)
    config = {"local": True, "devices": DEVICES[:1]}
    command = _command(config, LONGER)
    with open(tmp_path / "client.out", "w") as out:
        client = subprocess.Popen(command, cwd=tmp_path, env=_env(tmp_path, held=True),
                                  stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    _first_result(tmp_path)
    client.send_signal(signal.SIGKILL)
    client.wait()
    assert len(_runs(tmp_path, "cell")) < 3 or _unfinished(tmp_path), "nothing left to pick up"
    _release(tmp_path)  # the driver goes on without its client
    done = subprocess.run(command, cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    _assert_nested_once(tmp_path, {"xeon-a": 3})


def _living(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (a zombie waiting for its parent is not)."""
    return {p for p in pids if running(p)}


def test_a_driver_killed_with_kill_9_leaves_nothing_running_and_the_same_command_resumes(
    tmp_path, tracking_uri
):
    from mlflow_ngraph.cluster.driver import Driver

    _make_store(tmp_path)
    command = _command({"local": True, "devices": DEVICES[:1]}, LONGER)
    with open(tmp_path / "client.out", "w") as out:  # the client follows the driver
        client = subprocess.Popen(command, cwd=tmp_path, env=_env(tmp_path, held=True),
                                  stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    _first_result(tmp_path)
    (directory,) = (tmp_path / "home" / "projects").iterdir()
    pid = Driver(directory).state()["pid"]
    started = _descendants(pid) - {pid}  # the local cluster's processes, the device's work
    assert len(started) > 3, started
    os.kill(pid, signal.SIGKILL)  # the driver alone, as `kill -9 <pid>` does
    assert client.wait(timeout=120) != 0
    said = (tmp_path / "client.out").read_text()
    line = next((ln for ln in said.splitlines() if "died before it finished" in ln), said[-2000:])
    assert f"pid {pid}" in line and "run the same command again to resume" in line, line
    deadline = time.time() + 15  # the reaper: SIGTERM, then SIGKILL 3 s later
    while _living(started) and time.time() < deadline:
        time.sleep(0.5)
    left = _living(started)
    assert not left, subprocess.run(["ps", "-o", "pid,pgid,etime,args", "-p",
                                     ",".join(map(str, left))], capture_output=True,
                                    text=True).stdout  # fmt: skip
    _release(tmp_path)
    done = subprocess.run(command, cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    _assert_nested_once(tmp_path, {"xeon-a": 3})
