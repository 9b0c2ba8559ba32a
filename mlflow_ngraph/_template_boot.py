"""Imported by the workers' forkserver alone, as its preload:
:func:`mlflow_ngraph.template.boot`."""

from mlflow_ngraph.template import boot

boot()
