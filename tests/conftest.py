"""Shared fixtures: an isolated cache/journal home and a fresh local MLflow store per test."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import warnings
from pathlib import Path

import pytest

warnings.filterwarnings("ignore", category=DeprecationWarning)


REPO = Path(__file__).resolve().parent.parent

pytest_plugins = ["tests._profile"]


#: the tiers. ``make test-fast`` runs what needs no compile, server, cluster or benchmark run
#: (``-m "not e2e"``): a test is ``e2e`` when its file is one of these, whose tests start
#: processes, servers or clusters or compile real engines ...
E2E_FILES = {
    "cluster/test_project_backend.py", "cluster/test_project_backend_kills.py",
    "cluster/test_sweep_faults.py", "cluster/test_sweep_local.py",
    "cluster/test_sweep_stumbles.py", "cluster/test_sync.py",
    "cluster/test_cancel_reaches_the_task.py", "cluster/test_sweep_view.py",
    "compilers/test_inductor.py", "compilers/test_onnxruntime.py", "compilers/test_openvino.py",
    "compilers/test_torchscript.py", "compilers/test_tvm.py", "compilers/test_tensorrt.py",
    "deploy/test_pull.py", "deploy/test_register.py", "deploy/test_serving.py",
    "deploy/test_trust.py", "deploy/test_trust_server.py", "deploy/test_register_output.py",
    "test_faults.py", "tracking/test_server_down.py", "tracking/test_team_server.py",
    "run/test_resume.py",
    "run/test_interrupt_and_view.py", "test_mlproject.py", "test_tvm_benchmark.py",
    "test_onnx_file_benchmark.py", "run/test_isolation.py", "tracking/test_mlflow_ui.py",
    "tracking/test_benchmark_mlflow.py", "tune/test_tune_run.py", "test_postgres_skip.py",
    "test_calibrated.py", "measure/test_stability.py", "deploy/test_register_faults.py",
    "cluster/test_reaper.py", "commands/test_calibrate.py", "run/test_paper_protocol.py",
    "run/test_sittings_run.py", "compilers/test_plugin.py", "loadgen/test_loadgen_run.py",
    "gate/test_gate_cli.py",
}  # fmt: skip
#: ... or it uses one of these fixtures (a benchmark in-process, a shared store)
E2E_FIXTURES = {"run_cli", "store", "tiny_store", "shared_build"}


#: the files that took longest in the last profiled run (``make test`` with
#: ``--profile-suite``), longest first: they start first, so that the run ends on short tests
#: (the longest-processing-time-first rule); a file not listed comes after them, in its order
SLOW_FILES = [  # by their seconds in a full run (--durations=0), the longest first
    "test_faults.py", "cluster/test_project_backend_kills.py", "deploy/test_trust.py",
    "deploy/test_pull.py", "cluster/test_sweep_faults.py", "tracking/test_server_down.py",
    "tune/test_tune_run.py", "deploy/test_trust_server.py", "deploy/test_register.py",
    "run/test_resume.py", "cluster/test_sweep_local.py", "deploy/test_signed.py",
    "cluster/test_project_backend.py", "tracking/test_team_server.py", "test_cache.py",
    "run/test_interrupt_and_view.py", "run/test_isolation.py", "compilers/test_plugin.py",
    "test_imports.py", "run/test_template.py", "deploy/test_register_faults.py",
    "tracking/test_store_record.py", "run/test_sittings_run.py",
    "tracking/test_benchmark_mlflow.py", "run/test_remeasure.py", "gate/test_gate_cli.py",
    "loadgen/test_loadgen_run.py", "gate/test_gate_sides.py",
    "deploy/test_register_output.py", "cluster/test_journal_safety.py", "commands/test_cli.py",
    "deploy/test_trust_limits.py", "report/test_report_index.py",
    "models/test_model_sources.py", "measure/test_stability.py", "run/test_paper_protocol.py",
    "compilers/test_inductor.py", "compilers/test_tvm.py", "test_onnx_file_benchmark.py",
    "commands/test_calibrate.py", "run/test_output.py", "deploy/test_serving.py",
    "cluster/test_sync.py", "deploy/test_store_text.py", "report/test_summary.py",
    "measure/test_harness.py",
]  # fmt: skip


def _name(item) -> str:
    path = Path(str(item.fspath)).resolve()
    return path.relative_to(REPO / "tests").as_posix() if path.is_relative_to(REPO) else ""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """The tiers' marks, and the slowest files first (:data:`SLOW_FILES`): under
    ``--dist loadscope`` (``make test``) each file is one unit of work that a free worker
    takes whole (its module fixtures built once), in this order."""
    for item in items:
        if _name(item) in E2E_FILES or E2E_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(_name(item), len(rank)), order[id(item)]))


def _run_folder(config) -> Path:
    """A folder every process of this test run shares: under pytest-xdist each worker's
    base temporary folder is ``<run>/popen-gwN``, so their parent; else the base folder."""
    base = config._tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _flock(path: Path, mode: int):
    with open(path, "a+") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Tests marked ``serial`` measure time or CPU, or load the CPU on purpose: under
    pytest-xdist each one runs alone, never beside another test of this run (a readers-writer
    lock over the run's folder: every other test, its fixtures' setup included, holds the
    shared side; a serial test the exclusive side, and the turnstile lets it in before any
    further test starts). Without xdist the lock is never contended."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    folder = _run_folder(item.config)
    serial = item.get_closest_marker("serial") is not None
    with _flock(folder / "turnstile.lock", fcntl.LOCK_EX):
        if serial:  # hold the turnstile until every other test has ended
            lock = _flock(folder / "serial.lock", fcntl.LOCK_EX)
            lock.__enter__()
    if not serial:
        lock = _flock(folder / "serial.lock", fcntl.LOCK_SH)
        lock.__enter__()
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


@pytest.fixture(scope="session")
def shared_build(request):
    """``shared_build(name, build)``: a folder built once per test run and shared by every
    pytest-xdist worker: the first caller runs ``build(folder)`` under a file lock, the
    others wait for it and get the same folder. For what tests only read; a test that
    changes it takes its own copy."""
    root = _run_folder(request.config) / "shared"
    root.mkdir(exist_ok=True)

    def get(name: str, build):
        folder = root / name
        done = root / f"{name}.done"
        with _flock(root / f"{name}.lock", fcntl.LOCK_EX):
            if not done.exists():
                if folder.exists():  # a build that failed part-way: start again
                    import shutil

                    shutil.rmtree(folder)
                folder.mkdir()
                build(folder)
                done.touch()
        return folder

    return get


@pytest.fixture(scope="session")
def tiny_store(shared_build) -> Path:
    """The folder of one tiny benchmark (identity, TorchScript, ONNX Runtime; experiment
    ``deploy``), built once per test run: ``mlflow.db``, its artifacts, ``home`` and the
    command's ``stdout``. Read it, or take a copy to change (``clone_store``)."""
    pytest.importorskip("onnxruntime")
    from tests._support import build_tiny_store

    return shared_build("tiny-store", build_tiny_store)


@pytest.fixture(scope="session", autouse=True)
def _session_in_tmp(tmp_path_factory):
    """Module and session fixtures run before the per-test directory exists: they run in
    a temporary directory of their own, never in the checkout."""
    previous = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("session-cwd"))
    yield
    os.chdir(previous)


@pytest.fixture(autouse=True)
def _work_in_tmp(tmp_path: Path, monkeypatch) -> None:
    """Every test runs in its own temporary directory: a local store's default artifact
    root (``./mlruns``) and anything else written relative to the working directory land
    there, never in the user's checkout."""
    monkeypatch.chdir(tmp_path)


def _untracked(root: Path) -> set[str]:
    """Files in ``root`` that git does not track, ignored ones included (``mlruns/``)."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    skip = (
        ".venv/",
        ".ruff_cache/",
        ".pytest_cache/",
        "mlflow_ngraph.egg-info/",
        "bench/results/",
        ".coverage-data/",
    )
    paths = {line[3:] for line in out.splitlines() if line[:2] in ("??", "!!")}
    return {p for p in paths if not p.startswith(skip) and "__pycache__" not in p}


def pytest_sessionstart(session) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the main process alone compares
        session.config._ngraph_untracked = _untracked(REPO)


def pytest_sessionfinish(session, exitstatus) -> None:
    """The suite writes nothing into the checkout: a test that did fails the run."""
    before = getattr(session.config, "_ngraph_untracked", None)
    if before is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    new = sorted(_untracked(REPO) - before)
    if new:
        print(f"\nerror: the tests wrote into the checkout {REPO}: {', '.join(new[:10])}")
        session.exitstatus = 1


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory) -> Path:
    """An MLflow SQLite store as MLflow creates it (its tables migrated, the Default
    experiment), built once per worker: creating one costs 1-2 s of a core."""
    from tests._support import build_empty_store

    root = tmp_path_factory.mktemp("empty-store")
    build_empty_store(root)
    return root / "mlflow.db"


@pytest.fixture
def tracking_uri(tmp_path: Path, empty_store: Path) -> str:
    """A fresh local store in the test's folder: a copy of :func:`empty_store`, its Default
    experiment's artifacts in the test's ``mlruns`` as a store created there would have them.
    A test that starts the tool on a new store takes this one (a module fixture: a copy of
    ``empty_store`` by ``copy_empty_store``); only the tests of the store's creation itself
    (as in cluster/test_journal_safety.py) have MLflow create one."""
    from tests._support import copy_empty_store

    return copy_empty_store(empty_store, tmp_path / "mlflow.db")


@pytest.fixture
def run_cli(home: Path, capsys, monkeypatch):
    """Run ``mlflow-ngraph ARGS`` in-process; returns (exit code, stdout, stderr)."""
    from mlflow_ngraph.commands.cli import main

    monkeypatch.setenv("MLFLOW_NGRAPH_HOME", str(home))

    def run(*args: str) -> tuple[int, str, str]:
        code = 0
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    return run


os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
# every `mlflow server` the tests start, as docs/team-server.md advises: no GenAI job runner
# (it starts eight processes, about 16 s of a core, that a tracking server never uses)
os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
# The suite checks what the tool does, not how fast the host is: its benchmarks stop at the
# fewest rounds (a +-50% target) and never measure an UNSTABLE figure again, unless a test
# sets these itself (the options' environment variables, as a user may set them).
os.environ.setdefault("MLFLOW_NGRAPH_BENCHMARK_PRECISION", "0.5")
os.environ.setdefault("MLFLOW_NGRAPH_BENCHMARK_STABLE_RETRIES", "0")
# ... and measure an engine at most 1 s a batch size (by default 4 s: on a busy host a +-50%
# interval is often out of reach, and every benchmark of the suite ran to that cap)
os.environ.setdefault("MLFLOW_NGRAPH_BENCHMARK_MAX_DURATION", "1")
os.environ.setdefault("MLFLOW_NGRAPH_TUNE_MAX_DURATION", "1")
# ... and measure at once, not waiting for a quiet host: beside the suite's other worker every
# benchmark would find the host busy (the tests of the check itself set what they check)
os.environ.setdefault("MLFLOW_NGRAPH_BENCHMARK_BUSY_OK", "1")
os.environ.setdefault("MLFLOW_NGRAPH_BLOCKS_BUSY_OK", "1")
os.environ.setdefault("MLFLOW_NGRAPH_TUNE_BUSY_OK", "1")
os.environ.setdefault("MLFLOW_NGRAPH_GATE_BUSY_OK", "1")
# and look at the host briefly: every e2e run pays the look (3 s by default) before it starts
os.environ.setdefault("MLFLOW_NGRAPH_HOST_SAMPLE_S", "0.3")
os.environ.setdefault("MLFLOW_NGRAPH_TUNE_PRECISION", "0.5")
os.environ.setdefault("MLFLOW_NGRAPH_TUNE_STABLE_RETRIES", "0")
# a tune's trials are measured for 0.5 s a batch size by default: the floor that still
# measures every engine in rounds is enough for what the tests check
os.environ.setdefault("MLFLOW_NGRAPH_TUNE_MIN_DURATION", "0.05")
# ... and its finalists to the same floor (by default +-1% or 12 s of windows each)
os.environ.setdefault("MLFLOW_NGRAPH_TUNE_FINAL_PRECISION", "0.5")
os.environ.setdefault("MLFLOW_NGRAPH_TUNE_FINAL_MAX_DURATION", "2")
# ... so their figures are often UNSTABLE, which pull and register would set aside
os.environ.setdefault("MLFLOW_NGRAPH_PULL_ALLOW_UNSTABLE", "1")
os.environ.setdefault("MLFLOW_NGRAPH_REGISTER_ALLOW_UNSTABLE", "1")


def _suite_signing_key() -> str:
    """One signing key for the whole suite (every xdist worker and every process it starts):
    the stores its benchmarks build are signed with it and the deploy commands trust it as
    their own, whatever home a test gives them. Derived from a fixed number, so that every
    worker writes the same file; a test of trust sets its own keys."""
    import tempfile

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.derive_private_key(0x6E6772617068, ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path = Path(tempfile.gettempdir()) / f"mlflow-ngraph-suite-key-{os.getuid()}.pem"
    if not path.is_file() or path.read_bytes() != pem:
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_bytes(pem)
        tmp.chmod(0o600)
        os.replace(tmp, path)
    return str(path)


os.environ.setdefault("MLFLOW_NGRAPH_SIGNING_KEY", _suite_signing_key())
