"""User-facing errors: one readable line, a non-zero exit, no traceback."""

from __future__ import annotations


class NgraphError(Exception):
    """An error caused by the user's input or environment.

    The CLI prints ``str(error)`` on one line and exits with ``exit_code``; it never shows a
    traceback for these.
    """

    exit_code = 2


class CompilerUnavailable(NgraphError):
    """A compiler was asked for but its package or device is missing on this host."""


class CompileFailed(Exception):
    """A compiler failed on one model: the cell is marked FAILED and the run goes on."""
