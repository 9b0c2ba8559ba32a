"""A tracking server that dies mid-run loses no measured result."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import requests
from mlflow.tracking import MlflowClient

from mlflow_ngraph.tracking import schema as S
from tests._support import PYTHON, REPO


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def test_server_killed_mid_run_then_resume(tmp_path):
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    home = tmp_path / "home"
    server = _start_server(tmp_path, port)
    args = [
        PYTHON,
        "-m",
        "mlflow_ngraph",
        "benchmark",
        "--compiler",
        "identity",
        "--batch-sizes",
        "1,2",
        "--warmup",
        "1",
        "--repetitions",
        "3",
        "--min-duration",
        "0.3",
        "--experiment",
        "down",
        "--tracking-uri",
        uri,
        "--home",
        str(home),
    ]
    for depth in (1, 2, 3, 4):
        args += ["--model", f"conv_block:width=8,depth={depth},image_size=32"]
    # MLflow's client retries a dead server for minutes by default; the test needs seconds
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
    }
    try:
        bench = subprocess.Popen(
            args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        deadline = time.time() + 240
        while _logged(home) < 2 and time.time() < deadline and bench.poll() is None:
            time.sleep(0.05)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        _, err = bench.communicate(timeout=600)
        assert bench.returncode == 2, err[-2000:]
        assert "kept in the journal" in err and "Traceback" not in err

        server = _start_server(tmp_path, port)
        result = subprocess.run(
            args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, result.stderr[-2000:]
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("down")
        cells = [
            r
            for r in client.search_runs([exp.experiment_id])
            if r.data.tags.get(S.T_ROLE) == "cell"
        ]
        assert len(cells) == 4
        for run in cells:
            assert {"throughput.bs1", "throughput.bs2"} <= set(run.data.metrics)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
