"""The environment recorded with every benchmark: versions, CPU, threads, OS, git revision."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

_LIBRARIES = (
    "mlflow-ngraph",
    "torch",
    "torchvision",
    "timm",
    "onnx",
    "onnxruntime",
    "onnxruntime-gpu",
    "openvino",
    "apache-tvm",
    "apache-tvm-ffi",
    "tensorrt",
    "mlflow",
    "numpy",
    "ray",
)
_THREAD_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "KMP_AFFINITY",
    "OMP_PROC_BIND",
    "OMP_PLACES",
    "TORCHINDUCTOR_CACHE_DIR",
)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def library_versions() -> dict[str, str]:
    versions = {}
    for name in _LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def git_revision() -> str:
    for where in (Path.cwd(), Path(__file__).resolve().parent):
        try:
            out = subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5
            )
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"
        if out.returncode == 0:
            return out.stdout.strip()
    return "unknown"


def environment(profile_name: str, device_kind: str) -> dict[str, Any]:
    """A flat record of this host, for the parent run's tags and ``environment.json``."""
    import psutil
    import torch

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
        "torch_num_threads": torch.get_num_threads(),
        "torch_num_interop_threads": torch.get_num_interop_threads(),
        "git_revision": git_revision(),
    }
    env.update({f"version.{k}": v for k, v in library_versions().items()})
    env.update({f"env.{k}": os.environ[k] for k in _THREAD_VARS if k in os.environ})
    if device_kind == "cuda":
        from mlflow_ngraph.measure.nvml import gpu_environment

        env.update({f"gpu.{k}": v for k, v in gpu_environment().items()})
    return env
