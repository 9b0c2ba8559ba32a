"""The cluster commands of the command line: ``sync`` (and ``sweep``)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("sync")
@click.option("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI).")
@click.option("--home", type=click.Path(path_type=Path), help="Cache and journal directory.")
def sync_command(tracking_uri: str | None, home: Path | None) -> None:
    """Send results measured while the tracking store was unreachable, exactly once."""
    from mlflow_ngraph.cluster.sync import sync
    from mlflow_ngraph.console import default_home, setup_logging
    from mlflow_ngraph.tracking.mlflow_log import redact_uri, resolve_tracking_uri
    from mlflow_ngraph.tracking.uri import check_tracking_uri

    setup_logging(0)
    uri = resolve_tracking_uri(tracking_uri)
    check_tracking_uri(uri)
    result = sync(home or default_home(), uri)
    click.echo(
        f"sync to {redact_uri(uri)}: {result.sent} result(s) sent, {result.present} already "
        f"in the store, from {result.journals} journal(s)"
        + (f", {result.settled} settled re-run interval(s) sent" if result.settled else "")
        + (
            f"; {result.unsendable} result(s) of cells without a run: run the benchmark "
            "again to send them"
            if result.unsendable
            else ""
        )
    )


@click.command("sweep")
@click.argument("spec_file")
@click.option(
    "--local",
    is_flag=True,
    help="Run on a Ray cluster of one node per device on this machine (127.0.0.1 only).",
)
@click.option("--address", help="Ray cluster address (default: the running cluster, 'auto').")
@click.option(
    "--wait", "wait_s", type=float,
    help="Seconds to wait for a device absent from the cluster (default: 0 at the start, "
    "120 for one whose node left mid-sweep).",
)  # fmt: skip
@click.option("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI).")
@click.option("--home", type=click.Path(path_type=Path), help="With --local: node homes here.")
def sweep_command(spec_file, local, address, wait_s, tracking_uri, home) -> None:
    """Benchmark every device of a sweep spec on a Ray cluster; compare them at the end.

    SPEC_FILE: a sweep spec (YAML), or a packaged one: sweep-local (two devices on this
    machine, with --local)."""
    import os
    import subprocess
    import sys

    from mlflow_ngraph.cluster.spec import load_sweep
    from mlflow_ngraph.cluster.sweep import check_outcome, require_ray, run_sweep, sweep_store
    from mlflow_ngraph.console import default_home, resolve_spec_path, setup_logging
    from mlflow_ngraph.tracking.mlflow_log import redact_uri

    setup_logging(0)
    require_ray()
    sweep = load_sweep(resolve_spec_path(str(spec_file)))
    uri = sweep_store(tracking_uri or sweep.shared.get("tracking_uri"), local, address)
    homes = (home or default_home()) / "nodes" if local else None
    outcome = run_sweep(
        sweep, uri, local=local, address=address, wait_s=wait_s, node_homes=homes,
        echo=click.echo, tty=sys.stdout.isatty(),
    )  # fmt: skip
    click.echo(f"sweep {outcome.sweep_id} finished: comparison across devices")
    compare = [sys.executable, "-m", "mlflow_ngraph", "compare", "--experiment", sweep.experiment,
               "--sweep", outcome.sweep_id]  # fmt: skip
    shown = subprocess.run(
        compare, env={**os.environ, "MLFLOW_TRACKING_URI": uri},
        capture_output=True, text=True,
    )  # fmt: skip
    click.echo(redact_uri(shown.stdout.rstrip()))
    if shown.returncode:
        click.echo(redact_uri(f"compare failed: {shown.stderr.strip()[-2000:]}"), err=True)
    check_outcome(outcome)
