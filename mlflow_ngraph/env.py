"""What this host is: its CPU, the runtimes' versions, the git revision, and the fingerprint
that makes two hosts the same for engines and figures (the run's whole environment record
is :mod:`mlflow_ngraph.run.environment`)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

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


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The CPU's ISA feature flags (``/proc/cpuinfo``), empty where the OS does not say:
    an engine's manifest records them, so a host missing one is told before loading."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return sorted(line.split(":", 1)[1].split())
    except OSError:
        pass
    return []


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


def host_fingerprint() -> str:
    """What makes two hosts the same for the engines built and the figures measured on
    them: the CPU model and the core count."""
    return f"{cpu_model()}|{os.cpu_count()}"
