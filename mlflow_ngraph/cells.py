"""A cell: one device x model x compiler x flags combination, measured at every batch size.

Below the runner (which plans and measures cells) and the tracking session (which writes
their runs), so that neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlflow_ngraph.compilers.base import Compiler
from mlflow_ngraph.config import ModelSpec


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
