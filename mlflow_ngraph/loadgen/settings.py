"""The settings of one ``loadgen`` invocation, validated once: the scenarios, the latency
bound, LoadGen's minimum duration and query count, the batching, and the served URL."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from urllib.parse import urlparse

from mlflow_ngraph.errors import NgraphError

#: the scenarios as the command names them -> (LoadGen's TestScenario member, the compile
#: profile of the engine it drives: one request at a time gets the latency profile (one
#: OpenVINO stream), many in flight the throughput one (the runtime's optimal requests))
SCENARIOS = {
    "singlestream": ("SingleStream", "latency"),
    "multistream": ("MultiStream", "latency"),
    "offline": ("Offline", "throughput"),
    "server": ("Server", "throughput"),
}

#: MLPerf's MultiStream query: 8 samples (test_settings.h, multi_stream_samples_per_query)
MULTISTREAM_SAMPLES = 8
#: samples LoadGen may draw from (the QSL's performance set): enough distinct indices for
#: its sample order, few enough that the HTTP driver's pre-serialized requests stay small
QSL_SAMPLES = 16
#: LoadGen's compliance minimum is 600 s (for submissions); a first look takes this: a
#: Server search of 7 steps in under 5 minutes a cell
DEFAULT_MIN_DURATION_S = 30.0
#: Server: LoadGen's early stopping judges the 99th percentile with 99% confidence
SERVER_PERCENTILE = 0.99
#: the percentile LoadGen's early stopping judges a stream scenario on (its defaults: a
#: SingleStream query's p90, a MultiStream query's p99), with one query allowed over it
STREAM_PERCENTILES = {"singlestream": 0.90, "multistream": 0.99}
EARLY_STOPPING_CONFIDENCE = 0.99
#: queries a run needs at least (LoadGen's own defaults are submission sizes: 270,336 for
#: Server); early stopping still asks for what its percentile needs, and says so
DEFAULT_MIN_QUERIES = 64
#: Server search: LoadGen runs at most this many target rates per cell
DEFAULT_SERVER_STEPS = 7


def early_stopping_floor(
    percentile: float = SERVER_PERCENTILE,
    confidence: float = EARLY_STOPPING_CONFIDENCE,
    over: int = 0,
) -> int:
    """The fewest queries with which LoadGen's early stopping can pass at ``percentile``
    with ``over`` of them over it (LoadGen's ``MinPassingQueriesFinder``: the fewest passing
    ones ``h`` whose binomial odds of ``over`` or fewer failures fall under 1 - confidence,
    plus ``over``). A Server run, judged on the queries over its bound, needs 459 at p99 with
    none over; SingleStream and MultiStream runs, judged with one allowed, need 64 at p90 and
    662 at p99 (MLPerf's own MultiStream minimum). Each run asks LoadGen for at least this
    many, so a short duration is not INVALID for its count alone."""
    passing = math.ceil(math.log(1 - confidence) / math.log(percentile))
    while _odds(passing + over, over, percentile) >= 1 - confidence:
        passing += 1
    return passing + over


def _odds(queries: int, over: int, percentile: float) -> float:
    """P(at most ``over`` of ``queries`` exceed ``percentile``): the binomial CDF."""
    return sum(
        math.comb(queries, k) * (1 - percentile) ** k * percentile ** (queries - k)
        for k in range(over + 1)
    )


@dataclass(frozen=True)
class LoadgenSettings:
    """What every cell of one invocation runs (frozen, validated in ``__post_init__``)."""

    scenarios: tuple[str, ...]
    latency_bound_ms: float = 50.0  # Server's p99 bound (MLPerf's ResNet50 Server bound is 15 ms)
    min_duration_s: float = DEFAULT_MIN_DURATION_S
    min_queries: int = DEFAULT_MIN_QUERIES
    max_batch: int = 1  # the SUT batches queued samples up to this (1: no batching)
    server_steps: int = DEFAULT_SERVER_STEPS
    url: str | None = None  # drive a running `serve` over HTTP instead of the engine

    def __post_init__(self) -> None:
        if not self.scenarios:
            raise NgraphError("no scenario given: name one with --scenario " + _choices())
        for name in self.scenarios:
            if name not in SCENARIOS:
                raise NgraphError(f"unknown scenario {name!r}: choose from {_choices()}")
        if not self.latency_bound_ms > 0:
            raise NgraphError(
                f"--latency-bound must be above 0 ms (got {self.latency_bound_ms:g}): "
                "give the p99 latency the Server scenario must hold, e.g. --latency-bound 50"
            )
        if not self.min_duration_s > 0:
            raise NgraphError(f"--min-duration must be above 0 s (got {self.min_duration_s:g})")
        if self.max_batch < 1 or self.min_queries < 1 or self.server_steps < 1:
            raise NgraphError("--max-batch, --min-queries and --server-steps must be at least 1")
        if self.url is not None:
            parsed = urlparse(self.url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise NgraphError(
                    f"--url {self.url!r} is not an http(s) address: give the address "
                    "`mlflow-ngraph serve` listens on, e.g. http://127.0.0.1:5001"
                )

    def key(self) -> str:
        """What makes two invocations the same measurement (a resumed one finds its cells)."""
        data = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()[:12]

    def params(self) -> dict[str, str]:
        """The settings as MLflow params (``loadgen.`` keys)."""
        return {
            "loadgen.scenarios": ",".join(self.scenarios),
            "loadgen.latency_bound_ms": f"{self.latency_bound_ms:g}",
            "loadgen.min_duration_s": f"{self.min_duration_s:g}",
            "loadgen.min_queries": str(self.min_queries),
            "loadgen.max_batch": str(self.max_batch),
            "loadgen.server_steps": str(self.server_steps),
            "loadgen.multistream_samples": str(MULTISTREAM_SAMPLES),
            "loadgen.target": self.url or "engine",
        }


def _choices() -> str:
    return "|".join(SCENARIOS)


def parse_scenarios(given: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``--scenario`` values (repeatable, or comma-separated), lower-cased, in order, once."""
    out: list[str] = []
    for value in given:
        for name in str(value).split(","):
            name = name.strip().lower().replace("-", "").replace("_", "")
            if name and name not in out:
                out.append(name)
    return tuple(out)
