"""The ``mlflow-ngraph loadgen`` command: MLPerf LoadGen's scenarios on each compiled engine
(or a running ``serve``), every result in MLflow (docs/loadgen.md)."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

import click

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.text import visible

log = logging.getLogger("mlflow_ngraph")


def _cell_options(command):
    """The cells (models x compilers on a device) and the scenarios to run on each."""
    options = [
        click.option("--model", "models", multiple=True, required=True,
                     help="NAME[:key=value,...] (repeatable): the models to drive."),
        click.option("--compiler", "compilers", multiple=True,
                     help="NAME[:flag=value,...] (repeatable). Default: identity. With --url, "
                     "only a label for the served engine (default: served)."),
        click.option("--device", default="cpu", show_default=True, help="Device profile."),
        click.option("--scenario", "scenarios", multiple=True, required=True,
                     help="singlestream|multistream|offline|server (repeatable, or "
                     "comma-separated)."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def _loadgen_options(command):
    """LoadGen's settings of each run (:class:`LoadgenSettings`)."""
    options = [
        click.option("--latency-bound", type=float, default=50.0, show_default=True,
                     metavar="MS", help="Server: the p99 latency (ms) the highest rate must "
                     "hold."),
        click.option("--min-duration", type=float, default=30.0, show_default=True,
                     metavar="S", help="LoadGen's minimum duration of each run, in seconds "
                     "(600 for a submission; a run also lasts until early stopping can "
                     "pass: 459 Server, 64 SingleStream, 662 MultiStream queries)."),
        click.option("--min-queries", type=int, default=64, show_default=True,
                     help="LoadGen's minimum query count of each run (early stopping may ask "
                     "more)."),
        click.option("--max-batch", type=int, default=1, show_default=True,
                     help="The SUT batches queued samples up to N (the engine is built at "
                     "batch N; a short batch is padded). SingleStream always runs batch 1."),
        click.option("--server-steps", type=int, default=7, show_default=True,
                     help="Server: LoadGen runs at most this many target rates in its search."),
        click.option("--url", help="Drive a running `mlflow-ngraph serve` at this address "
                     "over HTTP."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


@click.command("loadgen")
@_cell_options
@_loadgen_options
@click.option(
    "--experiment", default="ngraph-loadgen", show_default=True, help="MLflow experiment."
)
@click.option("--tracking-uri", help="Default: MLFLOW_TRACKING_URI, then MLflow's.")
@click.option("--home", type=click.Path(path_type=Path), help="Cache and journal directory.")
@click.option("-v", "--verbose", count=True)
def loadgen(**o: Any) -> None:
    """Run MLPerf LoadGen's SingleStream, MultiStream, Offline and Server scenarios on each
    model x compiler engine (or a served model), every result in MLflow."""
    from mlflow_ngraph.console import interrupt, setup_logging

    setup_logging(o["verbose"])
    settings, models, compilers, home, uri = _inputs(o)
    from mlflow_ngraph.loadgen.drive import LoadgenRun, plan_cells

    cells = plan_cells(models, compilers, o["device"], settings, home)
    if settings.url:
        from mlflow_ngraph.loadgen.runners import probe

        probe(settings.url)
    job = LoadgenRun(settings, home, uri, o["experiment"], True, say)
    say(f"loadgen: {len(cells)} cell(s) x {', '.join(settings.scenarios)} on {o['device']}, "
        f"into experiment {o['experiment']!r}")  # fmt: skip
    previous = signal.signal(signal.SIGTERM, interrupt)
    failed = 0
    try:
        for cell in cells:
            failed += bool(job.run(cell).failed)
    finally:
        signal.signal(signal.SIGTERM, previous)
    from mlflow_ngraph.commands.ui_lines import say_view
    from mlflow_ngraph.loadgen.view import write_view

    key = write_view(job.client, job.experiment_id, o["device"], settings.scenarios)
    say_view(uri, job.experiment_id, key)
    if failed:
        raise NgraphError(f"{failed} cell(s) had a scenario that failed: see the lines above")


def say(text: str) -> None:
    click.echo(visible(text))


def _inputs(o: dict[str, Any]):
    """The settings, models, compilers, home and store URI (a bad one is one line)."""
    from mlflow_ngraph.console import default_home, split_multi
    from mlflow_ngraph.loadgen.settings import LoadgenSettings, parse_scenarios
    from mlflow_ngraph.loadgen.sut import lg
    from mlflow_ngraph.plan.config import ModelSpec, check_home, split_name_args
    from mlflow_ngraph.tracking.mlflow_log import resolve_tracking_uri
    from mlflow_ngraph.tracking.uri import check_tracking_uri

    settings = LoadgenSettings(
        scenarios=parse_scenarios(o["scenarios"]), latency_bound_ms=o["latency_bound"],
        min_duration_s=o["min_duration"], min_queries=o["min_queries"],
        max_batch=o["max_batch"], server_steps=o["server_steps"], url=o["url"],
    )  # fmt: skip
    lg()  # the extra is installed, or one line naming it
    models = [ModelSpec(*split_name_args(t, "model")) for t in split_multi(o["models"])]
    texts = split_multi(o["compilers"]) or ([] if o["url"] else ["identity"])
    compilers = [split_name_args(t, "compiler") for t in texts]
    home = o["home"] or default_home()
    check_home(home)
    uri = resolve_tracking_uri(o["tracking_uri"])
    check_tracking_uri(uri)
    return settings, models, compilers, home, uri
