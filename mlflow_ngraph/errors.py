"""User-facing errors: one readable line, a non-zero exit, no traceback."""

from __future__ import annotations


class NgraphError(Exception):
    """An error caused by the user's input or environment.

    The CLI prints ``str(error)`` on one line and exits with ``exit_code``; it never shows a
    traceback for these.
    """

    exit_code = 2


class StoreAway(NgraphError):
    """The tracking server does not answer (at the start, or again before the run's end):
    what was measured waits in the journal. Its own exit status lets a caller (a sweep's
    device task) try again later, where a user error (2) would fail the same way."""

    exit_code = 3


class CompilerUnavailable(NgraphError):
    """A compiler was asked for but its package or device is missing on this host."""


class CompileFailed(Exception):
    """A compiler failed on one model: the cell is marked FAILED and the run goes on."""


class HostFault(NgraphError):
    """The host, not the benchmark, failed: a full disk, a read-only or unwritable home, no
    memory. Nothing measured is lost; the same command, run again once the host is fixed,
    measures what is missing. Its own exit status tells it from a user error."""

    exit_code = 4


#: errno values that are the host's fault, with the fix to name
HOST_ERRNOS = {
    28: "free space on that disk, or point --home / MLFLOW_NGRAPH_HOME at a disk with room",
    122: "free space (disk quota exceeded), or point --home / MLFLOW_NGRAPH_HOME elsewhere",
    30: "make that file system writable, or point --home / MLFLOW_NGRAPH_HOME at a writable one",
    13: "make that directory writable by this user, or point --home / MLFLOW_NGRAPH_HOME at one",
    1: "make that directory writable by this user, or point --home / MLFLOW_NGRAPH_HOME at one",
    12: "free memory (close other programs), or measure fewer or smaller models at once",
}

#: how a cell failure reads when a file of the home vanished under it (:func:`vanished`)
VANISHED = "a file of the home's caches vanished under the run"
#: how a host failure reads in a cell's failure reason (an exception as one line)
_HOST_TEXTS = (
    ("[Errno 28]", 28),
    ("No space left on device", 28),
    ("[Errno 122]", 122),
    ("Disk quota exceeded", 122),
    ("[Errno 30]", 30),
    ("Read-only file system", 30),
    ("[Errno 13]", 13),
    ("Permission denied", 13),
    ("[Errno 12]", 12),
    ("Cannot allocate memory", 12),
    ("MemoryError", 12),
    (VANISHED, 2),
)


#: the fix of each host failure a cell's reason can name
HOST_FIXES = {
    **HOST_ERRNOS,
    2: "let nothing remove the home's files while a run uses them (another user's prune, "
    "a cleaner of the temp folder)",
}


def vanished(reason: str, home) -> bool:
    """Whether a cell failure ``reason`` is a file of ``home`` that was not found (removed
    under the run: by a prune, a cleaner), not a fault of the model or compiler."""
    if "No such file or directory" not in reason and "[Errno 2]" not in reason:
        return False
    from pathlib import Path

    places = {str(home), str(Path(home).absolute()), str(Path(home).resolve())}
    return any(place in reason for place in places)


def host_errno(reason: str) -> int | None:
    """The errno of a cell failure ``reason`` that is the host's fault (a full disk, a
    read-only home, no memory), or None for a failure of the model or compiler."""
    return next((code for text, code in _HOST_TEXTS if text in reason), None)


def host_fix(reason: str) -> str:
    """The fix of a host failure named by a cell failure ``reason``."""
    return HOST_FIXES.get(host_errno(reason) or 0, "fix the host")


def host_fault(exc: BaseException, what: str, kept: str = "") -> HostFault | None:
    """One line for an ``OSError`` that is the host's fault while doing ``what``: the path,
    the problem and the fix (``kept``: what is safe, said before the fix); None otherwise."""
    if not isinstance(exc, OSError) or exc.errno not in HOST_ERRNOS:
        return None
    path = exc.filename or "?"
    return HostFault(
        f"cannot {what} {path}: {exc.strerror or exc}; {kept + '; ' if kept else ''}"
        f"{HOST_ERRNOS[exc.errno]}, then run the same command again"
    )
