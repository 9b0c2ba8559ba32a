"""Shared by the MLproject entry points: run ``mlflow-ngraph <command>`` with MLproject's
string params as its options (:func:`mlflow_ngraph.commands.entrypoints.command_line`)."""

from __future__ import annotations

import sys


def run_cli(command: str, argv: list[str]) -> None:
    """Call ``mlflow-ngraph <command>`` with the non-empty options of ``argv``."""
    from mlflow_ngraph.commands.cli import main
    from mlflow_ngraph.commands.entrypoints import command_line

    main(command_line(command, argv))


if __name__ == "__main__":  # pragma: no cover
    run_cli(sys.argv[1], sys.argv[2:])
