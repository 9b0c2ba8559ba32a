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
