"""Resource sampling over a measured window: the process's CPU usage and peak RSS, what the
rest of the host did meanwhile (other processes' CPU time, steal, load, frequency,
throttling), GPU via NVML."""

from __future__ import annotations

import glob
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from mlflow_ngraph.measure.energy import METHOD, POWERCAP_ROOT, RaplReader

#: RSS polling period; 50 ms catches allocation peaks of a request on the models studied
#: while costing well under 0.1% of one core.
RSS_POLL_S = 0.05
#: the CPU frequency is read every this many RSS polls (0.5 s)
FREQ_EVERY_POLLS = 10


#: a window shorter than this says nothing about other processes: /proc/stat counts CPU
#: time in ticks of 10 ms, so one tick on a 0.1 s window of 2 cores already reads 5%
HOST_MIN_WINDOW_S = 0.5
#: sysfs counters of thermal throttling (Intel; absent on VMs and most ARM boards)
THROTTLE_GLOB = "/sys/devices/system/cpu/cpu*/thermal_throttle/*_throttle_count"


@dataclass
class HostNoise:
    """What the host did over a window besides this process; ``None`` where the OS does not
    expose it or the window was too short to tell."""

    other_cpu_percent: float | None = None  # other processes' CPU time, % of all cores
    steal_percent: float | None = None  # hypervisor steal, % of all cores
    load_avg: float | None = None  # 1-minute load average at the end
    cpu_freq_mhz: float | None = None  # mean current frequency over the window
    throttle_events: float | None = None  # thermal throttle events during the window


@dataclass
class ResourceUsage:
    cpu_percent: float  # CPU time / wall time / logical cores * 100
    peak_rss_mb: float
    wall_s: float
    gpu: dict
    host: HostNoise = field(default_factory=HostNoise)
    #: joules per RAPL domain over the window (``package``, ``dram``; energy.py), empty where
    #: no counter is readable: energy.energy_metrics makes the metrics of it
    energy_j: dict[str, float] = field(default_factory=dict)
    #: how ``energy_j`` was measured (energy.METHOD), ``None`` when it was not
    energy_method: str | None = None


def _proc_stat() -> tuple[float, float] | None:
    """(busy, steal) CPU seconds of the whole machine since boot, from /proc/stat; busy is
    user + nice + system + irq + softirq (guest time is inside user)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:]]
    ticks += [0] * (8 - len(ticks))
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks[:8]
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / hz, steal / hz


def _tree_cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds of ``process`` and its live descendants, in the same
    accounting as /proc/stat."""
    total = 0.0
    try:
        family = [process, *process.children(recursive=True)]
    except psutil.Error:
        family = [process]
    for member in family:
        try:
            times = member.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def _throttle_count() -> float | None:
    paths = glob.glob(THROTTLE_GLOB)
    if not paths:
        return None
    total = 0.0
    for path in paths:
        try:
            with open(path) as f:
                total += float(f.read().strip() or 0)
        except (OSError, ValueError):
            continue
    return total


def _frequency_mhz() -> float | None:
    try:
        freq = psutil.cpu_freq()
    except (OSError, NotImplementedError, AttributeError):
        return None
    return float(freq.current) if freq and freq.current else None


class ResourceSampler:
    """Measures the benchmark process's CPU usage, peak RSS, what the rest of the host did
    and (where RAPL is readable) energy over one or more windows of one engine (``begin`` /
    ``end`` around each), leaving out the time between them: another engine's windows when
    engines are measured in rounds. :meth:`result` sums the windows, so the host is judged
    over their total time and short windows together reach :data:`HOST_MIN_WINDOW_S`.
    ``start`` / ``stop`` measure a single window.

    CPU usage is the process's user + system CPU time (all threads, including runtime worker
    threads) over the wall time, as a percentage of all logical cores: one busy thread on
    16 logical cores reads 6.25%. On NVIDIA devices the NVML sampler adds GPU utilisation.
    """

    def __init__(self, gpu: bool = False, powercap_root: Path = POWERCAP_ROOT) -> None:
        self._process = psutil.Process(os.getpid())
        self._cores = psutil.cpu_count(logical=True) or 1
        self._energy = RaplReader(powercap_root)
        self._gpu = gpu
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak_rss = 0
        self._wall = self._cpu = self._busy = self._steal = self._own = 0.0
        self._host_ok = True
        #: CPU seconds other processes and the hypervisor took during the last window (None:
        #: /proc/stat not readable)
        self.last_other_s: float | None = None
        self._freqs: list[float] = []
        self._throttle: float | None = 0.0
        self._joules: dict[str, float] | None = None
        #: NVML over exactly the windows, opened at the first (measure/nvml.py GpuWindows)
        self._gpu_windows = None

    def _poll(self) -> None:
        polls = 0
        while not self._stop.wait(RSS_POLL_S):
            self._peak_rss = max(self._peak_rss, self._process.memory_info().rss)
            polls += 1
            if polls % FREQ_EVERY_POLLS == 0:
                mhz = _frequency_mhz()
                if mhz is not None:
                    self._freqs.append(mhz)
                self._energy.sample()  # a counter wrapping twice in a window is still counted

    def begin(self) -> None:
        self._peak_rss = max(self._peak_rss, self._process.memory_info().rss)
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="ngraph-rss", daemon=True)
        self._thread.start()
        if self._gpu and self._gpu_windows is None:
            from mlflow_ngraph.measure.nvml import GpuWindows

            self._gpu_windows = GpuWindows()
        self._energy.start()
        self._stat0 = _proc_stat()
        self._own0 = _tree_cpu_seconds(self._process)
        self._throttle0 = _throttle_count()
        self._cpu0 = time.process_time()  # every thread, ns resolution
        if self._gpu_windows is not None:
            self._gpu_windows.begin()  # last: the window's clock starts here
        self._wall0 = time.perf_counter()

    def end(self) -> None:
        wall = time.perf_counter() - self._wall0
        cpu = time.process_time() - self._cpu0
        if self._gpu_windows is not None:
            self._gpu_windows.end()
        stat1, own1, throttle1 = _proc_stat(), _tree_cpu_seconds(self._process), _throttle_count()
        joules = self._energy.stop()  # at the window's end (a lock keeps the poll's out)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._peak_rss = max(self._peak_rss, self._process.memory_info().rss)
        self._wall += wall
        self._cpu += cpu
        if self._stat0 is None or stat1 is None:
            self._host_ok = False
            self.last_other_s = None
        else:
            busy, steal, own = (
                stat1[0] - self._stat0[0],
                stat1[1] - self._stat0[1],
                own1 - self._own0,
            )
            self._busy += busy
            self._steal += steal
            self._own += own
            self.last_other_s = max(0.0, busy - own) + steal
        if throttle1 is None or self._throttle0 is None or self._throttle is None:
            self._throttle = None
        else:
            self._throttle += throttle1 - self._throttle0
        mhz = _frequency_mhz()
        if mhz is not None:
            self._freqs.append(mhz)
        if joules and self._joules is not False:
            self._joules = self._joules or {}
            for domain, value in joules.items():
                self._joules[domain] = self._joules.get(domain, 0.0) + value
        elif self._energy.available:
            self._joules = False  # a window without a reading: no total to speak of

    def result(self) -> ResourceUsage:
        """Everything measured over the windows so far."""
        wall = self._wall
        # The process CPU clock of threads on other cores is read at their last accounting
        # update, so on a short window it can overshoot wall x cores by a few percent (107%
        # seen on a 2-core VM); no process can use more than all cores: capped there.
        percent = 100.0 * self._cpu / wall / self._cores if wall > 0 else 0.0
        host = HostNoise(
            load_avg=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            cpu_freq_mhz=sum(self._freqs) / len(self._freqs) if self._freqs else None,
            throttle_events=self._throttle,
        )
        if self._host_ok and wall >= HOST_MIN_WINDOW_S:
            capacity = wall * self._cores
            other = max(0.0, self._busy - self._own)
            host.other_cpu_percent = min(100.0, 100.0 * other / capacity)
            host.steal_percent = min(100.0, 100.0 * self._steal / capacity)
        energy = dict(self._joules or {})
        methods = [METHOD] if energy else []
        gpu = self._gpu_windows
        if gpu is not None and gpu.joules is not None:  # the GPU's beside the CPU's, named
            energy["gpu"] = gpu.joules
            methods.append(gpu.energy_method)
        return ResourceUsage(
            cpu_percent=min(percent, 100.0),
            peak_rss_mb=self._peak_rss / 2**20,
            wall_s=wall,
            gpu=gpu.result() if gpu is not None else {},
            host=host,
            energy_j=energy,
            energy_method="+".join(methods) or None,
        )

    def close(self) -> None:
        """Release NVML (a no-op without a GPU)."""
        if self._gpu_windows is not None:
            self._gpu_windows.close()

    def start(self) -> None:
        """One window (:meth:`begin`)."""
        self.begin()

    def stop(self) -> ResourceUsage:
        """The end of one window and what it measured."""
        self.end()
        return self.result()
