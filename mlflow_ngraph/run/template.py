"""The template every cell's worker is forked from: imported once per run by the
``forkserver`` process (:mod:`multiprocessing.forkserver`), never by the runner.

A worker used to be a spawned Python process that imported PyTorch, NumPy, SciPy and the
package's measuring modules itself: 2-3 s of one core each time on a quiet 2-core host, 4-8 s
under load, for every cell. The forkserver is a fresh interpreter started by the runner that
does this once (the runner's own modules, state and threads are not in it); each worker is a
fork of it, ready in milliseconds with the same modules imported. What a worker shares with
the runner or with other cells is what it did with a spawn: nothing. Its heap policy
(:func:`~mlflow_ngraph.measure.memory.keep_freed_memory`) is set here before the imports, as a
spawned worker set it at its start, so every buffer the imports allocate is on the kept heap
the worker inherits. No thread pool crosses the fork: PyTorch's intra-op pool, OpenMP and the
runtimes' pools start in the worker, at its first inference, and OpenBLAS (which starts its
pool when NumPy is imported) shuts it down before each fork and starts it again in the child.

The template dies with the runner (the kernel kills it when the runner's thread that started
it ends, even by ``kill -9``), and each worker dies with the template: no worker outlives its
run. The template's own output (import chatter) goes nowhere; a worker's goes to its log.

``MLFLOW_NGRAPH_WORKER_START=spawn`` starts every worker as its own interpreter instead (the
way to compare: ``bench/bench_isolation.py --sides process,process-spawn,none``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import multiprocessing

# imported now, not at the first worker: multiprocessing.util's exit handler (which removes
# the forkserver's socket folder) is then registered before isolation's, and runs after it
import multiprocessing.forkserver
import os
import signal
import sys
import threading

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.measure.memory import MALLOC_ENV, keep_freed_memory

#: ``forkserver`` (the default where the platform has it) or ``spawn``
WORKER_START_ENV = "MLFLOW_NGRAPH_WORKER_START"
FORKSERVER, SPAWN = "forkserver", "spawn"

#: environment variables a library reads when it is imported (thread pools, allocators,
#: PyTorch's switches), by prefix: the forkserver imported them under the values it was
#: started with, so a change starts a new one. Every other variable is the runner's at the
#: worker's start, as with a spawn (:func:`apply_environment`).
IMPORT_TIME_ENV = (
    "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "BLIS_", "NUMEXPR_", "DNNL_", "ONEDNN_",
    "TORCH", "PYTORCH_", "CUDA_", "NVIDIA_", "LD_", "MALLOC_", "GLIBC_TUNABLES", "PYTHON",
    MALLOC_ENV,
)  # fmt: skip

#: what every worker imports before its task comes (no engine state); a runtime only some
#: cells use (timm, ONNX Runtime, OpenVINO) is imported by the worker for its own cell
PRELOAD = (
    "numpy",
    "torch",
    "scipy.stats",  # the throughput interval of every measurement (seconds to import)
    "mlflow_ngraph.run.worker",
    "mlflow_ngraph.compilers.registry",
    "mlflow_ngraph.models.registry",
    "mlflow_ngraph.run.supply",
    "mlflow_ngraph.measure.harness",
    "mlflow_ngraph.measure.stability",
)


def preload(names=PRELOAD) -> None:
    """Import ``names``, each that is installed; a failure is left for the cell's own
    import to meet and report."""
    for name in names:
        if importlib.util.find_spec(name.split(".")[0]) is None:
            continue
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def start_method() -> str:
    """How a worker starts: :data:`WORKER_START_ENV`, ``forkserver`` by default (``spawn``
    where the platform has no forkserver); any other value is an error naming the choices."""
    value = os.environ.get(WORKER_START_ENV, FORKSERVER).strip().lower() or FORKSERVER
    if value not in (FORKSERVER, SPAWN):
        raise NgraphError(
            f"{WORKER_START_ENV}={value!r} is not a choice: set it to {FORKSERVER} or {SPAWN}"
        )
    if value == FORKSERVER and FORKSERVER not in multiprocessing.get_all_start_methods():
        return SPAWN
    return value


_lock = threading.Lock()
_server_key: tuple | None = None  # the import-time environment the forkserver started with


def _import_time_environment() -> tuple:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(IMPORT_TIME_ENV)))


def context():
    """The :mod:`multiprocessing` context a worker starts from, its forkserver running with
    this process's import-time environment (started now if not yet: its imports go on
    while the caller does other work, and the first worker waits for them). A forkserver
    started under other import-time values is replaced when none of its workers is alive;
    while one is, this worker is spawned instead."""
    global _server_key
    try:
        method = start_method()
    except NgraphError:  # the run reports it (env.py); a worker starts anyway
        method = FORKSERVER if FORKSERVER in multiprocessing.get_all_start_methods() else SPAWN
    if method == SPAWN:
        return multiprocessing.get_context(SPAWN)
    from multiprocessing import forkserver

    key = _import_time_environment()
    with _lock:
        if _server_key is not None and key != _server_key:
            if any(_forked(p) for p in multiprocessing.active_children()):
                return multiprocessing.get_context(SPAWN)
            forkserver._forkserver._stop()
        forkserver.set_forkserver_preload(["mlflow_ngraph.run._template_boot"])
        forkserver.ensure_running()
        _server_key = key
    return multiprocessing.get_context(FORKSERVER)


def stop() -> None:
    """End the forkserver if this process started one (at the end of a run, after its
    workers: a worker still alive dies with it); nothing of a run stays behind in a process
    that goes on, a Ray worker's say."""
    global _server_key
    from multiprocessing import forkserver

    with _lock:
        if _server_key is None:
            return
        try:
            forkserver._forkserver._stop()
        except OSError:  # its socket's folder is already gone (at exit): it ended anyway
            pass
        finally:
            _server_key = None


def _server_pid() -> int | None:
    from multiprocessing import forkserver

    return forkserver._forkserver._forkserver_pid if running() else None


def running() -> bool:
    """Whether this process's forkserver is up (started by :func:`context`)."""
    return _server_key is not None


def ask(function):
    """``function()`` in a fork of the template, its result: what a worker would see (its
    imports, its environment) for the price of a fork. Only while the forkserver runs;
    raises what the fork raised, or :class:`RuntimeError` when it died first."""
    if not running():
        raise RuntimeError("the workers' template is not running")
    ctx = context()
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=_answer, args=(sender, function, dict(os.environ)), name="ngraph template query"
    )
    process.start()
    sender.close()
    try:
        ok, value = receiver.recv()
    except EOFError:
        raise RuntimeError(f"the template's fork ended with {process.exitcode}") from None
    finally:
        process.join()
        receiver.close()
    if not ok:
        raise value
    return value


def _answer(sender, function, environment) -> None:
    in_worker(environment)
    try:
        sender.send((True, function()))
    except Exception as exc:
        sender.send((False, exc))


def _forked(process) -> bool:
    return type(getattr(process, "_popen", None)).__module__.endswith("popen_forkserver")


def in_worker(environment: dict[str, str]) -> None:
    """At a forked worker's start: the runner's environment as it was when the worker was
    asked for (a spawn inherits it; a fork inherits the forkserver's), and the forkserver's
    "alive" pipe closed, so that the forkserver ends when the runner does, whatever its
    workers do, and the kernel then kills them (:func:`die_with_parent`)."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None and server._forkserver_pid is None:
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    if environment != os.environ:
        os.environ.clear()
        os.environ.update(environment)


def die_with_parent(expected: int | None = None) -> None:
    """Linux: the kernel kills this process when its parent ends (``kill -9`` included); a
    parent that ended before (this process's parent is not ``expected``, or changed while
    the kernel was told) ends it now."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid() if expected is None else expected
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent:
        os._exit(1)


def parent_of_workers(ctx) -> int:
    """The pid a worker started from ``ctx`` has as its parent: the forkserver's, or this
    process's for a spawn."""
    return (_server_pid() if ctx.get_start_method() == FORKSERVER else None) or os.getpid()


def boot() -> None:
    """The forkserver's start (:mod:`mlflow_ngraph.run._template_boot`): it dies with the
    runner; the heap policy, then the imports, their output discarded."""
    die_with_parent()
    keep_freed_memory()
    saved = os.dup(1), os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        preload()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)
