"""What a tune searches for, and under which limits: objectives, constraints, budget."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.measure.settings import MeasureSettings
from mlflow_ngraph.plan.config import CompilerSpec, ModelSpec
from mlflow_ngraph.tracking import schema as S

#: objective -> (Optuna direction, the metric a trial is ranked on). Trials are ranked on
#: figures paired with an identity engine measured in the same rounds, never on absolute
#: numbers measured minutes apart (the host drifts): throughput and p50 on the paired
#: speedup (in the latency scenario one request at a time, the speedup is the ratio of mean
#: latencies), p99 on its ratio to the reference's p99 of the same group.
OBJECTIVES = {
    "throughput": "maximize",
    "latency_p50_ms": "maximize",
    "latency_p99_ms": "minimize",
}
#: the metric each objective is judged on in the end, and whether higher is better
OBJECTIVE_METRICS = {
    "throughput": (S.M_THROUGHPUT, True),
    "latency_p50_ms": (S.M_LATENCY_P50, False),
    "latency_p99_ms": (S.M_LATENCY_P99, False),
}
#: metrics only some devices produce: what asking for them on another device says
DEVICE_METRICS = {
    S.M_GPU_MEM: ("cuda", "GPU memory is read through NVML on a CUDA device"),
    S.M_ENERGY_PER_SAMPLE: ("rapl", "energy needs RAPL (/sys/class/powercap), absent here"),
}
#: the shortest budget that holds one trial: workers for the reference and the candidate,
#: a compile, the output check and the paired rounds (4 s of each engine's windows)
MIN_TRIAL_S = 40.0


@dataclass
class Constraints:
    """Limits a winner must meet (``None``: no limit)."""

    max_latency_ms: float | None = None  # on the p99 latency of one request
    min_throughput: float | None = None  # samples/s
    max_compile_s: float | None = None
    max_gpu_mem_mb: float | None = None  # CUDA devices only (NVML)

    def violations(self, metrics: dict[str, float], valid: bool) -> list[float]:
        """Optuna's convention: each value <= 0 where the constraint is met."""
        out = [0.0 if valid else 1.0]
        for value, limit, sign in self._pairs(metrics):
            out.append(sign * (value - limit) if value is not None else 1.0)
        return out

    def miss(self, metrics: dict[str, float]) -> tuple[float, str] | None:
        """The worst relative miss and its sentence, ``None`` when every limit is met."""
        worst: tuple[float, str] | None = None
        names = {S.M_LATENCY_P99: "p99 latency", S.M_THROUGHPUT: "throughput"}
        for (value, limit, sign), (metric, option, unit) in zip(
            self._pairs(metrics), self._names(), strict=True
        ):
            if value is None or sign * (value - limit) <= 0:
                continue
            share = abs(value - limit) / limit
            text = (
                f"{names.get(metric, metric)} {value:.4g}{unit} against {option} {limit:g} "
                f"({100 * share:.0f}% {'over' if sign > 0 else 'under'})"
            )
            if worst is None or share > worst[0]:
                worst = (share, text)
        return worst

    def _names(self):
        out = []
        if self.max_latency_ms is not None:
            out.append((S.M_LATENCY_P99, "--max-latency-ms", " ms"))
        if self.min_throughput is not None:
            out.append((S.M_THROUGHPUT, "--min-throughput", "/s"))
        if self.max_compile_s is not None:
            out.append((S.M_COMPILE, "--max-compile-s", " s"))
        if self.max_gpu_mem_mb is not None:
            out.append((S.M_GPU_MEM, "--max-gpu-mem-mb", " MB"))
        return out

    def _pairs(self, metrics: dict[str, float]):
        out = []
        if self.max_latency_ms is not None:
            out.append((metrics.get(S.M_LATENCY_P99), self.max_latency_ms, 1.0))
        if self.min_throughput is not None:
            out.append((metrics.get(S.M_THROUGHPUT), self.min_throughput, -1.0))
        if self.max_compile_s is not None:
            out.append((metrics.get(S.M_COMPILE), self.max_compile_s, 1.0))
        if self.max_gpu_mem_mb is not None:
            out.append((metrics.get(S.M_GPU_MEM), self.max_gpu_mem_mb, 1.0))
        return out


@dataclass
class TuneSettings:
    """One tune: a model on a device, the compilers to search and the limits."""

    model: ModelSpec
    device: str
    compilers: list[CompilerSpec]  # each with the flags the user pinned
    batch_sizes: list[int]
    objectives: list[str] = field(default_factory=lambda: ["throughput"])
    constraints: Constraints = field(default_factory=Constraints)
    budget_s: float | None = 15 * 60.0
    max_trials: int | None = None
    #: stop after this many trials in a row that did not improve the best of their batch
    #: size by more than 1% (model_analyzer's early exit)
    patience: int = 12
    #: candidates measured together in one group with the identity reference
    per_group: int = 2
    #: the best few per batch size measured again, interleaved, to call the winner
    finalists: int = 3
    allow_precision: bool = False
    experiment: str = "mlflow-ngraph-tune"
    tracking_uri: str | None = None
    seed: int = 0
    measure: MeasureSettings = field(default_factory=MeasureSettings)

    def validate(self, device_kind: str) -> None:
        """Raises NgraphError (one line) for anything a tune cannot start with."""
        for objective in self.objectives:
            if objective in DEVICE_METRICS and DEVICE_METRICS[objective][0] != device_kind:
                raise NgraphError(device_metric_error(objective, self.device))
            if objective not in OBJECTIVES:
                known = ", ".join(OBJECTIVES)
                raise NgraphError(f"--objective {objective!r} is not one of: {known}")
        if len(set(self.objectives)) != len(self.objectives) or len(self.objectives) > 2:
            raise NgraphError("--objective: one objective, or two different ones")
        for name, value in (
            ("--max-latency-ms", self.constraints.max_latency_ms),
            ("--min-throughput", self.constraints.min_throughput),
            ("--max-compile-s", self.constraints.max_compile_s),
            ("--max-gpu-mem-mb", self.constraints.max_gpu_mem_mb),
        ):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise NgraphError(f"{name} must be a number > 0, got {value}")
        if self.constraints.max_gpu_mem_mb is not None and device_kind != "cuda":
            raise NgraphError(device_metric_error(S.M_GPU_MEM, self.device))
        if self.budget_s is not None and self.budget_s < MIN_TRIAL_S:
            raise NgraphError(
                f"--budget {self.budget_s:g}s is shorter than one trial (about "
                f"{MIN_TRIAL_S:.0f} s: a worker per engine, a compile, the output check and "
                "the paired rounds); give --budget 5m or more"
            )
        if self.per_group < 1 or self.finalists < 1:
            raise NgraphError("--per-group and --finalists must be >= 1")
        if self.max_trials is not None and self.max_trials < 1:
            raise NgraphError(f"--trials must be >= 1, got {self.max_trials}")
        if self.budget_s is None and self.max_trials is None:
            raise NgraphError("give --budget, --trials or both: a tune needs an end")

    @property
    def scenario(self) -> str:
        return "throughput" if self.objectives[0] == "throughput" else "latency"

    @property
    def higher(self) -> bool:
        """Whether a higher figure of the first objective (the one ranked on) is better."""
        return OBJECTIVES[self.objectives[0]] == "maximize"

    def key(self) -> str:
        """What the tune searches (not how long): a re-run with the same key resumes it,
        a longer budget included."""
        data = asdict(self)
        for name in ("budget_s", "max_trials", "patience", "tracking_uri"):
            data.pop(name)
        text = json.dumps(data, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def device_metric_error(metric: str, device: str) -> str:
    kind, why = DEVICE_METRICS[metric]
    return f"{metric} is not measured on device {device!r} ({why}): choose another objective"


def parse_budget(text: str | None) -> float | None:
    """``20m``, ``90s``, ``1h30m``, ``600`` (seconds) -> seconds."""
    if text is None or str(text).strip() == "":
        return None
    value = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms])", value)
    if not parts or "".join(f"{n}{u}" for n, u in parts) != value.replace(" ", ""):
        raise NgraphError(f"--budget {text!r} is not a duration: write it as 20m, 90s or 1h30m")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return sum(float(n) * scale[u] for n, u in parts)
