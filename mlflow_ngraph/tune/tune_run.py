"""The tune's own run in MLflow: the parent of every trial's cell run, found again when the
tune resumes, its search's params logged once."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tune.settings import TuneSettings
from mlflow_ngraph.tune.space import SearchSpace


class TuneRun(NamedTuple):
    """Where the tune's run is: the store's client, its experiment, the run."""

    client: Any
    experiment_id: str
    experiment_name: str
    run_id: str


def open_tune_run(
    settings: TuneSettings, space: SearchSpace, tracking_uri: str, experiment_explicit: bool
) -> TuneRun:
    """The tune's run (``mlflow run``'s own run under ``mlflow run . -e tune``), RUNNING,
    with its tags and params (``experiment_explicit``: the user named the experiment)."""
    from mlflow_ngraph.tracking import mlflow_log as ml

    s = settings
    client = ml.connect(tracking_uri)
    experiment_id, experiment_name = ml.run_experiment(client, s.experiment, experiment_explicit)
    tags = {S.T_ROLE: "tune", S.T_TUNE_KEY: s.key(), S.T_DEVICE: ml.device_name(s.device)}
    project_run = os.environ.get("MLFLOW_RUN_ID")  # `mlflow run . -e tune`
    if project_run:
        run_id = project_run
        ml.log_batch(client, project_run, tags=tags)
    else:
        name = f"tune {s.model.label} on {ml.device_name(s.device)}"
        run_id = ml.find_or_create_run(client, experiment_id, tags, name)
    client.update_run(run_id, status="RUNNING")
    ml.log_params_once(client, run_id, tune_params(s, space))
    return TuneRun(client, experiment_id, experiment_name, run_id)


def tune_params(settings: TuneSettings, space: SearchSpace) -> dict[str, Any]:
    """The params of the tune's run: what it searched, under which limits."""
    s = settings
    c = s.constraints
    return {
        "model": s.model.label,
        "device": s.device,
        "compilers": ",".join(space.compilers),
        "batch_sizes": ",".join(map(str, s.batch_sizes)),
        "objective": ",".join(s.objectives),
        "scenario": s.scenario,
        "max_latency_ms": c.max_latency_ms,
        "min_throughput": c.min_throughput,
        "max_compile_s": c.max_compile_s,
        "allow_precision": s.allow_precision,
        "search_space_size": space.size(),
        "sampler": "optuna.TPESampler(multivariate, group)",
        "seed": s.seed,
    }
