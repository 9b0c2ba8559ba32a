"""``mlflow-ngraph gate``: the challenger against the champion, measured in the same rounds
on this device; the verdict as the exit status (docs/gate.md)."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any

import click

from mlflow_ngraph.commands.cli import host_check_of, host_options, store_failure
from mlflow_ngraph.commands.deploy import signature_options
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.gate.verdict import EXIT_ERROR, EXIT_STATUS, TOLERANCE


class GateCommand(click.Command):
    """A command whose bad options exit with the gate's error status (3), never 2, which
    a CI job reads as ``unsure``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            exc.exit_code = EXIT_ERROR
            raise


SIDE_HELP = (
    "models:/NAME@ALIAS (or /VERSION), runs:/RUN_ID (with --batch-size), an engine folder "
    "from pull, or MODEL[:k=v,...]@COMPILER[:flag=v,...] built here."
)


@click.command("gate", cls=GateCommand)
@click.option("--champion", required=True, help="The deployed engine: " + SIDE_HELP)
@click.option("--challenger", required=True, help="The engine to judge: " + SIDE_HELP)
@click.option("--batch-size", type=int, help="The batch size (runs:/ and specs; default 1).")
@click.option(
    "--tolerance",
    type=float,
    default=TOLERANCE,
    show_default=True,
    help="The ratio's band around 1 called 'same' (0.03: +-3%).",
)
@click.option(
    "--budget",
    default="60s",
    show_default=True,
    help="Seconds of rounds at most while the verdict is unsure: 90s, 3m.",
)
@click.option("--champion-python", help="The champion's worker runs with this Python.")
@click.option("--challenger-python", help="The challenger's worker runs with this Python.")
@click.option(
    "--output-tolerance",
    type=float,
    default=1e-3,
    show_default=True,
    help="The challenger's outputs must match the champion's within this (as benchmark's).",
)
@click.option("--promote", is_flag=True, help="Move the champion's alias to the challenger "
              "when it is faster or the same (never when unsure).")  # fmt: skip
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "markdown", "json", "junit"]),
    default="text",
    show_default=True,
)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the report here too.")
@click.option("--rerun-sd", type=float, help="The host's spread between sittings (sd of log).")
@click.option("--device", default="cpu", show_default=True, help="Device profile.")
@click.option("--experiment", default="ngraph-gate", show_default=True)
@click.option("--tracking-uri", help="Default: MLFLOW_TRACKING_URI, then MLflow's.")
@click.option("--home", type=click.Path(path_type=Path), help="Cache directory.")
@click.option(
    "--trust-code", is_flag=True, default=None, help="Load engines whose loading runs code."
)
@host_options
@signature_options
def gate(**o: Any) -> None:
    """The challenger against the champion, in the same interleaved rounds on this device.

    Exit status: 0 faster or same, 1 slower beyond --tolerance (or outputs that differ),
    2 unsure (the interval too wide when --budget ran out, or the host busy past
    --wait-quiet), 3 an error.
    """
    try:
        result = _gate(o)
    except NgraphError as exc:
        from mlflow_ngraph.gate.gate import HostBusy

        exc.exit_code = exc.exit_code if isinstance(exc, HostBusy) else EXIT_ERROR
        raise
    except Exception as exc:
        error = store_failure(exc)
        if error is None:
            from mlflow_ngraph.console import to_log_file

            to_log_file("".join(traceback.format_exception(exc)), logging.ERROR, __name__)
            error = NgraphError(f"the gate failed: {type(exc).__name__}: {exc}")
        error.exit_code = EXIT_ERROR
        raise error from None
    raise SystemExit(EXIT_STATUS.get(result["verdict"], 1))


#: what a gate measured on a busy host should expect, said under --busy-ok (its noise shows
#: as a wider interval and an unsure verdict, not as UNSTABLE figures)
BUSY_EFFECT = "expect a wider interval, and unsure"


def gate_host_check(o: dict[str, Any]):
    """The gate's look at the host, as ``o``'s ``--busy-ok`` and ``--wait-quiet`` ask."""
    from mlflow_ngraph.plan.config import RunPolicy

    return host_check_of(o, RunPolicy().max_other_cpu, busy_effect=BUSY_EFFECT)


def _gate(o: dict[str, Any]) -> dict[str, Any]:
    from mlflow_ngraph.console import default_home, open_log_file, setup_logging
    from mlflow_ngraph.gate.gate import GateSettings, run_gate
    from mlflow_ngraph.gate.report import render
    from mlflow_ngraph.text import visible
    from mlflow_ngraph.tracking.mlflow_log import resolve_tracking_uri
    from mlflow_ngraph.tune.settings import parse_budget

    settings = GateSettings(
        champion=o["champion"],
        challenger=o["challenger"],
        tracking_uri=resolve_tracking_uri(o["tracking_uri"]),
        home=Path(o["home"] or default_home()),
        champion_python=o["champion_python"],
        challenger_python=o["challenger_python"],
        batch_size=o["batch_size"],
        tolerance=o["tolerance"],
        budget_s=parse_budget(o["budget"]) or 0.0,
        output_tolerance=o["output_tolerance"],
        device=o["device"],
        experiment=o["experiment"],
        promote=o["promote"],
        rerun_sd=o["rerun_sd"],
        trusted_keys=o["trusted_keys"],
        allow_unsigned=o["allow_unsigned"],
        trust_code=o["trust_code"],
        host_check=gate_host_check(o),
    )
    quiet = o["fmt"] != "text"
    setup_logging(0)  # MLflow's store lines off the terminal; ours to the log file
    open_log_file(settings.home, "gate")
    result = run_gate(settings, lambda line: click.echo(visible(line), err=quiet))
    text = render(result, o["fmt"])
    click.echo(text)
    if o["output"] is not None:
        Path(o["output"]).write_text(text + "\n")
    return result
