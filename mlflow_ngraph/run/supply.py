"""The engine supply: an engine for (compiler, flags, model, batch size), from the local
cache when a verified copy exists, else compiled and stored there with its manifest.

It knows no compiler by name: the compiler object says whether it starts from the ONNX
export (``uses_onnx``) and whether it can reload its engines (``load``).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow_ngraph.compilers.base import CompileContext, Compiler, Engine
from mlflow_ngraph.console import DETAIL
from mlflow_ngraph.env import host_fingerprint
from mlflow_ngraph.models.base import LoadedModel
from mlflow_ngraph.redaction import first_line
from mlflow_ngraph.tracking.engines import EngineCache, cache_key, write_manifest

log = logging.getLogger(__name__)


@dataclass
class Supplied:
    """An engine and how it was obtained."""

    engine: Engine
    compile_s: float  # seconds spent getting it (a cache load on a hit)
    cache_hit: bool
    engine_dir: Path | None  # its directory with ``manifest.json``


class EngineSupply:
    """Engines of one device profile and scenario, cached under ``home``."""

    def __init__(
        self, home: Path, device: str, device_kind: str, scenario: str, math: str = "fp32"
    ) -> None:
        self.home = Path(home)
        self.device = device
        self.device_kind = device_kind
        self.scenario = scenario
        self.math = math
        self.cache = EngineCache(self.home)

    def context(self, batch_size: int, math: str | None = None) -> CompileContext:
        ctx = CompileContext(
            workdir=self.home / "work",
            device=self.device_kind,
            batch_size=batch_size,
            cache_dir=self.home,
            scenario=self.scenario,
            math=math or self.math,
        )
        ctx.workdir.mkdir(parents=True, exist_ok=True)
        return ctx

    def get(
        self, compiler: Compiler, flags: dict[str, Any], model: LoadedModel, b: int, name: str
    ) -> Supplied:
        """The engine for batch size ``b``: cache hit, else compiled (and stored)."""
        key = self.key(compiler, flags, model, b)
        ctx = self.context(b)
        cached = self.cache.lookup(key)
        if compiler.uses_onnx and model.is_torch and cached is None:
            from mlflow_ngraph.compilers._export import export_onnx

            export_onnx(model, self.home)  # cached: the compile clock below excludes it
        t0 = time.perf_counter()
        if cached is not None:
            engine = self._load(compiler, flags, model, ctx, cached, name, b)
            if engine is not None:
                log.log(DETAIL, "%s bs%d: engine cache hit (%s), compilation skipped", name, b, key)
                return Supplied(engine, time.perf_counter() - t0, True, cached)
            t0 = time.perf_counter()  # the failed load is not the compile's time
        log.log(DETAIL, "%s bs%d: compiling", name, b)
        with self._build_lock():
            engine = compiler.compile(model, flags, ctx)
        compile_s = time.perf_counter() - t0
        saved = self.save(compiler, flags, model, engine, b, compile_s, replace=cached is not None)
        return Supplied(engine, compile_s, False, saved)

    def _load(self, compiler, flags, model, ctx, cached: Path, name: str, b: int):
        """The cached engine, or None where it does not load here (a TensorRT plan of
        another TensorRT or driver, a file the runtime refuses): it is rebuilt, never the
        cell's failure."""
        try:
            return compiler.load(model, flags, ctx, cached)
        except Exception as exc:  # every runtime fails a foreign engine its own way
            first = first_line(exc) or type(exc).__name__
            log.warning("%s bs%d: the cached engine does not load (%s): rebuilding", name, b, first)
            return None

    @contextlib.contextmanager
    def _build_lock(self):
        """On a GPU, one engine build at a time: TensorRT's tactic timing, Inductor's
        autotuning and cuDNN's search time kernels, and a build beside another times them
        on a shared GPU (slower plans, no error) or runs out of memory. The workers of a
        group still measure in interleaved rounds; only their builds take turns."""
        if self.device_kind != "cuda":
            yield
            return
        import fcntl

        path = self.home / "locks" / "gpu-build.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+") as handle:
            t0 = time.perf_counter()
            fcntl.flock(handle, fcntl.LOCK_EX)
            waited = time.perf_counter() - t0
            if waited > 1.0:
                log.log(DETAIL, "waited %.0f s for another engine build on this GPU", waited)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def key(self, compiler: Compiler, flags: dict[str, Any], model: LoadedModel, b: int) -> str:
        facts = {
            "model": model.content_hash,
            "compiler": compiler.name,
            "version": compiler.version(),
            "flags": flags,
            "batch": b,
            "device": self.device,
            "scenario": self.scenario,
            "host_cpu": host_fingerprint(),
        }
        if self.device_kind == "cuda":  # the card, CUDA, cuDNN and driver it was built for
            facts["gpu"] = gpu_fingerprint()
        if self.math != "fp32":  # an fp32 key is the one earlier runs wrote
            facts["math"] = self.math
        return cache_key(facts)

    def save(
        self,
        compiler: Compiler,
        flags: dict[str, Any],
        model: LoadedModel,
        engine: Engine,
        b: int,
        compile_s: float,
        replace: bool = False,
    ) -> Path:
        """Write ``engine`` and its manifest; serializable engines go into the cache (``replace``:
        over an entry there, one that did not load), the others (eager, JIT) leave a
        manifest-only directory under ``work``."""
        key = self.key(compiler, flags, model, b)
        (self.home / "work").mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.home / "work") as tmp:
            files = engine.save(Path(tmp))
            info = {
                "compiler": compiler.name,
                "compiler_version": compiler.version(),
                "flags": flags,
                "model": model.label,
                "model_sha256": model.content_hash,
                "family": model.family,
                "batch_size": b,
                "input_name": model.input_name,
                "input_shape": list(model.input_shape(b)),
                "dtype": model.dtype,
                "device": self.device,
                "device_kind": self.device_kind,
                "math": self.math,
                "format": files.format,
                "compile_s": compile_s,
                "cache_key": key,
                "host_cpu": host_fingerprint(),
                "gpu": gpu_fingerprint() if self.device_kind == "cuda" else "",
                "cpu_flags": _cpu_flags(),
                "versions": _versions(),
            }
            write_manifest(Path(tmp), files.files, info)
            if not files.files:  # nothing serializable (eager, torch.compile JIT)
                return publish(Path(tmp), self.home / "work" / f"manifest-{key}")
            return self.cache.store(key, Path(tmp), replace=replace)


def publish(source: Path, target: Path, tries: int = 8) -> Path:
    """A copy of the folder ``source`` put at ``target`` whole, replacing what is there:
    copied into a work folder beside it, then renamed into place (the one being replaced
    renamed into the work folder first, and removed with it; what a kill leaves, the next
    one removes). Two workers of one engine (two runs into one home, an A/A pair) publish
    the same manifest at once: removing and copying in place let the second copy meet the
    first one's files (``FileExistsError``, the engine's measurement lost)."""
    from mlflow_ngraph.scratch import put_in_place, work_folder

    with work_folder(target.parent, f".{target.name}-") as holder:
        shutil.copytree(source, holder / "new")
        return put_in_place(holder / "new", target, holder, tries=tries)


def gpu_fingerprint() -> str:
    from mlflow_ngraph.measure.nvml import gpu_fingerprint as fingerprint

    return fingerprint()


def _cpu_flags() -> list[str]:
    from mlflow_ngraph.env import cpu_flags

    return cpu_flags()


def _versions() -> dict[str, str]:
    from mlflow_ngraph.env import library_versions

    return library_versions()
