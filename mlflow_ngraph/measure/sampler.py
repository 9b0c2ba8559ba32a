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


class HostSampler:
    """Reads what the host did over a window: machine-wide CPU time from /proc/stat minus
    this process tree's own, steal time, the load average, the mean CPU frequency and
    thermal throttle events."""

    def __init__(self) -> None:
        self._process = psutil.Process(os.getpid())
        self._cores = psutil.cpu_count(logical=True) or 1
        self._freqs: list[float] = []

    def start(self) -> None:
        self._wall0 = time.perf_counter()
        self._stat0 = _proc_stat()
        self._own0 = _tree_cpu_seconds(self._process)
        self._throttle0 = _throttle_count()
        self._freqs = []
        self.sample()

    def sample(self) -> None:
        """A frequency reading (called by the poll thread now and then)."""
        mhz = _frequency_mhz()
        if mhz is not None:
            self._freqs.append(mhz)

    def stop(self) -> HostNoise:
        self.sample()
        wall = time.perf_counter() - self._wall0
        stat1, own1 = _proc_stat(), _tree_cpu_seconds(self._process)
        throttle1 = _throttle_count()
        noise = HostNoise(
            load_avg=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            cpu_freq_mhz=sum(self._freqs) / len(self._freqs) if self._freqs else None,
            throttle_events=(
                throttle1 - self._throttle0
                if throttle1 is not None and self._throttle0 is not None
                else None
            ),
        )
        if self._stat0 is None or stat1 is None or wall < HOST_MIN_WINDOW_S:
            return noise
        capacity = wall * self._cores
        busy = stat1[0] - self._stat0[0]
        other = max(0.0, busy - (own1 - self._own0))
        noise.other_cpu_percent = min(100.0, 100.0 * other / capacity)
        noise.steal_percent = min(100.0, 100.0 * (stat1[1] - self._stat0[1]) / capacity)
        return noise


class ResourceSampler:
    """Measures the benchmark process's CPU usage and peak RSS between ``start`` and ``stop``.

    CPU usage is the process's user + system CPU time (all threads, including runtime worker
    threads) over the wall time, as a percentage of all logical cores: one busy thread on
    16 logical cores reads 6.25%. On NVIDIA devices the NVML sampler adds GPU utilisation.
    """

    def __init__(self, gpu: bool = False, powercap_root: Path = POWERCAP_ROOT) -> None:
        self._process = psutil.Process(os.getpid())
        self._energy = RaplReader(powercap_root)
        self._cores = psutil.cpu_count(logical=True) or 1
        self._stop = threading.Event()
        self._host = HostSampler()
        self._peak_rss = 0
        self._thread: threading.Thread | None = None
        self._gpu_sampler = None
        if gpu:
            from mlflow_ngraph.measure.nvml import NvmlSampler

            self._gpu_sampler = NvmlSampler()

    def _poll(self) -> None:
        polls = 0
        while not self._stop.wait(RSS_POLL_S):
            self._peak_rss = max(self._peak_rss, self._process.memory_info().rss)
            polls += 1
            if polls % FREQ_EVERY_POLLS == 0:
                self._host.sample()
                self._energy.sample()  # a counter wrapping twice in a window is still counted

    def start(self) -> None:
        self._peak_rss = self._process.memory_info().rss
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="ngraph-rss", daemon=True)
        self._thread.start()
        if self._gpu_sampler is not None:
            self._gpu_sampler.start()
        self._host.start()
        self._energy.start()
        self._cpu0 = self._cpu_seconds()
        self._wall0 = time.perf_counter()

    def stop(self) -> ResourceUsage:
        wall = time.perf_counter() - self._wall0
        cpu = self._cpu_seconds() - self._cpu0
        energy = self._energy.stop()  # at the window's end (a lock keeps the poll's out)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        host = self._host.stop()
        self._peak_rss = max(self._peak_rss, self._process.memory_info().rss)
        gpu = self._gpu_sampler.stop() if self._gpu_sampler is not None else {}
        # The process CPU clock of threads running on other cores is read at their last
        # accounting update, so on a short window it can overshoot the wall clock times the
        # cores by a few percent (107% seen on a 2-core VM); no process can use more than all
        # cores, so the reading is capped there.
        percent = 100.0 * cpu / wall / self._cores if wall > 0 else 0.0
        return ResourceUsage(
            cpu_percent=min(percent, 100.0),
            peak_rss_mb=self._peak_rss / 2**20,
            wall_s=wall,
            gpu=gpu,
            host=host,
            energy_j=energy,
            energy_method=METHOD if energy else None,
        )

    @staticmethod
    def _cpu_seconds() -> float:
        # CLOCK_PROCESS_CPUTIME_ID: every thread of the process, nanosecond resolution (psutil's
        # cpu_times() ticks at 10 ms, which reads 0% on a window of a few milliseconds).
        return time.process_time()


class WindowSampler:
    """:class:`ResourceSampler` summed over several windows of one engine (``begin`` /
    ``end`` around each), leaving out the time between them (another engine's windows when
    engines are measured in rounds). ``result`` judges the host over the windows' total
    time, so short windows together reach :data:`HOST_MIN_WINDOW_S`."""

    def __init__(self, gpu: bool = False) -> None:
        self._process = psutil.Process(os.getpid())
        self._cores = psutil.cpu_count(logical=True) or 1
        self._gpu = gpu
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak_rss = 0
        self._wall = self._cpu = self._busy = self._steal = self._own = 0.0
        self._host_ok = True
        self._freqs: list[float] = []
        self._throttle: float | None = 0.0
        self._gpu_samples: list[dict] = []
        self._gpu_sampler = None

    def _poll(self) -> None:
        while not self._stop.wait(RSS_POLL_S):
            self._peak_rss = max(self._peak_rss, self._process.memory_info().rss)

    def begin(self) -> None:
        self._peak_rss = max(self._peak_rss, self._process.memory_info().rss)
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="ngraph-rss", daemon=True)
        self._thread.start()
        if self._gpu:
            from mlflow_ngraph.measure.nvml import NvmlSampler

            self._gpu_sampler = NvmlSampler()
            self._gpu_sampler.start()
        self._stat0 = _proc_stat()
        self._own0 = _tree_cpu_seconds(self._process)
        self._throttle0 = _throttle_count()
        self._cpu0 = time.process_time()
        self._wall0 = time.perf_counter()

    def end(self) -> None:
        wall = time.perf_counter() - self._wall0
        cpu = time.process_time() - self._cpu0
        stat1, own1, throttle1 = _proc_stat(), _tree_cpu_seconds(self._process), _throttle_count()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._peak_rss = max(self._peak_rss, self._process.memory_info().rss)
        if self._gpu_sampler is not None:
            self._gpu_samples.append(self._gpu_sampler.stop())
            self._gpu_sampler = None
        self._wall += wall
        self._cpu += cpu
        if self._stat0 is None or stat1 is None:
            self._host_ok = False
        else:
            self._busy += stat1[0] - self._stat0[0]
            self._steal += stat1[1] - self._stat0[1]
            self._own += own1 - self._own0
        if throttle1 is None or self._throttle0 is None or self._throttle is None:
            self._throttle = None
        else:
            self._throttle += throttle1 - self._throttle0
        mhz = _frequency_mhz()
        if mhz is not None:
            self._freqs.append(mhz)

    def result(self) -> ResourceUsage:
        wall = self._wall
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
        gpu = self._gpu_samples[-1] if self._gpu_samples else {}
        return ResourceUsage(
            cpu_percent=min(percent, 100.0),
            peak_rss_mb=self._peak_rss / 2**20,
            wall_s=wall,
            gpu=gpu,
            host=host,
        )
