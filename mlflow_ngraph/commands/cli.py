"""The ``mlflow-ngraph`` command line: one command per verb.

Every option can also come from the environment as ``MLFLOW_NGRAPH_<COMMAND>_<OPTION>``
(click's ``auto_envvar_prefix``). User errors print one line and exit with status 2.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import signal
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from mlflow_ngraph.console import (
    default_home,
    interrupt,
    merge_options,
    open_log_file,
    resolve_spec_path,
    say_log_file,
    setup_logging,
    split_multi,
    to_log_file,
)
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.redaction import first_line, redact_log_records, redact_text
from mlflow_ngraph.text import visible

if TYPE_CHECKING:
    from mlflow_ngraph.plan.config import RunPolicy

log = logging.getLogger("mlflow_ngraph")


class LazyGroup(click.Group):
    """A group some of whose commands are imported only when one of them is run.

    ``lazy`` maps a command name to ``("package.module:attribute", help)``. ``compare``
    imports MLflow and pandas (seconds); importing it up front made every ``benchmark`` pay
    for it, a resume most of all. The listing of ``--help`` shows ``help`` (the first
    paragraph of the command's docstring, shortened by click as for any command) without
    importing it; running it, or asking for its own ``--help``, imports the real command.
    """

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})
        self._listing = False

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            target, help_text = self.lazy[cmd_name]
            if self._listing:  # a stand-in that only carries the help of the listing
                return click.Command(cmd_name, help=help_text)
            module_name, _, attribute = target.partition(":")
            try:
                command = getattr(importlib.import_module(module_name), attribute)
            except ImportError as exc:  # pragma: no cover - the module is part of the package
                log.debug("command %s does not import: %s", cmd_name, exc)
                return None
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._listing = False


#: commands of other modules of the package: name -> (import path, first paragraph of help)
LAZY_COMMANDS = {
    "compare": (
        "mlflow_ngraph.commands.report:compare",
        "Compare benchmark results across devices, compilers and experiments.",
    ),
    "pull": (
        "mlflow_ngraph.commands.deploy:pull",
        "Fetch the fastest verified engine of a device and model into a directory.",
    ),
    "run-engine": (
        "mlflow_ngraph.commands.deploy:run_engine",
        "Run a pulled engine: output shape, a checksum and latency.",
    ),
    "register": (
        "mlflow_ngraph.commands.deploy:register",
        "Log the fastest verified engine as an MLflow model and alias it per device.",
    ),
    "serve": (
        "mlflow_ngraph.commands.deploy:serve",
        "Serve a registered engine after checking it against its registered version.",
    ),
    "sync": (
        "mlflow_ngraph.commands.cluster:sync_command",
        "Send results measured while the tracking store was unreachable, exactly once.",
    ),
    "calibrate": (
        "mlflow_ngraph.commands.calibrate:calibrate",
        "Measure this host's spread between sittings into the home (for re-run intervals).",
    ),
    "cache": (
        "mlflow_ngraph.cache:cache_command",
        "Show the size of the engine and export caches, or prune them.",
    ),
    "keys": (
        "mlflow_ngraph.commands.keys:keys_command",
        "This home's signing key and the producers whose results you trust.",
    ),
    "tune": (
        "mlflow_ngraph.commands.tune:tune",
        "Find the fastest verified configuration of a model across compilers and knobs.",
    ),
    "loadgen": (
        "mlflow_ngraph.commands.loadgen:loadgen",
        "Run MLPerf LoadGen's scenarios on each compiled engine or a served model.",
    ),
    "gate": (
        "mlflow_ngraph.commands.gate:gate",
        "The challenger against the champion engine, measured in the same rounds; a verdict.",
    ),
    "sweep": (
        "mlflow_ngraph.commands.cluster:sweep_command",
        "Benchmark every device of a sweep spec on a Ray cluster; compare them at the end.",
    ),
}


@click.group(
    cls=LazyGroup,
    lazy=LAZY_COMMANDS,
    context_settings={"auto_envvar_prefix": "MLFLOW_NGRAPH", "help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="mlflow-ngraph")
def cli() -> None:
    """Benchmark graph compilers on this device; every result goes to MLflow."""


#: ``benchmark --scenario`` values that run MLPerf LoadGen (``mlflow-ngraph loadgen``)
LOADGEN_SCENARIOS = ("singlestream", "multistream", "offline", "server")

#: ``--remeasure``, the same on ``benchmark`` and ``blocks``
remeasure_option = click.option(
    "--remeasure",
    metavar="unstable|all",
    help="Measure again, into their own cell runs, the measurements the store holds that "
    "are UNSTABLE (unstable) or every one (all): a model's whole group at each such batch "
    "size, its identity baseline included (speedups stay paired); figures, intervals, marks "
    "and signed records are replaced, MLflow keeps the metric history.",
)


def host_options(command):
    """``--busy-ok`` and ``--wait-quiet``: what a run does when the host is busy before it
    measures (:mod:`mlflow_ngraph.measure.quiet`)."""
    command = click.option(
        "--wait-quiet",
        default="300",
        show_default=True,
        metavar="SECONDS",
        help="Before measuring, the host is sampled for a few seconds; where other processes "
        "take more of the CPU than a stable measurement allows (--max-other-cpu, 25% by "
        "default), wait up to SECONDS for it to go quiet, then stop with exit status 2 (0: "
        "look, do not wait).",
    )(command)
    return click.option(
        "--busy-ok",
        is_flag=True,
        help="Measure on a busy host at once (its figures are marked UNSTABLE where the "
        "load disturbed them).",
    )(command)


def host_check_of(o: dict[str, Any], max_other_cpu: float, **more: Any):
    """The sample before the run that ``o``'s ``--busy-ok`` and ``--wait-quiet`` ask for
    (``more``: the other fields of :class:`~mlflow_ngraph.measure.quiet.HostCheck`)."""
    from mlflow_ngraph.measure.quiet import HostCheck

    return HostCheck(max_other_cpu, o["wait_quiet"], o["busy_ok"], **more)


#: ``-v``'s help: the terminal shows results; the run's steps are the log file's
VERBOSE_HELP = (
    "Show the run's steps on the terminal too (each engine compiled or loaded, each group "
    "measured again, each UNSTABLE reason in full; -vv: debug lines). Every step goes to "
    "the log file in the home (logs/) either way."
)


@cli.command()
@click.option(
    "--spec",
    "spec_file",
    help="Experiment spec (YAML file, or a packaged name: default, paper, smoke).",
)
@click.option("--device", help="Device profile: cpu, xeon, gpu, orin.")
@click.option("--model", "models", multiple=True, help="NAME[:key=value,...] (repeatable).")
@click.option("--compiler", "compilers", multiple=True, help="NAME[:flag=value,...] (repeatable).")
@click.option("--batch-sizes", help="Comma-separated batch sizes, e.g. 1,2,4,8.")
@click.option(
    "--scenario",
    type=click.Choice(["throughput", "latency", *LOADGEN_SCENARIOS]),
    help="Measurement scenario; singlestream, multistream, offline and server are MLPerf "
    "LoadGen's, run as `mlflow-ngraph loadgen --scenario NAME` with its defaults "
    "(docs/loadgen.md).",
)
@click.option("--warmup", type=int, help="Warm-up repetitions (default 10).")
@click.option("--repetitions", type=int, help="Minimum measured repetitions (default 100).")
@click.option(
    "--protocol",
    type=click.Choice(["rounds", "paper"]),
    help="How each cell is timed: rounds (the default: windows interleaved with the model's "
    "other engines, paired speedups) or paper (exactly --repetitions single inferences "
    "after --warmup, each timed; the mean and std of b/t_i; needs --scenario latency).",
)
@click.option("--min-duration", type=float, help="Minimum measured seconds per cell (default 1).")
@click.option("--max-duration", type=float, help="Cap on measured seconds per cell.")
@click.option(
    "--tolerance",
    type=float,
    help="Output check: error bound as a fraction of each output's largest reference "
    "magnitude, and 1 - minimum cosine similarity (default 1e-3).",
)
@click.option(
    "--atol",
    type=float,
    help="Output check: absolute tolerance, |out - ref| <= atol + rtol * |ref| elementwise "
    "(default: tolerance x the output's largest reference magnitude).",
)
@click.option("--rtol", type=float, help="Output check: relative tolerance (default 0).")
@click.option(
    "--math",
    type=click.Choice(["fp32", "tf32", "fp16"]),
    help="The arithmetic every compiler runs: fp32 (strict, the default), tf32 or fp16 "
    "(GPU devices); the output check's default tolerance follows (docs/gpu.md).",
)
@click.option("--experiment", help="MLflow experiment name.")
@click.option(
    "--tracking-uri",
    help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, then MLflow's default).",
)
@click.option(
    "--home",
    type=click.Path(path_type=Path),
    help="Cache and journal directory (default: MLFLOW_NGRAPH_HOME or ~/.cache/mlflow-ngraph).",
)
@click.option("--retry-failed", is_flag=True, help="Measure cells that failed before again.")
@remeasure_option
@click.option("--no-engine-artifacts", is_flag=True, help="Do not log engines as artifacts.")
@click.option(
    "--log-models",
    is_flag=True,
    help="Also log every valid engine as an MLflow logged model of its cell run.",
)
@click.option(
    "--isolation",
    type=click.Choice(["process", "none"]),
    default="process",
    show_default=True,
    help="Measure each cell in a fresh worker process, or all in this one.",
)
@click.option(
    "--cell-timeout",
    type=float,
    default=1800.0,
    show_default=True,
    help="Seconds a cell's worker may run before it is killed and the cell FAILED.",
)
@click.option(
    "--max-interval",
    type=float,
    default=0.05,
    show_default=True,
    help="A measurement whose speedup's 95% interval (identity: its throughput's) is wider "
    "than +-X of it is UNSTABLE.",
)
@click.option(
    "--precision",
    type=float,
    default=0.02,
    show_default=True,
    help="Measure in rounds until this sitting's 95% interval of each speedup (identity: "
    "its throughput, against twice X) is within +-X, or --max-duration (the re-run interval "
    "adds the host's spread between sittings, which more rounds cannot narrow).",
)
@click.option(
    "--rerun-sd",
    type=float,
    default=None,
    help="The spread (sd of the log) of a figure between sittings on this host, for the "
    "re-run intervals (where a re-run is expected to land). Default: the spread this host's "
    "earlier measurements in the home show; without one, no re-run interval is given.",
)
@click.option(
    "--max-other-cpu",
    type=float,
    default=25.0,
    show_default=True,
    help="Percent of the CPU other processes may use during a measurement before it is UNSTABLE.",
)
@click.option(
    "--stable-retries",
    type=int,
    default=1,
    show_default=True,
    help="Measure an UNSTABLE batch size (with its baseline) again up to K times after a "
    "pause; the last attempt is kept.",
)
@click.option(
    "--sittings",
    type=int,
    default=1,
    show_default=True,
    help="Measure each model's group N times, spread over the run (every model's first "
    "sitting, then every model's second), each in fresh workers with the engines loaded "
    "again (each to a looser target, the default cap shared): every figure is their mean, "
    "and its re-run interval rests on the spread between sittings this run measured.",
)
@host_options
@click.option("-v", "--verbose", count=True, help=VERBOSE_HELP)
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="No live display and no log lines: one line per finished cell, then the summary.",
)
def benchmark(**o: Any) -> None:
    """Compile and measure models x compilers x batch sizes on this device."""
    from mlflow_ngraph.plan.config import RunPolicy

    if o["scenario"] in LOADGEN_SCENARIOS:
        return _loadgen_instead(o)
    setup_logging(-1 if o["quiet"] else o["verbose"])
    data = _benchmark_data(o)
    _run(
        data,
        o["home"],
        o["retry_failed"],
        o["isolation"],
        o["cell_timeout"],
        policy=RunPolicy(
            max_interval=o["max_interval"],
            max_other_cpu=o["max_other_cpu"],
            stable_retries=o["stable_retries"],
            precision=o["precision"],
            rerun_sd=o["rerun_sd"],
            sittings=o["sittings"],
        ),
        quiet=o["quiet"],
        experiment_explicit=o["experiment"] is not None,
        remeasure=o["remeasure"],
        host_check=host_check_of(o, o["max_other_cpu"]),
    )


def _loadgen_instead(o: dict[str, Any]) -> None:
    """``benchmark --scenario singlestream|multistream|offline|server``: the ``loadgen``
    command on the same cells (its defaults for what benchmark has no option for)."""
    from mlflow_ngraph.commands.loadgen import loadgen

    scenario = o["scenario"]
    if o["spec_file"] or not o["models"]:
        raise NgraphError(
            f"--scenario {scenario} runs MLPerf LoadGen on --model x --compiler cells: give "
            "--model (not --spec), or run `mlflow-ngraph loadgen` (docs/loadgen.md)"
        )
    given = {"min_duration": o["min_duration"]} if o["min_duration"] is not None else {}
    sizes = [b for b in (o["batch_sizes"] or "").split(",") if b.strip()]
    if len(sizes) > 1 or (sizes and not sizes[0].strip().isdigit()):
        raise NgraphError(f"--scenario {scenario} runs one batch size: give one --batch-sizes N")
    if sizes:
        given["max_batch"] = int(sizes[0])
    click.get_current_context().invoke(
        loadgen, models=o["models"], compilers=o["compilers"], device=o["device"] or "cpu",
        scenarios=(scenario,), experiment=o["experiment"] or "ngraph-loadgen",
        tracking_uri=o["tracking_uri"], home=o["home"], verbose=o["verbose"], **given,
    )  # fmt: skip


def _benchmark_data(options: dict[str, Any]) -> dict[str, Any]:
    """The spec settings of a ``benchmark`` command line, from its parsed ``options``."""
    from mlflow_ngraph.plan.config import load_spec_file, parse_batch_sizes

    spec_file, batch_sizes = options["spec_file"], options["batch_sizes"]
    file_data = load_spec_file(resolve_spec_path(spec_file)) if spec_file else {}
    return merge_options(
        file_data,
        device=options["device"],
        models=split_multi(options["models"]),
        compilers=split_multi(options["compilers"]),
        batch_sizes=parse_batch_sizes(batch_sizes) if batch_sizes else None,
        scenario=options["scenario"],
        warmup=options["warmup"],
        repetitions=options["repetitions"],
        protocol=options["protocol"],
        min_duration=options["min_duration"],
        max_duration=options["max_duration"],
        tolerance=options["tolerance"],
        atol=options["atol"],
        rtol=options["rtol"],
        math=options["math"],
        experiment=options["experiment"],
        tracking_uri=options["tracking_uri"],
        log_engines=False if options["no_engine_artifacts"] else None,
        log_models=True if options["log_models"] else None,
    )


def _run(
    data: dict[str, Any],
    home: Path | None,
    retry_failed: bool,
    isolation: str = "process",
    cell_timeout: float = 1800.0,
    policy: RunPolicy | None = None,
    quiet: bool = False,
    experiment_explicit: bool = False,
    remeasure: str | None = None,
    host_check=None,
    command: str = "benchmark",
) -> None:
    """Validate the merged settings and the run's ``policy`` (how it judges and repeats
    its measurements), run every cell (after ``host_check`` looked at the host) and print
    the summary (``remeasure``: which stored measurements are measured again, in place).
    Every step goes to the ``command``'s log file in the home, said first."""
    from mlflow_ngraph.deploy.register import log_cell_engine
    from mlflow_ngraph.plan.config import RunPolicy
    from mlflow_ngraph.run.live import make_view
    from mlflow_ngraph.run.runner import Runner, check_remeasure, check_sittings

    check_remeasure(remeasure)
    ctx = click.get_current_context(silent=True)
    hint = remeasure_command(ctx) if ctx is not None else None
    policy = policy or RunPolicy()
    _check_cell_timeout(cell_timeout)
    policy.validate()
    check_sittings(policy.sittings, isolation, str(data.get("protocol") or "rounds"))
    home = home or default_home()
    work, uri = _planned(data, home, command, quiet)
    spec = work.spec
    runner = Runner(
        work, uri, home, retry_failed=retry_failed, isolation=isolation,
        cell_timeout_s=cell_timeout, policy=policy, view=make_view(len(work.cells), quiet),
        experiment_explicit=experiment_explicit, model_logger=log_cell_engine,
        remeasure=remeasure, remeasure_hint=hint,
        host_check=host_check,
    )  # fmt: skip
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        rows = runner.run()
    except NgraphError:  # e.g. the server did not come back: what was measured still shows
        if runner.rows:
            click.echo(_summary(runner.rows, spec, runner, hint))
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    _finish(_summary(rows, spec, runner, hint), runner, uri)


def _finish(summary: str, runner, uri: str) -> None:
    """The end of a run: its summary (on the terminal and in the log file), where the
    answer opens in MLflow, and its HTML report."""
    click.echo(summary)
    to_log_file(summary)
    _say_view(runner, uri)
    _say_report(runner, uri)


def _summary(rows, spec, runner, remeasure: str | None = None) -> str:
    """The summary, fitted to the terminal's width when standard output is one
    (``remeasure``: the command that measures its UNSTABLE measurements again)."""
    from mlflow_ngraph.report.summary import format_summary
    from mlflow_ngraph.table import terminal_width

    width = terminal_width() if sys.stdout.isatty() else None
    return format_summary(
        rows, spec, experiment=runner.experiment_name, width=width, remeasure=remeasure
    )


#: options a re-measuring command leaves out (how much it says is the user's to choose)
_NOT_REPEATED = ("remeasure", "verbose", "quiet")


def remeasure_command(ctx: click.Context, mode: str = "unstable") -> str:
    """The command that measures the UNSTABLE measurements of this invocation again, in
    place: the options given on its command line (the same cells, store and experiment),
    then ``--remeasure mode``; secrets in it redacted."""
    import shlex

    from click.core import ParameterSource

    words = ["mlflow-ngraph", ctx.info_name or "benchmark"]
    for param in ctx.command.params:
        name = param.name or ""
        if not isinstance(param, click.Option) or name in _NOT_REPEATED:
            continue
        if ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE:
            continue
        flag, value = max(param.opts, key=len), ctx.params[name]
        if param.is_flag:
            words += [flag] if value else []
        else:
            values = value if param.multiple else [value]
            words += [w for v in values for w in (flag, str(v))]
    return redact_text(shlex.join([*words, "--remeasure", mode]))


def _say_view(runner, uri: str) -> None:
    """Where the answer opens in MLflow's UI: the designed view when it was written, else
    the experiment's runs."""
    experiment_id = getattr(runner, "experiment_id", None)
    if experiment_id:
        from mlflow_ngraph.commands.ui_lines import say_view

        say_view(uri, experiment_id, getattr(runner.store, "view_key", None))


def _say_report(runner, uri: str) -> None:
    """Write the invocation's HTML report (next to the store, and on the parent run) and
    say where, in one line; a report that cannot be made is one warning: the results stand.
    Nothing where the invocation opened no run (every cell was done before)."""
    store = getattr(runner, "store", None)
    parent_id = getattr(store, "parent_id", None)
    if not parent_id:
        return
    from mlflow_ngraph.report.html_report import benchmark_report

    try:
        path = benchmark_report(store.client, uri, parent_id)
    except Exception as exc:  # a report is an extra: its failure never fails the run
        reason = first_line(exc) or type(exc).__name__
        log.warning("the HTML report was not written (%s); the results stand", reason)
        return
    click.echo(f"report: {visible(str(path))}")


def _planned(data: dict[str, Any], home: Path, command: str, quiet: bool):
    """:func:`_plan`, every line of it in the ``command``'s log file, whose path is said
    once the settings were found good (a bad one stays one line)."""
    log_path = open_log_file(home, command, say=False)
    planned = _plan(data, home)
    if not quiet:
        say_log_file(log_path)
    return planned


def _plan(data: dict[str, Any], home: Path):
    """The validated plan of ``data`` and the tracking URI it goes to, said in one line.

    Raises:
        NgraphError: a bad setting, a home or store that cannot be used."""
    from mlflow_ngraph.plan.config import build_spec, check_home
    from mlflow_ngraph.run.runner import plan
    from mlflow_ngraph.tracking.mlflow_log import redact, resolve_tracking_uri
    from mlflow_ngraph.tracking.uri import check_tracking_uri

    spec = build_spec(data)
    check_home(home)
    work = plan(spec, home)
    uri = resolve_tracking_uri(spec.tracking_uri)
    check_tracking_uri(uri)
    log.info(
        "benchmarking %d model(s) x %d compiler(s) x batch sizes %s on %s -> %s",
        len(spec.models),
        len(work.cells) // max(len(spec.models), 1),
        ",".join(map(str, spec.batch_sizes)),
        spec.device,
        redact(uri),
    )
    return work, uri


def _check_cell_timeout(cell_timeout: float) -> None:
    """Raises:
    NgraphError: a cell timeout out of its range."""
    if not (math.isfinite(cell_timeout) and cell_timeout > 0):
        raise NgraphError(
            f"cell-timeout must be a finite number of seconds > 0, got {cell_timeout}"
        )


#: the paper's block grid (Section V-C/V-E): conv widths are channels, MHA widths embedding
#: dimensions; sequence length 10; depths 1..6.
BLOCK_WIDTHS = {"conv_block": [64, 96, 128, 256], "mha_block": [128, 256, 384, 512]}
BLOCK_DEPTHS = [1, 2, 3, 4, 5, 6]
BLOCK_BATCH_SIZES = [1, 2, 4, 8, 16]
#: ``--small``: a grid of minutes on a small host that still has a width and a depth axis
SMALL_WIDTHS = {"conv_block": [64, 128], "mha_block": [128, 256]}
SMALL_DEPTHS = [1, 2, 3]
SMALL_BATCH_SIZES = [1, 8]
#: ``--small`` measures like the default experiment (the paper's 100 repetitions of a
#: width-128 conv stack at batch 8 take minutes per cell on 2 cores)
SMALL_MEASURE = {"warmup": 3, "repetitions": 10, "min_duration": 0.5}


def _int_list(text: str | None, what: str) -> list[int] | None:
    from mlflow_ngraph.plan.config import parse_int_list

    return parse_int_list(text, what, ranges=True) if text else None


def block_models(kinds: list[str], widths: list[int] | None, depths: list[int]) -> list[dict]:
    """The depth x width grid of the synthetic blocks as model entries of a spec."""
    models = []
    for kind in kinds:
        if kind not in BLOCK_WIDTHS:
            raise NgraphError(f"unknown block kind {kind!r} (kinds: {', '.join(BLOCK_WIDTHS)})")
        for width in widths or BLOCK_WIDTHS[kind]:
            for depth in depths:
                models.append({"name": kind, "params": {"width": width, "depth": depth}})
    return models


@cli.command()
@click.option("--device", help="Device profile: cpu, xeon, gpu, orin.")
@click.option("--kinds", default="conv_block,mha_block", show_default=True, help="Block kinds.")
@click.option("--widths", help="Widths for every kind (default: the paper's per kind).")
@click.option("--depths", help="Depths, e.g. 1-6 or 1,2,4 (default 1-6).")
@click.option("--batch-sizes", help="Batch sizes (default 1,2,4,8,16).")
@click.option(
    "--small",
    is_flag=True,
    help="A small grid: 2 widths per kind, depths 1-3, batch 1 and 8, 10 repetitions.",
)
@click.option(
    "--compiler", "compilers", multiple=True, help="NAME[:flag=value,...] (default: the profile's)."
)
@click.option("--scenario", type=click.Choice(["throughput", "latency"]))
@click.option("--warmup", type=int)
@click.option("--repetitions", type=int)
@click.option(
    "--protocol",
    type=click.Choice(["rounds", "paper"]),
    help="rounds (default) or paper: exactly --repetitions timed single inferences, as the "
    "paper's Tables VII/VIII (needs --scenario latency).",
)
@click.option("--min-duration", type=float)
@click.option("--experiment", default="ngraph-blocks", show_default=True)
@click.option("--tracking-uri")
@click.option("--home", type=click.Path(path_type=Path))
@click.option("--retry-failed", is_flag=True)
@remeasure_option
@host_options
@click.option("-v", "--verbose", count=True, help=VERBOSE_HELP)
def blocks(**o: Any) -> None:
    """Run the depth x width x batch grid of conv_block and mha_block (Tables VII/VIII)."""
    from mlflow_ngraph.plan.config import RunPolicy

    setup_logging(o["verbose"])
    check = host_check_of(o, RunPolicy().max_other_cpu)
    _run(
        _blocks_data(o),
        o["home"],
        o["retry_failed"],
        remeasure=o["remeasure"],
        host_check=check,
        command="blocks",
    )


def _blocks_data(o: dict[str, Any]) -> dict[str, Any]:
    """The spec settings of a ``blocks`` command line, from its parsed options ``o``."""
    from mlflow_ngraph.plan.config import parse_batch_sizes

    small = o["small"]
    models = _block_grid(o["kinds"], o["widths"], o["depths"], small)
    sizes = (
        parse_batch_sizes(o["batch_sizes"])
        if o["batch_sizes"]
        else (SMALL_BATCH_SIZES if small else BLOCK_BATCH_SIZES)
    )
    measure = {name: o[name] for name in SMALL_MEASURE}
    if small:  # the small grid's settings, where the command line gives none
        measure = {k: SMALL_MEASURE[k] if v is None else v for k, v in measure.items()}
    return merge_options(
        {},
        **measure,
        device=o["device"],
        models=models,
        compilers=split_multi(o["compilers"]),
        batch_sizes=sizes,
        scenario=o["scenario"],
        protocol=o["protocol"],
        experiment=o["experiment"],
        tracking_uri=o["tracking_uri"],
    )


def _block_grid(kinds: str, widths: str | None, depths: str | None, small: bool) -> list[dict]:
    """The model entries of the blocks' grid (``--small``: its smaller widths and depths)."""
    width_list = _int_list(widths, "widths")
    depth_list = _int_list(depths, "depths") or (SMALL_DEPTHS if small else BLOCK_DEPTHS)
    models = []
    for kind in [k for k in kinds.replace(" ", ",").split(",") if k]:
        kind_widths = width_list or (SMALL_WIDTHS.get(kind) if small else None)
        models += block_models([kind], kind_widths, depth_list)
    return models


@cli.command("compilers")
@click.option("--device", default="cpu", help="Device profile whose device kind to check.")
@click.option("--flags", "show_flags", is_flag=True, help="Also list each compiler's flags.")
def compilers_command(device: str, show_flags: bool) -> None:
    """List every registered compiler, its version and whether it runs here."""
    from mlflow_ngraph.compilers.registry import compiler_names, get_compiler
    from mlflow_ngraph.devices import get_profile

    profile = get_profile(device)
    rows = []
    for name in compiler_names():
        try:
            compiler = get_compiler(name)
        except NgraphError as exc:
            rows.append((name, "-", "no", str(exc)))
            continue
        ok, reason = compiler.availability(profile.kind)
        rows.append((name, compiler.version(), "yes" if ok else "no", "" if ok else reason))
        if show_flags:
            for flag, spec in compiler.flags.items():
                choices = f" {{{'|'.join(map(str, spec.choices))}}}" if spec.choices else ""
                rows.append(
                    (
                        "",
                        "",
                        "",
                        f"  {flag}: {spec.type.__name__}{choices} = {spec.default}  {spec.help}",
                    )
                )
    from mlflow_ngraph.table import format_table

    click.echo(
        f"device profile {profile.name} ({profile.kind}): defaults {', '.join(profile.compilers)}"
    )
    click.echo(format_table(["compiler", "version", "available", "reason"], rows))


@cli.command("models")
def models_command() -> None:
    """List the registered models (the paper's 15 and the synthetic blocks) by family."""
    from mlflow_ngraph.models.registry import MODEL_SETS, registered_models
    from mlflow_ngraph.table import format_table

    rows = [(name, family) for name, family in registered_models().items()]
    click.echo(format_table(["model", "family"], rows))
    click.echo("model sets: " + ", ".join(f"{k} ({len(v)})" for k, v in MODEL_SETS.items()))
    click.echo("also: any timm model name, a file ending in .onnx, or package.module:function")


#: the commands whose settings are a benchmark spec, and how their options make it
_SPEC_DATA = {"benchmark": _benchmark_data, "blocks": _blocks_data}


def spec_of(args: list[str]) -> dict[str, Any]:
    """The benchmark spec settings the command line ``mlflow-ngraph ARGS`` would run,
    without running it (``benchmark`` and ``blocks``).

    Raises:
        NgraphError: another command, or an option the command rejects (one line).
    """
    name = args[0] if args else ""
    if name not in _SPEC_DATA:
        raise NgraphError(f"{name!r} does not run a benchmark spec ({', '.join(_SPEC_DATA)} do)")
    command = cli.commands[name]
    try:
        with command.make_context(name, list(args[1:])) as ctx:
            return _SPEC_DATA[name](ctx.params)
    except click.ClickException as exc:
        raise NgraphError(f"{name}: {exc.format_message()}") from None


def _signal_main_thread() -> None:
    """SIGINT to the main thread if Python handles it (SIGTERM if only that one is: see
    :func:`mlflow_ngraph.console.interrupt`)."""
    import threading

    for signum in (signal.SIGINT, signal.SIGTERM):
        if callable(signal.getsignal(signum)):
            signal.pthread_kill(threading.main_thread().ident, signum)
            return


@contextlib.contextmanager
def _interrupts_end_the_run():
    """Ctrl-C that lands while a finalizer runs (SQLAlchemy's, during a garbage collection)
    is raised there, where Python can only print it ("Exception ignored in ...", a
    traceback) and drop it. Inside the block it is raised again in the main thread, where
    it ends the run as any Ctrl-C does."""
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            import threading

            # a moment later, from another thread: the main thread takes it out of here (a
            # signal, so that a sleep or a wait on the workers ends at once too)
            later = threading.Timer(0.1, _signal_main_thread)
            later.daemon = True
            later.start()
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: user errors become one line and exit status 2, an error
    of the tracking store one line too (:func:`store_failure`); whatever is printed is
    redacted (:func:`mlflow_ngraph.redaction.redact_text`), a traceback included."""
    redact_log_records()
    try:
        with _interrupts_end_the_run():
            cli.main(args=argv, prog_name="mlflow-ngraph", standalone_mode=False)
    except NgraphError as exc:
        _exit_line(exc)
    except (click.exceptions.Abort, KeyboardInterrupt):  # Ctrl-C (SIGTERM too: console.interrupt)
        click.echo(_interrupted(sys.argv[1:] if argv is None else argv), err=True)
        to_log_file("interrupted", logging.WARNING, __name__)
        sys.exit(130)
    except click.ClickException as exc:
        exc.message = redact_text(exc.message)
        exc.show()
        sys.exit(exc.exit_code)
    except Exception as exc:
        error = store_failure(exc)
        if error is None:  # a fault of the tool: its traceback, without the secrets
            text = redact_text("".join(traceback.format_exception(exc))).rstrip()
            click.echo(text, err=True)
            to_log_file(text, logging.ERROR, __name__)
            sys.exit(1)
        _exit_line(error)


def _exit_line(error: NgraphError) -> None:
    """One line, whatever values from the store it names (shown visibly, secrets redacted),
    in the invocation's log file too."""
    line = f"error: {visible(redact_text(error))}"
    click.echo(line, err=True)
    to_log_file(line, logging.ERROR, __name__)
    sys.exit(error.exit_code)


def store_failure(exc: BaseException) -> NgraphError | None:
    """The one line of an error MLflow or requests raised for the tracking store the command
    uses (any command: compare, pull, register, serve, tune, sync...); None for any other
    error. A results index that is gone or unreadable names ``--live``."""
    if "mlflow" not in sys.modules and "requests" not in sys.modules:
        return None  # neither was imported: the error comes from neither
    from mlflow_ngraph.tracking.index import index_hint
    from mlflow_ngraph.tracking.mlflow_log import is_store_error, store_failed

    if not is_store_error(exc):
        return None
    return store_failed(exc, hint=index_hint(str(exc)))


#: the commands whose finished work a re-run keeps (journal, store) and skips
RESUMABLE = ("benchmark", "blocks", "sweep", "sync", "tune")


def _interrupted(argv: list[str]) -> str:
    command = next((a for a in argv if not a.startswith("-")), "")
    if command in RESUMABLE:
        return "interrupted: run the same command to resume"
    return "interrupted"
