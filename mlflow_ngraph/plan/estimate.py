"""How long a run will take: said before it starts, and kept up to date while it runs.

One model of the time, built on how a batch size is measured
(:mod:`mlflow_ngraph.measure.rounds`), serves both. An item is one (model, compiler, flags,
batch size); it costs

    prepare + attempts x (warm-up + measured)

- prepare: getting the engine (its compile, or a load from the engine cache), its output
  check and first inference, plus :data:`OVERHEAD_S`;
- measured: the engine's windows. The rounds stop once the floors are met (``--repetitions``
  requests, ``--min-duration`` seconds, ``MIN_ROUNDS`` windows) and the figure is precise
  enough, or at the cap (``--max-duration``, default ``MAX_S``). The floors need the seconds
  of one request; the precision stop needs the host's noise, so an item never seen is taken
  to reach the cap;
- warm-up: ``--warmup`` requests;
- attempts: 1, plus ``--stable-retries`` when the figure was UNSTABLE.

What an item cost is recorded in ``<home>/timings.json`` from its result (the seconds of one
request, the compile or load seconds, the measured seconds, the attempts), so the next run's
estimate of it is learned rather than rough; a batch size never measured borrows the seconds
of a request from another batch size of its model.

The host's load, sampled before the run (:mod:`mlflow_ngraph.measure.quiet`), sets the
rough terms and stretches every item (:class:`Host`): on a quiet host an engine's rounds
stop at their precision well before the cap and few figures are measured again; on a busy
one they run to the cap and many are; and other processes' share of the cores lengthens
every second of the run's own (a known item's seconds are scaled from the share recorded
with them to today's). Without a sample (a run that did not look) the rough terms are a
busy host's.

While a run goes on, the wall time its finished items took is set against what the model
said of them: the ratio (the host's factor: worker starts, contention, what the model does
not count) scales what is left, and is kept for the next run's first estimate.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TIMINGS_FILE = "timings.json"
#: a batch size's reference outputs, output check and worker messages, besides its engine
OVERHEAD_S = 2.0
#: seconds to load an engine the cache holds (an item measured before on this host)
LOAD_S = 1.0
#: the share of items measured again as UNSTABLE when this host has no record yet (80% of
#: the default experiment's figures were UNSTABLE on a busy 2-core host: docs/measurement.md)
RETRY_SHARE = 0.5
#: predicted seconds that the host factor of an earlier run weighs, against those of this run
#: (so the first finished item does not swing the estimate alone)
PRIOR_WEIGHT_S = 60.0
#: the key of the host factor in the timings file
FACTOR_KEY = "_host_factor"
#: on a host sampled quiet, what the rough terms become. The declared compile allowances are
#: generous (a busy host's, with room); the default experiment with empty caches on a quiet
#: 2-core host took 10m41s where the busy terms said 31 min: these three reproduce it
#: (docs/resume.md). The share of the allowance an engine's build takes ...
QUIET_PREPARE_SHARE = 0.3
#: ... the share of the cap an engine's rounds take to reach their precision ...
QUIET_MEASURED_SHARE = 0.4
#: ... and the share of items measured again as UNSTABLE (2 of 80 on that run)
QUIET_RETRY_SHARE = 0.05


def timing_key(model: str, compiler: str, flags: dict[str, Any], batch_size: int) -> str:
    return json.dumps([model, compiler, sorted(flags.items()), batch_size], default=str)


class Timings:
    """What each (model, compiler, flags, batch size) cost on this host, and the host factor."""

    def __init__(self, home: Path) -> None:
        self.path = Path(home) / TIMINGS_FILE
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            data = {}
        self.data: dict[str, Any] = data if isinstance(data, dict) else {}

    def get(self, key: str) -> dict[str, float] | None:
        """The item's record (an older file's bare seconds are not one)."""
        value = self.data.get(key)
        return value if isinstance(value, dict) else None

    def items(self) -> list[dict[str, float]]:
        return [v for k, v in self.data.items() if isinstance(v, dict) and k != FACTOR_KEY]

    @property
    def factor(self) -> float | None:
        value = self.data.get(FACTOR_KEY)
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

    def record(self, key: str, value: dict[str, float] | float) -> None:
        """Keep the latest (atomically replaced: a kill never leaves half a file)."""
        self.data[key] = value
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as handle:
                json.dump(self.data, handle)
            os.replace(tmp, self.path)
        except OSError as exc:  # an estimate is never worth failing a run
            log.debug("could not record timings: %s", exc)


def cost_of(record: dict) -> dict[str, float] | None:
    """What a measured batch size's result says it cost (None for a result without the
    figures, e.g. an old journal's)."""
    m = record.get("metrics") or {}
    duration, requests = m.get("duration_s"), m.get("repetitions")
    if not duration or not requests:
        return None
    # a record combined from N sittings counts every sitting's attempts (its seconds and
    # requests are its last sitting's): the attempts of one sitting, on average
    sittings = max(1, int(m.get("sittings") or 1))
    attempts = int((record.get("stability") or {}).get("attempts") or 1)
    attempts = max(1.0, attempts / sittings) if sittings > 1 else attempts
    prepare = float(m.get("compile_s") or 0.0) + float(m.get("first_inference_ms") or 0.0) / 1e3
    cost = {"request_s": duration / requests, "measured_s": float(duration), "attempts": attempts}
    cost["load_s" if m.get("cache_hit") else "compile_s"] = round(prepare, 3)
    others = m.get("host_other_cpu_percent")
    if isinstance(others, (int, float)) and others >= 0:  # the load its seconds were made under
        cost["others"] = min(float(others), 100.0) / 100.0
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in cost.items()}


@dataclass
class Item:
    model: str
    compiler: str
    flags: dict[str, Any]
    batch_size: int

    @property
    def key(self) -> str:
        return timing_key(self.model, self.compiler, self.flags, self.batch_size)


@dataclass(frozen=True)
class Host:
    """What the sample before the run found (:mod:`mlflow_ngraph.measure.quiet`)."""

    #: other processes' share of all cores, 0..1
    share: float = 0.0
    #: more than the stability rule allows (``--max-other-cpu``)
    busy: bool = False

    @property
    def slowdown(self) -> float:
        """How much longer each second of the run's own work takes: the others' share of
        the cores is taken from it (a fully loaded host doubles it)."""
        return 1.0 + min(max(self.share, 0.0), 1.0)


@dataclass
class Policy:
    """What the model needs of how items are measured."""

    warmup: int
    repetitions: int
    min_duration_s: float
    max_duration_s: float | None = None
    retries: int = 1
    protocol: str = "rounds"
    #: each group measured this many times (``--sittings``)
    sittings: int = 1

    @classmethod
    def of(cls, measure, retries: int = 1, sittings: int = 1) -> Policy:
        return cls(
            measure.warmup,
            measure.repetitions,
            measure.min_duration_s,
            measure.max_duration_s,
            retries,
            measure.protocol,
            sittings,
        )

    @property
    def cap_s(self) -> float:
        """One sitting's cap: ``--max-duration``, else the default shared among the
        sittings (as the worker caps each)."""
        from mlflow_ngraph.measure.rounds import MAX_S

        return self.max_duration_s or max(MAX_S, 2 * self.min_duration_s) / self.sittings

    def floor_s(self, request_s: float | None) -> float:
        """The seconds one sitting's floors need before the rounds may stop (each sitting
        takes its share of ``--repetitions`` and ``--min-duration``, as the groups measure
        it: MeasureSettings.per_sitting; every sitting takes the rounds its interval needs)."""
        from mlflow_ngraph.measure.rounds import MIN_ROUNDS, WINDOW_S
        from mlflow_ngraph.measure.settings import sitting_floors

        repetitions, min_duration_s = sitting_floors(
            self.repetitions, self.min_duration_s, self.sittings
        )
        floor = max(min_duration_s, MIN_ROUNDS * WINDOW_S)
        if request_s is None:
            return floor
        return max(floor, repetitions * request_s, MIN_ROUNDS * request_s)


def predict(
    item: Item, policy: Policy, timings: Timings, learned: dict[str, dict], host: Host | None = None
) -> float:
    """Seconds ``item`` will take (before the host factor). ``learned``: this run's results
    by item key (they come before the file's, which holds earlier runs'); ``host``: the
    sample before the run (None: none was made)."""
    return predict_all([item], policy, timings, learned, host)[0]


def predict_all(
    items, policy: Policy, timings: Timings, learned: dict[str, dict], host: Host | None = None
) -> list[float]:
    """:func:`predict` of each of ``items``."""
    costs = [(json.loads(k), v) for k, v in {**timings.data, **learned}.items()
             if isinstance(v, dict) and k != FACTOR_KEY and "request_s" in v]  # fmt: skip
    retry_share = _retry_share(timings)
    return [_predict(i, policy, timings, learned, costs, retry_share, host) for i in items]


def _predict(item: Item, policy: Policy, timings, learned, costs, retry_share, host) -> float:
    known = learned.get(item.key) or timings.get(item.key)
    request_s = known.get("request_s") if known else _borrowed_request_s(item, costs)
    quiet = host is not None and not host.busy
    if known:
        prepare = known.get("load_s", min(known.get("compile_s", LOAD_S), LOAD_S))
    else:
        prepare = _allowance(item.compiler, item.flags) * (QUIET_PREPARE_SHARE if host else 1.0)
    if policy.protocol == "paper" and request_s is not None:  # exactly these requests, once
        seconds = prepare + OVERHEAD_S + (policy.warmup + policy.repetitions) * request_s
        return seconds * _stretch(host, known)
    floor = policy.floor_s(request_s)
    cap = policy.cap_s
    if known:
        measured = max(floor, min(cap, known.get("measured_s", cap)))
        attempts = 1 + min(known.get("attempts", 1) - 1, policy.retries)
    else:
        measured = max(floor, cap * (QUIET_MEASURED_SHARE if quiet else 1.0))
        attempts = 1 + policy.retries * (QUIET_RETRY_SHARE if quiet else retry_share)
    warm = policy.warmup * (request_s if request_s is not None else measured / policy.repetitions)
    sitting = OVERHEAD_S + attempts * (warm + measured)
    # each later sitting loads the engine the first one built or loaded, in fresh workers
    seconds = prepare + sitting + (policy.sittings - 1) * (min(prepare, LOAD_S) + sitting)
    return seconds * _stretch(host, known)


def _stretch(host: Host | None, known: dict | None) -> float:
    """How much longer than its model an item takes under ``host``'s load: its slowdown,
    over the slowdown a known item's seconds were recorded under."""
    if host is None:
        return 1.0
    then = Host(known.get("others", 0.0)) if known else Host()
    return host.slowdown / then.slowdown


def _borrowed_request_s(item: Item, costs) -> float | None:
    """The seconds of one request at ``item``'s batch size from another batch size of the
    same model and compiler (scaled by the batch: a conservative guess), else from another
    compiler of the model at the same batch size, else at another (scaled). ``costs``:
    ((model, compiler, flags, batch size), cost) of what is known."""
    flags = json.loads(json.dumps(sorted(item.flags.items()), default=str))
    same_cell, same_batch, same_model = [], [], []
    for (model, compiler, other_flags, b), value in costs:
        if model != item.model:
            continue
        scaled = value["request_s"] * item.batch_size / b
        if compiler == item.compiler and other_flags == flags:
            same_cell.append(scaled)
        elif b == item.batch_size:
            same_batch.append(scaled)
        else:
            same_model.append(scaled)
    found = same_cell or same_batch or same_model
    return max(found) if found else None


def _retry_share(timings: Timings) -> float:
    seen = [v.get("attempts", 1) for v in timings.items()]
    if len(seen) < 5:
        return RETRY_SHARE
    return sum(1 for a in seen if a > 1) / len(seen)


@dataclass
class Estimate:
    """The time a run has left, from its start to its end.

    Args:
        items: (model, compiler, flags, batch size) still to measure, in the order the run
            measures them.
        grouped: the cells of a model are measured together, batch size by batch size (the
            process isolation), rather than one cell after the other.
        host: what the sample before the run found (None: the run did not look).
    """

    items: list[Item]
    policy: Policy
    timings: Timings
    grouped: bool = True
    host: Host | None = None
    learned: dict[str, dict] = field(default_factory=dict)
    #: predicted seconds of each item (the host factor not applied), made at the start
    predicted: dict[str, float] = field(default_factory=dict)
    observed_s: float = 0.0  # wall seconds of the finished items
    finished_predicted_s: float = 0.0  # what the model had said of them
    last: float = field(default_factory=time.monotonic)  # when the last item ended

    def __post_init__(self) -> None:
        self.remaining = list(self.items)
        self.costs = predict_all(self.items, self.policy, self.timings, self.learned, self.host)
        self.predicted = {i.key: c for i, c in zip(self.items, self.costs)}

    @classmethod
    def of(
        cls, items, measure, timings: Timings, retries: int = 1, grouped: bool = True,
        sittings: int = 1, host: Host | None = None,
    ):  # fmt: skip
        policy = Policy.of(measure, retries, sittings)
        return cls([Item(*i) for i in items], policy, timings, grouped, host)

    @property
    def factor(self) -> float:
        """Wall seconds per predicted second: this run's, weighed with the last run's."""
        prior = self.timings.factor or 1.0
        return (self.observed_s + PRIOR_WEIGHT_S * prior) / (
            self.finished_predicted_s + PRIOR_WEIGHT_S
        )

    @property
    def total_s(self) -> float:
        """The estimate of the whole run (what is said at its start)."""
        return self.factor * sum(self.predicted[i.key] for i in self.remaining)

    @property
    def known(self) -> int:
        return sum(1 for i in self.items if self.timings.get(i.key))

    def said(self) -> str:
        """The estimate in words, as the run opens (:func:`describe`)."""
        return describe(self.total_s, self.known, len(self.items), self.host)

    def left_s(self, now: float | None = None) -> float:
        """Seconds left: the remaining items' predictions (re-made with what this run
        learned) scaled by the factor, less the time the item in progress has run, but
        never below what the items after the current group need."""
        if not self.remaining:
            return 0.0
        now = time.monotonic() if now is None else now
        costs = self.costs
        first = self.remaining[0]
        current = [
            c
            for i, c in zip(self.remaining, costs)
            if (i.model, i.batch_size) == (first.model, first.batch_size)
            and (self.grouped or i is first)
        ]
        factor = self.factor
        after = factor * (sum(costs) - sum(current))
        return max(factor * sum(costs) - (now - self.last), after)

    def done(self, item: Item, record: dict | None, now: float | None = None) -> None:
        """``item`` ended (measured, or failed when ``record`` is None): its cost is learned
        and recorded, its wall time set against its prediction."""
        now = time.monotonic() if now is None else now
        match = next((i for i in self.remaining if i.key == item.key), None)
        if match is None:
            return
        self.remaining.remove(match)
        self.observed_s += now - self.last
        self.finished_predicted_s += self.predicted.get(item.key, 0.0)
        self.last = now
        cost = cost_of(record) if record else None
        if cost is not None:
            self.learned[item.key] = cost
            self.timings.record(item.key, cost)
        # what is left, re-priced with what this run has learned
        self.costs = predict_all(self.remaining, self.policy, self.timings, self.learned, self.host)
        if not self.remaining and self.finished_predicted_s > 0:
            self.timings.record(FACTOR_KEY, round(self.factor, 3))


def describe(seconds: float, known: int, count: int, host: Host | None = None) -> str:
    """``about 12 min for 48 batch sizes to measure (31 timed on this host before)``, and
    the load it was priced at where the host was found busy."""
    minutes = seconds / 60
    when = f"{seconds:.0f} s" if seconds < 90 else f"{minutes:.0f} min"
    basis = (
        "from earlier runs on this host"
        if known == count
        else f"{known} of them timed on this host before, the rest rough"
    )
    if host is not None and host.busy:
        basis += f"; at today's load, other processes taking {host.share:.0%} of the CPU"
    return f"estimated time: about {when} for {count} batch size(s) to measure ({basis})"


def _allowance(compiler: str, flags: dict[str, Any]) -> float:
    """What the compiler declares an engine build with ``flags`` takes before this host has
    a record (``Compiler.compile_allowance``); a compiler not installed here gets the
    default."""
    from mlflow_ngraph.compilers.base import Compiler
    from mlflow_ngraph.compilers.registry import declared

    found = declared(compiler)
    return (found or Compiler).compile_allowance(flags)
