"""NVML sampling and GPU environment: a quiet no-op without a GPU, real readings with one."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time

import pytest

from mlflow_ngraph.devices import cuda_status
from mlflow_ngraph.measure import nvml
from mlflow_ngraph.measure.nvml import (
    NvmlSampler,
    gpu_environment,
    is_jetson,
    parse_jetson_clocks,
    parse_nvpmodel,
    summarize,
)
from mlflow_ngraph.tracking.schema import M_GPU_MEM, M_GPU_UTIL

CUDA_OK, CUDA_REASON = cuda_status()
HAS_PYNVML = importlib.util.find_spec("pynvml") is not None
no_gpu_here = pytest.mark.skipif(CUDA_OK or is_jetson(), reason="this host has an NVIDIA GPU")
needs_gpu = pytest.mark.skipif(not CUDA_OK, reason=CUDA_REASON)


def test_importing_the_module_does_not_import_pynvml():
    code = (
        "import sys\n"
        "import mlflow_ngraph.measure.nvml\n"
        "assert 'pynvml' not in sys.modules\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# --- pure parts -------------------------------------------------------------------------


def test_summarize_means_utilisation_and_peaks_memory():
    readings = [(10.0, 100.0), (30.0, 300.0), (None, 200.0), (50.0, None)]
    assert summarize(readings) == {M_GPU_UTIL: 30.0, M_GPU_MEM: 300.0}


def test_summarize_keeps_only_what_was_measured():
    assert summarize([]) == {}
    assert summarize([(None, None)]) == {}
    assert summarize([(None, 512.0)]) == {M_GPU_MEM: 512.0}
    assert M_GPU_UTIL == "gpu_util_percent" and M_GPU_MEM == "gpu_mem_mb"


@pytest.mark.parametrize(("encoded", "text"), [(12040, "12.4"), (13000, "13.0"), (12060, "12.6")])
def test_cuda_driver_version_decoding(encoded, text):
    assert nvml._cuda_version(encoded) == text


def test_parse_nvpmodel_query():
    assert parse_nvpmodel("NV Power Mode: MAXN\n0\n") == {
        "jetson_power_mode": "MAXN",
        "jetson_power_mode_id": 0,
    }
    assert parse_nvpmodel("NVPM WARN: something\nNV Power Mode: 15W\n2\n") == {
        "jetson_power_mode": "15W",
        "jetson_power_mode_id": 2,
    }
    assert parse_nvpmodel("") == {}


def test_parse_jetson_clocks_show_keeps_gpu_and_memory_clocks():
    output = (
        "SOC family:tegra234  Machine:NVIDIA Jetson AGX Orin Developer Kit\n"
        "Online CPUs: 0-11\n"
        "cpu0: Online=1 Governor=schedutil MinFreq=729600 MaxFreq=2201600 CurrentFreq=1728000\n"
        "GPU MinFreq=306000000 MaxFreq=1300500000 CurrentFreq=1300500000\n"
        "EMC MinFreq=204000000 MaxFreq=3199000000 CurrentFreq=3199000000 FreqOverride=1\n"
        "NV Power Mode: MAXN\n"
    )
    assert parse_jetson_clocks(output) == {
        "jetson_clocks.gpu.minfreq": 306000000,
        "jetson_clocks.gpu.maxfreq": 1300500000,
        "jetson_clocks.gpu.currentfreq": 1300500000,
        "jetson_clocks.emc.minfreq": 204000000,
        "jetson_clocks.emc.maxfreq": 3199000000,
        "jetson_clocks.emc.currentfreq": 3199000000,
        "jetson_clocks.emc.freqoverride": 1,
    }
    assert parse_jetson_clocks("") == {}


def test_missing_tool_reads_as_empty_output():
    assert nvml._run_tool(["mlflow-ngraph-no-such-tool", "-q"]) == ""


# --- on a host without an NVIDIA GPU (this CI) -------------------------------------------


@no_gpu_here
def test_sampler_is_a_quiet_no_op_here(caplog):
    sampler = NvmlSampler()
    with caplog.at_level("WARNING"):
        sampler.start()
        assert not sampler.active
        time.sleep(0.12)
        assert sampler.stop() == {}
    assert sampler.result == {}
    assert caplog.records == []


@no_gpu_here
def test_sampler_as_context_manager_here():
    with NvmlSampler(interval_s=0.01) as sampler:
        time.sleep(0.03)
    assert sampler.result == {}
    assert sampler.stop() == {}  # stopping twice is harmless


@no_gpu_here
def test_gpu_environment_is_empty_here(caplog):
    with caplog.at_level("WARNING"):
        assert gpu_environment() == {}
    assert caplog.records == []
    assert nvml.jetson_environment() == {}


@no_gpu_here
@pytest.mark.skipif(not HAS_PYNVML, reason="pynvml (nvidia-ml-py) is not installed")
def test_pynvml_without_driver_reads_as_no_gpu():
    # the real package, failing in nvmlInit (no driver library) on this host
    assert nvml._init_nvml() is None


@no_gpu_here
def test_missing_pynvml_reads_as_no_gpu(monkeypatch):
    # fault injection: hide pynvml even where it is installed
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert nvml._init_nvml() is None
    assert NvmlSampler().start().stop() == {}
    assert gpu_environment() == {}


def test_sampler_thread_aggregates_readings_and_survives_a_failed_read(monkeypatch):
    # injected readings: this host has no GPU to produce them, nor a failing read on demand
    readings = iter([(20.0, 100.0), RuntimeError("driver hiccup"), (40.0, 300.0)])
    memory = {}
    closed = []

    def utilisation():
        value = next(readings, (None, None))
        if isinstance(value, Exception):
            raise value
        memory["mb"] = value[1]
        return value[0]

    probe = nvml._Probe(utilisation, lambda: memory.get("mb"), lambda: closed.append(True))
    monkeypatch.setattr(nvml, "_open_probe", lambda device_index: probe)
    sampler = NvmlSampler(interval_s=0.005).start()
    assert sampler.active
    deadline = time.monotonic() + 5
    while len(sampler._readings) < 4 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert sampler.stop() == {M_GPU_UTIL: 30.0, M_GPU_MEM: 300.0}
    assert closed == [True]
    assert not sampler.active


# --- on an NVIDIA GPU -------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_PYNVML, reason="pynvml (nvidia-ml-py) is not installed")
@needs_gpu
def test_sampler_sees_a_busy_gpu():
    import torch

    a = torch.randn(2048, 2048, device="cuda")
    with NvmlSampler() as sampler:
        deadline = time.perf_counter() + 1.0
        while time.perf_counter() < deadline:
            a @ a
        torch.cuda.synchronize()
    assert sampler.result, "no GPU reading at all"
    if M_GPU_MEM in sampler.result:
        assert sampler.result[M_GPU_MEM] > 16  # the 16 MB tensor alone
    if M_GPU_UTIL in sampler.result:
        assert 0 < sampler.result[M_GPU_UTIL] <= 100


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_PYNVML, reason="pynvml (nvidia-ml-py) is not installed")
@needs_gpu
def test_gpu_environment_names_the_gpu():
    env = gpu_environment()
    assert env["driver_version"]
    assert "." in env["cuda_driver_version"]
    if not is_jetson():
        assert env["name"]
        assert env["memory_total_mb"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not is_jetson(), reason="not a Jetson (no /etc/nv_tegra_release)")
def test_jetson_environment_on_a_jetson():
    env = nvml.jetson_environment()
    assert env["jetson_l4t_release"].startswith("R")
