"""A ``loadgen`` invocation: its cells (model x compiler on this device), each run in its
own worker (:mod:`mlflow_ngraph.loadgen.cell`), every result journaled, then logged to the
cell's MLflow run, then said in one line. A scenario the journal holds is not run again."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow_ngraph.loadgen.cell import LoadgenTask, in_worker
from mlflow_ngraph.loadgen.record import CellRecord, LoadgenJournal
from mlflow_ngraph.loadgen.settings import LoadgenSettings
from mlflow_ngraph.loadgen.summary import ScenarioResult
from mlflow_ngraph.plan.config import ModelSpec
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.variables import ENV_SWEEP_ID

log = logging.getLogger(__name__)


@dataclass
class LoadgenCell:
    model: ModelSpec
    compiler: str
    flags: dict[str, Any]
    device: str
    settings: LoadgenSettings

    @property
    def title(self) -> str:
        return f"{self.model.label} {self.compiler}"

    @property
    def key(self) -> str:
        from mlflow_ngraph.tracking.mlflow_log import device_name

        # the device by its sweep name (two devices of one profile keep their own runs in a
        # shared store); outside a sweep that is the profile's name, as before
        device = device_name(self.device)
        facts = [self.model.label, self.compiler, self.flags, device, self.settings.key()]
        text = json.dumps(facts, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Outcome:
    """What one cell gave: scenario -> its result, or the reason it failed."""

    cell: LoadgenCell
    results: dict[str, ScenarioResult] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    run_id: str = ""


def plan_cells(models: list[ModelSpec], compilers: list[tuple[str, dict]], device: str,
               settings: LoadgenSettings, home: Path) -> list[LoadgenCell]:  # fmt: skip
    """The cells, each compiler's flags resolved as ``benchmark`` resolves them (so the
    engine is the one its cache holds); an unknown model, compiler or flag is one line."""
    from mlflow_ngraph.compilers.registry import get_compiler, require_available
    from mlflow_ngraph.devices import check_profile_runs_here, get_profile
    from mlflow_ngraph.models.registry import validate_model_spec

    profile = get_profile(device)
    check_profile_runs_here(profile)
    for model in models:
        validate_model_spec(model.name, model.params, home)
    if settings.url:  # the served model's engine is the server's: the names only label it
        names = [name for name, _ in compilers] or ["served"]
        return [LoadgenCell(m, n, {}, device, settings) for n in names for m in models]
    cells = []
    for name, given in compilers:
        compiler = get_compiler(name)
        defaults = {**profile.compiler_flags.get(name, {}), **compiler.math_flags("fp32")}
        flags = compiler.resolve_flags({**{k: v for k, v in defaults.items()
                                           if k in compiler.flags}, **given})  # fmt: skip
        require_available(compiler, profile.kind)
        cells += [LoadgenCell(m, name, flags, device, settings) for m in models]
    return cells


class LoadgenRun:
    """One invocation's cells into one experiment of one store."""

    def __init__(self, settings: LoadgenSettings, home: Path, tracking_uri: str,
                 experiment: str, explicit: bool, say: Callable[[str], None]) -> None:  # fmt: skip
        from mlflow_ngraph.tracking import mlflow_log as ml

        self.settings = settings
        self.home = Path(home)
        self.say = say
        self.client = ml.connect(tracking_uri)
        self.experiment_id, self.experiment = ml.run_experiment(self.client, experiment, explicit)
        self.tracking_uri = tracking_uri

    def run(self, cell: LoadgenCell) -> Outcome:
        """The cell's pending scenarios in its worker; what the journal holds is logged (if
        MLflow does not have it yet) and said, not run again."""
        journal = LoadgenJournal(self.home, self.tracking_uri, self.experiment, cell.device)
        done, logged = journal.state(cell.key)
        record = self.open(cell)
        outcome = Outcome(cell, run_id=record.run_id)
        for scenario, result in done.items():
            if scenario in cell.settings.scenarios:
                if scenario not in logged:
                    record.result(scenario, result)
                    journal.logged(cell.key, scenario)
                outcome.results[scenario] = result
                self.say(line(cell, scenario, result) + " (journaled earlier)")
        pending = [s for s in cell.settings.scenarios if s not in done]
        if pending:
            death = in_worker(self.task(cell, pending), self.events(cell, record, journal, outcome))
            for scenario in pending:
                if scenario not in outcome.results and scenario not in outcome.failed:
                    outcome.failed[scenario] = death or "the worker gave no result"
                    record.failed(scenario, outcome.failed[scenario])
                    self.say(f"{cell.title} {scenario}: FAILED ({outcome.failed[scenario]})")
        record.finish("FINISHED" if not outcome.failed else "FAILED")
        return outcome

    def open(self, cell: LoadgenCell) -> CellRecord:
        from mlflow_ngraph.tracking.mlflow_log import device_name

        tags = {S.T_DEVICE: device_name(cell.device), "ngraph.model": cell.model.label,
                "ngraph.compiler": cell.compiler}  # fmt: skip
        if os.environ.get(ENV_SWEEP_ID):  # run by a device of a sweep (docs/sweep.md)
            tags[S.T_SWEEP] = os.environ[ENV_SWEEP_ID]
        target = "served" if cell.settings.url else "engine"
        name = f"{cell.title} loadgen" + (" served" if cell.settings.url else "")
        record = CellRecord(self.client, self.experiment_id, cell.key, name, tags)
        params = {"model": cell.model.label, "compiler": cell.compiler, "device": cell.device,
                  "loadgen.driven": target, **cell.settings.params()}  # fmt: skip
        params.update({f"flag.{k}": v for k, v in cell.flags.items()})
        record.params(params)
        return record

    def task(self, cell: LoadgenCell, pending: list[str]) -> LoadgenTask:
        from mlflow_ngraph.devices import get_profile

        outdir = self.home / "loadgen" / "logs" / cell.key
        return LoadgenTask(
            name=cell.title, model_name=cell.model.name, model_params=dict(cell.model.params),
            compiler=cell.compiler, flags=dict(cell.flags), device=cell.device,
            device_kind=get_profile(cell.device).kind, home=str(self.home),
            settings=cell.settings, scenarios=pending, outdir=str(outdir),
            extra={"parent": os.getpid()},
        )  # fmt: skip

    def events(self, cell: LoadgenCell, record: CellRecord, journal: LoadgenJournal,
               outcome: Outcome) -> Callable[[str, Any], None]:  # fmt: skip
        from mlflow_ngraph.run.worker import relog

        def on_event(kind: str, payload: Any) -> None:
            if kind == "log":
                relog(payload)
            elif kind == "model":
                record.params({"parameter_count": payload.get("parameter_count"),
                               "family": payload.get("family")})  # fmt: skip
            elif kind == "engine":
                record.engine(payload)
            elif kind == "result":
                scenario, data = payload
                result = ScenarioResult.from_dict(data)
                journal.result(cell.key, scenario, result)
                record.result(scenario, result)
                journal.logged(cell.key, scenario)
                outcome.results[scenario] = result
                self.say(line(cell, scenario, result))
            elif kind == "failed":
                scenario, reason = payload
                outcome.failed[scenario] = reason
                record.failed(scenario, reason)
                self.say(f"{cell.title} {scenario}: FAILED ({reason})")

        return on_event


def line(cell: LoadgenCell, scenario: str, result: ScenarioResult) -> str:
    """One scenario's line: its figure when VALID, else INVALID and LoadGen's reason (never
    a figure)."""
    head = f"{cell.title} {scenario}"
    if not result.valid:
        return f"{head}: INVALID ({result.reason})"
    f, bound = result.figures, cell.settings.latency_bound_ms
    text = {
        "singlestream": lambda: f"p90 {f['singlestream.p90_ms']:.3f} ms (early-stopping estimate)",
        "multistream": lambda: f"p99 {f['multistream.p99_ms']:.3f} ms of 8-sample queries",
        "offline": lambda: f"{f['offline.samples_per_s']:.1f} samples/s",
        "server": lambda: (
            f"{f['server.qps']:.1f} QPS at p99 {f['server.p99_ms']:.2f} ms <= {bound:g} ms"
        ),
    }[scenario]()
    return f"{head}: {text} (VALID)"
