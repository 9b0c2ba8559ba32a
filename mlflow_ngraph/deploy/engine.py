"""Load and run a pulled engine with the runtime named in its manifest.

The engine is loaded through its compiler's own ``load`` (the code path the benchmark used
on a cache hit), so a deployed engine runs exactly as it was measured. Before loading, the
host is checked: the runtime installed, its version the one that built the engine where the
format requires it (an OpenVINO blob, a TVM library, a TensorRT plan), the CPU the one it
was built on where code was generated for it (TVM; ONNX Runtime's NCHWc layouts: a warning),
a CUDA device for CUDA engines.
"""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlflow_ngraph.errors import NgraphError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def read_manifest(directory: Path) -> dict[str, Any]:
    """The engine's manifest.

    Raises:
        NgraphError: missing, too big, not JSON, or without the fields an engine needs.
    """
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise NgraphError(f"{path} does not exist: not an engine directory (pull one first)")
    from mlflow_ngraph.deploy import trust

    trust.check_manifest_size(path.stat().st_size)
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise NgraphError(f"{path} does not parse as JSON ({exc}): pull the engine again") from None
    required = ("compiler", "flags", "input_shape", "dtype", "files", "batch_size")
    missing = [k for k in required if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise NgraphError(f"{path} lacks {', '.join(missing)}: pull the engine again")
    return manifest


def verify_files(directory: Path, manifest: dict[str, Any]) -> None:
    """Every file the manifest lists is present with its size and sha256.

    Raises:
        NgraphError: naming the first file that is missing, truncated or altered.
    """
    from mlflow_ngraph.models.base import file_hash

    directory = Path(directory)
    for entry in manifest["files"]:
        path = directory / entry["path"]
        if path.is_symlink():
            raise NgraphError(f"engine file {entry['path']} is a symbolic link: refusing it")
        if not path.is_file():
            raise NgraphError(f"engine file {entry['path']} is missing")
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise NgraphError(
                f"engine file {entry['path']} has {size} bytes, the manifest says "
                f"{entry['bytes']} (truncated or altered): refusing it"
            )
        if file_hash(path) != entry["sha256"]:
            raise NgraphError(
                f"engine file {entry['path']} does not match its sha256 in the manifest "
                "(altered): refusing it"
            )


def check_host(manifest: dict[str, Any]) -> list[str]:
    """Whether this host can run the engine; returns warnings.

    Raises:
        NgraphError: the runtime is not installed (naming the extra), its version is not the
            one that built an engine that needs the same, the CPU differs for code generated
            for it, or a CUDA engine on a host without CUDA.
    """
    from mlflow_ngraph.compilers.registry import get_compiler

    name = manifest["compiler"]
    try:
        compiler = get_compiler(name)
    except NgraphError:
        raise NgraphError(
            f"the engine was built by compiler {name!r}, which this installation does not know"
        ) from None
    ok, reason = compiler.availability(manifest.get("device_kind", "cpu"))
    if not ok:
        raise NgraphError(f"cannot run a {name} engine here: {reason}")
    built, here = manifest.get("compiler_version"), compiler.version()
    if compiler.exact_version and built and here and built != here:
        raise NgraphError(
            f"the engine was built with {name} {built}, this host has {here}: a {name} engine "
            f"loads only into the version that built it (install {name}=={built}, or pull an "
            "engine built with this version)"
        )
    warns = _gpu_differs(name, compiler.gpu_rule, manifest.get("gpu") or "")
    built_cpu, here_cpu = manifest.get("host_cpu"), _host_cpu()
    policy = compiler.cpu_rule
    if policy and built_cpu and built_cpu.split("|")[0] != here_cpu.split("|")[0]:
        text = (
            f"the engine was built on CPU {built_cpu.split('|')[0]!r}, this host is "
            f"{here_cpu.split('|')[0]!r}"
        )
        missing = sorted(set(manifest.get("cpu_flags") or []) - set(_cpu_flags()))
        if policy == "refuse" and (missing or not manifest.get("cpu_flags")):
            detail = f": it needs {', '.join(missing[:8])}" if missing else ""
            raise NgraphError(
                f"{text}{detail}; {name} generated machine code for that CPU: benchmark and "
                "pull an engine built on this kind of host"
            )
        warns.append(f"{text}; it may run slower here than it was measured")
    return warns


def _gpu_differs(name: str, policy: str | None, built: str) -> list[str]:
    """Whether the GPU (``name|smXY|cuda..|cudnn..|driver..``, measure.nvml.gpu_fingerprint) the
    engine was built on is this host's: another card or capability refuses or warns as the
    compiler declares (``gpu_rule``); another CUDA, cuDNN or driver is a warning."""
    from mlflow_ngraph.measure.nvml import gpu_fingerprint

    here = gpu_fingerprint() if built and policy else ""
    if not here or built == here:
        return []
    card, here_card = built.split("|")[:2], here.split("|")[:2]
    text = f"the engine was built on GPU {'|'.join(card)!r}, this host has {'|'.join(here_card)!r}"
    if card != here_card:
        if policy == "refuse":
            raise NgraphError(
                f"{text}: a {name} engine runs only on the GPU it was built for; benchmark and "
                "pull an engine built on this kind of GPU"
            )
        return [f"{text}; it may run slower here than it was measured"]
    return [f"the engine was built with {built!r}, this host has {here!r}"]


def _host_cpu() -> str:
    import os

    from mlflow_ngraph.env import cpu_model

    return f"{cpu_model()}|{os.cpu_count()}"


def _cpu_flags() -> list[str]:
    from mlflow_ngraph.env import cpu_flags

    return cpu_flags()


@dataclass
class _ManifestModel:
    """What a compiler's ``load`` reads of a model, from the manifest and engine files."""

    name: str
    input_name: str
    sample_shape: tuple[int, ...]
    dtype: str
    onnx_file: Path | None
    params: dict
    module: Any = None

    @property
    def is_torch(self) -> bool:
        return False

    def input_shape(self, batch_size: int) -> tuple[int, ...]:
        return (batch_size, *self.sample_shape)


class DeployedEngine:
    """A pulled engine, ready to run: ``predict(x)`` takes and returns numpy arrays."""

    def __init__(self, directory: Path, manifest: dict[str, Any], engine: Any) -> None:
        self.directory = Path(directory)
        self.manifest = manifest
        self._engine = engine
        self.input_shape = tuple(manifest["input_shape"])
        self.dtype = np.dtype(manifest["dtype"])
        #: the verified signed record it was loaded with (None: not checked, or unsigned)
        self.signed: Any = None

    @property
    def compiler(self) -> str:
        return self.manifest["compiler"]

    @property
    def runtime_engine(self) -> Any:
        """The compiler's engine itself (what the harness measures: ``mlflow-ngraph gate``)."""
        return self._engine

    def check_input(self, x: Any) -> np.ndarray:
        """``x`` as the array the engine was built for.

        Raises:
            NgraphError: another shape, or a dtype that does not convert safely.
        """
        array = np.asarray(x)
        if tuple(array.shape) != self.input_shape:
            raise NgraphError(
                f"input shape {tuple(array.shape)} is not the engine's {self.input_shape} "
                f"(it was compiled for batch size {self.manifest['batch_size']})"
            )
        if array.dtype != self.dtype:
            if not np.can_cast(array.dtype, self.dtype, casting="same_kind"):
                raise NgraphError(f"input dtype {array.dtype} is not the engine's {self.dtype}")
            array = array.astype(self.dtype)
        return np.ascontiguousarray(array)

    def predict(self, x: Any) -> np.ndarray:
        return self._engine.outputs(self.check_input(x))

    def close(self) -> None:
        self._engine.close()

    def __enter__(self) -> DeployedEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def load_engine(
    directory: Path | str,
    check_files: bool = True,
    sha256: str | None = None,
    trust_code: bool | None = None,
    trusted_keys: str | Path | None = None,
    allow_unsigned: bool | None = None,
    check_signature: bool = True,
) -> DeployedEngine:
    """Load the engine in ``directory`` (as ``mlflow-ngraph pull`` writes it).

    The folder's signed record must verify against a trusted producer (the home's, or
    ``trusted_keys``) and sign its manifest, unless ``allow_unsigned`` (or
    ``MLFLOW_NGRAPH_ALLOW_UNSIGNED=1``); ``check_signature=False``: the caller verified it.

    Only what the manifest lists is read, the manifest confined to the folder
    (:func:`mlflow_ngraph.deploy.trust.check_manifest`). ``sha256`` pins the manifest's own
    hash (``pull`` prints it). An engine whose loading runs code (what its compiler declares
    of its format and flags: ``trust.runs_code``) needs ``trust_code=True`` or the setting
    ``MLFLOW_NGRAPH_TRUST_CODE=1``.

    Raises:
        NgraphError: not an engine, a manifest not confined or not the one pinned, files not
            matching the manifest, code not trusted, a host that cannot run it (see
            :func:`check_host`), or a runtime that fails to load it.
    """
    from mlflow_ngraph.deploy import trust

    directory = Path(directory)
    manifest = read_manifest(directory)
    if not manifest["files"]:
        raise NgraphError(
            f"the {manifest['compiler']} cell logged no engine files (it runs in-process "
            "only): nothing to deploy"
        )
    if sha256 is not None:
        trust.check_pin(trust.file_sha256(directory / MANIFEST), sha256, "the sha256 pinned")
    trust.check_manifest(manifest)
    signed = None
    if check_signature:
        signed = check_provenance(directory, manifest, trusted_keys, allow_unsigned)
    trust.check_code(manifest, trust_code)
    if check_files:
        verify_files(directory, manifest)
    for text in check_host(manifest):
        warnings.warn(text, stacklevel=2)
        log.warning(text)
    engine = DeployedEngine(directory, manifest, _loaded(directory, manifest))
    engine.signed = signed
    return engine


def check_provenance(
    directory: Path,
    manifest: dict[str, Any],
    trusted_keys: str | Path | None = None,
    allow_unsigned: bool | None = None,
):
    """The folder's signed record (``pull`` keeps it there), verified against the user's
    trusted producers, of this manifest; None where unsigned engines are allowed and it is
    not (said as a warning).

    Raises:
        NgraphError: no trusted producer signed this engine (and how to trust one)."""
    from mlflow_ngraph.deploy.signed import Trust
    from mlflow_ngraph.deploy.trust import file_sha256
    from mlflow_ngraph.tracking.provenance import LOCAL_RECORD, LOCAL_SIGNATURE, verify_files

    policy = Trust.of(trusted_keys and str(trusted_keys), allow_unsigned)
    try:
        signed = verify_files(
            directory / LOCAL_RECORD, directory / LOCAL_SIGNATURE, policy.keys, None, None
        )
        if signed.record.get("engine_manifest_sha256") != file_sha256(directory / MANIFEST):
            raise NgraphError(f"its manifest is not the one {signed.signer.name} signed")
        if signed.record.get("batch_size") != manifest.get("batch_size"):
            raise NgraphError(f"{signed.signer.name} signed it for another batch size")
        return signed
    except NgraphError as exc:
        if policy.allow_unsigned:
            log.info("loading an UNSIGNED engine from %s: %s", directory, exc)
            return None
        raise NgraphError(
            f"the engine in {directory} is not trusted: {exc}: {policy.advice()}"
        ) from None


def _loaded(directory: Path, manifest: dict[str, Any]):
    """The compiler's engine from the (checked) files of ``directory``.

    Raises:
        NgraphError: the runtime failed to load it, or found nothing it can load."""
    from mlflow_ngraph.compilers.base import CompileContext
    from mlflow_ngraph.compilers.registry import get_compiler
    from mlflow_ngraph.deploy import trust

    compiler = get_compiler(manifest["compiler"])
    # only what the manifest lists (and verified) is ever handed to a loader
    onnx_files = sorted(
        directory / f["path"] for f in manifest["files"] if f["path"].endswith(".onnx")
    )
    shape = tuple(manifest["input_shape"])
    model = _ManifestModel(
        name=str(manifest.get("model", "")),
        input_name=str(manifest.get("input_name") or "input"),
        sample_shape=shape[1:],
        dtype=str(manifest["dtype"]),
        onnx_file=onnx_files[0] if onnx_files else None,
        params={},
    )
    work = directory / ".work"
    ctx = CompileContext(
        workdir=work,
        device=manifest.get("device_kind", "cpu"),
        batch_size=int(manifest["batch_size"]),
        cache_dir=work,
        scenario="latency",
        math=str(manifest.get("math") or "fp32"),  # the arithmetic it was measured in
    )
    try:
        # the flags the trust check asked the compiler about (trust.check_code)
        flags = trust.loader_flags(compiler, manifest)
        engine = compiler.load(model, flags, ctx, directory)
    except NgraphError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NgraphError(f"{manifest['compiler']} could not load the engine: {first}") from None
    if engine is None:
        raise NgraphError(
            f"{manifest['compiler']} found no engine it can load in {directory} "
            f"(format {manifest.get('format')!r})"
        )
    return engine


def timed_runs(engine: DeployedEngine, x: np.ndarray, repetitions: int) -> dict[str, float]:
    """Latency of ``repetitions`` calls of ``predict`` (ms): mean, p50, p99."""
    times = []
    for _ in range(max(repetitions, 1)):
        t0 = time.perf_counter()
        engine.predict(x)
        times.append(1000 * (time.perf_counter() - t0))
    data = np.asarray(times)
    return {
        "mean_ms": float(data.mean()),
        "p50_ms": float(np.percentile(data, 50)),
        "p99_ms": float(np.percentile(data, 99)),
        "throughput": engine.input_shape[0] / (float(data.mean()) / 1000)
        if data.mean() > 0
        else math.nan,
    }
