"""Compare benchmark runs across devices and experiments: tables, figures, reports (the
``compare`` command is :func:`mlflow_ngraph.commands.report.compare`)."""
