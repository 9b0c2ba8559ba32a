"""Resource sampling over a measured window: process CPU usage, peak RSS, GPU via NVML."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import psutil

#: RSS polling period; 50 ms catches allocation peaks of a request on the models studied
#: while costing well under 0.1% of one core.
RSS_POLL_S = 0.05


@dataclass
class ResourceUsage:
    cpu_percent: float  # CPU time / wall time / logical cores * 100
    peak_rss_mb: float
    wall_s: float
    gpu: dict


class ResourceSampler:
    """Measures the benchmark process's CPU usage and peak RSS between ``start`` and ``stop``.

    CPU usage is the process's user + system CPU time (all threads, including runtime worker
    threads) over the wall time, as a percentage of all logical cores: one busy thread on
    16 logical cores reads 6.25%. On NVIDIA devices the NVML sampler adds GPU utilisation.
    """

    def __init__(self, gpu: bool = False) -> None:
        self._process = psutil.Process(os.getpid())
        self._cores = psutil.cpu_count(logical=True) or 1
        self._stop = threading.Event()
        self._peak_rss = 0
        self._thread: threading.Thread | None = None
        self._gpu_sampler = None
        if gpu:
            from mlflow_ngraph.measure.nvml import NvmlSampler

            self._gpu_sampler = NvmlSampler()

    def _poll(self) -> None:
        while not self._stop.wait(RSS_POLL_S):
            self._peak_rss = max(self._peak_rss, self._process.memory_info().rss)

    def start(self) -> None:
        self._peak_rss = self._process.memory_info().rss
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="ngraph-rss", daemon=True)
        self._thread.start()
        if self._gpu_sampler is not None:
            self._gpu_sampler.start()
        self._cpu0 = self._cpu_seconds()
        self._wall0 = time.perf_counter()

    def stop(self) -> ResourceUsage:
        wall = time.perf_counter() - self._wall0
        cpu = self._cpu_seconds() - self._cpu0
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
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
        )

    @staticmethod
    def _cpu_seconds() -> float:
        # CLOCK_PROCESS_CPUTIME_ID: every thread of the process, nanosecond resolution (psutil's
        # cpu_times() ticks at 10 ms, which reads 0% on a window of a few milliseconds).
        return time.process_time()
