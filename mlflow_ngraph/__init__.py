"""mlflow-ngraph: benchmark graph compilers on real devices; every result in MLflow."""

__version__ = "0.1.0"
