"""The sweep spec: a benchmark spec with a ``devices:`` list.

::

    experiment: edge-study
    devices:
      - {name: xeon-a, profile: xeon}
      - {name: orin-1, profile: orin, batch_sizes: [1, 2, 4]}
    models: [resnet18, {name: conv_block, params: {width: 64, depth: 3}}]
    compilers: [identity, onnxruntime, openvino]
    batch_sizes: [1, 2, 4, 8]
    loadgen: {scenarios: [offline, server], latency_bound_ms: 50, min_duration_s: 30}

Each device is a device profile under a name of its own (two hosts of one profile stay
apart); ``models``, ``compilers`` and ``batch_sizes`` of a device replace the shared ones.
An optional ``loadgen:`` section names MLPerf LoadGen scenarios each device runs on the same
models x compilers after its benchmark (``mlflow-ngraph loadgen``, docs/loadgen.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mlflow_ngraph.errors import NgraphError

#: what a device entry may set besides its name and profile
DEVICE_OVERRIDES = ("models", "compilers", "batch_sizes")
#: the ``loadgen:`` section's keys -> the ``mlflow-ngraph loadgen`` option each becomes
LOADGEN_KEYS = {
    "scenarios": "--scenario",
    "latency_bound_ms": "--latency-bound",
    "min_duration_s": "--min-duration",
    "min_queries": "--min-queries",
    "max_batch": "--max-batch",
    "server_steps": "--server-steps",
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


@dataclass
class SweepDevice:
    name: str
    profile: str
    #: the benchmark spec of this device (the shared settings with its overrides)
    spec: dict[str, Any] = field(default_factory=dict)
    #: the LoadGen settings it runs after its benchmark (:func:`parse_loadgen`), or None
    loadgen: dict[str, Any] | None = None

    @property
    def resource(self) -> str:
        """The Ray custom resource a node of this device offers (one unit: one benchmark at
        a time on the device)."""
        return device_resource(self.name)


@dataclass
class SweepSpec:
    experiment: str
    devices: list[SweepDevice]
    shared: dict[str, Any]
    loadgen: dict[str, Any] | None = None


def device_resource(name: str) -> str:
    return f"ngraph_device_{name}"


def parse_sweep(data: Any, where: str = "sweep spec") -> SweepSpec:
    """Validate a sweep spec (a parsed YAML mapping).

    Raises:
        NgraphError: no devices, a device without a name or with an unknown profile, two
            devices of one name, an unknown key, or a device spec the benchmark would reject.
    """
    from mlflow_ngraph.devices import PROFILES
    from mlflow_ngraph.plan.config import TOP_KEYS, build_spec

    if not isinstance(data, dict):
        raise NgraphError(f"{where} must be a mapping of settings")
    shared = {k: v for k, v in data.items() if k not in ("devices", "loadgen")}
    loadgen = parse_loadgen(data["loadgen"], where) if "loadgen" in data else None
    unknown = sorted(set(shared) - (TOP_KEYS - {"device"}))
    if unknown:
        raise NgraphError(f"{where}: unknown key {unknown[0]!r}")
    raw = data.get("devices")
    if not isinstance(raw, list) or not raw:
        raise NgraphError(
            f"{where}: 'devices' must list the devices, e.g. - {{name: a, profile: cpu}}"
        )
    devices: list[SweepDevice] = []
    for entry in raw:
        if not isinstance(entry, dict) or "name" not in entry or "profile" not in entry:
            raise NgraphError(f"{where}: each device is a mapping with 'name' and 'profile'")
        name, profile = str(entry["name"]), str(entry["profile"])
        if not _NAME.match(name):
            raise NgraphError(f"{where}: device name {name!r} must be letters, digits, '-' or '_'")
        if any(d.name == name for d in devices):
            raise NgraphError(f"{where}: device name {name!r} is given twice; names must differ")
        if profile not in PROFILES:
            raise NgraphError(
                f"{where}: device {name!r} has unknown profile {profile!r} "
                f"(profiles: {', '.join(PROFILES)})"
            )
        extra = sorted(set(entry) - {"name", "profile", *DEVICE_OVERRIDES})
        if extra:
            raise NgraphError(f"{where}: device {name!r} has unknown key {extra[0]!r}")
        spec = {**shared, **{k: entry[k] for k in DEVICE_OVERRIDES if k in entry}}
        spec["device"] = profile
        try:
            build_spec(spec)
        except NgraphError as exc:
            raise NgraphError(f"{where}: device {name!r}: {exc}") from None
        devices.append(SweepDevice(name, profile, spec, loadgen))
    return SweepSpec(str(shared.get("experiment") or "mlflow-ngraph"), devices, shared, loadgen)


def parse_loadgen(raw: Any, where: str = "sweep spec") -> dict[str, Any]:
    """Validate a sweep spec's ``loadgen:`` section into the settings each device runs
    (scenarios as a list, in order, once; the numbers as numbers).

    Raises:
        NgraphError: not a mapping, an unknown key, no or an unknown scenario, a number that
            is none or out of range (a latency bound <= 0): one line naming the field.
    """
    from mlflow_ngraph.loadgen.settings import SCENARIOS, LoadgenSettings, parse_scenarios

    if not isinstance(raw, dict):
        raise NgraphError(f"{where}: 'loadgen' must be a mapping, e.g. {{scenarios: [offline]}}")
    extra = sorted(set(raw) - set(LOADGEN_KEYS))
    if extra:
        raise NgraphError(f"{where}: unknown key 'loadgen.{extra[0]}' (keys: "
                          f"{', '.join(LOADGEN_KEYS)})")  # fmt: skip
    given = raw.get("scenarios")
    scenarios = parse_scenarios([given] if isinstance(given, str) else list(given or []))
    bad = [s for s in scenarios if s not in SCENARIOS] or ([] if scenarios else ["(none)"])
    if bad:
        raise NgraphError(f"{where}: loadgen.scenarios: unknown scenario {bad[0]!r} "
                          f"(choose from {', '.join(SCENARIOS)})")  # fmt: skip
    out: dict[str, Any] = {"scenarios": list(scenarios)}
    for key in ("latency_bound_ms", "min_duration_s", "min_queries", "max_batch", "server_steps"):
        if key in raw:
            out[key] = _loadgen_number(raw[key], key, where)
    try:
        LoadgenSettings(scenarios=scenarios, **{k: v for k, v in out.items() if k != "scenarios"})
    except NgraphError as exc:
        raise NgraphError(f"{where}: loadgen: {exc}") from None
    return out


def _loadgen_number(value: Any, key: str, where: str) -> float | int:
    kind, what = (float, "a number") if key.endswith(("_ms", "_s")) else (int, "an integer")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or (kind is int and value != int(value)):
        raise NgraphError(f"{where}: loadgen.{key} must be {what} (got {value!r})")
    if not value > 0:
        raise NgraphError(f"{where}: loadgen.{key} must be above 0 (got {value!r})")
    return kind(value)


def load_sweep(path: str | Path) -> SweepSpec:
    path = Path(path)
    if not path.is_file():
        raise NgraphError(f"sweep spec {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise NgraphError(f"sweep spec {str(path)!r} is not valid YAML: {exc}") from None
    return parse_sweep(data, f"sweep spec {str(path)!r}")
