"""NVML sampling and GPU environment: a quiet no-op without a GPU, real readings with one."""

from __future__ import annotations

import importlib.util
import os
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


# --- GPU figures over exactly the measured windows ----------------------------------------


def test_only_samples_inside_a_window_count_each_once():
    samples = [(100, 10.0), (150, 20.0), (150, 20.0), (250, 90.0), (320, 40.0)]
    # 250 lies between the windows (another engine's turn); 100 is the first window's start
    assert nvml.in_windows(samples, [(100, 200), (300, 400)]) == [20.0, 40.0]
    assert nvml.in_windows(samples, []) == []


class _RecordedNvml:
    """NVML's answers recorded as a GPU would give them: this host has no GPU (and no
    unsupported query on demand). Clock in microseconds, energy in millijoules."""

    NVML_GPU_UTILIZATION_SAMPLES = 1

    class NVMLError(Exception):
        pass

    def __init__(self, pid, energy=True, attributes=True):
        from types import SimpleNamespace as NS

        self.NS, self.pid, self.energy, self.attributes = NS, pid, energy, attributes
        self.energy_mj = 1_000_000.0
        self.process_samples: list = []  # (pid, stamp, sm util)
        self.device_samples: list = []  # (stamp, util)
        self.shutdowns = 0

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if not self.energy:
            raise self.NVMLError("Not Supported")
        self.energy_mj += 2500.0  # 2.5 J between two reads: one window
        return self.energy_mj

    def nvmlDeviceGetPowerUsage(self, handle):
        return 300_000  # mW

    def nvmlDeviceGetProcessUtilization(self, handle, since):
        if not self.attributes:
            raise self.NVMLError("Not Found")
        return [self.NS(pid=p, timeStamp=t, smUtil=u) for p, t, u in self.process_samples
                if t > since]  # fmt: skip

    def nvmlDeviceGetSamples(self, handle, kind, since):
        assert kind == self.NVML_GPU_UTILIZATION_SAMPLES
        values = [self.NS(timeStamp=t, sampleValue=self.NS(uiVal=u))
                  for t, u in self.device_samples if t > since]  # fmt: skip
        return (0, values)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return self.NS(used=3000 * 2**20)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [self.NS(pid=self.pid, usedGpuMemory=700 * 2**20),
                self.NS(pid=self.pid + 1, usedGpuMemory=1500 * 2**20)]  # fmt: skip

    def nvmlShutdown(self):
        self.shutdowns += 1


def _windows(monkeypatch, fake, clock):
    monkeypatch.setattr(nvml, "_init_nvml", lambda: fake)
    monkeypatch.setattr(nvml, "_nvml_handle", lambda n, i: "gpu0")
    monkeypatch.setattr(nvml, "_now_us", lambda: clock.pop(0))
    return nvml.GpuWindows(pid=fake.pid)


def test_gpu_windows_use_this_process_samples_inside_the_windows_and_the_energy_counter(
    monkeypatch,
):
    fake = _RecordedNvml(pid=4242)
    fake.process_samples = [
        (4242, 1_050, 80.0),  # inside window 1
        (4243, 1_060, 99.0),  # another worker of the group: never this engine's
        (4242, 1_500, 5.0),  # between the windows: another engine's turn
        (4242, 2_090, 60.0),  # inside window 2
    ]
    meter = _windows(monkeypatch, fake, [1_000, 1_100, 2_000, 2_100])
    for _ in range(2):
        meter.begin()
        meter.end()
    assert meter.util_source == "process"
    assert meter.result() == {
        M_GPU_UTIL: 70.0, "gpu_util_samples": 2.0, M_GPU_MEM: 700.0, "gpu_device_mem_mb": 3000.0,
    }  # fmt: skip
    assert meter.joules == 5.0 and meter.energy_method == nvml.ENERGY_COUNTER
    meter.close()
    assert fake.shutdowns == 1 and not meter.active


def test_gpu_windows_fall_back_to_device_samples_and_power(monkeypatch):
    # a PID namespace hides the process from NVML; a GPU without the energy counter
    fake = _RecordedNvml(pid=7, energy=False, attributes=False)
    fake.device_samples = [(900, 100.0), (1_040, 30.0), (1_080, 50.0)]
    meter = _windows(monkeypatch, fake, [1_000, 2_001_000])  # a 2 s window
    meter.begin()
    meter.end()
    assert meter.util_source == "device"
    assert meter.result()[M_GPU_UTIL] == 40.0  # 900 was before the window
    assert meter.joules == pytest.approx(600.0) and meter.energy_method == nvml.ENERGY_POWER


def test_the_gpu_energy_is_its_own_domain_beside_the_cpu(monkeypatch, tmp_path):
    from mlflow_ngraph.measure.energy import energy_metrics
    from mlflow_ngraph.measure.sampler import ResourceSampler
    from mlflow_ngraph.tracking import schema as S

    fake = _RecordedNvml(pid=os.getpid())
    monkeypatch.setattr(nvml, "_init_nvml", lambda: fake)
    monkeypatch.setattr(nvml, "_nvml_handle", lambda n, i: "gpu0")
    sampler = ResourceSampler(gpu=True, powercap_root=tmp_path)  # no RAPL here
    for _ in range(3):
        sampler.begin()
        sampler.end()
    usage = sampler.result()
    sampler.close()
    assert usage.energy_j == {"gpu": 7.5} and usage.energy_method == nvml.ENERGY_COUNTER
    metrics = energy_metrics(usage.energy_j, samples=75, seconds=1.0)
    assert metrics[S.domain_key(S.M_ENERGY_PER_SAMPLE, "gpu")] == pytest.approx(0.1)
    assert S.is_schema_metric("power_w.gpu")
    assert usage.gpu[M_GPU_MEM] == 700.0  # this process, not the device's 3000
