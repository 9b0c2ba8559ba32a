"""A cell: one device x model x compiler x flags combination, measured at every batch size.

Below the runner (which plans and measures cells) and the tracking session (which writes
their runs), so that neither imports the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mlflow_ngraph.compilers.base import Compiler
from mlflow_ngraph.plan.config import ModelSpec


@dataclass
class Cell:
    """One device x model x compiler x flags combination, measured at every batch size."""

    model: ModelSpec
    compiler: Compiler
    flags: dict[str, Any]
    key: str
    #: the short name of its MLflow run (model, compiler, the flags that tell it apart)
    run_name: str = ""
    #: the cell key of identity on this device and model: the baseline of its speedup
    baseline: str = ""

    @property
    def name(self) -> str:
        """Every resolved flag: unique, for the records that key on it."""
        flags = ",".join(f"{k}={v}" for k, v in sorted(self.flags.items()) if v is not None)
        return f"{self.model.label}/{self.compiler.name}" + (f"[{flags}]" if flags else "")

    @property
    def title(self) -> str:
        """What a person reads in a log line: the run name (only the flags that tell the
        cell apart), the full name where there is none."""
        return self.run_name or self.name


def differing_flags(flag_sets: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, set[str]]:
    """Per compiler, the names of the flags whose values differ between its settings in one
    run (``openvino`` under two ``PERFORMANCE_HINT`` values -> ``{"openvino":
    {"PERFORMANCE_HINT"}}``); a compiler run under one setting has none."""
    seen: dict[str, list[dict[str, Any]]] = {}
    for compiler, flags in flag_sets:
        settings = seen.setdefault(compiler, [])
        if flags not in settings:
            settings.append(flags)
    out: dict[str, set[str]] = {}
    for compiler, settings in seen.items():
        names = {k for flags in settings for k in flags}
        out[compiler] = {k for k in names if len({repr(flags.get(k)) for flags in settings}) > 1}
    return out


def compiler_label(compiler: str, flags: dict[str, Any], differing: Iterable[str]) -> str:
    """``openvino[PERFORMANCE_HINT=LATENCY]``: the compiler and the flags that tell it apart
    from its other settings in the same run (all flags stay in the run's params)."""
    shown = [f"{k}={flags.get(k)}" for k in sorted(differing)]
    return compiler + (f"[{','.join(shown)}]" if shown else "")


def cell_run_name(model_label: str, compiler: str, flags: dict[str, Any], differing) -> str:
    """A cell run's short, readable name: ``resnet18 openvino`` or ``conv_block w64 d3
    onnxruntime[...]``. Block and factory parameters are shortened (``width=64`` -> ``w64``);
    the full identity is in the run's params."""
    name, _, params = model_label.partition(":")
    short = [_short_param(p) for p in params.split(",") if p] if params else []
    return " ".join([name.rsplit(".", 1)[-1], *short, compiler_label(compiler, flags, differing)])


def _short_param(item: str) -> str:
    key, _, value = item.partition("=")
    abbreviations = {"width": "w", "depth": "d", "seq_len": "s", "heads": "h"}
    return f"{abbreviations[key]}{value}" if key in abbreviations else item
