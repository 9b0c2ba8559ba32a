"""Energy from RAPL (powercap), on a fake powercap tree: this host (a VM) has none, which is
the absent case for real. Present, absent, unreadable and wrapping counters."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mlflow_ngraph.measure.energy import (
    METHOD,
    RaplReader,
    discover,
    energy_metrics,
    environment_record,
)
from mlflow_ngraph.measure.sampler import ResourceSampler
from mlflow_ngraph.run import environment as env
from mlflow_ngraph.tracking import schema as S

MAX_UJ = 262_143_328_850  # a real package zone's max_energy_range_uj


def _zone(root: Path, zone: str, name: str, energy_uj: int, max_uj: int = MAX_UJ) -> Path:
    """One zone as the kernel lays it out: flat under the root (subzones are also nested in
    their parent; the flat links are what /sys/class/powercap lists)."""
    path = root / zone
    path.mkdir(parents=True, exist_ok=True)
    (path / "name").write_text(name + "\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return path


def _set(path: Path, energy_uj: int) -> None:
    (path / "energy_uj").write_text(f"{energy_uj}\n")


@pytest.fixture
def two_sockets(tmp_path):
    """Two packages with core/uncore/dram subzones, a psys zone and an mmio duplicate."""
    root = tmp_path / "powercap"
    zones = {
        "pkg0": _zone(root, "intel-rapl:0", "package-0", 1_000_000),
        "core0": _zone(root, "intel-rapl:0:0", "core", 500_000),
        "dram0": _zone(root, "intel-rapl:0:1", "dram", 2_000_000, max_uj=65_712_999_613),
        "pkg1": _zone(root, "intel-rapl:1", "package-1", 3_000_000),
        "psys": _zone(root, "intel-rapl:2", "psys", 9_000_000),
    }
    _zone(root, "intel-rapl-mmio:0", "package-0", 7)  # the same package, another interface
    (root / "intel-rapl").mkdir()  # the control type, not a zone
    return root, zones


def test_package_and_dram_joules_over_a_window(two_sockets):
    root, zones = two_sockets
    reader = RaplReader(root)
    assert reader.available and reader.unavailable is None
    assert reader.domains == ["dram", "package"]
    assert sorted(z.name for z in reader.zones) == ["dram", "package-0", "package-1"]
    reader.start()
    _set(zones["pkg0"], 1_000_000 + 12_500_000)  # 12.5 J
    _set(zones["pkg1"], 3_000_000 + 7_500_000)  # 7.5 J
    _set(zones["dram0"], 2_000_000 + 1_250_000)  # 1.25 J
    _set(zones["core0"], 500_000 + 99_000_000)  # part of the package: not added
    _set(zones["psys"], 9_000_000 + 99_000_000)  # overlaps both: not added
    assert reader.stop() == pytest.approx({"package": 20.0, "dram": 1.25})


def test_a_wrapping_counter_counts_across_the_wrap(two_sockets):
    root, zones = two_sockets
    reader = RaplReader(root)
    _set(zones["pkg0"], MAX_UJ - 1_000_000)  # 1 J before the wrap
    reader.start()
    _set(zones["pkg0"], 2_000_000)  # wrapped: 1 J + 2 J
    reader.sample()  # as the sampler's poll does every 0.5 s
    assert reader.stop()["package"] == pytest.approx(3.0)

    # a window longer than one wrap period: sampled in between, every joule counts
    _set(zones["pkg0"], MAX_UJ - 1_000_000)
    reader.start()
    _set(zones["pkg0"], 2_000_000)  # wrapped once
    reader.sample()
    _set(zones["pkg0"], MAX_UJ - 500_000)  # nearly a whole range further
    reader.sample()
    _set(zones["pkg0"], 4_000_000)  # wrapped again
    joules = reader.stop()
    # two wraps from MAX - 1 J to 4 J: 2 x MAX - (MAX - 1 J) + 4 J
    assert joules["package"] == pytest.approx((MAX_UJ + 5_000_000) / 1e6, rel=1e-12)
    assert joules["dram"] == 0.0  # counted, and nothing used


def test_absent_powercap_logs_nothing_and_says_why(tmp_path):
    reader = RaplReader(tmp_path / "no-powercap")
    assert not reader.available and "no " in reader.unavailable
    reader.start()
    assert reader.stop() == {}
    assert energy_metrics({}, 100, 1.0) == {}
    record = environment_record(tmp_path / "no-powercap")
    assert record["energy.method"] == "none" and "powercap" in record["energy.unavailable"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no intel-rapl zone" in discover(empty)[1]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_root_only_counters_are_unavailable_with_the_reason(tmp_path):
    root = tmp_path / "powercap"
    zone = _zone(root, "intel-rapl:0", "package-0", 1_000)
    (zone / "energy_uj").chmod(0o000)  # as Linux >= 5.10 for a non-root user
    zones, reason = discover(root)
    assert zones == [] and "not readable" in reason and "Permission denied" in reason


def test_this_hosts_environment_record_says_why_there_is_no_energy():
    record = env.energy_record()
    if Path("/sys/class/powercap").is_dir():
        pytest.skip("this host has a powercap tree")
    assert record == {
        "energy.method": "none",
        "energy.unavailable": record["energy.unavailable"],
    }
    assert "/sys/class/powercap" in record["energy.unavailable"]
    # and the sampler of a measured window carries no energy at all
    sampler = ResourceSampler()
    sampler.start()
    usage = sampler.stop()
    assert usage.energy_j == {} and usage.energy_method is None


def test_the_samplers_window_carries_joules_per_domain(two_sockets):
    root, zones = two_sockets
    sampler = ResourceSampler(powercap_root=root)
    sampler.start()
    _set(zones["pkg0"], 1_000_000 + 30_000_000)
    _set(zones["dram0"], 2_000_000 + 6_000_000)
    usage = sampler.stop()
    assert usage.energy_j == pytest.approx({"package": 30.0, "dram": 6.0})
    assert usage.energy_method == METHOD
    # what the harness logs: joules per sample and watts, total and per domain
    metrics = energy_metrics(usage.energy_j, samples=120, seconds=2.0)
    assert metrics == pytest.approx(
        {
            S.M_ENERGY_PER_SAMPLE: 36.0 / 120,
            S.M_POWER: 18.0,
            "energy_j_per_sample.package": 0.25,
            "energy_j_per_sample.dram": 0.05,
            "power_w.package": 15.0,
            "power_w.dram": 3.0,
        }
    )
    assert all(S.is_schema_metric(S.flat_key(k, 8)) for k in metrics)
