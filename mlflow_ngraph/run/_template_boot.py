"""Imported by the workers' forkserver alone, as its preload:
:func:`mlflow_ngraph.run.template.boot`."""

from mlflow_ngraph.run.template import boot

boot()
