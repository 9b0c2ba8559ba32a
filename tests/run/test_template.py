"""The workers' template (mlflow_ngraph/run/template.py): each cell's worker is a fork of a
process that imported PyTorch once per run, and still has the runner's environment, working
folder and fate (it dies with the runner), as a spawned worker had."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.run import template
from tests._support import PYTHON, REPO

pytestmark = pytest.mark.e2e  # starts the forkserver (it imports PyTorch)


@pytest.fixture
def fresh():
    template.stop()
    yield
    template.stop()


def test_a_fork_has_the_imports_and_the_environment_and_folder_of_the_moment(
    fresh, tmp_path, monkeypatch
):
    from tests.fixtures.probe import view

    template.context()
    server = template._server_pid()
    monkeypatch.setenv("NGRAPH_TEST_PROBE", "set after the template started")
    monkeypatch.chdir(tmp_path)
    seen = template.ask(view)
    assert seen["parent"] == server != os.getpid()
    assert seen["probe"] == "set after the template started"
    assert seen["cwd"] == str(tmp_path)
    assert seen["imported"] == ["torch", "numpy", "scipy.stats"]
    # the same template serves the next worker: no second import of PyTorch
    assert template.ask(view)["parent"] == server
    with pytest.raises(ValueError, match="asked to fail"):
        from tests.fixtures.probe import fails

        template.ask(fails)


def test_a_variable_read_at_import_starts_a_new_template(fresh, monkeypatch):
    from tests.fixtures.probe import torch_threads

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    template.context()
    first = template._server_pid()
    assert template.ask(torch_threads) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    template.context()
    assert template._server_pid() != first and not psutil.pid_exists(first)
    assert template.ask(torch_threads) == 2


def test_stop_leaves_no_template_behind(fresh):
    template.context()
    server = template._server_pid()
    template.stop()
    assert not template.running() and not psutil.pid_exists(server)


def test_spawn_is_the_other_way_and_anything_else_is_a_clear_error(fresh, monkeypatch):
    monkeypatch.setenv(template.WORKER_START_ENV, "spawn")
    assert template.start_method() == "spawn"
    assert template.context().get_start_method() == "spawn" and not template.running()
    monkeypatch.setenv(template.WORKER_START_ENV, "thread")
    with pytest.raises(NgraphError, match=r"_START='thread' .* forkserver or spawn"):
        template.start_method()


RUNNER = """
import sys, time
if __name__ == "__main__":
    from mlflow_ngraph.run import isolation
    from mlflow_ngraph.run import template
    from mlflow_ngraph.measure.settings import MeasureSettings
    from mlflow_ngraph.run.worker import CellTask

    spare = isolation._Spare()
    spare.conn.send(CellTask(
        name="cell", model_name="tests.fixtures.crashing:hanging", model_params={"input_shape": 4},
        compiler="identity", flags={}, batch_sizes=[1], device="cpu", device_kind="cpu",
        home=sys.argv[1], tolerance=1e-3, log_file=sys.argv[1] + "/worker.log",
        measure=MeasureSettings(warmup=1, repetitions=3, min_duration_s=0.1)))
    while True:  # let it through its gate: then it runs the model, which hangs
        kind, payload = spare.conn.recv()
        if kind == "gate":
            spare.conn.send(("prepare", payload))
            break
    time.sleep(2)  # in the model's forward by now, not reading its pipe
    print(spare.proc.pid, template._server_pid(), flush=True)
    time.sleep(300)
"""


def test_a_killed_runner_takes_the_template_and_its_busy_workers_with_it(tmp_path):
    """A worker in the middle of its cell (a model that hangs: it reads nothing from the
    runner) dies with the runner, as does the template."""
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runner = subprocess.Popen([PYTHON, str(script), str(tmp_path)], stdout=subprocess.PIPE,
                              text=True, env=env)  # fmt: skip
    try:
        worker, server = map(int, runner.stdout.readline().split())
        assert psutil.Process(worker).ppid() == server
        assert psutil.Process(server).ppid() == runner.pid
        runner.send_signal(signal.SIGKILL)
        runner.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(map(_running, (worker, server))):
            time.sleep(0.1)
        assert not _running(worker) and not _running(server)
    finally:
        runner.kill()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_run_records_how_its_workers_started_and_its_runner_never_imports_torch(
    tmp_path, tracking_uri
):
    """The runner plans, logs and coordinates; PyTorch is the workers' (forks of the
    template), and the environment record's thread counts are asked of a fork."""
    uri = tracking_uri
    args = ["benchmark", "--model", "conv_block:width=8,depth=1,image_size=32",
            "--batch-sizes", "1", "--warmup", "1", "--repetitions", "3", "--min-duration", "0",
            "--tracking-uri", uri, "--home", str(tmp_path / "home"), "--compiler", "identity",
            "-q"]  # fmt: skip
    code = (
        "import sys\n"
        "from mlflow_ngraph.run import template\n"
        "from mlflow_ngraph.commands.cli import main\n"
        "try:\n"
        f"    main({args!r})\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print('torch' in sys.modules, template.running())\n"
    )
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "False False"  # and the run ended its template
    import mlflow

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    tags = next(r.data.tags for r in runs if "env.worker_start" in r.data.tags)
    assert tags["env.worker_start"] == "forkserver"
    threads = subprocess.run([PYTHON, "-c", "import torch; print(torch.get_num_threads())"],
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
    assert tags["env.torch_num_threads"] == threads
