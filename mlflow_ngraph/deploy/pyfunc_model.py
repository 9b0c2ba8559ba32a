"""The loader of a registered engine: MLflow's ``loader_module`` of the logged model.

The logged model holds data only: the engine files (its ``data`` folder) and, in its
``MLmodel``, the sha256 of the engine's manifest (``model_config``). What runs on
``mlflow.pyfunc.load_model`` or ``mlflow models serve`` is this module, as installed with
``mlflow-ngraph``, never code from the store: :func:`_load_pyfunc` checks the manifest
against the recorded hash, then loads the engine with
:func:`mlflow_ngraph.deploy.engine.load_engine` (every file against the manifest, the host
against the engine; a format that runs code needs ``MLFLOW_NGRAPH_TRUST_CODE=1``).

Loading through MLflow trusts the ``MLmodel`` file it reads from the store: whoever can
write the experiment's artifacts can point it at other code. ``mlflow-ngraph serve`` and
:func:`mlflow_ngraph.deploy.registered.load_registered` check it against the registered
version first (docs/security.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlflow_ngraph.errors import NgraphError

#: MLflow's ``loader_module`` of a registered engine: this module
LOADER_MODULE = "mlflow_ngraph.deploy.pyfunc_model"

CONFIG_KEY = "manifest_sha256"


class EngineModel:
    """What MLflow's pyfunc wrapper calls: ``predict`` takes the engine's input array (or a
    DataFrame of a JSON request) and returns its outputs."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> np.ndarray:
        if hasattr(model_input, "to_numpy"):  # a DataFrame from a JSON request
            model_input = model_input.to_numpy()
        return self.engine.predict(np.asarray(model_input))


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> EngineModel:
    """MLflow's entry point: the engine in ``data_path``, its manifest pinned to the sha256
    of ``model_config``.

    Raises:
        NgraphError: no hash recorded, or any refusal of ``load_engine``.
    """
    from mlflow_ngraph.deploy.engine import load_engine

    expected = (model_config or {}).get(CONFIG_KEY)
    if not expected:
        raise NgraphError(
            "this model records no sha256 of its engine's manifest: register the engine again "
            "with mlflow-ngraph register"
        )
    return EngineModel(load_engine(data_path, sha256=str(expected)))
