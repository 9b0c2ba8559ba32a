"""The ``MLmodel`` of a registered engine model, checked key by key before MLflow reads it.

``mlflow-ngraph register`` logs an engine model whose ``MLmodel`` holds a known set of
keys, each with a known value: the value the tool writes (the installed loader module, no
code, the manifest's hash, the environment files' names...), or a value only known when it
was logged that the registry records too (the logged model's id and location, the source
run) or that the registered version pins (tag ``mlmodel_sha256``: the hash of the whole
``MLmodel`` as registered). A writer of the experiment can rewrite the file; any key the tool
does not write (``predict_fn``, ``metadata``, ``env_vars``...) or any other value is refused
in one line, before MLflow reads the file.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

from mlflow_ngraph.errors import NgraphError

#: version tag: the sha256 of the registered model's ``MLmodel`` (:func:`mlmodel_digest`)
T_MLMODEL = "mlmodel_sha256"

_CHANGED = "it was changed after registration: refusing it"
_VERSION = re.compile(r"\d+(\.\d+)+([.+-]?[0-9A-Za-z]+)*")


@dataclass(frozen=True)
class Recorded:
    """What the registry holds of a registered engine model (never the experiment's
    artifacts, which its writers can change)."""

    manifest_sha256: str  #: the version's tag
    model_id: str  #: the logged model the version is of
    artifact_location: str  #: where the registry says the logged model's files are
    run_id: str | None = None  #: the version's source run
    mlmodel_sha256: str | None = None  #: the version's tag (None: registered before it)


@dataclass(frozen=True)
class Check:
    """A value only known when the model was logged: ``what`` it must be, ``test`` says."""

    what: str
    test: Callable[[Any], bool]


def _is_time(value: Any) -> bool:
    for layout in ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S"):
        try:
            datetime.strptime(str(value), layout)
            return isinstance(value, str)
        except ValueError:
            continue
    return False


def _tensor_spec(spec: Any) -> bool:
    if not isinstance(spec, dict) or set(spec) - {"type", "tensor-spec", "name"}:
        return False
    tensor = spec.get("tensor-spec")
    return (
        spec.get("type") == "tensor"
        and isinstance(spec.get("name", ""), str)
        and isinstance(tensor, dict)
        and set(tensor) == {"dtype", "shape"}
        and isinstance(tensor["dtype"], str)
        and re.fullmatch(r"[a-z]+[0-9]*", tensor["dtype"]) is not None
        and isinstance(tensor["shape"], list)
        and all(type(d) is int and d >= -1 for d in tensor["shape"])
    )


def _tensor_specs(text: Any) -> bool:
    try:
        specs = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return False
    return isinstance(specs, list) and bool(specs) and all(map(_tensor_spec, specs))


def _place(location: Any) -> str:
    return str(location).removeprefix("file://").rstrip("/")


def _data_folder(data: Any) -> bool:
    parts = PurePosixPath(str(data)).parts if isinstance(data, str) else ()
    return (
        len(parts) == 2 and parts[0] == "data" and parts[1] not in ("..", ".") and "\\" not in data
    )


def expected(record: Recorded) -> dict[str, Any]:
    """Every key ``register`` writes in an engine model's ``MLmodel``, with its value: the
    value itself, a mapping of the keys under it, or a :class:`Check` of a value known only
    when the model was logged."""
    from mlflow_ngraph.deploy.pyfunc_model import CONFIG_KEY, LOADER_MODULE

    version = Check("a version", lambda v: isinstance(v, str) and bool(_VERSION.fullmatch(v)))
    where = _place(record.artifact_location)
    return {
        "artifact_path": Check(f"the registry's location {where}", lambda v: _place(v) == where),
        "flavors": {
            "python_function": {
                "code": None,
                "config": {CONFIG_KEY: record.manifest_sha256},
                "data": Check("data/<engine folder>", _data_folder),
                "env": {"conda": "conda.yaml", "virtualenv": "python_env.yaml"},
                "loader_module": LOADER_MODULE,
                "python_version": version,
                "streamable": False,
            }
        },
        "is_signature_from_type_hint": False,
        "mlflow_version": version,
        "model_id": record.model_id,
        "model_size_bytes": Check("a size", lambda v: type(v) is int and v >= 0),
        "model_uuid": record.model_id,
        "prompts": None,
        # a model logged inside its run (MLflow 2) names it: the version's source run
        "run_id": record.run_id or Check("absent", lambda v: False),
        "saved_input_example_info": {
            "artifact_path": "input_example.json",
            "serving_input_path": "serving_input_example.json",
            "type": "ndarray",
        },
        "signature": {
            "inputs": Check("tensor specs", _tensor_specs),
            "outputs": Check("tensor specs", _tensor_specs),
            "params": None,
        },
        "type_hint_from_example": False,
        "utc_time_created": Check("a time", _is_time),
    }


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _walk(conf: Any, spec: dict[str, Any], path: str, label: str) -> None:
    """Every key of ``conf`` is one of ``spec``'s, with the value ``spec`` says."""
    if not isinstance(conf, dict):
        raise NgraphError(f"{label}: its MLmodel's {path or 'top'} is {_shown(conf)}: {_CHANGED}")
    for key, value in conf.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in spec:
            raise NgraphError(
                f"{label}: its MLmodel holds {where!r}, which mlflow-ngraph register never "
                f"writes: {_CHANGED}"
            )
        want = spec[key]
        if isinstance(want, dict):
            _walk(value, want, where, label)
        elif isinstance(want, Check):
            if not want.test(value):
                raise NgraphError(
                    f"{label}: its MLmodel's {where} is {_shown(value)}, not {want.what}: "
                    f"{_CHANGED}"
                )
        elif type(value) is not type(want) or value != want:
            raise NgraphError(
                f"{label}: its MLmodel's {where} is {_shown(value)}, not {_shown(want)}: {_CHANGED}"
            )


def _loader(conf: Any, label: str) -> dict[str, Any]:
    """The ``python_function`` flavor, after checking that it is the only one and that it
    asks for the installed loader and no code."""
    from mlflow_ngraph.deploy.pyfunc_model import LOADER_MODULE

    flavors = conf.get("flavors") if isinstance(conf, dict) else None
    if not isinstance(flavors, dict) or set(flavors) != {"python_function"}:
        raise NgraphError(
            f"{label}: its MLmodel has flavors {sorted(flavors or {})}, not the engine "
            f"loader's only: {_CHANGED}"
        )
    pf = flavors["python_function"]
    if not isinstance(pf, dict):
        raise NgraphError(f"{label}: its MLmodel's python_function is {_shown(pf)}: {_CHANGED}")
    runs = ("loader_module", "code", "python_model", "cloudpickle_version", "predict_fn")
    asked = {k: pf.get(k) for k in runs}
    if asked["loader_module"] != LOADER_MODULE or any(asked[k] for k in runs[1:]):
        wanted = {k: v for k, v in asked.items() if v and v != LOADER_MODULE}
        raise NgraphError(
            f"{label}: its MLmodel asks MLflow to run {wanted}, not the installed "
            f"{LOADER_MODULE}: {_CHANGED}"
        )
    return pf


def check_mlmodel(conf: Any, record: Recorded, label: str) -> str:
    """The data folder of a logged engine model, after checking its ``MLmodel`` (parsed)
    holds exactly the keys ``register`` writes, each with its value (:func:`expected`), and,
    where the version pins it, is the ``MLmodel`` registered.

    Raises:
        NgraphError: naming the first key or value the tool does not write.
    """
    from mlflow_ngraph.deploy.pyfunc_model import CONFIG_KEY

    pf = _loader(conf, label)
    if (pf.get("config") or {}).get(CONFIG_KEY) != record.manifest_sha256:  # model_config
        raise NgraphError(
            f"{label}: its MLmodel's engine hash is not the registered version's "
            f"manifest_sha256: {_CHANGED}"
        )
    if not _data_folder(pf.get("data")):
        raise NgraphError(f"{label}: its MLmodel names data {pf.get('data')!r}: refusing it")
    _walk(conf, expected(record), "", label)
    if record.mlmodel_sha256 and mlmodel_digest(conf) != record.mlmodel_sha256:
        raise NgraphError(
            f"{label}: its MLmodel is not the one registered (the version's {T_MLMODEL}): "
            f"{_CHANGED}"
        )
    return str(pf["data"])


def check_signature(conf: dict[str, Any], manifest: dict[str, Any], label: str) -> None:
    """The ``MLmodel``'s input signature (what the scoring server converts a request to) is
    the engine's input: its manifest's shape and dtype.

    Raises:
        NgraphError: another input signature."""
    import numpy as np

    spec = {"dtype": str(np.dtype(manifest["dtype"])), "shape": list(manifest["input_shape"])}
    inputs = (conf.get("signature") or {}).get("inputs")
    if inputs is not None and json.loads(inputs) != [{"type": "tensor", "tensor-spec": spec}]:
        raise NgraphError(
            f"{label}: its MLmodel's input signature {_shown(inputs)} is not its engine's "
            f"input {spec}: {_CHANGED}"
        )


def mlmodel_digest(conf: Any) -> str:
    """The sha256 of an ``MLmodel`` (parsed): of its keys and values, not of its layout."""
    text = json.dumps(conf, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()
