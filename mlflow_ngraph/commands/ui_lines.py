"""The lines that tell a user where a command's answer opens in the MLflow UI."""

from __future__ import annotations

import click


def say_view(uri: str, experiment_id: str, key: str | None) -> None:
    """The MLflow UI lines of an experiment: the command that starts a UI over a local store,
    then the designed view ``key`` (its table and its charts), or the experiment's runs."""
    from urllib.parse import urlencode

    from mlflow_ngraph.tracking.mlflow_log import redact
    from mlflow_ngraph.tracking.ui import WORKFLOW, view_address

    served = uri.startswith(("http://", "https://"))
    base = redact(uri) if served else "http://127.0.0.1:5000"
    if not served:
        click.echo(
            f"MLflow UI: mlflow ui --backend-store-uri {redact(uri)} --host 127.0.0.1 --port 5000"
        )
    if key:
        click.echo(f"answer: {view_address(base, experiment_id, key)}")
        click.echo(f"charts: {view_address(base, experiment_id, key, charts=True)}")
    else:
        click.echo(f"runs: {base}/#/experiments/{experiment_id}/runs?{urlencode(WORKFLOW)}")
