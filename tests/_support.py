"""Constants shared by the tests (import as ``from tests._support import ...``)."""

import functools
import os
import sys
from contextlib import contextmanager
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
    """A TCP port free on 127.0.0.1 now, for a server a test starts.

    Drawn from a block of ports of this test process's own (by pytest-xdist worker), below
    the system's ephemeral range (32768-60999 on Linux), so that neither the other worker's
    servers nor any client's outgoing connection takes it between this check and the
    server's bind, and a test that restarts a server on its port minutes later gets it."""
    import itertools
    import random
    import socket

    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    base = 20000 + 1000 * (index % 12)
    start = random.randrange(1000)
    for offset in itertools.islice(itertools.count(start), 1000):
        port = base + offset % 1000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {base}-{base + 999}")


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


def clone_store(source: Path, target: Path, skip_home: bool = False) -> str:
    """A copy of the store under ``source`` (``mlflow.db`` + artifacts, and the home unless
    ``skip_home``) at ``target``, its artifact locations rewritten (MLflow keeps them as
    absolute paths); returns its tracking URI. Never hard links: a test that writes its copy
    would write the original. Clears MLflow's artifact repositories cached by run id, which
    every copy shares with the original."""
    import shutil
    import sqlite3

    from mlflow.tracking._tracking_service import utils

    ignore = shutil.ignore_patterns("home") if skip_home else None
    shutil.copytree(source, target, ignore=ignore)
    db = sqlite3.connect(target / "mlflow.db")
    old, new = str(source), str(target)
    for table, column in (
        ("experiments", "artifact_location"),
        ("runs", "artifact_uri"),
        ("logged_models", "artifact_location"),
        ("model_versions", "storage_location"),
    ):
        db.execute(f"UPDATE {table} SET {column} = replace({column}, ?, ?)", (old, new))
    db.commit()
    db.close()
    utils._artifact_repos_cache.clear()
    return f"sqlite:///{target / 'mlflow.db'}"


def build_empty_store(root: Path) -> None:
    """``root/mlflow.db`` as MLflow creates a store: its tables migrated, the Default
    experiment (its artifacts under ``root/mlruns``)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    SqlAlchemyStore(f"sqlite:///{root / 'mlflow.db'}", str(root / "mlruns")).engine.dispose()


def copy_empty_store(template: Path, target: Path) -> str:
    """A copy of the store :func:`build_empty_store` made, at ``target``, whose Default
    experiment keeps its artifacts in ``mlruns`` beside it; returns its tracking URI."""
    import shutil
    import sqlite3

    shutil.copyfile(template, target)
    db = sqlite3.connect(target)
    db.execute(
        "UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
        (str(target.parent / "mlruns" / "0"),),
    )
    db.commit()
    db.close()
    return f"sqlite:///{target}"


#: the tiny benchmark several test files read (``tiny_store`` in conftest.py): its model,
#: compilers and experiment
TINY_STORE_MODEL = "conv_block:width=8,depth=1,image_size=32"
TINY_STORE_COMPILERS = ["identity", "torchscript", "onnxruntime"]
TINY_STORE_EXPERIMENT = "deploy"


def build_tiny_store(root: Path) -> None:
    """The tiny benchmark of :data:`TINY_STORE_COMPILERS` into ``root/mlflow.db`` (home
    ``root/home``), in its own process as a user runs it; its stdout in ``root/stdout``."""
    import subprocess

    args = [PYTHON, "-m", "mlflow_ngraph", "benchmark", "--model", TINY_STORE_MODEL,
            "--batch-sizes", "1,2", "--warmup", "1", "--repetitions", "3",
            "--min-duration", "0.05", "--experiment", TINY_STORE_EXPERIMENT,
            "--tracking-uri", f"sqlite:///{root / 'mlflow.db'}"]  # fmt: skip
    for compiler in TINY_STORE_COMPILERS:
        args += ["--compiler", compiler]
    env = {**os.environ, "MLFLOW_NGRAPH_HOME": str(root / "home"), "PYTHONPATH": str(REPO)}
    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=root, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    (root / "stdout").write_text(done.stdout)


@contextmanager
def process_tracking_uri(uri: str):
    """MLflow's process-wide tracking URI is ``uri`` inside the block; afterwards both it and
    ``MLFLOW_TRACKING_URI`` (which ``mlflow.set_tracking_uri`` also sets, or unsets) are as
    they were, so that no later test's client or subprocess inherits this test's store."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    saved = utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        utils._tracking_uri = saved[0]
        if saved[1] is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved[1]


def running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie waiting for its parent does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def cell_runs(uri: str, experiment: str) -> list:
    """The cell runs (role ``cell``) of ``experiment`` in the store at ``uri``."""
    from mlflow.tracking import MlflowClient

    from mlflow_ngraph.tracking import schema as S

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    return [r for r in runs if r.data.tags.get(S.T_ROLE) == "cell"]


def last_log(home: Path) -> str:
    """The text of the newest invocation's log file in ``home`` (every line of the run's
    machinery the terminal leaves to ``-v``)."""
    logs = [p for p in (Path(home) / "logs").glob("*.log") if p.is_file()]
    assert logs, f"no log file in {home}/logs"
    return max(logs, key=lambda p: (p.stat().st_mtime_ns, p.name)).read_text()


def history_of_runs(home, rng, spreads, groups=12, engines=3, noise=0.003) -> None:
    """A host's history of ``len(spreads)`` runs of one sitting (occasions run0, run1, ...)
    of ``groups`` x ``engines`` conv-block engines (keys g<g>e<e>): in run r each group moves
    by its own offset (sd ``spreads[r]``: the host's state then), each engine by its
    sitting's noise (sd ``noise``, its interval the 95% one of that)."""
    import math
    import time

    from mlflow_ngraph.measure import history

    levels = rng.uniform(5, 9, size=(groups, engines))
    for r, sd in enumerate(spreads):
        for g in range(groups):
            offset = rng.normal(0, sd)
            for e in range(engines):
                x = levels[g, e] + offset + rng.normal(0, noise)
                kept = history.Entry(time.time(), "conv_block", math.exp(x), history.Z95 * noise,
                                     occasion=f"run{r}", group=f"conv_block/g{g}")  # fmt: skip
                history.append(home, f"g{g}e{e}", kept)
