"""Named points where a test (or ``bench/bench_faults.py``) stops the process on purpose.

``MLFLOW_NGRAPH_FAULT_POINT=<name>[@<n>][:<action>]`` makes the ``n``-th time (default: the
first) the process passes the point named ``<name>`` do ``<action>``:

- ``kill`` (the default): ``SIGKILL`` itself, as a power cut or ``kill -9`` would;
- ``enospc`` / ``erofs``: raise the ``OSError`` a full disk / a read-only file system gives
  (a fake of a fault the disk cannot produce on demand);
- ``fill``: fill the file system of ``MLFLOW_NGRAPH_HOME`` with a ballast file, so the next
  writes there meet a real full disk;
- ``hold=<file>``: wait there while ``<file>`` exists (at most :data:`HOLD_MAX_S`), so that a
  test's kill or cancel lands while work is left, however fast or busy the host is.

Unset (always, outside tests), a point costs one dictionary lookup. :data:`POINTS` lists every
point, in the order one benchmark invocation passes them.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

ENV = "MLFLOW_NGRAPH_FAULT_POINT"

#: every named point, in the order an invocation passes them (what each is just after)
POINTS = {
    "journal_append": "any record is about to be appended to the journal",
    "parent_started": "the parent run was found or created and is RUNNING",
    "cell_run_created": "a cell's run was created in the store (before anything else of it)",
    "cell_begun": "a cell's run was opened and tagged",
    "journal_measured": "a result was written to the journal (MLflow has not heard of it)",
    "result_unsigned": "a result's figures and engine were sent to MLflow, its signed record not",
    "record_sent": "a result was sent to MLflow (the journal does not say so yet)",
    "record_logged": "the journal says a result is in MLflow",
    "cell_closed_in_store": "a cell's run was ended (the journal does not say so yet)",
    "rerun_journaled": "the settle journaled a result's re-run interval (its run lacks it)",
    "rerun_unsigned": "a settled re-run interval was sent to its run, its signed record not",
    "loadgen_journaled": "loadgen: a scenario's result was journaled (MLflow has not heard of it)",
    "index_written": "the parent's results index was written (the parent is still RUNNING)",
    "parent_finished": "the parent run was ended (the journal's indexed record not written)",
    "indexed": "the journal's indexed record was written (the invocation is complete)",
}

#: the points ``register`` passes (and ``tune --register``), in order
REGISTER_POINTS = {
    "register_model_initialized": "the logged model was created, PENDING, nothing in it yet",
    "register_model_logged": "the logged model is READY (its run and metrics not linked)",
    "register_version_created": "the registered version was created (the alias not moved)",
}

#: the longest a ``hold`` waits for its file to go (a test that never removes it)
HOLD_MAX_S = 600.0

_seen: dict[str, int] = {}


def _wanted() -> tuple[str, int, str] | None:
    value = os.environ.get(ENV)
    if not value:
        return None
    name, _, action = value.partition(":")
    name, _, nth = name.partition("@")
    return name, int(nth or 1), action or "kill"


def point(name: str) -> None:
    """Pass the point ``name``: stop here if the environment says so."""
    wanted = _wanted()
    if wanted is None or wanted[0] != name:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] != wanted[1]:
        return
    action = wanted[2]
    home = os.environ.get("MLFLOW_NGRAPH_HOME", ".")
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), home)
    elif action == "erofs":
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), home)
    elif action == "fill":
        _fill(Path(home))
    elif action.startswith("hold="):
        gate = Path(action[len("hold=") :])
        deadline = time.monotonic() + HOLD_MAX_S
        while gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        raise ValueError(f"{ENV}: unknown action {action!r} (kill, enospc, erofs, fill, hold=F)")


def _fill(home: Path) -> None:
    """Write a ballast file in ``home`` until its file system is full."""
    fd = os.open(home / ".ballast", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 16, 4096, 512, 1):  # to the last byte
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
