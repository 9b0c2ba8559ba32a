"""The MLproject entry points as ``mlflow-ngraph`` command lines.

MLflow passes every parameter, so an unset one arrives as an empty string; it is dropped
and the library's default applies. The thin scripts of ``entrypoints/`` call
:func:`command_line` on their own arguments, and the ``ngraph-ray`` project backend on the
command MLflow computes for an entry point, so both run the same command.
"""

from __future__ import annotations

#: per entry point's script (``entrypoints/<name>.py``): the options that hold a list
#: separated by spaces or semicolons (not commas: a model's params use them,
#: ``conv_block:width=64,depth=2``) and the repeatable option each expands to
#: (``--models "a b"`` -> ``--model a --model b``)
LIST_OPTIONS: dict[str, dict[str, str]] = {
    "benchmark": {"--models": "--model", "--compilers": "--compiler"},
    "blocks": {"--compilers": "--compiler"},
    "compare": {},
    "tune": {"--compilers": "--compiler", "--objectives": "--objective"},
    "loadgen": {"--models": "--model", "--compilers": "--compiler", "--scenarios": "--scenario"},
}
#: per entry point: the options that are flags, passed alone when their param is true
FLAG_OPTIONS: dict[str, set[str]] = {
    "benchmark": {"--busy-ok"},
    "blocks": {"--busy-ok"},
    "tune": {"--allow-precision"},
}
TRUE = ("1", "true", "yes", "on")


def command_line(command: str, argv: list[str]) -> list[str]:
    """The ``mlflow-ngraph`` arguments of entry point ``command`` called with ``argv``
    (option, value pairs as MLproject passes them)."""
    multi = LIST_OPTIONS.get(command, {})
    args = [command]
    for option, value in zip(argv[0::2], argv[1::2]):
        value = value.strip()
        if not value:
            continue
        if option in FLAG_OPTIONS.get(command, ()):
            if value.lower() in TRUE:
                args.append(option)
            continue
        if option in multi:
            for item in value.replace(";", " ").split():
                args += [multi[option], item]
        else:
            args += [option, value]
    return args
