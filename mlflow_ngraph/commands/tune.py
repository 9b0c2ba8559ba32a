"""The ``mlflow-ngraph tune`` command."""

from __future__ import annotations

import logging
import math
import signal
from pathlib import Path
from typing import Any

import click

from mlflow_ngraph.commands.cli import host_check_of, host_options
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.text import visible

log = logging.getLogger("mlflow_ngraph")


@click.command("tune")
@click.option("--model", required=True, help="NAME[:key=value,...] of the model to tune.")
@click.option("--device", default="cpu", show_default=True, help="Device profile.")
@click.option(
    "--compiler",
    "compilers",
    multiple=True,
    help="NAME[:flag=value,...] to search (repeatable); a flag given here is pinned, not "
    "searched. Default: every compiler of the device profile that is installed.",
)
@click.option("--batch-sizes", default="1,8", show_default=True, help="Batch sizes to search.")
@click.option(
    "--objective",
    "objectives",
    multiple=True,
    help="throughput (default), latency_p50_ms or latency_p99_ms; twice for two objectives "
    "(Optuna's multi-objective TPE; the first decides the winner).",
)
@click.option("--max-latency-ms", type=float, help="Cap on the p99 latency of a request (ms).")
@click.option("--min-throughput", type=float, help="Floor on the throughput (samples/s).")
@click.option("--max-compile-s", type=float, help="Cap on a candidate's compile seconds.")
@click.option("--max-gpu-mem-mb", type=float, help="Cap on GPU memory (CUDA devices).")
@click.option("--budget", default="15m", show_default=True, help="Wall clock: 20m, 90s, 1h30m.")
@click.option("--trials", type=int, help="Stop after this many trials.")
@click.option(
    "--patience",
    type=int,
    default=12,
    show_default=True,
    help="Stop after this many trials in a row that improved no batch size's best by over 1%.",
)
@click.option(
    "--allow-precision", is_flag=True, help="Also search knobs that lower precision (bf16, fp16)."
)
@click.option("--register", "register_name", help="Register the winner under this model name.")
@click.option(
    "--experiment", help="MLflow experiment (default: mlflow-ngraph-tune, or mlflow run's)."
)
@click.option("--tracking-uri", help="Default: MLFLOW_TRACKING_URI, then MLflow's.")
@click.option("--home", type=click.Path(path_type=Path), help="Cache and journal directory.")
@click.option("--seed", type=int, default=0, show_default=True, help="The sampler's seed.")
@click.option(
    "--per-group",
    type=int,
    default=2,
    show_default=True,
    help="Candidates measured together, interleaved with one identity engine.",
)
@click.option(
    "--finalists",
    type=int,
    default=3,
    show_default=True,
    help="The best configurations per batch size measured again to call the winner.",
)
@click.option(
    "--precision",
    type=float,
    default=0.02,
    show_default=True,
    help="Each trial's rounds stop when its speedup's 95% interval is within +-X.",
)
@click.option(
    "--min-duration",
    type=float,
    default=0.5,
    show_default=True,
    help="Each trial's engines are measured at least this many seconds per batch size.",
)
@click.option(
    "--max-duration",
    type=float,
    default=None,
    help="Cap on each trial's seconds of windows per engine and batch size (default 4).",
)
@click.option(
    "--final-precision",
    type=float,
    default=0.01,
    show_default=True,
    help="The finalists' rounds stop when every speedup's 95% interval is within +-X.",
)
@click.option(
    "--final-max-duration",
    type=float,
    default=12.0,
    show_default=True,
    help="... or when each finalist has had this many seconds of windows.",
)
@click.option(
    "--stable-retries",
    type=int,
    default=1,
    show_default=True,
    help="Measure an UNSTABLE group again up to K times.",
)
@click.option(
    "--remeasure",
    metavar="unstable|all",
    help="Measure the final round again, in its own cell runs with its baseline, where a "
    "finalist's figures are UNSTABLE (unstable) or at every batch size (all); the search's "
    "trials are left as they are.",
)
@host_options
@click.option("-v", "--verbose", count=True)
@click.option("-q", "--quiet", is_flag=True)
def tune(**o: Any) -> None:
    """Find the fastest verified configuration of a model on this device across compilers
    and their knobs (Optuna TPE), every trial a benchmark cell paired with eager."""
    from mlflow_ngraph.console import interrupt, open_log_file, setup_logging
    from mlflow_ngraph.plan.config import RunPolicy

    # the trials' benchmark lines only with -v: the tune's own lines are its live view
    setup_logging(-1 if o["quiet"] or not o["verbose"] else o["verbose"] - 1)
    from mlflow_ngraph.run.runner import check_remeasure

    check_remeasure(o["remeasure"])
    settings, home, uri = _settings(o)
    open_log_file(home, "tune", say=not o["quiet"])
    from mlflow_ngraph.tune.search import Tune

    job = Tune(
        settings,
        home,
        uri,
        say=lambda text: click.echo(visible(text)),
        stable_retries=o["stable_retries"],
        precision=o["precision"],
        final_precision=o["final_precision"],
        final_max_s=o["final_max_duration"],
        experiment_explicit=o["experiment"] is not None,
        remeasure=o["remeasure"],
        host_check=host_check_of(o, RunPolicy().max_other_cpu),
    )
    job.prepare()
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        with job.hold():  # a second copy of this tune waits for the first, then concludes
            job.run()
            signal.signal(signal.SIGTERM, previous)
            verdict = _conclude(job)
            if o["register_name"] and verdict is not None:
                _register(job, verdict, o["register_name"])
    finally:
        signal.signal(signal.SIGTERM, previous)


def _settings(o: dict[str, Any]):
    """The tune's settings, home and store URI from the command's options (a bad one is
    one line before anything runs)."""
    from mlflow_ngraph.console import default_home
    from mlflow_ngraph.devices import get_profile
    from mlflow_ngraph.plan.config import ModelSpec, check_home, parse_batch_sizes, split_name_args
    from mlflow_ngraph.tracking.mlflow_log import resolve_tracking_uri
    from mlflow_ngraph.tracking.uri import check_tracking_uri
    from mlflow_ngraph.tune.settings import Constraints, TuneSettings, parse_budget

    _check_rounds(o)
    compilers = _compilers(o["compilers"], get_profile(o["device"]))
    model = ModelSpec(*split_name_args(o["model"], "model"))
    home = o["home"] or default_home()
    check_home(home)
    objectives = list(o["objectives"]) or ["throughput"]
    uri = resolve_tracking_uri(o["tracking_uri"])
    check_tracking_uri(uri)
    settings = TuneSettings(
        model=model,
        device=o["device"],
        compilers=compilers,
        batch_sizes=parse_batch_sizes(o["batch_sizes"]),
        objectives=objectives,
        constraints=Constraints(
            o["max_latency_ms"], o["min_throughput"], o["max_compile_s"], o["max_gpu_mem_mb"]
        ),
        budget_s=parse_budget(o["budget"]),
        max_trials=o["trials"],
        patience=o["patience"],
        allow_precision=o["allow_precision"],
        experiment=o["experiment"] or "mlflow-ngraph-tune",
        tracking_uri=uri,
        seed=o["seed"],
        per_group=o["per_group"],
        finalists=o["finalists"],
        measure=_measure(o, objectives),
    )
    settings.measure.validate()  # --min-duration / --max-duration: one line before anything runs
    return settings, home, uri


def _check_rounds(o: dict[str, Any]) -> None:
    """The stop rules of the trials' and the finalists' rounds: one line for a bad one."""
    for option in ("precision", "final_precision"):
        if not (math.isfinite(o[option]) and 0 < o[option] < 1):
            flag = "--" + option.replace("_", "-")
            raise NgraphError(f"{flag} must be a fraction in (0, 1), got {o[option]}")
    if not (math.isfinite(o["final_max_duration"]) and o["final_max_duration"] > 0):
        raise NgraphError(
            f"--final-max-duration must be seconds > 0, got {o['final_max_duration']}"
        )


def _measure(o: dict[str, Any], objectives: list[str]):
    """How each trial is measured (its cells' settings)."""
    from mlflow_ngraph.measure.harness import P99_MIN_SAMPLES
    from mlflow_ngraph.plan.config import MeasureSettings

    # a p99 is reported from P99_MIN_SAMPLES requests (no distribution-free interval below):
    # a tune that ranks or caps on it measures at least that many of each trial
    p99 = "latency_p99_ms" in objectives or o["max_latency_ms"] is not None
    return MeasureSettings(
        warmup=3,
        repetitions=P99_MIN_SAMPLES if p99 else 10,
        min_duration_s=o["min_duration"],
        max_duration_s=o["max_duration"],
    )


def _compilers(texts: tuple[str, ...], profile) -> list:
    """The compilers to search: those of ``--compiler`` (NAME[:flag=value,...]), else every
    compiler of the profile installed here."""
    from mlflow_ngraph.console import split_multi
    from mlflow_ngraph.plan.config import CompilerSpec, split_name_args

    names = split_multi(texts)
    if names:
        return [CompilerSpec(*split_name_args(text, "compiler")) for text in names]
    return _installed(profile)


def _installed(profile) -> list:
    """The profile's compilers that can run here (identity is the baseline, not searched)."""
    from mlflow_ngraph.compilers.registry import get_compiler
    from mlflow_ngraph.plan.config import CompilerSpec

    out = []
    for name in profile.compilers:
        if name == "identity":
            continue
        ok, why = get_compiler(name).availability(profile.kind)
        if ok:
            out.append(CompilerSpec(name))
        else:
            log.info("not searching %s: %s", name, why)
    return out


def _conclude(job):
    """Print the tables and the winner, log them to the tune's run; the verdict, or a
    one-line error when nothing met the constraints (after logging what was measured)."""
    from mlflow_ngraph.tune.choose import closest_miss, spec_fragment, verdict
    from mlflow_ngraph.tune.report import (
        best_table,
        failures_table,
        front_table,
        log_tune,
        stop_lines,
    )
    from mlflow_ngraph.tune.settings import OBJECTIVE_METRICS

    _, higher = OBJECTIVE_METRICS[job.settings.objectives[0]]
    finals = [t for t in job.trials if t.stage == "final"]
    paired = job.settings.objectives[0] == "throughput"
    result = verdict(finals, job.final_value, higher, paired=paired)
    miss = None if result is not None else closest_miss(job.trials, job.settings.constraints)
    fragment = None
    if result is not None:
        m = job.settings.model
        fragment = spec_fragment(result.winner, m.label, m.name, m.params)
    click.echo("")
    click.echo(best_table(job))
    failed = failures_table(job)
    if failed:
        click.echo("\nfailed or invalid trials (never chosen):")
        click.echo(failed)
    click.echo("\nPareto front, throughput against p99 latency (every valid trial):")
    click.echo(front_table(job))
    log_tune(job, result, miss, fragment)
    click.echo("\n" + "\n".join(stop_lines(job)))
    if result is None:
        raise NgraphError(miss)
    click.echo(visible(result.sentence()))
    click.echo("\nthe winner as a spec (benchmark --spec FILE):")
    click.echo(fragment.rstrip())
    _say_run(job)
    return result


def _say_run(job) -> None:
    """Where the tune's run opens in MLflow's UI (its trials are its child runs)."""
    from urllib.parse import urlencode

    from mlflow_ngraph.tracking.mlflow_log import redact
    from mlflow_ngraph.tracking.ui import WORKFLOW

    served = job.uri.startswith(("http://", "https://"))
    base = redact(job.uri) if served else "http://127.0.0.1:5000"
    if not served:
        click.echo(
            f"MLflow UI: mlflow ui --backend-store-uri {redact(job.uri)} --host 127.0.0.1 "
            "--port 5000"
        )
    where = f"{base}/#/experiments/{job.experiment_id}/runs/{job.run_id}"
    click.echo(f"tune run: {where}?{urlencode(WORKFLOW)}")


def _register(job, result, name: str) -> None:
    """``--register``: the existing ``register`` on the winner's cell run and batch size."""
    from mlflow_ngraph.commands.deploy import register

    winner = result.winner
    if not winner.run_id:
        raise NgraphError("--register: the winner's cell run is not known; register it by hand")
    ctx = click.get_current_context()
    ctx.invoke(
        register,
        name=name,
        sha256=None,
        trust_code=None,
        trusted_keys=None,  # the trials are this home's, signed with its own key
        allow_unsigned=None,
        experiment=job.experiment_name,
        device=job.settings.device,
        model=job.settings.model.label,
        compiler=winner.compiler,
        batch_size=winner.batch_size,
        metric="throughput",
        max_latency_ms=None,
        run_id=winner.run_id,
        allow_unstable=True,
        live=True,
        tracking_uri=job.uri,
    )
