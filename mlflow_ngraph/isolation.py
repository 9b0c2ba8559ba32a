"""Each cell in its own process: a spawned worker runs :func:`~mlflow_ngraph.worker.measure_cell`
and streams its events back through a pipe, one batch size at a time.

The worker shares nothing with the runner or with other cells (thread pools, allocator
state, peak RSS). A worker that dies (a segfault, an abort, the kernel's OOM killer) or runs
past its time limit ends with a reason naming the signal or the limit; what it had already
sent (batch sizes measured before the crash) is kept. Its stdout and stderr (third-party
chatter) go to a log file, and the package's log records are forwarded to the runner.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.worker import CellTask

log = logging.getLogger("mlflow_ngraph.worker")

#: seconds a finished worker gets to exit before it is killed
EXIT_GRACE_S = 30.0
#: warning categories and words that bear on the validity of a result (counted per cell)
VALIDITY_WORDS = ("precision", "fallback", "fall back", "tracer", "fp16", "bf16")


def run_isolated(
    task: CellTask, on_event: Callable[[str, Any], None], timeout_s: float
) -> str | None:
    """Run ``task`` in a fresh spawned process, passing each event to ``on_event``.

    Returns ``None`` when the worker finished, else why it did not ("worker died with
    SIGSEGV", "cell timed out after 20 s"). Any exception of the caller (Ctrl-C included)
    kills the worker and its children first.
    """
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_worker_main, args=(task, sender), name=f"cell {task.name}")
    proc.start()
    sender.close()
    deadline = time.monotonic() + timeout_s
    done = False
    try:
        while not done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _kill_tree(proc.pid)
                proc.join()
                return f"cell timed out after {timeout_s:g} s (raise --cell-timeout to allow more)"
            if not receiver.poll(min(remaining, 1.0)):
                continue
            try:
                kind, payload = receiver.recv()
            except (EOFError, OSError):  # the worker is gone
                break
            if kind == "done":
                done = True
            else:
                on_event(kind, payload)
        proc.join(EXIT_GRACE_S if done else 5.0)
        if proc.exitcode is None:
            _kill_tree(proc.pid)
            proc.join()
            if done:
                return None
        return None if done and proc.exitcode == 0 else _death_reason(proc.exitcode)
    except BaseException:
        _kill_tree(proc.pid)
        proc.join()
        raise
    finally:
        receiver.close()


def _death_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory?)" if name == "SIGKILL" else ""
        return f"worker died with {name}{hint}"
    return f"worker exited with status {code} before finishing its cell"


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process it started (TVM's builders, compile workers)."""
    import psutil

    try:
        parent = psutil.Process(pid)
        procs = [*parent.children(recursive=True), parent]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=10)


# --- in the worker ------------------------------------------------------------------------
class _Forward(logging.Handler):
    def __init__(self, send: Callable[[str, Any], None]) -> None:
        super().__init__(logging.INFO)
        self.send = send

    def emit(self, record: logging.LogRecord) -> None:
        self.send("log", (record.levelno, record.getMessage()))


def _worker_main(task: CellTask, conn) -> None:
    """The spawned worker: measure the cell, send every event, then ``done``."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's to handle
    if task.log_file:
        _redirect_output(task.log_file)

    def send(kind: str, payload: Any) -> None:
        conn.send((kind, payload))

    root = logging.getLogger("mlflow_ngraph")
    root.handlers[:] = [_Forward(send)]
    root.setLevel(logging.INFO)
    root.propagate = False
    for noisy in ("mlflow", "alembic", "torch", "onnxscript", "onnx_ir", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    counted = _count_warnings()
    from mlflow_ngraph.worker import measure_cell

    def emit(kind: str, payload: Any) -> None:
        if kind == "record":  # warnings so far: compile and check of this cell
            payload[1]["metrics"][S.M_VALIDITY_WARNINGS] = float(counted[0])
        send(kind, payload)

    measure_cell(task, emit)
    send("done", None)
    conn.close()


def _count_warnings() -> list[int]:
    """Write every warning to the log file; count the ones that bear on validity."""
    counter = [0]
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        text = f"{category.__name__}: {message}".lower()
        if any(word in text for word in VALIDITY_WORDS):
            counter[0] += 1
        original(message, category, filename, lineno, file, line)

    warnings.simplefilter("default")
    warnings.showwarning = show
    return counter


def _redirect_output(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _die_with_parent() -> None:
    """Linux: the kernel kills the worker if the runner dies (kill -9 of the runner)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
