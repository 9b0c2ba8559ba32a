"""ONNX export, once per model, cached on disk by the model's content hash.

ONNX Runtime, OpenVINO, TVM and TensorRT all start from this file. The batch dimension is
dynamic, so one export serves every batch size.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from mlflow_ngraph.errors import CompileFailed
from mlflow_ngraph.scratch import put_in_place

log = logging.getLogger(__name__)

#: opset 18 is the newest that ONNX Runtime, OpenVINO, TVM's Relax frontend and TensorRT 10
#: all import; the dynamo exporter defaults to it.
OPSET = 18


def export_onnx(model, cache_dir: Path) -> Path:
    """The ONNX file for ``model`` (exported on first use, then read from the cache).

    Returns ``model.onnx_file`` for ONNX models. Tries the ``torch.export``-based exporter
    first and falls back to the TorchScript one, recording which was used next to the file.

    Raises:
        CompileFailed: neither exporter could export the model.
    """
    if model.onnx_file is not None:
        return Path(model.onnx_file)
    import torch

    target = Path(cache_dir) / "exports" / f"{model.content_hash[:32]}-{torch.__version__}"
    path = target / "model.onnx"
    if path.is_file():
        log.debug("ONNX export cache hit: %s", path)
        from mlflow_ngraph.cache import touch

        touch(target)  # its last use: a prune beside this run keeps it
        return path
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        (tmp / "new").mkdir()
        exporter = _export_to(model, tmp / "new" / "model.onnx")
        (tmp / "new" / "exporter.txt").write_text(exporter)
        # the workers of one group prepare at once: ONNX Runtime's and OpenVINO's both export
        # the model on a new home, and the second to finish finds the first's entry (renamed
        # whole, so whole): it keeps it. Checking first and renaming after lost that race
        # (OSError: directory not empty, the cell's batch size FAILED).
        put_in_place(tmp / "new", target, tmp, keep=lambda entry: (entry / "model.onnx").is_file())
    except FileNotFoundError as exc:  # the folder went while the export was written in it
        raise CompileFailed(
            f"the ONNX export's folder was removed while it was written: {exc}"
        ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not path.is_file():  # its folder went before the rename (a prune of a home no run held)
        raise CompileFailed(f"the ONNX export could not be put in place at {target}: run again")
    return path


def _export_to(model, path: Path) -> str:
    import torch

    example = torch.zeros(model.input_shape(2))
    errors = []
    try:
        batch = torch.export.Dim("batch", min=1, max=4096)
        program = torch.onnx.export(
            model.module,
            (example,),
            dynamo=True,
            input_names=[model.input_name],
            output_names=["output"],
            dynamic_shapes=({0: batch},),
            opset_version=OPSET,
            optimize=True,
            verbose=False,
        )
        program.save(str(path), external_data=False)
        return "dynamo"
    except Exception as exc:  # the dynamo exporter fails on some data-dependent models
        errors.append(f"torch.export: {str(exc).splitlines()[0] if str(exc) else exc!r}")
        log.info("dynamo ONNX export failed (%s); trying the TorchScript exporter", errors[-1])
    try:
        torch.onnx.export(
            model.module,
            (example,),
            str(path),
            dynamo=False,
            input_names=[model.input_name],
            output_names=["output"],
            dynamic_axes={model.input_name: {0: "batch"}, "output": {0: "batch"}},
            opset_version=OPSET,
        )
        return "torchscript"
    except Exception as exc:
        errors.append(f"TorchScript exporter: {str(exc).splitlines()[0] if str(exc) else exc!r}")
    raise CompileFailed("ONNX export failed: " + "; ".join(errors))
