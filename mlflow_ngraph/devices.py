"""Device profiles: which compilers a device runs by default, and with which settings.

A profile names a kind of device (``cpu`` or ``cuda``) and the compilers and flags that suit
it. ``cpu`` and ``xeon`` run on any x86 CPU; ``gpu`` (a CUDA server) and ``orin`` (Jetson)
need a CUDA device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from mlflow_ngraph.errors import NgraphError


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    kind: str  # "cpu" or "cuda"
    description: str
    compilers: tuple[str, ...]
    #: flag defaults this profile sets per compiler (user flags override them)
    compiler_flags: dict[str, dict[str, Any]] = field(default_factory=dict)


_CPU_COMPILERS = ("identity", "torchscript", "inductor", "onnxruntime", "openvino")

PROFILES: dict[str, DeviceProfile] = {
    "cpu": DeviceProfile("cpu", "cpu", "any CPU host", _CPU_COMPILERS),
    # the paper's Xeon set adds TVM, whose MetaSchedule tuning takes minutes per model and
    # batch size; the plain `cpu` profile leaves it out so a first run stays short
    "xeon": DeviceProfile(
        "xeon",
        "cpu",
        "Intel Xeon server (the paper's CPU device)",
        (*_CPU_COMPILERS, "tvm"),
        {"openvino": {"device": "CPU"}},
    ),
    "gpu": DeviceProfile(
        "gpu",
        "cuda",
        "NVIDIA GPU server (the paper's RTX device)",
        ("identity", "torchscript", "inductor", "onnxruntime", "tensorrt"),
        {"onnxruntime": {"provider": "cuda"}},
    ),
    "orin": DeviceProfile(
        "orin",
        "cuda",
        "NVIDIA Jetson Orin (JetPack)",
        ("identity", "torchscript", "onnxruntime", "tensorrt"),
        {"onnxruntime": {"provider": "cuda"}},
    ),
}


def get_profile(name: str) -> DeviceProfile:
    if name not in PROFILES:
        raise NgraphError(f"unknown device profile {name!r} (profiles: {', '.join(PROFILES)})")
    return PROFILES[name]


@functools.lru_cache(maxsize=1)
def cuda_status() -> tuple[bool, str]:
    """Whether a CUDA device is usable here, and if not, why."""
    try:
        import torch
    except ImportError:
        return False, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA device on this host (torch.cuda.is_available() is False)"
    return True, torch.cuda.get_device_name(0)


def check_profile_runs_here(profile: DeviceProfile) -> None:
    """Raise a clear error when the profile's device kind is missing on this host."""
    if profile.kind == "cuda":
        ok, reason = cuda_status()
        if not ok:
            raise NgraphError(
                f"device profile {profile.name!r} needs a CUDA device: {reason}; "
                "use --device cpu or xeon on this host"
            )
