"""Log a compare report to MLflow: tables, figures and the HTML pages, as a report run."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from mlflow_ngraph.report import render
from mlflow_ngraph.tracking import schema

#: where a report goes when no experiment was named: a report over every experiment
#: belongs to none of them
REPORT_EXPERIMENT = "ngraph-reports"
T_REPORT_FILTERS = "ngraph.report.filters"
#: MLflow's limit on a param value
PARAM_LIMIT = 6000


def report_experiment(client: MlflowClient, experiment_ids: Sequence[str]) -> str:
    """The first selected experiment, else the ``ngraph-reports`` experiment (created)."""
    if experiment_ids:
        return experiment_ids[0]
    existing = client.get_experiment_by_name(REPORT_EXPERIMENT)
    if existing is not None:
        return existing.experiment_id
    return client.create_experiment(REPORT_EXPERIMENT)


def write_artifacts(
    out_dir: Path,
    tables: Mapping[str, pd.DataFrame],
    plots: Sequence[Path],
    notes: Sequence[str],
    source_runs: Sequence[str],
    page: str | None = None,
) -> None:
    """``tables/<name>.{csv,md,json}``, ``plots/*.png``, ``tables.html`` (every table and
    figure on one page), ``report.html`` (``page``: the HTML report, where it was made) and
    ``sources.json``."""
    table_dir = out_dir / "tables"
    table_dir.mkdir(parents=True)
    for name, frame in tables.items():
        one = {name: frame}
        (table_dir / f"{name}.csv").write_text(render.render(one, "csv"))
        (table_dir / f"{name}.md").write_text(render.render(one, "markdown"))
        (table_dir / f"{name}.json").write_text(render.render(one, "json"))
    plot_dir = out_dir / "plots"
    plot_dir.mkdir()
    for path in plots:
        (plot_dir / path.name).write_bytes(path.read_bytes())
    (out_dir / "tables.html").write_text(render.to_html(tables, plots, notes), encoding="utf-8")
    if page is not None:
        (out_dir / "report.html").write_text(page, encoding="utf-8")
    (out_dir / "sources.json").write_text(json.dumps(sorted(set(source_runs))))


def log_report(
    client: MlflowClient,
    experiment_ids: Sequence[str],
    filters: Mapping[str, str],
    tables: Mapping[str, pd.DataFrame],
    plots: Sequence[Path],
    notes: Sequence[str],
    source_runs: Sequence[str],
    page: str | None = None,
) -> str:
    """Create a run tagged ``ngraph.role=report`` holding the report (``page``: the HTML
    report); returns its id."""
    experiment_id = report_experiment(client, experiment_ids)
    summary = "; ".join(f"{k}={v}" for k, v in filters.items() if v) or "all cell runs"
    tags = {schema.T_ROLE: "report", T_REPORT_FILTERS: summary}
    run = client.create_run(experiment_id, tags=tags, run_name="compare-report")
    run_id = run.info.run_id
    now = int(time.time() * 1000)
    params = [Param(f"filter.{k}", str(v)[:PARAM_LIMIT]) for k, v in filters.items() if v]
    counts = {"source_runs": len(set(source_runs)), "cells": len(tables.get("cells", []))}
    metrics = [Metric(k, float(v), now, 0) for k, v in counts.items()]
    client.log_batch(
        run_id,
        metrics=metrics,
        params=params,
        tags=[RunTag("mlflow.note.content", f"mlflow-ngraph compare report: {summary}")],
    )
    with tempfile.TemporaryDirectory(prefix="ngraph-report-") as tmp:
        write_artifacts(Path(tmp), tables, plots, notes, source_runs, page)
        client.log_artifacts(run_id, tmp)
    client.set_terminated(run_id)
    return run_id
