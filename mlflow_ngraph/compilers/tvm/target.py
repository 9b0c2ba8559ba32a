"""TVM targets: the host CPU as LLVM sees it (minus what the hypervisor hides), CUDA, and
TVM's thread pool."""

from __future__ import annotations

import os
from typing import Any

from mlflow_ngraph.compilers.tvm.settings import X86_ISA_FLAGS
from mlflow_ngraph.errors import CompileFailed


def make_target(device: str) -> Any:
    """The TVM target for ``device`` ("cpu" or "cuda") on this host.

    Raises:
        CompileFailed: ``cuda`` was asked for but TVM has no CUDA support or sees no GPU.
    """
    import tvm

    host = tvm.target.Target(host_cpu_target_spec())
    if device != "cuda":
        return host
    return tvm.target.Target(cuda_target_spec(), host=host)


def host_cpu_target_spec() -> dict[str, Any]:
    """An ``llvm`` target dict for this CPU: its LLVM name, features and physical core count.

    ``mcpu=native`` is rejected by the LLVM 22 inside TVM 0.27, so the CPU name comes from
    LLVM's host detection and the features LLVM would assume for it are checked against
    /proc/cpuinfo.
    """
    from tvm.target import codegen

    spec: dict[str, Any] = {"kind": "llvm", "num-cores": physical_cores()}
    cpu = str(codegen.llvm_get_system_cpu())
    triple = str(codegen.llvm_get_system_triple())
    if cpu and cpu != "generic" and codegen.llvm_is_valid_cpu(cpu, triple):
        spec["mcpu"] = cpu
        hidden = _features_missing_on_host(spec)
        if hidden:
            spec["mattr"] = [f"-{feature}" for feature in hidden]
    return spec


def _features_missing_on_host(spec: dict[str, Any]) -> list[str]:
    """x86 ISA features implied by ``spec["mcpu"]`` that /proc/cpuinfo does not list."""
    import tvm
    from tvm.target import codegen

    flags = _cpuinfo_flags()
    if not flags or "avx" not in flags and "sse2" not in flags:
        return []  # not x86, or no /proc/cpuinfo: trust LLVM's host detection
    implied = codegen.llvm_get_cpu_features(tvm.target.Target(spec))
    return sorted(f for f, flag in X86_ISA_FLAGS.items() if f in implied and flag not in flags)


def _cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def configure_threads() -> None:
    """Give TVM's thread pool one thread per physical core, unless ``TVM_NUM_THREADS`` is set.

    Left to itself, TVM 0.27 on a VM without cpufreq data starts ONE thread and pins the
    calling thread, and with it every later runtime in the process (PyTorch, ONNX Runtime),
    to core 0. The variable is read when the pool starts and inherited by the tuning workers,
    so it must be set before the first TVM kernel runs.
    """
    os.environ.setdefault("TVM_NUM_THREADS", str(physical_cores()))


def physical_cores() -> int:
    """Physical cores this process may use (TVM's thread pool uses one thread per core)."""
    import psutil

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    physical = psutil.cpu_count(logical=False) or usable or 1
    return max(1, min(physical, usable or physical))


def cuda_target_spec() -> dict[str, Any]:
    """A ``cuda`` target dict from the properties of GPU 0.

    Raises:
        CompileFailed: TVM was built without CUDA or sees no CUDA device.
    """
    import tvm

    if not tvm.runtime.enabled("cuda"):
        raise CompileFailed(
            "TVM target cuda: this TVM build has no CUDA support (tvm.runtime.enabled('cuda') "
            "is False); install a CUDA-enabled apache-tvm build"
        )
    dev = tvm.cuda(0)
    if not dev.exist:
        raise CompileFailed("TVM target cuda: no CUDA device visible (tvm.cuda(0).exist is False)")
    major, minor = str(dev.compute_version).split(".")[:2]
    return {
        "kind": "cuda",
        "arch": f"sm_{major}{minor}",
        "max_threads_per_block": int(dev.max_threads_per_block),
        "max_shared_memory_per_block": int(dev.max_shared_memory_per_block),
        "thread_warp_size": int(dev.warp_size),
    }


def is_gpu(target: Any) -> bool:
    return target.kind.name == "cuda"
