"""mlflow-ngraph: benchmark graph compilers on real devices; every result in MLflow."""

__version__ = "0.1.0"


def load_engine(directory, check_files: bool = True):
    """Load a pulled engine (``mlflow-ngraph pull -o DIR``): ``predict(x)`` takes and returns
    numpy arrays, run with the runtime named in its manifest after checking its files and
    this host. See :func:`mlflow_ngraph.deploy.engine.load_engine`."""
    from mlflow_ngraph.deploy.engine import load_engine as _load

    return _load(directory, check_files=check_files)
