"""The MLflow model of a deployed engine (models from code: MLflow logs this file, never a
pickled object). ``mlflow.pyfunc.load_model`` runs it with the engine files that were logged
as the model's ``engine`` artifact; ``predict`` takes the engine's input array and returns
its outputs. It loads the engine with :func:`mlflow_ngraph.deploy.engine.load_engine`, which
checks every file against the manifest and this host against the engine first."""

from __future__ import annotations

import warnings

import mlflow
import numpy as np
from mlflow.pyfunc import PythonModel

# the engine's signature (a tensor of the shape it was compiled for) validates the input;
# MLflow's type-hint validation does not cover numpy tensors
warnings.filterwarnings("ignore", message=".*Add type hints to the `predict` method.*")


class EngineModel(PythonModel):
    def load_context(self, context) -> None:
        from mlflow_ngraph.deploy.engine import load_engine

        self.engine = load_engine(context.artifacts["engine"])

    def predict(self, context, model_input, params=None):
        if hasattr(model_input, "to_numpy"):  # a DataFrame from a JSON request
            model_input = model_input.to_numpy()
        return self.engine.predict(np.asarray(model_input))


mlflow.models.set_model(EngineModel())
