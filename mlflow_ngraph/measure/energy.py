"""Energy over a measured window, where the host can say it: RAPL through Linux powercap.

Each RAPL zone under ``/sys/class/powercap`` (``intel-rapl:0``, its subzones
``intel-rapl:0:0``...; AMD's RAPL uses the same names) holds a ``name`` (``package-0``,
``core``, ``uncore``, ``dram``, ``psys``), a cumulative ``energy_uj`` counter and the
``max_energy_range_uj`` at which that counter wraps to 0. Two domains are kept: ``package``
(the sum over sockets' ``package-N``) and ``dram`` (where the platform exposes it). ``core``
and ``uncore`` are parts of the package and ``psys`` overlaps both, so adding them would
count energy twice.

Where no counter is readable (no powercap tree: most VMs, this one included; or
``energy_uj`` readable by root only, as on Linux >= 5.10 since CVE-2020-8694), nothing is
measured and :attr:`RaplReader.unavailable` says why, for the environment record. No
estimate (TDP x utilisation, CodeCarbon's way, off by -60% to +190% against RAPL) stands in
for a measurement.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from mlflow_ngraph.tracking import schema as S

POWERCAP_ROOT = Path("/sys/class/powercap")
#: how energy is measured, for the record (metrics carry only numbers)
METHOD = "rapl-powercap"
#: the domains kept, by the prefix of their zone's ``name``
DOMAINS = {"package": "package-", "dram": "dram"}


@dataclass(frozen=True)
class Zone:
    """One readable RAPL counter."""

    domain: str  # "package" or "dram"
    name: str  # the zone's own name ("package-0")
    energy_file: Path
    max_range_uj: int  # the counter wraps to 0 past this


def _domain(name: str) -> str | None:
    for domain, prefix in DOMAINS.items():
        if name == prefix or (prefix.endswith("-") and name.startswith(prefix)):
            return domain
    return None


def discover(root: Path = POWERCAP_ROOT) -> tuple[list[Zone], str | None]:
    """The readable package and DRAM counters under ``root``, and why there are none
    (``None`` when there are some)."""
    root = Path(root)
    if not root.is_dir():
        return [], f"no {root} (a kernel without powercap, or a VM that exposes no RAPL)"
    dirs = {p.name: p for p in sorted(root.glob("intel-rapl:*"))}
    for nested in sorted(root.glob("intel-rapl:*/intel-rapl:*")):  # subzones, if not flat
        dirs.setdefault(nested.name, nested)
    if not dirs:
        return [], f"no intel-rapl zone under {root} (no RAPL driver loaded)"
    zones, problems = [], []
    for zone_name, path in sorted(dirs.items()):
        try:
            name = (path / "name").read_text().strip()
        except OSError as exc:
            problems.append(f"{zone_name}/name: {exc.strerror or exc}")
            continue
        domain = _domain(name)
        if domain is None:
            continue
        try:
            int((path / "energy_uj").read_text())
            max_range = int((path / "max_energy_range_uj").read_text())
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            problems.append(f"{zone_name} ({name}) energy_uj: {reason}")
            continue
        zones.append(Zone(domain, name, path / "energy_uj", max_range))
    if zones:
        return zones, None
    if problems:
        return [], (
            "RAPL counters not readable: "
            + "; ".join(problems)
            + " (energy_uj is root-only since Linux 5.10, CVE-2020-8694)"
        )
    return [], f"no package or dram RAPL zone under {root}"


class RaplReader:
    """Joules per domain between :meth:`start` and :meth:`stop`.

    The counters wrap at ``max_energy_range_uj`` (about 262 kJ: 44 minutes at 100 W); a
    reading below the previous one has wrapped once. :meth:`sample` may be called during a
    window (the resource sampler does, every 0.5 s) so that a window longer than one wrap
    period still counts every joule.
    """

    def __init__(self, root: Path = POWERCAP_ROOT) -> None:
        self.zones, self.unavailable = discover(root)
        self._lock = threading.Lock()
        self._last: list[int] = []
        self._total_uj: list[int] = []

    @property
    def available(self) -> bool:
        return bool(self.zones)

    @property
    def domains(self) -> list[str]:
        return sorted({z.domain for z in self.zones})

    def _read(self) -> list[int] | None:
        try:
            return [int(z.energy_file.read_text()) for z in self.zones]
        except (OSError, ValueError):
            return None  # a counter that went away mid-window: no energy for it

    def start(self) -> None:
        with self._lock:
            self._last = self._read() or []
            self._total_uj = [0] * len(self._last)

    def sample(self) -> None:
        """Add what each counter counted since the last reading (wrap-around included)."""
        if not self.zones:
            return
        with self._lock:
            now = self._read()
            if now is None or len(now) != len(self._last):
                self._last, self._total_uj = [], []
                return
            for i, (zone, before, after) in enumerate(
                zip(self.zones, self._last, now, strict=True)
            ):
                delta = after - before
                if delta < 0:  # wrapped past max_energy_range_uj back to 0
                    delta += zone.max_range_uj
                self._total_uj[i] += delta
            self._last = now

    def stop(self) -> dict[str, float]:
        """Joules per domain since :meth:`start` (``{}`` where nothing is readable)."""
        self.sample()
        with self._lock:
            if not self._last:
                return {}
            joules: dict[str, float] = {}
            for zone, total in zip(self.zones, self._total_uj, strict=True):
                joules[zone.domain] = joules.get(zone.domain, 0.0) + total / 1e6
            return joules


def energy_metrics(joules: dict[str, float], samples: float, seconds: float) -> dict[str, float]:
    """The metrics of one window: ``energy_j_per_sample`` and ``power_w`` (package + dram,
    the domains measured) and per domain (``power_w.package``...). Empty where nothing was
    measured, so no name carries a guess."""
    if not joules or samples <= 0 or seconds <= 0:
        return {}
    out = {
        S.M_ENERGY_PER_SAMPLE: sum(joules.values()) / samples,
        S.M_POWER: sum(joules.values()) / seconds,
    }
    for domain, value in joules.items():
        out[S.domain_key(S.M_ENERGY_PER_SAMPLE, domain)] = value / samples
        out[S.domain_key(S.M_POWER, domain)] = value / seconds
    return out


def environment_record(root: Path = POWERCAP_ROOT) -> dict[str, str]:
    """What the environment record says about energy: the method and domains measured, or
    why nothing is."""
    zones, reason = discover(root)
    if not zones:
        return {"energy.method": "none", "energy.unavailable": reason or "unknown"}
    return {
        "energy.method": METHOD,
        "energy.domains": ",".join(sorted({z.domain for z in zones})),
        "energy.zones": ",".join(z.name for z in zones),
    }
