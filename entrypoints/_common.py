"""Shared by the MLproject entry points: turn MLproject's string params into CLI arguments.

MLflow passes every parameter, so an unset one arrives as an empty string; it is dropped here
and the library's default applies.
"""

from __future__ import annotations

import sys


def run_cli(command: str, argv: list[str], multi: dict[str, str] | None = None) -> None:
    """Call ``mlflow-ngraph <command>`` with the non-empty options of ``argv``.

    ``multi`` maps an entry-point option that holds a list separated by spaces or semicolons
    (not commas: a model's params use them, ``conv_block:width=64,depth=2``) to the repeatable
    CLI option it expands to (``--models "a b"`` -> ``--model a --model b``).
    """
    from mlflow_ngraph.cli import main

    multi = multi or {}
    args = [command]
    pairs = zip(argv[0::2], argv[1::2])
    for option, value in pairs:
        value = value.strip()
        if not value:
            continue
        if option in multi:
            for item in value.replace(";", " ").split():
                args += [multi[option], item]
        else:
            args += [option, value]
    main(args)


if __name__ == "__main__":  # pragma: no cover
    run_cli(sys.argv[1], sys.argv[2:])
