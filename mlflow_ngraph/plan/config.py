"""Experiment specs: YAML files and command-line options, validated into one :class:`Spec`.

A spec file looks like::

    experiment: default
    device: cpu
    models:
      - resnet18
      - {name: conv_block, params: {width: 64, depth: 2}}
    compilers:
      - identity
      - {name: openvino, flags: {PERFORMANCE_HINT: LATENCY}}
    batch_sizes: [1, 2, 4, 8]
    scenario: throughput
    warmup: 10
    repetitions: 100
    min_duration: 1.0
    tolerance: 0.001

Command-line options override the file; ``--model``/``--compiler`` replace its lists.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.measure.rounds import PRECISION
from mlflow_ngraph.measure.settings import (
    DEFAULT_MIN_DURATION_S,
    DEFAULT_REPETITIONS,
    DEFAULT_WARMUP,
    MeasureSettings,
)
from mlflow_ngraph.measure.stability import MAX_INTERVAL, OTHER_CPU_THRESHOLD

#: MLflow refuses longer experiment names
MAX_EXPERIMENT_NAME = 500

#: outputs must match identity within this fraction of the reference's largest magnitude,
#: and their cosine similarity must be at least 1 - tolerance. float32 compilers that reorder
#: reductions land around 1e-6..1e-4; 1e-3 flags precision changes (bf16, fp16) as invalid.
DEFAULT_TOLERANCE = 1e-3

TOP_KEYS = {
    "experiment",
    "device",
    "models",
    "compilers",
    "batch_sizes",
    "scenario",
    "warmup",
    "repetitions",
    "min_duration",
    "max_duration",
    "protocol",
    "tolerance",
    "atol",
    "rtol",
    "math",
    "tracking_uri",
    "log_engines",
    "log_models",
}


@dataclass
class ModelSpec:
    name: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))


@dataclass
class CompilerSpec:
    name: str
    flags: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunPolicy:
    """How a run judges its measurements and how far it goes to make them hold: what
    ``benchmark``'s stability options set (``tune`` passes its own). Validated here, then
    carried whole from the command line to each cell's worker and its rounds. Not part of
    a cell's key: a figure measured under a stricter policy is the same figure."""

    #: the widest relative half-width of a STABLE figure's 95% interval (a speedup's;
    #: identity's throughput against twice that): ``--max-interval``
    max_interval: float = MAX_INTERVAL
    #: percent of all cores other processes may use during a measurement: ``--max-other-cpu``
    max_other_cpu: float = OTHER_CPU_THRESHOLD
    #: measurements of an UNSTABLE batch size after the first: ``--stable-retries``
    stable_retries: int = 1
    #: the stop rule's target relative half-width: ``--precision``
    precision: float = PRECISION
    #: the spread between sittings (sd of the log) the re-run intervals use; None: the one
    #: measured (this run's sittings, else the host's history): ``--rerun-sd``
    rerun_sd: float | None = None
    #: each group measured this many times in fresh workers (measure/sittings.py)
    sittings: int = 1

    def validate(self) -> None:
        """Raises:
        NgraphError: a setting out of its range, named as its option."""
        if not (math.isfinite(self.max_interval) and 0 < self.max_interval < 1):
            raise NgraphError(f"max-interval must be a fraction in (0, 1), got {self.max_interval}")
        if not (math.isfinite(self.precision) and 0 < self.precision < 1):
            raise NgraphError(f"precision must be a fraction in (0, 1), got {self.precision}")
        if not (math.isfinite(self.max_other_cpu) and 0 <= self.max_other_cpu <= 100):
            raise NgraphError(
                f"max-other-cpu must be a percent in 0..100, got {self.max_other_cpu}"
            )
        rerun_sd = self.rerun_sd
        if rerun_sd is not None and not (math.isfinite(rerun_sd) and 0 <= rerun_sd < 1):
            raise NgraphError(
                f"rerun-sd must be a fraction in [0, 1) (0.012 is 1.2%), got {rerun_sd}"
            )
        if self.stable_retries < 0:
            raise NgraphError(f"stable-retries must be >= 0, got {self.stable_retries}")
        if self.sittings < 1:
            raise NgraphError(f"sittings must be at least 1, got {self.sittings}")

    def per_sitting(self) -> RunPolicy:
        """What each of the sittings aims at: the target and the limit it is judged against
        √N looser (the mean of N sittings narrows by that)."""
        scale = math.sqrt(self.sittings)
        return replace(
            self, precision=self.precision * scale, max_interval=self.max_interval * scale
        )


@dataclass
class Spec:
    """A validated experiment."""

    models: list[ModelSpec]
    compilers: list[CompilerSpec]
    batch_sizes: list[int]
    device: str = "cpu"
    experiment: str = "mlflow-ngraph"
    measure: MeasureSettings = field(default_factory=MeasureSettings)
    tolerance: float = DEFAULT_TOLERANCE
    tracking_uri: str | None = None
    log_engines: bool = True
    #: every valid engine also as an MLflow logged model of its cell run (``--log-models``)
    log_models: bool = False
    #: output check, elementwise |out - ref| <= atol + rtol * |ref| (Polygraphy's); atol
    #: None is ``tolerance`` times the output's largest reference magnitude
    atol: float | None = None
    rtol: float = 0.0
    #: the arithmetic every compiler runs: fp32 (strict), tf32 or fp16 (compilers/precision.py)
    math: str = "fp32"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("tracking_uri")  # where results go is not part of what is measured
        data.pop("log_models")  # nor how they are logged
        for key, default in (("atol", None), ("rtol", 0.0), ("math", "fp32")):
            if data[key] == default:  # a spec that does not set them keeps its hash
                data.pop(key)
        data["measure"] = self.measure.key()
        return data

    @property
    def spec_hash(self) -> str:
        text = json.dumps(self.to_dict(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_scalar(text: str) -> Any:
    """``"8"`` -> 8, ``"true"`` -> True, ``"0.5"`` -> 0.5, anything else stays a string."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, bool)) or value is None else str(text)


def split_name_args(text: str, what: str) -> tuple[str, dict[str, Any]]:
    """Parse ``NAME[:key=value,...]``; a factory ``package.module:function[:key=value]`` keeps
    its colon."""
    head, sep, rest = text.partition(":")
    if sep and rest and "=" not in rest.split(":")[0].split(",")[0] and _is_module_path(head):
        func, _, rest = rest.partition(":")
        head = f"{head}:{func}"
    args: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise NgraphError(f"{what} {text!r}: {item!r} is not key=value")
        args[key.strip()] = parse_scalar(value.strip())
    if not head.strip():
        raise NgraphError(f"{what} {text!r} has no name")
    return head.strip(), args


def _is_module_path(head: str) -> bool:
    """``package.module`` (a factory) rather than a model or compiler name."""
    from mlflow_ngraph.models.registry import registered_models

    return "." in head or head not in registered_models()


def parse_int_list(value: Any, what: str, ranges: bool = False) -> list[int]:
    """The one parser of integer lists: ``"1,2,4"``, ``"1 2 4"``, ``[1, 2, 4]`` and, with
    ``ranges``, ``"1-6"``; every value a positive integer, in the order given, without
    repeats. Anything else is one clear error naming ``what``."""
    items = value if isinstance(value, (list, tuple)) else str(value).replace(" ", ",").split(",")
    like = "1,2,4 or 1-6" if ranges else "1,2,4"
    values: list[int] = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        low, dash, high = text[1:].partition("-") if ranges else (text[1:], "", "")
        low = text[0] + low
        try:
            part = [int(low), int(high)] if dash else [int(text)]
        except ValueError:
            raise NgraphError(f"{what} {text!r} is not an integer (expected e.g. {like})") from None
        if min(part) < 1:
            raise NgraphError(f"{what} {min(part)} must be a positive integer")
        if part[0] > part[-1]:
            raise NgraphError(f"{what} range {text!r} is empty (expected LOW-HIGH, e.g. 1-6)")
        values += range(part[0], part[-1] + 1)
    if not values:
        raise NgraphError(f"no {what} given (expected e.g. {like})")
    return list(dict.fromkeys(values))


def parse_batch_sizes(value: Any) -> list[int]:
    """Batch sizes, sorted and without repeats."""
    return sorted(parse_int_list(value, "batch size"))


def _entries(raw: Any, key: str, params_key: str) -> list[tuple[str, dict]]:
    if not isinstance(raw, list):
        raise NgraphError(f"spec: {key!r} must be a list")
    entries = []
    for item in raw:
        if isinstance(item, str):
            entries.append(split_name_args(item, key[:-1]))
        elif isinstance(item, dict) and "name" in item:
            extra = set(item) - {"name", params_key}
            if extra:
                raise NgraphError(
                    f"spec: {key} entry {item['name']!r} has unknown key {sorted(extra)[0]!r}"
                )
            entries.append((str(item["name"]), dict(item.get(params_key) or {})))
        else:
            raise NgraphError(f"spec: each of {key!r} is a name or a mapping with 'name'")
    return entries


def load_spec_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML spec into a plain dict (validated later by :func:`build_spec`)."""
    path = Path(path)
    if not path.is_file():
        raise NgraphError(f"spec file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise NgraphError(f"spec file {str(path)!r} is not valid YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise NgraphError(f"spec file {str(path)!r} must be a mapping of settings")
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise NgraphError(
            f"spec file {str(path)!r}: unknown key {unknown[0]!r} "
            f"(keys: {', '.join(sorted(TOP_KEYS))})"
        )
    return data


def _number(data: dict, key: str, kind: type, default: Any) -> Any:
    value = data.get(key, default)
    if value is None:
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise NgraphError(f"{key.replace('_', '-')} {value!r} is not a {kind.__name__}") from None


def build_spec(data: dict[str, Any]) -> Spec:
    """Validate a merged dict of settings (spec file overridden by the command line)."""
    from mlflow_ngraph.devices import get_profile

    device = str(data.get("device") or "cpu")
    profile = get_profile(device)
    models = [ModelSpec(n, p) for n, p in _entries(data.get("models") or [], "models", "params")]
    if not models:
        raise NgraphError("no models given: use --model NAME or a spec file with 'models'")
    raw_compilers = data.get("compilers") or list(profile.compilers)
    compilers = [CompilerSpec(n, f) for n, f in _entries(raw_compilers, "compilers", "flags")]
    measure = MeasureSettings(
        scenario=str(data.get("scenario") or "throughput"),
        warmup=_number(data, "warmup", int, DEFAULT_WARMUP),
        repetitions=_number(data, "repetitions", int, DEFAULT_REPETITIONS),
        min_duration_s=_number(data, "min_duration", float, DEFAULT_MIN_DURATION_S),
        max_duration_s=_number(data, "max_duration", float, None),
        protocol=str(data.get("protocol") or "rounds"),
    )
    measure.validate()
    from mlflow_ngraph.compilers.precision import TOLERANCE, check_math

    math_ = check_math(str(data.get("math") or "fp32"), profile.kind)
    # the output check's default follows the arithmetic; a tolerance given is kept
    tolerance = _number(data, "tolerance", float, TOLERANCE[math_])
    if not (math.isfinite(tolerance) and tolerance > 0):
        raise NgraphError(f"tolerance must be a finite number > 0, got {tolerance}")
    atol = _number(data, "atol", float, None)
    rtol = _number(data, "rtol", float, 0.0)
    for name, value in (("atol", atol), ("rtol", rtol)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise NgraphError(f"{name} must be a finite number >= 0, got {value}")
    experiment = _experiment_name(data)
    return Spec(
        models=_expand_sets(models),
        compilers=compilers,
        batch_sizes=parse_batch_sizes(data.get("batch_sizes", [1, 2, 4, 8])),
        device=device,
        experiment=experiment,
        measure=measure,
        tolerance=tolerance,
        tracking_uri=data.get("tracking_uri"),
        log_engines=bool(data.get("log_engines", True)),
        log_models=bool(data.get("log_models", False)),
        atol=atol,
        rtol=rtol,
        math=math_,
    )


def _experiment_name(data: dict[str, Any]) -> str:
    """Raises:
    NgraphError: a blank name, or one longer than MLflow takes."""
    experiment = str(data.get("experiment") or "mlflow-ngraph")
    if not experiment.strip():
        raise NgraphError("experiment name is blank: give --experiment a name, or leave it out")
    if len(experiment) > MAX_EXPERIMENT_NAME:
        raise NgraphError(
            f"experiment name is {len(experiment)} characters long; MLflow allows at most "
            f"{MAX_EXPERIMENT_NAME}: choose a shorter --experiment"
        )
    return experiment


def _expand_sets(models: list[ModelSpec]) -> list[ModelSpec]:
    from mlflow_ngraph.models.registry import expand_model_set

    out: list[ModelSpec] = []
    for spec in models:
        names = expand_model_set(spec.name)
        out.extend(ModelSpec(n, dict(spec.params)) for n in names) if names else out.append(spec)
    return out


def unwritable(folder: Path) -> str | None:
    """Why ``folder`` cannot be created or written by this process (None: it can)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".ngraph-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        return str(exc.strerror or exc)
    return None


def check_home(home: Path) -> None:
    """The cache and journal directory must be a directory this process can write.

    Raises:
        NgraphError: it is a file, or it cannot be created or written.
    """
    home = Path(home)
    if home.exists() and not home.is_dir():
        raise NgraphError(f"home {str(home)!r} is a file, not a directory: give another --home")
    problem = unwritable(home)
    if problem:
        raise NgraphError(
            f"home {str(home)!r} cannot be written ({problem}): give a writable "
            "--home or MLFLOW_NGRAPH_HOME"
        )
