"""A tracking server that dies mid-run loses no measured result: measuring goes on into the
journal, and what it holds is sent exactly once when the server is back (by the same run on
its next contact, by the same command again, or by ``mlflow-ngraph sync``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
from mlflow.tracking import MlflowClient

from mlflow_ngraph.tracking import mlflow_log as ml
from mlflow_ngraph.tracking import schema as S
from tests._support import PYTHON, REPO, TINY, copy_empty_store, free_port, last_log


def _start_server(tmp: Path, port: int) -> subprocess.Popen:
    mlflow = str(Path(PYTHON).parent / "mlflow")
    proc = subprocess.Popen(
        [
            mlflow,
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{tmp / 'server.db'}",
            "--artifacts-destination",
            str(tmp / "artifacts"),
        ],
        cwd=tmp,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok:
                return proc
        except requests.RequestException:
            time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError("mlflow server did not start")


def _logged(home: Path) -> int:
    return sum(p.read_text().count('"logged"') for p in (home / "journals").glob("*.jsonl"))


# --- the run goes on while the server is down -----------------------------------------------
def _bench_args(uri: str, home: Path, depths=(1, 2, 3, 4), min_duration="0.3") -> list[str]:
    args = [PYTHON, "-m", "mlflow_ngraph", "benchmark", "--compiler", "identity",
            "--batch-sizes", "1,2", "--warmup", "1", "--repetitions", "3",
            "--min-duration", min_duration, "--experiment", "down", "--tracking-uri", uri,
            "--home", str(home)]  # fmt: skip
    for depth in depths:
        args += ["--model", f"conv_block:width=8,depth={depth},image_size=32"]
    return args


class _Stderr:
    """A process's stderr lines as they come, each with the time it was read."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc) -> None:
        for line in proc.stderr:
            self.lines.append((time.time(), line))

    def text(self) -> str:
        self._thread.join(timeout=10)
        return "".join(line for _, line in self.lines)

    def first(self, needle: str) -> float | None:
        return next((t for t, line in self.lines if needle in line), None)


def _journal_records(home: Path, kind: str) -> list[dict]:
    out = []
    for path in (home / "journals").glob("*.jsonl"):
        out += [json.loads(x) for x in path.read_text().splitlines() if f'"kind": "{kind}"' in x]
    return out


def _bench_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_TRACKING_URI"):  # fmt: skip
        env.pop(name, None)  # the tool's own bounds (mlflow_log.HTTP_LIMITS) are under test
    return env


def _run_until_server_killed(tmp_path: Path, port: int, home: Path, server, after: int):
    """Start the 4-cell benchmark, kill the server once ``after`` results are logged; the
    benchmark process and its stderr reader, and when the server was killed."""
    bench = subprocess.Popen(
        _bench_args(f"http://127.0.0.1:{port}", home), cwd=tmp_path, env=_bench_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    err = _Stderr(bench)
    deadline = time.time() + 300
    while _logged(home) < after and time.time() < deadline and bench.poll() is None:
        time.sleep(0.05)
    assert bench.poll() is None, "the run finished before the server could be killed"
    os.killpg(server.pid, signal.SIGKILL)
    killed_at = time.time()
    server.wait()
    return bench, err, killed_at


def _cells(uri: str) -> list:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("down")
    runs = client.search_runs([exp.experiment_id])
    return [r for r in runs if r.data.tags.get(S.T_ROLE) == "cell"]


def _assert_complete_and_once(uri: str, cells: int = 4) -> None:
    """Every cell run holds every result, each metric once per batch size, and is done."""
    client = MlflowClient(uri)
    runs = _cells(uri)
    assert len(runs) == cells, [r.info.run_name for r in runs]
    for run in runs:
        name = run.info.run_name
        assert run.info.status == "FINISHED", (name, run.info.status)
        assert run.data.tags[S.T_STATUS] == "OK", name
        assert run.data.tags["mlflow.parentRunId"], name
        assert run.data.params["compiler"] == "identity", name
        keys = {"throughput.bs1", "throughput.bs2", "speedup.bs2", "rtr.bs2"}
        assert keys <= set(run.data.metrics), (name, sorted(run.data.metrics))
        assert run.data.tags[f"{S.T_STATUS}.bs2"] == "OK", name
        for key in run.data.metrics:
            steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            assert len(steps) == len(set(steps)), (name, key, steps)


def _offline_run(tmp_path: Path):
    """A 4-cell run whose server is killed after 2 logged results: it measures every cell
    into the journal and ends with one line; returns (port, home, server-kill-to-warning s)."""
    port = free_port()
    home = tmp_path / "home"
    server = _start_server(tmp_path, port)
    bench, err, killed_at = _run_until_server_killed(tmp_path, port, home, server, after=2)
    bench.wait(timeout=600)
    text = err.text()
    assert bench.returncode == 3, text[-3000:]  # StoreAway: the results wait in the journal
    assert "Traceback" not in text
    assert text.count("is unreachable") == 1, text[-3000:]
    said_at = err.first("is unreachable")
    last = text.strip().splitlines()[-1]
    assert "did not answer again" in last and "wait in the journal" in last, last
    assert "mlflow-ngraph sync" in last
    measured = {(r["cell"], r["batch_size"]) for r in _journal_records(home, "measured")}
    assert len(measured) == 8  # every cell measured, the server down or not
    print(f"server killed -> unreachable warning: {said_at - killed_at:.1f} s")
    assert said_at - killed_at < 30, said_at - killed_at
    return port, home, said_at - killed_at


@pytest.fixture(scope="module")
def offline(tmp_path_factory, empty_store):
    """One outage run for the tests below (the folder it ran in, its server's port): each
    test sends what its journal holds from a copy of the folder, to a server started again
    on the same port (the journal belongs to the store's address)."""
    folder = tmp_path_factory.mktemp("offline")
    copy_empty_store(empty_store, folder / "server.db")  # the server's store, made
    port, _, _ = _offline_run(folder)
    return folder, port


def _copy_of(offline, tmp_path: Path) -> tuple[int, Path]:
    """This test's copy of the outage run's server store, artifacts and home (the folder)."""
    folder, port = offline
    copy = tmp_path / "outage"
    copy.mkdir()
    for name in ("server.db", "artifacts", "home"):
        source = folder / name
        if source.is_dir():
            shutil.copytree(source, copy / name)
        elif source.exists():
            shutil.copy2(source, copy / name)
    return port, copy


def test_server_killed_mid_run_measuring_goes_on_and_a_rerun_sends_each_result_once(
    tmp_path, offline
):
    port, copy = _copy_of(offline, tmp_path)
    home = copy / "home"
    uri = f"http://127.0.0.1:{port}"
    server = _start_server(copy, port)
    try:
        result = subprocess.run(
            _bench_args(uri, home), cwd=tmp_path, env=_bench_env(), capture_output=True,
            text=True, timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        assert len(_journal_records(home, "measured")) == 8  # nothing measured again
        assert "compiling" not in last_log(home)
        _assert_complete_and_once(uri)
    finally:
        os.killpg(server.pid, signal.SIGKILL)


def test_server_killed_mid_run_then_sync_sends_each_result_once(tmp_path, run_cli, offline):
    port, copy = _copy_of(offline, tmp_path)
    home = copy / "home"
    uri = f"http://127.0.0.1:{port}"
    opened = {r["cell"] for r in _journal_records(home, "run")}
    described = {r["cell"] for r in _journal_records(home, "cell")}
    assert len(described) == 4 and described - opened, "some cell never had its run opened"
    waiting = 8 - _logged(home)
    server = _start_server(copy, port)
    try:
        code, out, err = run_cli("sync", "--tracking-uri", uri, "--home", str(home))
        assert code == 0, err
        assert f"{waiting} result(s) sent, 0 already in the store" in out, out
        _assert_complete_and_once(uri)
        code, out, err = run_cli("sync", "--tracking-uri", uri, "--home", str(home))
        assert "0 result(s) sent" in out
        # the same command again finds everything sent: it only ends the parent run
        result = subprocess.run(
            _bench_args(uri, home), cwd=tmp_path, env=_bench_env(), capture_output=True,
            text=True, timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        assert len(_journal_records(home, "measured")) == 8
        _assert_complete_and_once(uri)
    finally:
        os.killpg(server.pid, signal.SIGKILL)


def test_server_back_during_the_run_gets_everything_on_the_next_contact(tmp_path, empty_store):
    copy_empty_store(empty_store, tmp_path / "server.db")  # the server's store, made
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    home = tmp_path / "home"
    server = _start_server(tmp_path, port)
    bench = subprocess.Popen(
        _bench_args(uri, home, depths=(1, 2, 3, 4, 5, 6), min_duration="0.5"), cwd=tmp_path,
        env=_bench_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    err = _Stderr(bench)
    try:
        deadline = time.time() + 300
        while _logged(home) < 1 and time.time() < deadline and bench.poll() is None:
            time.sleep(0.05)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        while err.first("is unreachable") is None and bench.poll() is None:
            time.sleep(0.1)
        time.sleep(2)
        assert bench.poll() is None, "the run ended before the server was back"
        # the run (parent and worker) waits while the server starts again: on a quiet host
        # the remaining cells would otherwise be measured before the new server answers
        os.killpg(bench.pid, signal.SIGSTOP)
        try:
            server = _start_server(tmp_path, port)
        finally:
            os.killpg(bench.pid, signal.SIGCONT)
        measured_while_down = len(_journal_records(home, "measured"))
        bench.wait(timeout=600)
        text = err.text()
        assert bench.returncode == 0, text[-3000:]
        assert text.count("is unreachable") == 1 and "answers again" in text, text[-3000:]
        assert "Traceback" not in text
        assert measured_while_down < 12  # cells remained when it came back
        _assert_complete_and_once(uri, cells=6)
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)


# --- the store answering again at a result's own write ---------------------------------------
def test_store_back_at_a_results_write_sends_it_once(tmp_path, tracking_uri, run_cli, monkeypatch):
    """The store drops at bs1's write and answers again at bs2's: that write first sends what
    the journal holds (bs1 and bs2, just journaled) and must not then send bs2 a second time.
    The outage is injected (one write fails, one probe unanswered); store and runner are real."""
    from mlflow_ngraph.tracking.recorder import CellRecorder

    monkeypatch.setattr(ml, "PROBE_EVERY_S", 0.0)
    state = {"down": False, "failed": False}
    record, answers = CellRecorder.record, ml.store_answers

    def flaky_record(self, run_id, b, result, *signed_with):
        if b == 1 and not state["failed"]:
            state["down"] = state["failed"] = True
            raise requests.ConnectionError("injected: connection refused")
        return record(self, run_id, b, result, *signed_with)

    def probe(uri):
        if state["down"]:
            state["down"] = False  # the probe of the failed write: unanswered, once
            return False
        return answers(uri)

    monkeypatch.setattr(CellRecorder, "record", flaky_record)
    monkeypatch.setattr(ml, "store_answers", probe)
    code, _, err = run_cli(
        "benchmark", *TINY, "--compiler", "identity", "--isolation", "none",
        "--experiment", "back", "--tracking-uri", tracking_uri,
    )  # fmt: skip
    assert code == 0, err
    assert "is unreachable" in err and "answers again" in err, err
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("back")
    (run,) = [
        r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get(S.T_ROLE) == "cell"
    ]
    assert {"throughput.bs1", "throughput.bs2"} <= set(run.data.metrics)
    for key in run.data.metrics:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert len(steps) == len(set(steps)), (key, steps)
