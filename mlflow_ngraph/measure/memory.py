"""How a measuring process's C heap treats the memory an inference frees.

An eager or compiled PyTorch model allocates its activations afresh at every inference and
frees them after it. With glibc's malloc left at its defaults, a buffer above the mmap
threshold (128 KiB, raised on the fly to the largest buffer freed so far, at most 32 MiB)
is mapped for the inference and unmapped after it, and the heap above the trim threshold is
handed back to the kernel; the next inference faults every page in again, and the kernel
zeroes each one. How many buffers take that path depends on the order of earlier
allocations (the threshold moves with them), so the same engine on the same input runs at
different speeds from one process to the next, and a buffer over 32 MiB always takes it.
Measured here (the width-64 depth-3 conv block in eager PyTorch, 2-core VM, four fresh
module copies per process; docs/measurement.md):

- batch 1, defaults: 6.6-12.3 samples/s, 2,700-34,400 page faults per inference, the level
  set by the process and the copy; kept: 11.9-13.5/s, 0-520 faults;
- batch 8, defaults: 5.0-5.9/s, 426,513 faults per inference (its 100 MiB activations are
  above any threshold); kept: 11.1-13.4/s, 0 faults after the first copy.

So a measuring process keeps what it frees (:func:`keep_freed_memory`): no buffer is
mapped on its own and the heap is never trimmed, which is what PyTorch's CPU tuning guide
gets by preloading jemalloc or TCMalloc ("reusing memory as much as possible"), done with
the allocator every Linux host has. ONNX Runtime and OpenVINO keep their own arenas and are
not changed by it; the baseline and the PyTorch-based compilers are no longer slowed by the
kernel's page zeroing, nor made irreproducible by it. A worker lives for one cell, so
nothing grows beyond it. ``MLFLOW_NGRAPH_MALLOC=system`` measures with the allocator's
defaults instead; the parent run's ``malloc`` tag says which was used.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

from mlflow_ngraph.errors import NgraphError

log = logging.getLogger(__name__)

#: ``keep`` (the default) or ``system``
MALLOC_ENV = "MLFLOW_NGRAPH_MALLOC"
KEEP, SYSTEM = "keep", "system"

# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
#: the largest trim threshold mallopt takes (an int): 2 GiB of free heap top before a trim
_NEVER_TRIM = 2**31 - 1

#: what the ``malloc`` tag says of each outcome
KEPT = f"{KEEP} (glibc: no mmap per buffer, no trim)"
NOT_GLIBC = f"{SYSTEM} (not glibc: its allocator is left as it is)"

_applied: str | None = None


def requested() -> str:
    """The policy :data:`MALLOC_ENV` asks for (``keep`` unless it says ``system``); any
    other value is an error naming the choices."""
    value = os.environ.get(MALLOC_ENV, KEEP).strip().lower() or KEEP
    if value not in (KEEP, SYSTEM):
        raise NgraphError(f"{MALLOC_ENV}={value!r} is not a choice: set it to {KEEP} or {SYSTEM}")
    return value


def _glibc():
    """glibc's mallopt, or ``None`` where the C library is another (musl, macOS)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None


def keep_freed_memory() -> str:
    """Set this process's C heap to keep what it frees (or leave it, per
    :data:`MALLOC_ENV`) and return what was done, as the ``malloc`` tag records it. Called
    once at a measuring process's start; later calls return the first answer."""
    global _applied
    if _applied is not None:
        return _applied
    try:
        policy = requested()
    except NgraphError:  # the runner reports it (:func:`record`); a worker keeps the default
        policy = KEEP
    if policy == SYSTEM:
        _applied = SYSTEM
        return _applied
    mallopt = _glibc()
    if mallopt is None:
        _applied = NOT_GLIBC
        return _applied
    ok = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM) == 1
    if not ok:
        log.warning("glibc refused mallopt: measuring with the allocator's defaults")
        _applied = f"{SYSTEM} (mallopt refused)"
        return _applied
    _applied = KEPT
    return _applied


def record() -> dict[str, str]:
    """The environment record's ``malloc`` entry: what a measuring process does (workers
    apply it at their start; this says what they will do on this host)."""
    if requested() == SYSTEM:
        return {"malloc": SYSTEM}
    return {"malloc": KEPT if _glibc() is not None else NOT_GLIBC}
