"""Whether the host is quiet enough to measure on, asked before a run spends its time.

Every measurement is judged against what other processes took of the CPU during its windows
(``--max-other-cpu``, :mod:`mlflow_ngraph.measure.stability`): on a host where they already
take more, a whole run ends UNSTABLE after costing its full time. So before the first
compile the run samples the host for a few seconds (the machine's CPU time less this
process tree's, as the stability rule counts it, and each other process's share to name the
largest) and says in one line when it is busy; then it waits for the host to go quiet (up to
``--wait-quiet`` seconds), or goes on at once under ``--busy-ok``. What the sample found
also sets the run's estimate (:mod:`mlflow_ngraph.plan.estimate`): a busy host's seconds
are longer.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.text import visible
from mlflow_ngraph.variables import ENV_HOST_SAMPLE_S

log = logging.getLogger(__name__)

#: seconds of one sample: /proc/stat counts in 10 ms ticks, so on 2 cores 3 s reads other
#: processes' share to within 0.2%, and a process busy for the whole sample is told from a
#: short burst
SAMPLE_S = 3.0
#: default of ``--wait-quiet``: a build or a browser tab calms down within minutes; a job
#: that does not is worth knowing about before a run of many minutes
WAIT_QUIET_S = 300.0


def sample_seconds() -> float:
    """Seconds of one sample: ``MLFLOW_NGRAPH_HOST_SAMPLE_S`` where set to a positive
    number, else :data:`SAMPLE_S`."""
    try:
        seconds = float(os.environ.get(ENV_HOST_SAMPLE_S, ""))
    except ValueError:
        return SAMPLE_S
    return seconds if seconds > 0 else SAMPLE_S


#: the consumers named in the busy line
TOP = 3


@dataclass(frozen=True)
class HostLoad:
    """What other processes did over one sample."""

    #: other processes' CPU time, percent of all logical cores (as ``--max-other-cpu``)
    other_percent: float
    cores: int
    #: the 1-minute load average at the end (None where the OS has none)
    load_avg: float | None = None
    #: the largest other consumers: (name, pid, percent of all cores), largest first
    top: tuple[tuple[str, int, float], ...] = ()

    @property
    def share(self) -> float:
        """Other processes' share of the machine, 0..1."""
        return min(max(self.other_percent / 100.0, 0.0), 1.0)

    def said(self) -> str:
        """``load 3.9, other processes 97% of the CPU: python3 (pid 41) 50%, ...``."""
        load = f"load {self.load_avg:.1f}, " if self.load_avg is not None else ""
        top = ", ".join(f"{visible(name)} (pid {pid}) {pct:.0f}%" for name, pid, pct in self.top)
        return f"{load}other processes {self.other_percent:.0f}% of the CPU" + (
            f": {top}" if top else ""
        )


def _own_pids() -> set[int]:
    """This process and its descendants (the workers it started)."""
    me = psutil.Process()
    try:
        return {me.pid, *(child.pid for child in me.children(recursive=True))}
    except psutil.Error:
        return {me.pid}


def _process_times() -> dict[int, tuple[str, float]]:
    """pid -> (name, user + system CPU seconds) of every process that can be read."""
    found = {}
    for proc in psutil.process_iter(["name", "cpu_times"]):
        times = proc.info.get("cpu_times")
        if times is not None:
            found[proc.pid] = (proc.info.get("name") or "?", times.user + times.system)
    return found


def _busy_seconds() -> float:
    """The whole machine's busy CPU seconds since boot (user + nice + system + irq +
    softirq, as /proc/stat counts them)."""
    t = psutil.cpu_times()
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq"))


def sample_host(seconds: float = SAMPLE_S) -> HostLoad:
    """Other processes' CPU share over ``seconds`` (this process tree left out) and the
    largest of them."""
    cores = psutil.cpu_count(logical=True) or 1
    before, busy0, start = _process_times(), _busy_seconds(), time.monotonic()
    time.sleep(seconds)
    after, busy1, wall = _process_times(), _busy_seconds(), time.monotonic() - start
    own = _own_pids()
    # a process started during the sample used all its seconds in it
    used = {
        pid: (name, cpu - (before[pid][1] if before.get(pid, ("",))[0] == name else 0.0))
        for pid, (name, cpu) in after.items()
    }
    own_s = sum(s for pid, (_, s) in used.items() if pid in own)
    capacity = wall * cores
    other = max(busy1 - busy0 - own_s, 0.0)
    ranked = sorted(
        ((name, pid, 100.0 * s / capacity) for pid, (name, s) in used.items() if pid not in own),
        key=lambda entry: -entry[2],
    )
    try:
        load: float | None = os.getloadavg()[0]
    except OSError:
        load = None
    top = tuple((n, p, pct) for n, p, pct in ranked[:TOP] if pct >= 1.0)
    return HostLoad(min(100.0 * other / capacity, 100.0), cores, load, top)


@dataclass
class HostCheck:
    """Samples the host before a run measures and decides whether it goes on.

    Args:
        max_other_cpu: percent of all cores other processes may use (``--max-other-cpu``).
        wait_s: seconds to wait for a busy host to go quiet (``--wait-quiet``; 0: look, do
            not wait).
        busy_ok: go on at once on a busy host (``--busy-ok``); its figures are marked
            UNSTABLE as the stability rule finds them.
        sample_s: seconds of each sample (None: :func:`sample_seconds`).
        busy_effect: what a run that measures on a busy host should expect, said with
            ``--busy-ok`` (a gate's noise shows as an unsure verdict, not UNSTABLE figures).
    """

    max_other_cpu: float
    wait_s: float = WAIT_QUIET_S
    busy_ok: bool = False
    sample_s: float | None = None
    sampler: Callable[[float], HostLoad] = sample_host
    busy_effect: str = "expect UNSTABLE figures"

    def __post_init__(self) -> None:
        self.wait_s = parse_wait(self.wait_s)

    def busy(self, load: HostLoad) -> bool:
        return load.other_percent > self.max_other_cpu

    def run(self) -> HostLoad:
        """The host's load once the run may measure: at once when it is quiet or under
        ``busy_ok``, else once it went quiet within ``wait_s``.

        Raises:
            NgraphError: the host stayed busy for ``wait_s`` seconds (exit status 2)."""
        load = self.sampler(self.sample_s or sample_seconds())
        if not self.busy(load):
            return load
        limit = f"> {self.max_other_cpu:g}% allowed"
        if self.busy_ok:
            log.warning("the host is busy (%s; %s): measuring anyway (--busy-ok), %s",
                        load.said(), limit, self.busy_effect)  # fmt: skip
            return load
        if self.wait_s <= 0:
            raise NgraphError(
                f"the host is busy ({load.said()}; {limit}): stop them, or measure anyway "
                "with --busy-ok, or wait for quiet with --wait-quiet SECONDS"
            )
        log.warning("the host is busy (%s; %s): waiting up to %.0f s for it to go quiet "
                    "(--busy-ok measures anyway)", load.said(), limit, self.wait_s)  # fmt: skip
        return self._wait(load)

    def _wait(self, load: HostLoad) -> HostLoad:
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            left = max(deadline - time.monotonic(), 0.1)
            load = self.sampler(min(self.sample_s or sample_seconds(), left))
            if not self.busy(load):
                log.warning("the host is quiet now (%s): measuring", load.said())
                return load
        raise NgraphError(
            f"the host stayed busy for {self.wait_s:.0f} s ({load.said()}): measure anyway "
            "with --busy-ok, or wait longer with --wait-quiet SECONDS"
        )


def parse_wait(text: str | float) -> float:
    """``--wait-quiet``'s seconds from the command line or its environment variable.

    Raises:
        NgraphError: not a number of seconds >= 0 (one line, as every bad option)."""
    try:
        seconds = float(text)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not 0 <= seconds < float("inf"):
        raise NgraphError(
            f"wait-quiet must be a number of seconds >= 0 (0: do not wait), got {text!r}"
        )
    return seconds
