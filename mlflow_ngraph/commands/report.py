"""``mlflow-ngraph compare``: tables and figures across devices and experiments.

The command works standalone (``compare.main()``, click's ``CliRunner``) and as a sub-command
of the main CLI (``cli.add_command(compare)``).
"""

from __future__ import annotations

import logging
import shlex
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import click
import pandas as pd
from mlflow.tracking import MlflowClient

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.plan.config import parse_int_list
from mlflow_ngraph.redaction import first_line, redact_text
from mlflow_ngraph.report import publish, render, tables
from mlflow_ngraph.report.query import RunQuery, fetch_cells, parse_where, resolve_experiments
from mlflow_ngraph.text import visible
from mlflow_ngraph.tracking.index import index_hint
from mlflow_ngraph.tracking.mlflow_log import is_store_error, resolve_tracking_uri, store_failed
from mlflow_ngraph.tracking.uri import check_tracking_uri

log = logging.getLogger(__name__)

TABLES = ("cells", "families", "depth", "compile", "flips", "payback", "pareto")
#: CSV and JSON are read by programs, which want one table: the per-cell one
SINGLE_TABLE_FORMATS = ("csv", "json")


@dataclass
class Comparison:
    """What one compare computed: the tables, the rows they came from and notes for people."""

    tables: dict[str, pd.DataFrame]
    frame: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    #: per empty table, why it is (shown in its place)
    why_empty: dict[str, str] = field(default_factory=dict)


def split_values(values: Iterable[str]) -> tuple[str, ...]:
    """Repeated and comma-separated option values, in order, without blanks or repeats."""
    out = [v.strip() for value in values for v in value.split(",")]
    return tuple(dict.fromkeys(v for v in out if v))


def parse_batch_sizes(values: Iterable[str]) -> tuple[int, ...]:
    """``["8", "16,32"]`` -> ``(8, 16, 32)``."""
    return tuple(parse_int_list(list(split_values(values)), "--batch-size")) if values else ()


def parse_ranges(text: str) -> list[tuple[int, int]]:
    """``"2-4,8-16"`` -> ``[(2, 4), (8, 16)]``; a single ``"8"`` is ``(8, 8)``."""
    ranges = []
    for part in split_values([text]):
        values = parse_int_list(part, "--ranges", ranges=True)
        ranges.append((values[0], values[-1]))
    if not ranges:
        raise NgraphError("--ranges is empty: expected e.g. 2-4,8-16")
    return ranges


def parse_tables(values: Sequence[str], fmt: str) -> list[str]:
    """Table names to print (``all`` expands; the default depends on the format)."""
    names = split_values(values)
    if not names:
        names = ("cells",) if fmt in SINGLE_TABLE_FORMATS else ("all",)
    unknown = [n for n in names if n not in (*TABLES, "all")]
    if unknown:
        raise NgraphError(f"unknown --table {unknown[0]!r} (one of {', '.join(TABLES)}, all)")
    return list(TABLES) if "all" in names else list(names)


def build_tables(
    frame: pd.DataFrame,
    names: Sequence[str],
    ranges: Sequence[tuple[int, int]],
    depth_batches: Sequence[int],
) -> dict[str, pd.DataFrame]:
    """The requested tables, in the requested order."""
    builders = {
        "cells": lambda: tables.cells_table(frame),
        "families": lambda: tables.family_table(frame, ranges),
        "depth": lambda: tables.depth_table(frame, depth_batches),
        "compile": lambda: tables.compile_table(frame),
        "flips": lambda: tables.flips_table(frame),
        "payback": lambda: tables.payback_table(frame),
        "pareto": lambda: tables.pareto_table(frame),
    }
    return {name: builders[name]() for name in names}


def explain_selection(frame: pd.DataFrame, query: RunQuery) -> str:
    """Why the client-side selection left nothing (the server found runs)."""
    if query.compilers and not frame["compiler"].isin(query.compilers).any():
        # the server was asked for these compilers plus the identity: only baselines came
        return f"no runs match --compiler {', '.join(query.compilers)} (with the filters before it)"
    if query.batch_sizes and not frame["batch_size"].isin(query.batch_sizes).any():
        sizes = ", ".join(str(b) for b in sorted(set(frame["batch_size"].dropna())))
        wanted = ", ".join(map(str, query.batch_sizes))
        return f"no runs match --batch-size {wanted} (measured: {sizes or 'none'})"
    if query.flag_where():
        return f"no runs match --where {', '.join(k for k, _ in query.where)} (with the others)"
    return "no runs match the filters together (each alone matches some runs)"


def remeasure_commands(unstable: pd.DataFrame, names: dict[str, str]) -> list[str]:
    """The command that measures the ``unstable`` rows again in place, per experiment and
    device (``names``: experiment id -> name): the blocks' grid, a packaged spec's
    benchmark, or a benchmark of the experiment (with the options that filled it)."""
    from mlflow_ngraph.report.query import BLOCKS_EXPERIMENT, packaged_specs

    packaged = packaged_specs()
    out = []
    pairs = unstable[["experiment_id", "device"]].drop_duplicates().itertuples(index=False)
    for experiment_id, device in pairs:
        name = names.get(str(experiment_id), str(experiment_id))
        if name == BLOCKS_EXPERIMENT:
            words = ["blocks", "--device", str(device), "..."]
        elif name in packaged:
            words = ["benchmark", "--spec", packaged[name], "--device", str(device)]
        else:
            words = ["benchmark", "--experiment", name, "--device", str(device), "..."]
        out.append(visible(shlex.join(["mlflow-ngraph", *words, "--remeasure", "unstable"])))
    return out


#: the moves a note spells out (the rest are counted)
MOVES_SHOWN = 5


def moved_note(frame: pd.DataFrame) -> str:
    """The figures the guard said moved against the same engine measured earlier on this
    host (``ngraph.moved.bs<b>``) that are not UNSTABLE (an UNSTABLE one names the move in
    its reason): each with the guard's words, store text made one visible line, and how
    many of them moved only between their own run's sittings."""
    from mlflow_ngraph.measure.history import OTHER_RUN

    if "moved" not in frame:
        return ""
    moved = frame[(frame["moved"].fillna("") != "") & (frame["stability"] != "UNSTABLE")]
    if moved.empty:
        return ""
    said = [
        f"{visible(r.model_label)} {visible(r.compiler_label)} bs{int(r.batch_size)}: "
        f"{visible(r.moved)}"
        for r in moved.head(MOVES_SHOWN).itertuples()
    ]
    more = len(moved) - len(said)
    # only against the same run's earlier sitting (no other run measured the engine yet):
    # the host drifted during that run, which its own spread between sittings carries
    within = int((~moved["moved"].str.contains(OTHER_RUN, regex=False)).sum())
    return (
        f"{len(moved)} figure(s) moved against the same engine measured earlier on this host "
        "by more than the intervals allow (tag ngraph.moved.bs<b>: the host's speed for it "
        "changed between the two): "
        + "; ".join(said)
        + (f"; and {more} more" if more else "")
        + (
            f". {within} of them moved only between their own run's sittings (the host "
            "drifted during that run; no other run had measured them)"
            if within
            else ""
        )
    )


def _notes(frame: pd.DataFrame, superseded: int, names: dict[str, str] | None = None) -> list[str]:
    notes = []
    if superseded:
        notes.append(f"{superseded} older run(s) of a re-measured cell left out (newest kept)")
    bare = frame[frame["batch_size"].isna() & (frame["status"] != "FAILED")]
    if len(bare):
        notes.append(
            f"{bare['run_id'].nunique()} run(s) without per-batch metrics "
            f"(<metric>.bs<b>): shown without values"
        )
    unstable = frame[frame["stability"] == "UNSTABLE"]
    if len(unstable):
        notes.append(
            f"{len(unstable)} UNSTABLE measurement(s) (marked): their CV or the host's other "
            "load passed the threshold; measure them again in their own runs, on a quiet "
            "host, with the command that measured them and --remeasure unstable: "
            + "; ".join(remeasure_commands(unstable, names or {}))
        )
    if note := moved_note(frame):
        notes.append(note)
    hits = frame[frame["cache_hit"] == 1]
    if len(hits):
        notes.append(f"{len(hits)} cache hit(s) left out of the compile table")
    return notes


def run_compare(
    client: MlflowClient,
    tracking_uri: str,
    query: RunQuery,
    table_names: Sequence[str],
    ranges: Sequence[tuple[int, int]],
    live: bool = False,
    verified=None,
) -> Comparison:
    """Fetch, prepare, select and tabulate (``verified``: a ``deploy.signed.Trust``: only
    what a trusted producer signed, with the signed figures).

    Raises:
        NgraphError: nothing matched (the message names the filter), or a bad filter.
    """
    raw = fetch_cells(client, query, tracking_uri, tables.READ_METRICS, live=live)
    trust_notes: list[str] = []
    if verified is not None:
        from mlflow_ngraph.deploy.signed import verified_cells

        raw, trust_notes = verified_cells(client, raw, verified)
        if raw.empty:
            raise NgraphError(f"--verified: {trust_notes[0].partition(': ')[2]}")
    frame, superseded = tables.prepare(raw)
    selected = tables.select(
        frame, query.compilers, query.batch_sizes, query.valid_only, query.flag_where()
    )
    if selected.empty:
        raise NgraphError(explain_selection(frame, query))
    depth_batches = query.batch_sizes or tables.DEFAULT_DEPTH_BATCHES
    built = build_tables(selected, table_names, ranges, depth_batches)
    names = {i: _experiment_name(client, i) for i in selected["experiment_id"].unique()}
    notes = trust_notes + _notes(selected, superseded, names)
    why = {n: tables.why_empty(n, selected, depth_batches) for n, t in built.items() if t.empty}
    if "depth" in built and (note := tables.single_depth_note(built["depth"])):
        notes.append(note)
    return Comparison(built, selected, notes, why)


def _experiment_name(client: MlflowClient, experiment_id: str) -> str:
    experiment = client.get_experiment(str(experiment_id))
    return experiment.name if experiment is not None else str(experiment_id)


def _filters(query: RunQuery, ranges: str) -> dict[str, str]:
    values = {
        "experiment": query.experiments,
        "device": query.devices,
        "model": query.models,
        "family": query.families,
        "compiler": query.compilers,
        "batch_size": tuple(map(str, query.batch_sizes)),
        "where": tuple(f"{k}={v}" for k, v in query.where),
    }
    out = {k: ",".join(v) for k, v in values.items()}
    out["valid_only"] = "true" if query.valid_only else ""
    out["ranges"] = ranges
    return out


def _draw(result: Comparison, plots_dir: Path | None, scratch: Path) -> list[Path]:
    from mlflow_ngraph.report import plots  # matplotlib only when figures are asked for

    out = plots.draw_all(result.frame, plots_dir or scratch)
    for reason in out.skipped:
        result.notes.append(f"plot skipped: {reason}")
    if plots_dir is not None:
        result.notes.append(f"{len(out.written)} plot(s) written to {plots_dir}")
    return out.written


def _report(
    client: MlflowClient,
    result: Comparison,
    query: RunQuery,
    ranges: str,
    figures: list[Path],
    page: str | None,
) -> None:
    experiments = resolve_experiments(client, query.experiments) if query.experiments else []
    run_id = publish.log_report(
        client,
        experiments,
        _filters(query, ranges),
        result.tables,
        figures,
        result.notes,
        list(result.frame["run_id"].unique()),
        page,
    )
    result.notes.append(f"report logged as run {run_id}")


def _html(client: MlflowClient, uri: str, result: Comparison, query: RunQuery) -> str | None:
    """The HTML report of the selected rows, written next to the store (said in a note);
    ``None`` where it could not be made (one warning: the tables stand)."""
    from mlflow_ngraph.report.html_report import compare_report

    named = ", ".join(query.experiments)
    scope = f"experiment {named}" if named else "every experiment"
    try:
        page, path = compare_report(client, uri, result.frame, scope, result.notes)
    except Exception as exc:  # a report is an extra: its failure never fails the compare
        log.warning("the HTML report was not written (%s)", first_line(exc) or type(exc).__name__)
        return None
    result.notes.append(f"report: {path}")  # made visible when printed, as every note
    return page


def _query(options: dict) -> RunQuery:
    return RunQuery(
        experiments=split_values(options["experiments"]),
        devices=split_values(options["devices"]),
        models=split_values(options["models"]),
        families=split_values(options["families"]),
        compilers=split_values(options["compilers"]),
        sweeps=split_values(options["sweeps"]),
        batch_sizes=parse_batch_sizes(options["batch_sizes"]),
        valid_only=options["valid_only"],
        where=parse_where(options["where"]),
    )


def _loadgen_table(options: dict) -> None:
    """``--scenario``: the loadgen table of one scenario."""
    from mlflow_ngraph.loadgen.table import format_rows, loadgen_rows, with_speedups
    from mlflow_ngraph.table import terminal_width

    uri = resolve_tracking_uri(options["tracking_uri"])
    check_tracking_uri(uri)
    client = MlflowClient(tracking_uri=uri)
    wanted = list(options["experiments"])
    found = [client.get_experiment_by_name(n) or client.get_experiment(n) for n in wanted]
    ids = [e.experiment_id for e in found] or [e.experiment_id for e in client.search_experiments()]
    scenario = str(options["loadgen_scenario"])
    rows = with_speedups(loadgen_rows(client, ids, scenario), scenario)
    if not rows:
        raise NgraphError(f"no loadgen results of {scenario}: run `mlflow-ngraph loadgen` first")
    click.echo(format_rows(rows, scenario, terminal_width()))


def _execute(options: dict) -> None:
    fmt, query = options["fmt"], _query(options)
    ranges = parse_ranges(options["ranges"])
    names = parse_tables(options["table_names"], fmt)
    if options["log_report"]:
        names = list(TABLES)  # a report holds every table, whatever is printed
    uri = resolve_tracking_uri(options["tracking_uri"])
    check_tracking_uri(uri)
    client = MlflowClient(tracking_uri=uri)
    verified = None
    if options["verified"]:
        from mlflow_ngraph.deploy.signed import Trust

        verified = Trust.of(options["trusted_keys"], False)
    result = run_compare(client, uri, query, names, ranges, options["live"], verified)
    shown = {n: result.tables[n] for n in parse_tables(options["table_names"], fmt)}
    click.echo(render.render(shown, fmt, why_empty=result.why_empty), nl=False)
    page = None if options["no_html"] else _html(client, uri, result, query)
    with tempfile.TemporaryDirectory(prefix="ngraph-plots-") as scratch:
        figures = []
        if options["plots_dir"] is not None or options["log_report"]:
            figures = _draw(result, options["plots_dir"], Path(scratch))
        if options["log_report"]:
            _report(client, result, query, options["ranges"], figures, page)
    for note in result.notes:
        click.echo(visible(note), err=True)


class CompareError(click.ClickException):
    """A user error, printed as one line; exit code 2 like the main CLI's NgraphError."""

    exit_code = NgraphError.exit_code

    def format_message(self) -> str:
        """The message on one line, values from the store in it shown visibly."""
        return visible(self.message)


@click.command("compare")
@click.option(
    "--experiment",
    "-e",
    "experiments",
    multiple=True,
    metavar="NAME|ID",
    help="Experiment to read (repeatable; default: every active experiment).",
)
@click.option(
    "--tracking-uri",
    envvar="MLFLOW_TRACKING_URI",
    show_envvar=True,
    help="Tracking server or store (default: MLflow's default store).",
)
@click.option("--device", "devices", multiple=True, help="Keep these devices.")
@click.option("--model", "models", multiple=True, help="Keep these models (registered names).")
@click.option("--family", "families", multiple=True, help="Keep these architectural families.")
@click.option(
    "--compiler",
    "compilers",
    multiple=True,
    help="Show these compilers (the identity baseline is always read).",
)
@click.option(
    "--batch-size",
    "batch_sizes",
    multiple=True,
    metavar="N",
    help="Show these batch sizes (batch 1 is still read for RTR/ASE/BSR).",
)
@click.option(
    "--sweep",
    "sweeps",
    multiple=True,
    metavar="ID",
    help="Keep the runs of these sweeps (the id `mlflow-ngraph sweep` prints).",
)
@click.option("--valid-only", is_flag=True, help="Only runs whose output check passed.")
@click.option(
    "--verified",
    is_flag=True,
    help="Only results a producer you trust signed, with the signed figures (the store's "
    "may have been rewritten by any writer of the experiment).",
)
@click.option(
    "--trusted-keys",
    type=click.Path(dir_okay=False),
    help="With --verified: a trusted-producers file instead of your home's.",
)
@click.option(
    "--live",
    is_flag=True,
    help="Search every cell run instead of reading the benchmarks' results indexes.",
)
@click.option(
    "--where",
    "where",
    multiple=True,
    metavar="KEY=VALUE",
    help="Filter on another param: scenario, model.<param> or flag.<flag>.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(render.FORMATS),
    default="terminal",
    show_default=True,
    help="Output format.",
)
@click.option(
    "--table",
    "table_names",
    multiple=True,
    metavar="NAME",
    help=f"Tables: {', '.join(TABLES)} or all (default: all; cells for csv/json).",
)
@click.option(
    "--ranges",
    default="2-4,8-16",
    show_default=True,
    help="Batch-size ranges of the families table.",
)
@click.option(
    "--plots",
    "plots_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the figures (PNG) to this directory.",
)
@click.option(
    "--log-report",
    is_flag=True,
    help="Log tables, figures, report.html and tables.html as a report run in MLflow.",
)
@click.option(
    "--no-html",
    is_flag=True,
    help="Write no HTML report (by default ngraph-compare-report.html, next to a local "
    "store, else in the current directory).",
)
@click.option(
    "--scenario",
    "loadgen_scenario",
    type=click.Choice(["singlestream", "multistream", "offline", "server"]),
    help="The `loadgen` results of this MLPerf scenario (docs/loadgen.md), with each "
    "compiler's speedup over eager on the same device.",
)
def compare(**options: object) -> None:
    """Compare benchmark results across devices, compilers and experiments.

    Every filter option is repeatable and takes comma-separated values. Relative metrics
    (speedup, RTR, ASE, BSR) are recomputed from the logged throughputs.
    """
    try:
        if options["loadgen_scenario"]:
            _loadgen_table(options)
            return
        _execute(options)
    except NgraphError as error:
        raise CompareError(redact_text(error)) from error
    except Exception as error:  # MLflow's and requests' errors of the store: one line
        if not is_store_error(error):
            raise
        failure = store_failed(error, hint=index_hint(str(error)))
        problem = CompareError(str(failure))
        problem.exit_code = failure.exit_code
        raise problem from None
