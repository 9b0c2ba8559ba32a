"""Helpers of the store-writer attack tests: a store to clone per test, a harmless native
payload, and the moves of an attacker who can write the experiment (through MLflow's client,
as a store writer would)."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests._support import clone_store  # noqa: F401  (the attack tests' copies)

EXPERIMENT = "deploy"


def build_payload(directory: Path, marker: Path) -> Path:
    """A shared library whose constructor writes ``marker`` when it is loaded (built with
    the C compiler; the test is skipped without one)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the payload library")
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "payload.c"
    source.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void payload(void) {\n"
        f'  FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("ran", f); fclose(f); }}\n'
        "}\n"
    )
    library = directory / "model.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def cell_run(client, compiler: str):
    experiment = client.get_experiment_by_name(EXPERIMENT)
    (run,) = [
        r
        for r in client.search_runs([experiment.experiment_id], "tags.`ngraph.role` = 'cell'")
        if r.data.params["compiler"] == compiler
    ]
    return run


def download_engine(client, run_id: str, batch_size: int, into: Path) -> Path:
    return Path(client.download_artifacts(run_id, f"engines/bs{batch_size}", str(into)))


def rewrite_manifest(folder: Path, **changes) -> dict:
    """The manifest of ``folder`` with every listed file's size and sha256 recomputed (what
    an attacker who changed the files does), and ``changes`` applied (``None`` drops)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    for key, value in changes.items():
        if value is None:
            manifest.pop(key, None)
        else:
            manifest[key] = value
    for entry in manifest["files"]:
        path = folder / entry["path"]
        if path.is_file():
            entry["bytes"] = path.stat().st_size
            entry["sha256"] = sha256(path)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def native_engine_claiming_tvm(folder: Path, payload: Path) -> dict:
    """The attack of issue 23: an engine folder holding the payload as ``model.so``, its
    manifest claiming TVM, correct hashes, no version or host fields."""
    for child in folder.iterdir():
        if child.is_file():
            child.unlink()
    shutil.copyfile(payload, folder / "model.so")
    (folder / "params.bin").write_bytes(b"\0" * 16)
    (folder / "tvm_engine.json").write_text(json.dumps({"format": "tvm-relax-vm", "params": 0}))
    manifest = {
        "manifest_version": 1,
        "compiler": "tvm",
        "format": "tvm-relax-vm",
        "flags": {"trials": 0},
        "batch_size": 1,
        "input_shape": [1, 3, 32, 32],
        "dtype": "float32",
        "device_kind": "cpu",
        "files": [{"path": n, "bytes": 0, "sha256": ""} for n in
                  ("model.so", "params.bin", "tvm_engine.json")],
    }  # fmt: skip
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return rewrite_manifest(folder)


def half_weights(onnx_file: Path) -> None:
    """Every float weight of an ONNX model set to 0.5, in place."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(onnx_file))
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init)
        if array.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(np.full_like(array, 0.5), init.name))
    onnx.save(model, str(onnx_file))


def poison_index(client, cell, fake_run_id: str, factor: float = 100.0) -> None:
    """Re-log the parent's results index with a copy of ``cell``'s record pointing at
    ``fake_run_id``, its throughput times ``factor``."""
    parent = cell.data.tags["mlflow.parentRunId"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(client.download_artifacts(parent, "ngraph/cells.json.gz", tmp))
        with gzip.open(path, "rt") as handle:
            payload = json.load(handle)
        (genuine,) = [r for r in payload["runs"] if r["run_id"] == cell.info.run_id]
        fake = json.loads(json.dumps(genuine))
        fake["run_id"] = fake_run_id
        fake["tags"]["ngraph.cell_key"] = "attacker"
        for key in list(fake["metrics"]):
            if key.startswith("throughput"):
                fake["metrics"][key] *= factor
        payload["runs"].append(fake)
        with gzip.open(path, "wt") as handle:
            json.dump(payload, handle)
        client.log_artifact(parent, str(path), artifact_path="ngraph")
