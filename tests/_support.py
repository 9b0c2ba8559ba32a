"""Constants shared by the tests (import as ``from tests._support import ...``)."""

import functools
import os
import sys
from pathlib import Path

#: the smallest real workload: a 32x32 conv block, two batch sizes, a few repetitions
TINY = [
    "--model",
    "conv_block:width=8,depth=1,image_size=32",
    "--batch-sizes",
    "1,2",
    "--warmup",
    "1",
    "--repetitions",
    "3",
    "--min-duration",
    "0",
]
PYTHON = sys.executable
REPO = Path(__file__).resolve().parent.parent


def assert_matches(out, ref) -> None:
    """An engine's output equals the reference's (eager PyTorch) within float32 noise."""
    import numpy as np

    assert out.shape == ref.shape
    assert np.abs(out - ref).max() < 1e-4
    cosine = float(np.dot(out.ravel(), ref.ravel()) / np.linalg.norm(out) / np.linalg.norm(ref))
    assert cosine > 0.9999


def in_threads(count: int, work) -> list:
    """``work(i)`` for i in range(count) in as many threads released at once (a barrier);
    the results in order. Any exception fails the calling test."""
    import threading

    results: list = [None] * count
    errors: list = []
    barrier = threading.Barrier(count)

    def go(i: int) -> None:
        try:
            barrier.wait()
            results[i] = work(i)
        except Exception as exc:  # collected: the test fails on any
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


#: the PostgreSQL the team-server tests use (a superuser ``postgres`` without a password);
#: ``MLFLOW_NGRAPH_TEST_PG_PORT`` moves it off 5432
POSTGRES = {
    "host": "127.0.0.1",
    "port": int(os.environ.get("MLFLOW_NGRAPH_TEST_PG_PORT") or 5432),
    "user": "postgres",
    "dbname": "postgres",
}
#: its address as a SQLAlchemy / libpq URL, without a database
POSTGRES_URL = f"postgresql://{POSTGRES['user']}@{POSTGRES['host']}:{POSTGRES['port']}"


@functools.cache
def postgres_missing(port: int | None = None) -> str | None:
    """Why the PostgreSQL of :data:`POSTGRES` (on ``port`` if given) cannot be used: a skip
    reason, or None when it answers."""
    where = f"{POSTGRES['host']}:{port or POSTGRES['port']}"
    try:
        import psycopg2
    except ImportError:
        return "psycopg2 is not installed (pip install -e '.[test]')"
    try:
        settings = {**POSTGRES, "port": port or POSTGRES["port"]}
        psycopg2.connect(connect_timeout=3, **settings).close()
    except psycopg2.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"no PostgreSQL reachable at {where} as user postgres ({first})"
    return None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, process, seconds: float = 120) -> None:
    """Wait until ``url`` answers; fails the test when ``process`` (the server) exits
    first, with the end of its stderr, or after ``seconds``."""
    import time
    import urllib.request

    deadline = time.time() + seconds
    while True:
        if process.poll() is not None:
            error = process.stderr.read()[-2000:] if process.stderr else ""
            raise AssertionError(f"{process.args[:4]} exited: {error}")
        if time.time() > deadline:
            raise AssertionError(f"{url} did not answer in {seconds} s")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
