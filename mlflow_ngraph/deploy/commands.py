"""``mlflow-ngraph pull``, ``run-engine`` and ``register``."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import click
import numpy as np

from mlflow_ngraph.errors import NgraphError


def _selection_options(command):
    options = [
        click.option("-e", "--experiment", required=True, help="Experiment name or id."),
        click.option("--device", required=True, help="Device the cells ran on."),
        click.option(
            "--model", required=True, help="Model name, or NAME:k=v,... for one configuration."
        ),
        click.option("--compiler", help="Only this compiler."),
        click.option("--batch-size", type=int, help="Only this batch size."),
        click.option(
            "--metric",
            type=click.Choice(["throughput", "latency_p50_ms", "latency_p99_ms"]),
            default="throughput",
            show_default=True,
            help="What 'best' means (throughput: highest; latencies: lowest).",
        ),
        click.option("--max-latency-ms", type=float, help="Cap on the p99 latency (ms)."),
        click.option("--run", "run_id", help="Only this cell run."),
        click.option("--live", is_flag=True, help="Search cell runs instead of results indexes."),
        click.option("--tracking-uri", help="Default: MLFLOW_TRACKING_URI, then MLflow's."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _choose(options: dict):
    """Connect, select and print the choice; returns (client, uri, candidates best first)."""
    from mlflow_ngraph.config import check_tracking_uri
    from mlflow_ngraph.deploy.select import best, candidates, describe, rank
    from mlflow_ngraph.tracking.mlflow_log import connect, resolve_tracking_uri

    if options["max_latency_ms"] is not None and not options["max_latency_ms"] > 0:
        raise NgraphError(f"--max-latency-ms must be > 0, got {options['max_latency_ms']}")
    uri = resolve_tracking_uri(options["tracking_uri"])
    check_tracking_uri(uri)
    client = connect(uri)
    found = candidates(
        client,
        uri,
        options["experiment"],
        options["device"],
        options["model"],
        options["compiler"],
        options["batch_size"],
        options["run_id"],
        options["live"],
    )
    selection = rank(found, options["metric"], options["max_latency_ms"])
    click.echo(describe(selection))
    what = f"{options['model']} on {options['device']}"
    return client, uri, best(selection, what), selection


@click.command("pull")
@_selection_options
@click.option(
    "-o", "--output", "output", required=True, type=click.Path(path_type=Path), help="Directory."
)
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
def pull(output: Path, force: bool, **options) -> None:
    """Fetch the fastest verified engine of a device and model into a directory.

    Candidates come from the benchmarks' results indexes; FAILED and INVALID cells, identity
    and cells over the latency cap are set aside with the reason. The engine is downloaded,
    every file checked against its manifest (size, sha256), then moved into place.
    """
    from mlflow_ngraph.deploy.pull import check_target
    from mlflow_ngraph.deploy.pull import pull as do_pull

    check_target(output, force)
    client, _, ranked, _ = _choose(options)
    chosen = ranked[0]
    click.echo(f"chose {chosen.label} (run {chosen.run_id})")
    path = do_pull(client, chosen, output, force)
    click.echo(f"pulled and verified into {path}")


@click.command("run-engine")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--input", "input_file", type=click.Path(path_type=Path), help="A .npy input.")
@click.option("--repetitions", type=int, default=10, show_default=True, help="Timed calls.")
def run_engine(directory: Path, input_file: Path | None, repetitions: int) -> None:
    """Run a pulled engine: output shape, a checksum and latency."""
    from mlflow_ngraph.deploy.engine import load_engine, timed_runs

    if repetitions < 1:
        raise NgraphError(f"--repetitions must be >= 1, got {repetitions}")
    engine = load_engine(directory)
    try:
        if input_file is not None:
            try:
                x = np.load(input_file, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise NgraphError(f"{input_file} is not a readable .npy array ({exc})") from None
        else:
            rng = np.random.default_rng(0)
            x = rng.standard_normal(engine.input_shape).astype(engine.dtype)
        y = np.asarray(engine.predict(x))
        timing = timed_runs(engine, x, repetitions)
    finally:
        engine.close()
    digest = hashlib.sha256(np.ascontiguousarray(y, dtype=np.float32).tobytes()).hexdigest()
    click.echo(f"engine: {engine.compiler} {engine.manifest.get('compiler_version', '')}")
    click.echo(f"input: {tuple(x.shape)} {x.dtype}  output: {tuple(y.shape)} {y.dtype}")
    click.echo(f"output sha256: {digest[:16]}  sum: {float(y.sum()):.6g}")
    click.echo(
        f"latency over {repetitions} call(s): mean {timing['mean_ms']:.3f} ms, "
        f"p50 {timing['p50_ms']:.3f} ms, p99 {timing['p99_ms']:.3f} ms "
        f"({timing['throughput']:.1f} samples/s)"
    )


@click.command("register")
@_selection_options
@click.option("--name", help="Registered model name (default <model>-<compiler>).")
def register(name: str | None, **options) -> None:
    """Log the fastest verified engine as an MLflow model, register it and point the
    device's alias at it (when it is faster than the version the alias points at)."""
    from mlflow_ngraph.deploy.pull import download_verified
    from mlflow_ngraph.deploy.register import cleanup
    from mlflow_ngraph.deploy.register import register as do_register

    client, uri, ranked, selection = _choose(options)
    chosen = ranked[0]
    click.echo(f"chose {chosen.label} (run {chosen.run_id})")
    with tempfile.TemporaryDirectory(prefix="ngraph-register-") as tmp:
        local = download_verified(client, chosen, Path(tmp))
        try:
            done = do_register(client, local, chosen, uri, selection.metric, name)
        finally:
            cleanup(local)
    click.echo(f"logged model {done.model_uri} (source run {chosen.run_id})")
    click.echo(f"registered {done.name} version {done.version}")
    where = "now points at it" if done.alias_moved else f"stays on version {done.alias_version}"
    click.echo(f"alias {done.alias!r} {where}: models:/{done.name}@{done.alias}")


__all__ = ["pull", "run_engine", "register"]
