"""GPU utilisation, memory and environment through NVML (``pynvml`` from nvidia-ml-py).

Everything here is optional: without ``pynvml``, without an NVIDIA driver or without a GPU,
:class:`NvmlSampler` is a quiet no-op that returns ``{}`` and :func:`gpu_environment`
returns ``{}`` (plus the Jetson facts on a Jetson). The CPU path never notices. ``pynvml``
is imported inside the functions, never when this module is imported.

On Jetson (detected by ``/etc/nv_tegra_release``) NVML support is partial: a query the
driver does not support is skipped, and GPU utilisation falls back to the integrated GPU's
``load`` file in sysfs.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlflow_ngraph.tracking.schema import (
    M_GPU_DEVICE_MEM,
    M_GPU_MEM,
    M_GPU_UTIL,
    M_GPU_UTIL_SAMPLES,
)

log = logging.getLogger(__name__)

#: NVML refreshes its utilisation counter every 1/6 s to 1 s depending on the GPU; polling
#: at 50 ms sees every update and costs well under 1% of one core.
SAMPLE_INTERVAL_S = 0.05
#: nvpmodel and jetson_clocks answer in well under a second; a hung tool must not hang a run.
TOOL_TIMEOUT_S = 5.0

TEGRA_RELEASE = Path("/etc/nv_tegra_release")
#: devfreq devices of the Jetson integrated GPU (names as in the device tree: Orin ga10b,
#: Xavier gv11b, TX2 gp10b); their ``device/load`` file holds the load in tenths of a percent.
_DEVFREQ = Path("/sys/class/devfreq")
_IGPU_NAMES = ("ga10b", "gv11b", "gp10b", "gpu")

_MB = 2**20

Reading = tuple[float | None, float | None]  # (utilisation %, memory used MB)


def is_jetson() -> bool:
    """``True`` on an NVIDIA Jetson (L4T writes ``/etc/nv_tegra_release``)."""
    return TEGRA_RELEASE.is_file()


def summarize(readings: list[Reading]) -> dict[str, float]:
    """Mean utilisation and peak memory of ``readings``; keys only for what was measured.

    Returns:
        ``{"gpu_util_percent": mean, "gpu_mem_mb": peak}``, either key missing when no
        reading carried it, ``{}`` for no readings.
    """
    utils = [u for u, _ in readings if u is not None]
    mems = [m for _, m in readings if m is not None]
    result: dict[str, float] = {}
    if utils:
        result[M_GPU_UTIL] = sum(utils) / len(utils)
    if mems:
        result[M_GPU_MEM] = max(mems)
    return result


class NvmlSampler:
    """Samples GPU utilisation and memory in a background thread between start and stop.

    Use as ``with NvmlSampler() as s: ...`` (then read ``s.result``) or call :meth:`start`
    and :meth:`stop`. Utilisation is NVML's "percent of time a kernel ran" averaged over the
    window; memory is the device's used memory (all processes) at its peak. Without NVML or
    a GPU every call is a no-op and the result is ``{}``.

    Args:
        device_index: CUDA device ordinal of the measured device (mapped to NVML through
            ``CUDA_VISIBLE_DEVICES``).
        interval_s: polling period.
    """

    def __init__(self, device_index: int = 0, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.device_index = device_index
        self.interval_s = interval_s
        self.result: dict[str, float] = {}
        self._readings: list[Reading] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._probe: _Probe | None = None

    @property
    def active(self) -> bool:
        """``True`` while sampling a real GPU (``False`` for the no-op sampler)."""
        return self._thread is not None

    def start(self) -> NvmlSampler:
        """Open the GPU and start sampling; a no-op when no GPU can be read."""
        self.result = {}
        self._readings = []
        self._probe = _open_probe(self.device_index)
        if self._probe is None:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="ngraph-nvml", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        """Stop sampling and return ``{"gpu_util_percent": mean, "gpu_mem_mb": peak}``."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._probe is not None:
            # a window shorter than one period still gets one reading, taken after the
            # harness synchronized the device (NVML's counter covers the recent past)
            if not self._readings:
                self._sample()
            self._probe.close()
            self._probe = None
        self.result = summarize(self._readings)
        return self.result

    def __enter__(self) -> NvmlSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        try:
            self._readings.append(self._probe.read())
        except Exception as exc:  # a failing read loses one sample, never the measurement
            log.debug("GPU sample failed: %s", exc)


#: how GPU energy was measured, for the record: NVML's cumulative counter (Volta and later),
#: or its power reading times the window's length where the GPU has no counter
ENERGY_COUNTER, ENERGY_POWER = "nvml-total-energy", "nvml-power"


def in_windows(samples: list[tuple[int, float]], windows: list[tuple[int, int]]) -> list[float]:
    """The values of NVML's timestamped ``(microseconds, value)`` samples that fall inside
    one of the ``(start, end)`` windows (microseconds, the same CPU clock), each once."""
    kept, seen = [], set()
    for stamp, value in samples:
        if stamp in seen:
            continue
        if any(start < stamp <= end for start, end in windows):
            seen.add(stamp)
            kept.append(float(value))
    return kept


class GpuWindows:
    """GPU figures over exactly the windows the harness measures (:meth:`begin` /
    :meth:`end` around each), opened once for the whole measurement.

    - **Utilisation**: NVML keeps timestamped utilisation samples (one per sample period,
      1/6 s to 1 s by GPU); after each window its samples inside the window are read:
      this process's (``nvmlDeviceGetProcessUtilization``, so the other workers of a group
      and the runner are not counted) where NVML attributes samples to it, else the
      device's (``nvmlDeviceGetSamples``; a PID namespace hides the process). The mean of
      the samples inside every window, and how many there were: a window shorter than
      NVML's period may hold none.
    - **Memory**: this process's GPU memory (``nvmlDeviceGetComputeRunningProcesses``) at
      its peak over the windows' ends, and the device's used memory beside it.
    - **Energy**: NVML's total-energy counter (millijoules) read at each window's start
      and end; where the GPU lacks it, power times the window's length.

    Without NVML or a GPU it is a quiet no-op (:attr:`active` False): ``{}`` and no joules.
    """

    def __init__(self, device_index: int = 0, pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self._nvml = _init_nvml()
        self._handle = None
        if self._nvml is not None:
            try:
                self._handle = _nvml_handle(self._nvml, device_index)
            except self._nvml.NVMLError as exc:
                log.debug("NVML has no handle for CUDA device %d: %s", device_index, exc)
                self.close()
        self.windows: list[tuple[int, int]] = []
        self.util: list[float] = []
        self.util_source: str | None = None  # "process" or "device"
        self.joules: float | None = None
        self.energy_method: str | None = None
        self._mem: float | None = None
        self._device_mem: float | None = None
        self._start_us = 0
        self._energy0: float | None = None

    @property
    def active(self) -> bool:
        return self._handle is not None

    def begin(self) -> None:
        if not self.active:
            return
        self._energy0 = self._energy_mj()
        self._start_us = _now_us()

    def end(self) -> None:
        if not self.active:
            return
        end_us = _now_us()
        energy1 = self._energy_mj()
        seconds = (end_us - self._start_us) / 1e6
        window = (self._start_us, end_us)
        self.windows.append(window)
        if energy1 is not None and self._energy0 is not None:
            self._add_joules(max(0.0, energy1 - self._energy0) / 1000.0, ENERGY_COUNTER)
        else:
            watts = self._query(lambda h: self._nvml.nvmlDeviceGetPowerUsage(h) / 1000.0)
            if watts is not None:
                self._add_joules(watts * seconds, ENERGY_POWER)
        self.util.extend(in_windows(self._util_samples(self._start_us), [window]))
        self._memory()

    def result(self) -> dict[str, float]:
        """``gpu_util_percent`` (mean of the samples inside the windows) and
        ``gpu_util_samples``, ``gpu_mem_mb`` (this process, peak), ``gpu_device_mem_mb``
        (the device, peak): each only where it was measured."""
        out: dict[str, float] = {}
        if self.util:
            out[M_GPU_UTIL] = sum(self.util) / len(self.util)
        if self.windows:
            out[M_GPU_UTIL_SAMPLES] = float(len(self.util))
        if self._mem is not None:
            out[M_GPU_MEM] = self._mem
        if self._device_mem is not None:
            out[M_GPU_DEVICE_MEM] = self._device_mem
        return out

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception as exc:  # shutting NVML down never costs a measurement
                log.debug("NVML shutdown failed: %s", exc)
        self._nvml = self._handle = None

    # -- NVML reads: each may be unsupported on a GPU (None), never an error

    def _query(self, read: Callable[[Any], Any]) -> Any:
        try:
            return read(self._handle)
        except self._nvml.NVMLError as exc:
            log.debug("NVML query not supported here: %s", exc)
            return None

    def _energy_mj(self) -> float | None:
        return self._query(lambda h: float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h)))

    def _add_joules(self, joules: float, method: str) -> None:
        self.joules = (self.joules or 0.0) + joules
        if self.energy_method not in (None, method):
            method = f"{self.energy_method}+{method}"
        self.energy_method = method

    def _util_samples(self, since_us: int) -> list[tuple[int, float]]:
        nvml = self._nvml
        own = self._query(lambda h: nvml.nvmlDeviceGetProcessUtilization(h, since_us)) or []
        mine = [(int(p.timeStamp), float(p.smUtil)) for p in own if p.pid == self.pid]
        if mine and self.util_source != "device":
            self.util_source = "process"
            return mine
        if self.util_source == "process":
            return []  # NVML attributes to this process: no sample of it here is 0% busy
        device = self._query(
            lambda h: nvml.nvmlDeviceGetSamples(h, nvml.NVML_GPU_UTILIZATION_SAMPLES, since_us)
        )
        if not device:
            return []
        self.util_source = "device"
        return [(int(x.timeStamp), float(x.sampleValue.uiVal)) for x in device[1]]

    def _memory(self) -> None:
        nvml = self._nvml
        used = self._query(lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used / _MB)
        if used is not None:
            self._device_mem = max(self._device_mem or 0.0, used)
        procs = self._query(nvml.nvmlDeviceGetComputeRunningProcesses) or []
        for proc in procs:
            memory = getattr(proc, "usedGpuMemory", None)
            if proc.pid == self.pid and isinstance(memory, int):
                self._mem = max(self._mem or 0.0, memory / _MB)


def _now_us() -> int:
    """NVML's sample clock: the CPU's wall clock in microseconds."""
    return time.time_ns() // 1000


class _Probe:
    """Reads (utilisation %, memory MB) of one GPU; ``close`` releases NVML."""

    def __init__(
        self,
        util: Callable[[], float | None],
        mem: Callable[[], float | None],
        close: Callable[[], None] = lambda: None,
    ) -> None:
        self._util, self._mem, self._close = util, mem, close

    def read(self) -> Reading:
        return self._util(), self._mem()

    def close(self) -> None:
        self._close()


def _open_probe(device_index: int) -> _Probe | None:
    """A probe for the GPU, or ``None`` when neither NVML nor a Jetson iGPU can be read."""
    nvml = _init_nvml()
    jetson_load = _jetson_load_reader() if is_jetson() else None
    if nvml is None:
        if jetson_load is None:
            return None
        return _Probe(jetson_load, lambda: None)
    try:
        handle = _nvml_handle(nvml, device_index)
    except nvml.NVMLError as exc:
        log.debug("NVML has no handle for CUDA device %d: %s", device_index, exc)
        nvml.nvmlShutdown()
        return None if jetson_load is None else _Probe(jetson_load, lambda: None)
    util = _supported(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu), nvml)
    mem = _supported(lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used / _MB, nvml)
    if util is None and jetson_load is not None:
        util = jetson_load
    if util is None and mem is None:
        nvml.nvmlShutdown()
        return None
    return _Probe(util or (lambda: None), mem or (lambda: None), nvml.nvmlShutdown)


def _supported(query: Callable[[], float], nvml: Any) -> Callable[[], float] | None:
    """``query`` when the driver answers it once, else ``None`` (unsupported on this GPU)."""
    try:
        query()
    except nvml.NVMLError as exc:
        log.debug("NVML query not supported here: %s", exc)
        return None
    return query


def _init_nvml() -> Any | None:
    """The initialised ``pynvml`` module, or ``None`` (package, driver or GPU missing)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # no driver library, no GPU, driver/library mismatch
        log.debug("NVML unavailable: %s", exc)
        return None
    try:
        if pynvml.nvmlDeviceGetCount() > 0:
            return pynvml
    except pynvml.NVMLError as exc:
        log.debug("NVML device count failed: %s", exc)
    pynvml.nvmlShutdown()
    return None


def _nvml_handle(nvml: Any, device_index: int) -> Any:
    """NVML handle of CUDA device ``device_index``, honouring ``CUDA_VISIBLE_DEVICES``.

    NVML ignores ``CUDA_VISIBLE_DEVICES``; its entries (indices or ``GPU-`` UUIDs) map the
    CUDA ordinal back. Without it NVML's index is assumed equal to CUDA's (true unless
    ``CUDA_DEVICE_ORDER`` differs from PCI order on a host with mixed GPU models).
    """
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
    if device_index < len(visible):
        entry = visible[device_index]
        if entry.startswith(("GPU-", "MIG-")):
            return nvml.nvmlDeviceGetHandleByUUID(entry)
        if entry.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(entry))
    return nvml.nvmlDeviceGetHandleByIndex(device_index)


def _jetson_load_reader() -> Callable[[], float] | None:
    """Reads the Jetson integrated GPU's load (tenths of a percent) from sysfs."""
    if not _DEVFREQ.is_dir():
        return None
    for entry in sorted(_DEVFREQ.iterdir()):
        try:
            name = (entry / "device" / "of_node" / "name").read_text().strip("\x00\n ")
        except OSError:
            continue
        load = entry / "device" / "load"
        if name in _IGPU_NAMES and os.access(load, os.R_OK):
            return lambda path=load: int(path.read_text().strip()) / 10.0
    return None


# --- environment ------------------------------------------------------------------------


def gpu_environment(device_index: int = 0) -> dict[str, Any]:
    """The GPU facts a benchmark run records (``{}`` without NVML, GPU and Jetson).

    Keys: ``name``, ``driver_version``, ``cuda_driver_version``, ``memory_total_mb``,
    ``sm_clock_mhz``/``mem_clock_mhz`` (current) and ``sm_clock_max_mhz``/
    ``mem_clock_max_mhz``; on a Jetson also ``jetson_l4t_release``, ``jetson_power_mode``,
    ``jetson_power_mode_id`` (``nvpmodel -q``) and ``jetson_clocks.<unit>.<field>``
    (``jetson_clocks --show``, which needs root). A query the device does not support is
    left out.
    """
    env: dict[str, Any] = {}
    nvml = _init_nvml()
    if nvml is not None:
        try:
            env.update(_nvml_environment(nvml, device_index))
        finally:
            nvml.nvmlShutdown()
    if is_jetson():
        env.update(jetson_environment())
    return env


def _nvml_environment(nvml: Any, device_index: int) -> dict[str, Any]:
    try:
        handle = _nvml_handle(nvml, device_index)
    except nvml.NVMLError as exc:
        log.debug("NVML has no handle for CUDA device %d: %s", device_index, exc)
        handle = None
    queries: dict[str, Callable[[], Any]] = {
        "driver_version": nvml.nvmlSystemGetDriverVersion,
        "cuda_driver_version": lambda: _cuda_version(nvml.nvmlSystemGetCudaDriverVersion()),
    }
    if handle is not None:
        queries.update(
            {
                "name": lambda: nvml.nvmlDeviceGetName(handle),
                "memory_total_mb": lambda: round(nvml.nvmlDeviceGetMemoryInfo(handle).total / _MB),
                "sm_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
                "mem_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
                "sm_clock_max_mhz": lambda: nvml.nvmlDeviceGetMaxClockInfo(
                    handle, nvml.NVML_CLOCK_SM
                ),
                "mem_clock_max_mhz": lambda: nvml.nvmlDeviceGetMaxClockInfo(
                    handle, nvml.NVML_CLOCK_MEM
                ),
            }
        )
    env = {}
    for key, query in queries.items():
        try:
            value = query()
        except nvml.NVMLError as exc:
            log.debug("NVML %s not available: %s", key, exc)
            continue
        env[key] = value.decode() if isinstance(value, bytes) else value
    return env


def _cuda_version(encoded: int) -> str:
    """NVML's CUDA driver version integer (12040) as ``12.4``."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def jetson_environment() -> dict[str, Any]:
    """L4T release, power mode and clocks of a Jetson; ``{}`` elsewhere."""
    if not is_jetson():
        return {}
    env: dict[str, Any] = {}
    try:
        env["jetson_l4t_release"] = TEGRA_RELEASE.read_text().splitlines()[0].lstrip("# ")
    except (OSError, IndexError):
        pass
    env.update(parse_nvpmodel(_run_tool(["nvpmodel", "-q"])))
    env.update(parse_jetson_clocks(_run_tool(["jetson_clocks", "--show"])))
    return env


def parse_nvpmodel(output: str) -> dict[str, Any]:
    """``nvpmodel -q`` output (``NV Power Mode: MAXN`` then the mode id) as a dict."""
    lines = [line.strip() for line in output.splitlines()]
    for i, line in enumerate(lines):
        match = re.match(r"NV Power Mode:\s*(.+)", line)
        if match:
            env: dict[str, Any] = {"jetson_power_mode": match.group(1).strip()}
            if i + 1 < len(lines) and lines[i + 1].isdigit():
                env["jetson_power_mode_id"] = int(lines[i + 1])
            return env
    return {}


def parse_jetson_clocks(output: str) -> dict[str, Any]:
    """The GPU and EMC (memory) lines of ``jetson_clocks --show`` as flat keys.

    ``GPU MinFreq=306000000 MaxFreq=1300500000 CurrentFreq=306000000`` becomes
    ``jetson_clocks.gpu.minfreq`` = 306000000 and so on.
    """
    env: dict[str, Any] = {}
    for line in output.splitlines():
        unit, _, rest = line.strip().partition(" ")
        if unit.rstrip(":") not in ("GPU", "EMC"):
            continue
        for key, value in re.findall(r"(\w+)=(\S+)", rest):
            env[f"jetson_clocks.{unit.rstrip(':').lower()}.{key.lower()}"] = (
                int(value) if value.isdigit() else value
            )
    return env


def _run_tool(command: list[str]) -> str:
    """stdout of a Jetson tool, or ``""`` when it is missing, fails or hangs."""
    if shutil.which(command[0]) is None:
        return ""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("%s failed: %s", command[0], exc)
        return ""
    if done.returncode != 0:
        log.debug("%s exited %d: %s", command[0], done.returncode, done.stderr.strip())
        return ""
    return done.stdout


@functools.cache
def gpu_fingerprint(device_index: int = 0) -> str:
    """What a GPU engine is tied to: the GPU's name and compute capability, the CUDA runtime
    and cuDNN PyTorch carries and the driver (NVML), ``name|sm90|cuda13.0|cudnn91300|
    driver580.159.04``; empty without a CUDA device. A TensorRT plan, an Inductor kernel
    or a TVM module tuned on one card is another card's engine only by luck: this goes into
    the engine cache key and the manifest that deploy checks."""
    from mlflow_ngraph.devices import cuda_status

    ok, _ = cuda_status()
    if not ok:
        return ""
    import torch

    major, minor = torch.cuda.get_device_capability(device_index)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    driver = gpu_environment(device_index).get("driver_version", "unknown")
    return (
        f"{torch.cuda.get_device_name(device_index)}|sm{major}{minor}|cuda{torch.version.cuda}"
        f"|cudnn{cudnn}|driver{driver}"
    )
