"""The MLmodel of a registered engine holds exactly the keys ``register`` writes, each with
the value it writes or the registry records (unit level: parsed MLmodels, no store; the
tampered models of a real store are in test_trust.py)."""

from __future__ import annotations

import copy
import json

import pytest

from mlflow_ngraph.deploy.mlmodel import (
    Recorded,
    check_mlmodel,
    check_signature,
    mlmodel_digest,
)
from mlflow_ngraph.errors import NgraphError

HASH = "bd8964dcee7db1faf244ac394ef35f44db2746065f1bd8a1456d2e20bba23777"
MODEL = "m-84adcb0808e54423bac8b0ecc418c8f2"
WHERE = f"mlflow-artifacts:/1/models/{MODEL}/artifacts"
INPUTS = '[{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [1, 3, 32, 32]}}]'
OUTPUTS = '[{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [1, 8, 32, 32]}}]'
#: the MLmodel `mlflow-ngraph register` wrote with MLflow 3, parsed
WRITTEN = {
    "artifact_path": WHERE,
    "flavors": {
        "python_function": {
            "code": None,
            "config": {"manifest_sha256": HASH},
            "data": "data/engine",
            "env": {"conda": "conda.yaml", "virtualenv": "python_env.yaml"},
            "loader_module": "mlflow_ngraph.deploy.pyfunc_model",
            "python_version": "3.11.7",
            "streamable": False,
        }
    },
    "is_signature_from_type_hint": False,
    "mlflow_version": "3.17.2",
    "model_id": MODEL,
    "model_size_bytes": 171137,
    "model_uuid": MODEL,
    "prompts": None,
    "saved_input_example_info": {
        "artifact_path": "input_example.json",
        "serving_input_path": "serving_input_example.json",
        "type": "ndarray",
    },
    "signature": {"inputs": INPUTS, "outputs": OUTPUTS, "params": None},
    "type_hint_from_example": False,
    "utc_time_created": "2026-11-26 16:04:09.458715",
}
RECORDED = Recorded(HASH, MODEL, WHERE, run_id=None)


def changed(path: str, value) -> dict:
    """``WRITTEN`` with the key at dotted ``path`` set to ``value``."""
    conf = copy.deepcopy(WRITTEN)
    *parents, last = path.split(".")
    place = conf
    for key in parents:
        place = place[key]
    place[last] = value
    return conf


def test_the_mlmodel_register_writes_is_accepted():
    assert check_mlmodel(copy.deepcopy(WRITTEN), RECORDED, "m") == "data/engine"
    pinned = Recorded(HASH, MODEL, WHERE + "/", mlmodel_sha256=mlmodel_digest(WRITTEN))
    assert check_mlmodel(copy.deepcopy(WRITTEN), pinned, "m") == "data/engine"


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        # a key register never writes, at the top and under the flavor
        ("flavors.python_function.predict_fn", "__init__", "asks MLflow to run"),
        ("metadata", {"x": 1}, "holds 'metadata', which mlflow-ngraph register never writes"),
        ("env_vars", ["PATH"], "holds 'env_vars'"),
        ("flavors.python_function.model_code_path", "x.py", "holds 'flavors.python_function.mo"),
        ("signature.extra", 1, "holds 'signature.extra'"),
        ("run_id", "r1", "run_id is 'r1', not absent"),
        # a key register writes, another value
        ("flavors.python_function.streamable", True, "streamable is True, not False"),
        ("flavors.python_function.env", {"conda": "evil.yaml"}, "env.conda is 'evil.yaml'"),
        ("flavors.python_function.env", "conda.yaml", "env is 'conda.yaml'"),
        ("flavors.python_function.config", {"manifest_sha256": HASH, "x": 1}, "config.x"),
        ("model_uuid", "m-other", f"model_uuid is 'm-other', not '{MODEL}'"),
        ("model_id", "m-other", "model_id is 'm-other'"),
        ("artifact_path", "s3://elsewhere/m", "artifact_path is 's3://elsewhere/m'"),
        ("prompts", ["prompts:/p/1"], "prompts is ['prompts:/p/1'], not None"),
        ("is_signature_from_type_hint", 0, "is_signature_from_type_hint is 0, not False"),
        ("saved_input_example_info.type", "dataframe", "type is 'dataframe'"),
        ("signature.params", "[]", "signature.params is '[]', not None"),
        ("signature.outputs", "[{}]", "outputs is '[{}]', not tensor specs"),
        ("utc_time_created", "yesterday", "utc_time_created is 'yesterday', not a time"),
        ("mlflow_version", "3; rm -rf", "mlflow_version is '3; rm -rf', not a version"),
        ("model_size_bytes", -1, "model_size_bytes is -1, not a size"),
        ("flavors.python_function.data", "data/../..", "names data"),
    ],
)
def test_any_other_key_or_value_is_refused_in_one_line(path, value, said):
    with pytest.raises(NgraphError) as refused:
        check_mlmodel(changed(path, value), RECORDED, "tiny-ort version 1")
    line = str(refused.value)
    assert said in line and "\n" not in line and line.startswith("tiny-ort version 1: ")
    assert "refusing it" in line


def test_the_values_recorded_at_registration_pin_the_rest():
    """A value only known when the model was logged (its time, MLflow's version) may be
    any of its kind for a version registered before the MLmodel was pinned; since, it must
    be the one registered."""
    later = changed("utc_time_created", "2026-11-27 10:00:00.000001")
    check_mlmodel(copy.deepcopy(later), RECORDED, "m")
    pinned = Recorded(HASH, MODEL, WHERE, mlmodel_sha256=mlmodel_digest(WRITTEN))
    with pytest.raises(NgraphError, match="MLmodel is not the one registered"):
        check_mlmodel(later, pinned, "m")
    ran_in = Recorded(HASH, MODEL, WHERE, run_id="r1")  # a model logged inside its run
    check_mlmodel(changed("run_id", "r1"), ran_in, "m")
    with pytest.raises(NgraphError, match="run_id is 'r2', not 'r1'"):
        check_mlmodel(changed("run_id", "r2"), ran_in, "m")


def test_the_input_signature_is_the_engines_input():
    manifest = {"dtype": "float32", "input_shape": [1, 3, 32, 32]}
    check_signature(WRITTEN, manifest, "m")
    other = json.loads(INPUTS)
    other[0]["tensor-spec"]["dtype"] = "float64"
    with pytest.raises(NgraphError, match="input signature .* is not its engine's input"):
        check_signature(changed("signature.inputs", json.dumps(other)), manifest, "m")
