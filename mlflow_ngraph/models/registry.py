"""Model sources: timm names, synthetic blocks, ONNX files and PyTorch factories.

``load_model(name, params)`` turns a spec into a :class:`LoadedModel`. Names resolve in this
order: a registered builder (the blocks, plus third-party ``mlflow_ngraph.models`` entry
points), a path ending in ``.onnx``, a factory ``package.module:function``, a timm model name.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.models.base import SEED, LoadedModel, file_hash, torch_content_hash

log = logging.getLogger(__name__)

#: the 15 models of the paper's Table IV, by family (timm 1.0 names; their parameter counts
#: match the table exactly).
PAPER_MODELS: dict[str, list[str]] = {
    "resnet": ["resnet18", "resnet50", "resnet101"],
    "efficientnet": ["efficientnet_b3", "efficientnet_b4", "efficientnet_b5"],
    "deit": ["deit3_small_patch16_224", "deit3_medium_patch16_224", "deit3_base_patch16_224"],
    "swin": ["swin_s3_tiny_224", "swin_s3_small_224", "swin_s3_base_224"],
    "convnext": ["convnext_tiny", "convnext_small", "convnext_base"],
}

#: named model sets usable wherever a model name is (``--model paper``).
MODEL_SETS: dict[str, list[str]] = {
    "paper": [m for models in PAPER_MODELS.values() for m in models],
    **{f"paper-{family}": models for family, models in PAPER_MODELS.items()},
}

_FAMILY_PREFIXES = ("resnet", "efficientnet", "deit", "swin", "convnext")

_BUILDERS: dict[str, tuple[Callable[..., LoadedModel], str]] = {}


def register_model(name: str, family: str) -> Callable:
    """Register ``builder(**params) -> LoadedModel`` under ``name`` (like timm's decorator)."""

    def wrap(builder: Callable[..., LoadedModel]) -> Callable[..., LoadedModel]:
        if name in _BUILDERS:
            warnings.warn(f"model {name!r} registered twice; the later one wins", stacklevel=2)
        _BUILDERS[name] = (builder, family)
        return builder

    return wrap


def family_of(name: str) -> str:
    """The architectural family of a model name (``custom`` when none matches)."""
    if name in _BUILDERS:
        return _BUILDERS[name][1]
    base = name.lower()
    if base.startswith("swin"):
        return "swin"
    for prefix in _FAMILY_PREFIXES:
        if base.startswith(prefix):
            return prefix
    return "custom"


def _int_param(params: dict[str, Any], key: str, default: int, model: str) -> int:
    value = params.pop(key, default)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise NgraphError(f"model {model!r}: {key}={value!r} is not an integer") from None
    if number < 1:
        raise NgraphError(f"model {model!r}: {key}={value!r} must be >= 1")
    return number


def _reject_leftover(model: str, params: dict[str, Any], allowed: str) -> None:
    if params:
        raise NgraphError(
            f"model {model!r} has no init param {sorted(params)[0]!r} (its params: {allowed})"
        )


def _torch_model(name: str, family: str, params: dict, module: Any, sample_shape) -> LoadedModel:
    module.eval()
    return LoadedModel(
        name=name,
        family=family,
        params=params,
        sample_shape=tuple(int(s) for s in sample_shape),
        module=module,
        parameter_count=sum(p.numel() for p in module.parameters()),
        content_hash=torch_content_hash(module),
    )


#: the init params of the built-in blocks and their defaults
BLOCK_PARAMS: dict[str, dict[str, int]] = {
    "conv_block": {"width": 64, "depth": 1, "image_size": 224},
    "mha_block": {"width": 128, "depth": 1, "heads": 8, "seq_len": 10},
}


def _block_args(kind: str, params: dict[str, Any]) -> dict[str, int]:
    """The checked init params of block ``kind`` (defaults filled in), without building it."""
    rest = dict(params)
    defaults = BLOCK_PARAMS[kind]
    args = {key: _int_param(rest, key, default, kind) for key, default in defaults.items()}
    _reject_leftover(kind, rest, ", ".join(defaults))
    if kind == "mha_block" and args["width"] % args["heads"]:
        raise NgraphError(
            f"model 'mha_block': width={args['width']} is not divisible by heads={args['heads']}"
        )
    return args


@register_model("conv_block", family="conv_block")
def conv_block(**params: Any) -> LoadedModel:
    from mlflow_ngraph.models.blocks import ConvBlockStack

    args = _block_args("conv_block", params)
    module = _seeded(lambda: ConvBlockStack(width=args["width"], depth=args["depth"]))
    size = args["image_size"]
    return _torch_model("conv_block", "conv_block", dict(params), module, (3, size, size))


@register_model("mha_block", family="mha_block")
def mha_block(**params: Any) -> LoadedModel:
    from mlflow_ngraph.models.blocks import MHABlockStack

    args = _block_args("mha_block", params)
    module = _seeded(
        lambda: MHABlockStack(width=args["width"], depth=args["depth"], heads=args["heads"])
    )
    return _torch_model(
        "mha_block", "mha_block", dict(params), module, (args["seq_len"], args["width"])
    )


#: the built-in blocks, whose params validate_model_spec checks without building them:
#: building even a small block imports torch (seconds on a resume that builds nothing)
_BUILTIN_BLOCKS = {"conv_block": conv_block, "mha_block": mha_block}


def _seeded(build: Callable[[], Any]) -> Any:
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return build()


def _timm_model(name: str, params: dict[str, Any]) -> LoadedModel:
    import timm

    if not timm.is_model(name):
        raise NgraphError(_unknown_model(name))
    kwargs = {k: v for k, v in params.items() if v is not None}
    kwargs.pop("pretrained", None)  # never download weights
    try:
        module = _seeded(lambda: timm.create_model(name, pretrained=False, **kwargs))
    except TypeError as exc:
        raise NgraphError(f"model {name!r}: bad init params {kwargs}: {exc}") from None
    config = getattr(module, "pretrained_cfg", None) or getattr(module, "default_cfg", {})
    sample_shape = tuple(config.get("input_size", (3, 224, 224)))
    if "img_size" in kwargs:
        size = int(kwargs["img_size"])
        sample_shape = (sample_shape[0], size, size)
    return _torch_model(name, family_of(name), params, module, sample_shape)


def _parse_shape(text: Any, model: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(p) for p in str(text).replace(",", "x").split("x") if p)
    except ValueError:
        raise NgraphError(f"model {model!r}: input_shape={text!r} is not like 3x224x224") from None
    if not shape or min(shape) < 1:
        raise NgraphError(f"model {model!r}: input_shape={text!r} is not like 3x224x224")
    return shape


def _factory_model(path: str, params: dict[str, Any]) -> LoadedModel:
    module_name, _, function_name = path.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), function_name)
    except ImportError as exc:
        raise NgraphError(f"model factory {path!r} does not import: {exc}") from None
    except AttributeError:
        raise NgraphError(
            f"model factory {path!r}: {module_name} has no {function_name!r}"
        ) from None
    kwargs = dict(params)
    shape = _parse_shape(kwargs.pop("input_shape", "3x224x224"), path)
    try:
        module = _seeded(lambda: factory(**kwargs))
    except TypeError as exc:
        raise NgraphError(f"model factory {path!r} rejected its params {kwargs}: {exc}") from None
    if not hasattr(module, "state_dict"):
        raise NgraphError(f"model factory {path!r} did not return a torch.nn.Module")
    return _torch_model(path, "custom", params, module, shape)


def _onnx_model(path_text: str, params: dict[str, Any]) -> LoadedModel:
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise NgraphError(f"ONNX file {path_text!r} does not exist")
    try:
        import onnx

        proto = onnx.load(str(path), load_external_data=False)
        data_files = _external_data_files(proto, path)
        # the path form: external data is found next to the file, wherever the command runs
        onnx.checker.check_model(str(path))
    except ImportError:
        raise NgraphError("ONNX models need the 'onnx' package: pip install onnx") from None
    except Exception as exc:  # onnx raises several unrelated types for a corrupt file
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NgraphError(
            f"ONNX file {path_text!r} is not a valid ONNX model: {first_line}"
        ) from None
    graph_input = proto.graph.input[0]
    dims = [d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    sample = tuple(dims[1:])
    if "input_shape" in params:
        sample = _parse_shape(params["input_shape"], path_text)
    if not sample or min(sample) < 1:
        raise NgraphError(
            f"ONNX file {path_text!r} has a dynamic input shape {dims}: give "
            "input_shape=CxHxW (without the batch) as a model param"
        )
    count = sum(int(_numel(t.dims)) for t in proto.graph.initializer)
    return LoadedModel(
        name=path.name,
        family=params.get("family", "custom"),
        params=params,
        sample_shape=sample,
        onnx_file=path.resolve(),
        parameter_count=count,
        content_hash=_onnx_hash(path, data_files),
        input_name=graph_input.name,
    )


def _external_data_files(proto: Any, path: Path) -> list[Path]:
    """The files holding the weights of an ONNX model saved with external data (what
    ``torch.onnx.export(..., dynamo=True)`` writes for any real model), which ONNX resolves
    relative to the model file. A missing one is one clear error naming it."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    files: dict[str, Path] = {}
    for tensor in proto.graph.initializer:
        if uses_external_data(tensor):
            location = ExternalDataInfo(tensor).location
            files.setdefault(location, path.parent / location)
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise NgraphError(
            f"ONNX file {str(path)!r} keeps its weights in {missing[0]!r}, which does not "
            "exist: keep the external data file next to the .onnx file"
        )
    return [files[k] for k in sorted(files)]


def _onnx_hash(path: Path, data_files: list[Path]) -> str:
    """sha256 of the model file and its external data: a changed weights file is a new
    model to every cache."""
    if not data_files:
        return file_hash(path)
    import hashlib

    digest = hashlib.sha256(file_hash(path).encode())
    for data in data_files:
        digest.update(f"{data.name}:{file_hash(data)}".encode())
    return digest.hexdigest()


def _numel(dims) -> int:
    total = 1
    for d in dims:
        total *= d
    return total


_entry_points_loaded = False


def _load_entry_points() -> None:
    """Register the ``mlflow_ngraph.models`` plug-ins, once per process (scanning every
    installed distribution's entry points takes ~10 ms)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for entry in importlib.metadata.entry_points(group="mlflow_ngraph.models"):
        if entry.name in _BUILDERS:
            continue
        try:
            builder = entry.load()
        except Exception as exc:  # a broken plug-in must not break the CLI
            log.warning("model plug-in %s failed to load: %s", entry.name, exc)
            continue
        _BUILDERS[entry.name] = (builder, getattr(builder, "family", "custom"))


def load_model(name: str, params: dict[str, Any] | None = None) -> LoadedModel:
    """Build the model ``name`` with init ``params``.

    Raises:
        NgraphError: the name resolves to nothing, a param is invalid, a file is missing or
            corrupt, or a factory does not import.
    """
    params = dict(params or {})
    _load_entry_points()
    if name in _BUILDERS:
        return _BUILDERS[name][0](**params)
    if name.lower().endswith(".onnx"):
        return _onnx_model(name, params)
    if ":" in name:
        return _factory_model(name, params)
    return _timm_model(name, params)


def registered_models() -> dict[str, str]:
    """Name -> family of the blocks and the paper's models."""
    _load_entry_points()
    names = {name: family for name, (_, family) in _BUILDERS.items()}
    for family, models in PAPER_MODELS.items():
        names.update({m: family for m in models})
    return names


def expand_model_set(name: str) -> list[str] | None:
    return MODEL_SETS.get(name)


def validate_model_spec(
    name: str, params: dict[str, Any] | None = None, cache_dir: Path | None = None
) -> None:
    """Check that ``name`` resolves, without building large models.

    The built-in blocks have their params checked without being built (that needs torch);
    ONNX files and plug-in models are cheap and built in full; a factory must import; a
    timm name must be registered in timm (checked against the list of timm's names cached
    under ``cache_dir`` when there is one, see :func:`is_timm_model`).

    Raises:
        NgraphError: what is wrong and how to fix it.
    """
    params = dict(params or {})
    _load_entry_points()
    if name in _BUILTIN_BLOCKS and _BUILDERS[name][0] is _BUILTIN_BLOCKS[name]:
        _block_args(name, params)  # a built-in block (not replaced by a plug-in)
    elif name in _BUILDERS or name.lower().endswith(".onnx"):
        load_model(name, params)
    elif ":" in name:
        module_name, _, function_name = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise NgraphError(f"model factory {name!r} does not import: {exc}") from None
        if not callable(getattr(module, function_name, None)):
            raise NgraphError(f"model factory {name!r}: {module_name} has no {function_name!r}")
    elif not is_timm_model(name, cache_dir):
        raise NgraphError(_unknown_model(name))


def _unknown_model(name: str) -> str:
    return (
        f"unknown model {name!r}: not a block, an .onnx file, a 'package.module:function' "
        "factory or a timm model name (see `mlflow-ngraph models`)"
    )


#: where the list of timm's model names is cached, under the home directory
TIMM_NAMES_DIR = "timm-models"


def _timm_names_file(cache_dir: Path | None) -> Path | None:
    """``<home>/timm-models/timm-<version>.txt``, or ``None`` without a home or timm."""
    if cache_dir is None:
        return None
    try:
        version = importlib.metadata.version("timm")
    except importlib.metadata.PackageNotFoundError:
        return None
    return Path(cache_dir) / TIMM_NAMES_DIR / f"timm-{version}.txt"


def is_timm_model(name: str, cache_dir: Path | None = None) -> bool:
    """Whether timm registers the architecture ``name`` (a pretrained tag is ignored), as
    ``timm.is_model``, without importing timm when it can be helped.

    Importing timm takes seconds (it pulls in torchvision and ``torch._dynamo``), so with a
    ``cache_dir`` the names timm registers are kept in a file keyed by timm's version: a
    name found there is a timm model without importing it. A name not found there (or no
    file yet) is checked by timm itself, which also (re)writes the file.
    """
    path = _timm_names_file(cache_dir)
    arch = name.split(".", 1)[0]
    if path is not None:
        try:
            if arch in path.read_text().split():
                return True
        except OSError:
            pass  # no list yet: timm decides, and the list is written below
    import timm

    known = timm.is_model(name)
    if path is not None:
        _write_names(path, timm.list_models())
    return known


def _write_names(path: Path, names: list[str]) -> None:
    """Write the name list atomically (a concurrent reader sees the old file or the new)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=path.parent, prefix=path.name, suffix=".tmp", delete=False
        ) as handle:
            handle.write("\n".join(names) + "\n")
        os.replace(handle.name, path)
    except OSError as exc:  # a read-only home only costs the import next time
        log.debug("could not cache timm's model names in %s: %s", path, exc)
