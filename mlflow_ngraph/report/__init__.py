"""Compare benchmark runs across devices and experiments: tables, figures, reports."""

from mlflow_ngraph.report.commands import compare

__all__ = ["compare"]
