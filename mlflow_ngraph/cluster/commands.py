"""The cluster commands of the command line: ``sync`` (and ``sweep``)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("sync")
@click.option("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI).")
@click.option("--home", type=click.Path(path_type=Path), help="Cache and journal directory.")
def sync_command(tracking_uri: str | None, home: Path | None) -> None:
    """Send results measured while the tracking store was unreachable, exactly once."""
    from mlflow_ngraph.cli import _setup_logging, default_home
    from mlflow_ngraph.cluster.sync import sync
    from mlflow_ngraph.tracking.mlflow_log import redact_uri, resolve_tracking_uri

    _setup_logging(0)
    uri = resolve_tracking_uri(tracking_uri)
    result = sync(home or default_home(), uri)
    click.echo(
        f"sync to {redact_uri(uri)}: {result.sent} result(s) sent, {result.present} already "
        f"in the store, from {result.journals} journal(s)"
        + (
            f"; {result.unsendable} result(s) of cells without a run: run the benchmark "
            "again to send them"
            if result.unsendable
            else ""
        )
    )
