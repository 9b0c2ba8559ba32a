"""The ``mlflow-ngraph`` commands: thin click commands over the stages (plan, run, report,
deploy, tune, cluster); ``cli`` holds the group and the benchmark commands."""
