"""The environment recorded with every benchmark: versions, CPU, threads, OS, git revision,
how the workers start, what energy and memory readings this host gives."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

from mlflow_ngraph.env import cpu_model, git_revision, library_versions

log = logging.getLogger(__name__)

#: environment variables that can change PyTorch's default thread counts
_THREAD_VAR_PREFIXES = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH_")
_THREAD_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "KMP_AFFINITY",
    "OMP_PROC_BIND",
    "OMP_PLACES",
    "TORCHINDUCTOR_CACHE_DIR",
)


def torch_threads(cache_dir: Path | None = None) -> tuple[int, int]:
    """PyTorch's intra-op and inter-op thread counts in this process.

    Importing torch takes seconds, which a re-run that measures nothing would spend only on
    these two numbers; a run that measures asks a fork of its workers' template, which has
    torch imported (:func:`_asked_threads`). With a ``cache_dir`` they are kept in a file
    keyed by everything PyTorch derives its defaults from (its version, the CPU, the
    affinity mask, the thread environment variables), written whenever torch is asked, and
    read only while torch is not imported: once it is, its own answer is the truth, and
    before it is nothing can have changed its defaults. (The package never calls
    ``torch.set_num_threads``.)
    """
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / "torch-threads" / f"{_thread_key()}.json"
        if "torch" not in sys.modules:
            try:
                intra, inter = json.loads(path.read_text())
                return int(intra), int(inter)
            except (OSError, ValueError, TypeError):
                pass  # not cached yet: asked below, and written
    threads = _asked_threads()
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(threads))
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home only costs the import next time
    return threads


def _torch_thread_counts() -> tuple[int, int]:
    import torch

    return torch.get_num_threads(), torch.get_num_interop_threads()


def _asked_threads() -> tuple[int, int]:
    """The counts in this process if it has imported torch; else from a fork of the run's
    workers' template, when it runs (it has torch imported, and the counts are the workers',
    which are the ones measured); else torch is imported here."""
    from mlflow_ngraph.run import template

    if "torch" not in sys.modules and template.running():
        try:
            return tuple(template.ask(_torch_thread_counts))
        except Exception as exc:  # asked here instead
            log.debug("the workers' template did not answer (%s): torch imported here", exc)
    return _torch_thread_counts()


def _thread_key() -> str:
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        version = "none"
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    parts = {
        "torch": version,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "affinity": affinity,
        "env": {k: v for k, v in os.environ.items() if k.startswith(_THREAD_VAR_PREFIXES)},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def energy_record(root: Path | None = None) -> dict[str, str]:
    """``energy.method`` and its domains where RAPL is readable, else ``energy.method`` =
    ``none`` and ``energy.unavailable`` saying why (measure/energy.py)."""
    from mlflow_ngraph.measure.energy import POWERCAP_ROOT, environment_record

    return environment_record(POWERCAP_ROOT if root is None else root)


def environment(
    profile_name: str, device_kind: str, cache_dir: Path | None = None
) -> dict[str, Any]:
    """A flat record of this host, for the parent run's tags and ``environment.json``.

    ``cache_dir`` lets PyTorch's thread counts come from a cache (see :func:`torch_threads`).
    """
    import psutil

    intra, inter = torch_threads(cache_dir)
    env: dict[str, Any] = {
        "device_profile": profile_name,
        "device_kind": device_kind,
        "host": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model(),
        "cpu_logical_cores": psutil.cpu_count(logical=True),
        "cpu_physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "torch_num_threads": intra,
        "torch_num_interop_threads": inter,
        "git_revision": git_revision(),
    }
    env.update({f"version.{k}": v for k, v in library_versions().items()})
    env.update({f"env.{k}": os.environ[k] for k in _THREAD_VARS if k in os.environ})
    # how measuring processes treat freed memory (measure/memory.py)
    from mlflow_ngraph.measure.memory import record as malloc_record

    env.update(malloc_record())
    # how measuring processes start: forked from the run's template, or spawned (template.py)
    from mlflow_ngraph.run.template import start_method

    env["worker_start"] = start_method()
    # energy: RAPL's method and domains, or why nothing is measured (never an estimate)
    env.update(energy_record())
    if device_kind == "cuda":
        from mlflow_ngraph.measure.nvml import gpu_environment

        env.update({f"gpu.{k}": v for k, v in gpu_environment().items()})
    return env
