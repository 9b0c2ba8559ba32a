"""Without a PostgreSQL to reach, the team-server tests skip and say why; they never error."""

from __future__ import annotations

import os
import socket
import subprocess

from tests._support import PYTHON, REPO, postgres_missing


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens there once closed


def test_an_unreachable_postgresql_is_a_reason_naming_where():
    port = _closed_port()
    reason = postgres_missing(port)
    assert reason is not None
    assert f"no PostgreSQL reachable at 127.0.0.1:{port} as user postgres" in reason


def test_the_team_server_tests_skip_with_the_reason(tmp_path):
    port = _closed_port()
    env = {**os.environ, "MLFLOW_NGRAPH_TEST_PG_PORT": str(port), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [PYTHON, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         str(REPO / "tests" / "tracking" / "test_team_server.py")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert "skipped" in last and "error" not in last and "failed" not in last, last
    assert f"no PostgreSQL reachable at 127.0.0.1:{port}" in done.stdout
