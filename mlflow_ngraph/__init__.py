"""mlflow-ngraph: benchmark graph compilers on real devices; every result in MLflow."""

__version__ = "0.1.0"


def load_engine(
    directory,
    check_files: bool = True,
    sha256=None,
    trust_code=None,
    trusted_keys=None,
    allow_unsigned=None,
):
    """Load a pulled engine (``mlflow-ngraph pull -o DIR``): ``predict(x)`` takes and returns
    numpy arrays, run with the runtime named in its manifest after checking its signed
    record (a producer you trust, or ``trusted_keys``, signed it; ``allow_unsigned=True``
    takes one that is not), its files and this host. ``sha256`` pins the manifest; formats
    that run code need ``trust_code=True``. See :func:`mlflow_ngraph.deploy.engine.load_engine`."""
    from mlflow_ngraph.deploy.engine import load_engine as _load

    return _load(
        directory,
        check_files=check_files,
        sha256=sha256,
        trust_code=trust_code,
        trusted_keys=trusted_keys,
        allow_unsigned=allow_unsigned,
    )


def load_registered(model_uri, trust_code=None, tracking_uri=None):
    """``mlflow.pyfunc.load_model`` of a registered engine (``models:/NAME@ALIAS``) after
    checking it against its registered version. See
    :func:`mlflow_ngraph.deploy.registered.load_registered`."""
    from mlflow_ngraph.deploy.registered import load_registered as _load

    return _load(model_uri, trust_code=trust_code, tracking_uri=tracking_uri)
