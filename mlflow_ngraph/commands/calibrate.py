"""``mlflow-ngraph calibrate``: this host's spread between sittings, measured into the home.

A re-run interval (where a re-run of a figure on this host is expected to land) needs the
spread of a figure from one sitting to the next beyond what one sitting's rounds show
(:mod:`mlflow_ngraph.measure.history`). Every benchmark adds to it as it goes; a host that
has not measured the same engines twice yet has none, and its figures carry no re-run
interval. This command measures a small spec in several sittings (each a fresh run: other
worker processes, engines loaded again), into a store of its own that it removes after,
and prints the spread the home's history then gives, by model family.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from mlflow_ngraph.errors import NgraphError


@click.command("calibrate")
@click.option(
    "--spec",
    "spec_file",
    default="calibration",
    show_default=True,
    help="What each sitting measures (YAML file, or a packaged name).",
)
@click.option("--device", help="Device profile (default: the spec's).")
@click.option(
    "--sittings",
    type=int,
    default=3,
    show_default=True,
    help="Sittings of the spec (each a fresh run; at least 2). Each adds a degree of "
    "freedom per model and batch size: the packaged spec's 4 give 8 in 3 sittings.",
)
@click.option("--max-duration", type=float, help="Cap on measured seconds per cell.")
@click.option(
    "--max-interval",
    type=float,
    default=0.05,
    show_default=True,
    help="A sitting's figure wider than +-X is UNSTABLE and left out of the spread.",
)
@click.option(
    "--max-other-cpu",
    type=float,
    default=25.0,
    show_default=True,
    help="A sitting's figure measured while other processes used more than this percent of "
    "the CPU was on a contended host and is left out of the spread.",
)
@click.option(
    "--home",
    type=click.Path(path_type=Path),
    help="Cache directory whose history gets the sittings (default: MLFLOW_NGRAPH_HOME).",
)
@click.option("-q", "--quiet", is_flag=True)
def calibrate(
    spec_file: str,
    device: str | None,
    sittings: int,
    max_duration: float | None,
    max_interval: float,
    max_other_cpu: float,
    home: Path | None,
    quiet: bool,
) -> None:
    """Measure this host's spread between sittings into the home (for re-run intervals)."""
    from mlflow_ngraph.console import (
        default_home,
        merge_options,
        open_log_file,
        resolve_spec_path,
        setup_logging,
    )
    from mlflow_ngraph.plan.config import RunPolicy, build_spec, check_home, load_spec_file
    from mlflow_ngraph.run.live import make_view
    from mlflow_ngraph.run.runner import Runner, plan

    setup_logging(-1 if quiet else 0)
    if sittings < 2:
        raise NgraphError(f"sittings must be at least 2 (a spread needs two), got {sittings}")
    home = home or default_home()
    check_home(home)
    open_log_file(home, "calibrate", say=not quiet)
    data = load_spec_file(resolve_spec_path(spec_file))
    occasions, kind = set(), "cpu"
    options = {"device": device, "max_duration": max_duration, "log_engines": False}
    policy = RunPolicy(max_interval=max_interval, max_other_cpu=max_other_cpu)
    with tempfile.TemporaryDirectory(prefix="ngraph-calibrate-") as tmp:
        uri = f"sqlite:///{Path(tmp) / 'calibrate.db'}"
        for i in range(1, sittings + 1):
            sitting = merge_options(
                data, experiment=f"ngraph-calibrate-{i}", tracking_uri=uri, **options
            )
            work = plan(build_spec(sitting), home)
            click.echo(f"sitting {i} of {sittings}: {len(work.cells)} cells", err=True)
            runner = Runner(work, uri, home, policy=policy, view=make_view(len(work.cells), True))
            runner.run()
            occasions.add(runner.work.occasion)
            kind = runner.profile.kind
    click.echo(report(home, occasions, kind))


def report(home: Path, occasions: set[str] | None = None, kind: str = "cpu") -> str:
    """The spread between sittings this host's history of the device ``kind`` gives,
    pooled and by model family; with ``occasions`` (this calibrate's sittings), how many
    of the figures they measured it rests on, and why the others were left out."""
    from mlflow_ngraph.measure import history

    lines = [f"spread between sittings on this host (the history in {home}):"]
    for what in ("speedup", "throughput"):
        pooled = history.spread(home, what, None, kind)
        said = pooled.words() if pooled else "not yet (too few engines measured in two sittings)"
        lines.append(f"  {what}: {said}")
        left_out = _left_out(home, what, occasions, pooled is not None, kind) if occasions else None
        if left_out:
            lines.append(f"    {left_out}")
        if pooled is None:
            continue
        for family in history.families(home, kind):
            own = history.spread(home, what, family, kind)
            if own is not None and f"the {family} engines" in own.source:
                lines.append(f"    {family}: {own.words().split(' from ')[0].removeprefix('sd ')}")
    lines.append(
        "later runs on this host give each figure a re-run interval from it "
        "(re-run CI in the summary, *_rerun_low/high in MLflow)"
    )
    return "\n".join(lines)


def _left_out(home: Path, what: str, occasions: set[str], spread: bool, kind: str) -> str | None:
    """One line: how many of the ``what`` figures this calibrate's sittings (``occasions``)
    measured the ``spread`` rests on (where there is none: how many could enter one), why
    the rest were left out, and what to do; None where every one is in it."""
    from mlflow_ngraph.measure import history

    share = history.spread_share(home, what, occasions, kind)
    if share["used"] == share["measured"]:
        return None
    causes = {
        "unstable": "UNSTABLE (wider than --max-interval, or the host moved)",
        "contended": "measured on a contended host",
        "alone": "without a second STABLE sitting of their engine",
    }
    said = ", ".join(f"{share[k]} {words}" for k, words in causes.items() if share[k])
    used = f"{share['used']} of the {share['measured']} {what} figures this calibrate measured " + (
        "are in it" if spread else "could enter one, too few for a spread"
    )
    return (
        f"{used}; left out: {said}. A quiet host, or a longer --max-duration, gives more "
        "degrees of freedom"
    )
