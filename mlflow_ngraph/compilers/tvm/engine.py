"""The built Relax VM executable with its weights, bound to one batch size: run, save, load."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from mlflow_ngraph.compilers.base import Engine, EngineFiles
from mlflow_ngraph.compilers.tvm.build import BuildResult
from mlflow_ngraph.compilers.tvm.database import copy_database, has_database
from mlflow_ngraph.compilers.tvm.settings import (
    DATABASE_DIR,
    ENGINE_FORMAT,
    LIBRARY_FILE,
    MANIFEST_FILE,
    PARAMS_FILE,
    RECORD_FILE,
    WORKLOAD_FILE,
)
from mlflow_ngraph.compilers.tvm.tuning import TuningReport
from mlflow_ngraph.errors import CompileFailed


class TvmEngine(Engine):
    """A built Relax VM executable with its weights, bound to one batch size."""

    def __init__(
        self,
        build: BuildResult,
        params: list[Any],
        device: str,
        input_shape: tuple[int, ...],
    ) -> None:
        self.build = build
        self.device_kind = device
        self.input_shape = tuple(input_shape)
        self.asynchronous_device = device == "cuda"
        self._raw_params = params
        self._vm, self._params = _start_vm(build.executable, params, device, build.transform_params)
        self._dev = _tvm_device(device)
        self._input = None
        report = build.report
        #: seconds spent tuning during this compile (0 when the database already covered it)
        self.tuning_seconds: float = report.tuning_seconds
        #: MetaSchedule trials measured during this compile
        self.trials_used: int = report.trials_used
        #: whether at least one kernel runs a tuned schedule
        self.tuned: bool = report.tuned

    def close(self) -> None:
        """Release the VM and remove the compile's work directory (its tuning logs,
        database and library: :meth:`save` has copied what the engine needs)."""
        self._vm = None
        self._params = []
        work = self.build.work_dir
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
            self.build.work_dir = None

    def compile_metrics(self) -> dict[str, float]:
        return {
            "tuning_s": float(self.tuning_seconds),
            "trials": float(self.trials_used),
            "tuned": float(self.tuned),
        }

    # -- running

    def prepare(self, inputs: np.ndarray) -> None:
        import tvm

        self._input = tvm.runtime.tensor(np.ascontiguousarray(inputs), self._dev)
        self._vm.save_function("main", "main_bound", self._input, *self._params)
        self._bound = self._vm["main_bound"]

    def infer(self) -> None:
        self._bound()
        self.synchronize()

    def run_many(self, count: int, stamps: list[float] | None = None) -> None:
        bound = self._bound
        if stamps is None:
            for _ in range(count):
                bound()
        else:  # the host runs each request to its end: stamp it (Engine.run_many)
            clock, stamp = time.perf_counter, stamps.append
            for _ in range(count):
                bound()
                stamp(clock())
        self.synchronize()

    def outputs(self, inputs: np.ndarray) -> np.ndarray:
        import tvm

        tensor = tvm.runtime.tensor(np.ascontiguousarray(inputs), self._dev)
        out = self._vm["main"](tensor, *self._params)
        self.synchronize()
        found = _tensors(out)
        return found[0] if len(found) == 1 else tuple(found)

    def synchronize(self) -> None:
        if self.asynchronous_device:
            self._dev.sync()

    def runtime_settings(self) -> dict[str, Any]:
        import tvm

        report = self.build.report
        return {
            "target": str(self.build.target),
            "tuned": report.tuned,
            "trials_used": report.trials_used,
            "tuning_seconds": round(report.tuning_seconds, 3),
            "tasks": report.tasks,
            "tasks_tuned": report.tasks_tuned,
            "database_reused": report.database_reused,
            "tuning_stop_reason": report.stop_reason,
            "opt_level": self.build.opt_level,
            "num_threads": int(tvm.runtime.num_threads()),
        }

    # -- files

    def save(self, directory: Path) -> EngineFiles:
        """Write ``model.so``, ``params.bin``, the tuning database and a manifest."""
        import tvm

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        library = self.build.library_file
        if library is None:
            self.build.executable.export_library(str(directory / LIBRARY_FILE))
        elif library.resolve() != (directory / LIBRARY_FILE).resolve():
            shutil.copyfile(library, directory / LIBRARY_FILE)
        params = {f"p{i}": p for i, p in enumerate(self._raw_params)}
        (directory / PARAMS_FILE).write_bytes(bytes(tvm.runtime.save_param_dict(params)))
        files = [LIBRARY_FILE, PARAMS_FILE, MANIFEST_FILE]
        source = self.build.report.database_dir
        if source is not None and has_database(source):
            (directory / DATABASE_DIR).mkdir(exist_ok=True)
            if source.resolve() != (directory / DATABASE_DIR).resolve():
                copy_database(source, directory / DATABASE_DIR)
            files += [f"{DATABASE_DIR}/{WORKLOAD_FILE}", f"{DATABASE_DIR}/{RECORD_FILE}"]
        manifest = self._manifest(len(params))
        (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        return EngineFiles(files=files, format=ENGINE_FORMAT)

    def _manifest(self, n_params: int) -> dict[str, Any]:
        import tvm

        report = self.build.report
        return {
            "format": ENGINE_FORMAT,
            "tvm_version": tvm.__version__,
            "target": str(self.build.target),  # the target's JSON form
            "device": self.device_kind,
            "input_shape": list(self.input_shape),
            "params": n_params,
            "transform_params": self.build.transform_params,
            "opt_level": self.build.opt_level,
            "tuned": report.tuned,
            "trials_used": report.trials_used,
            "tuning_seconds": report.tuning_seconds,
            "tasks": report.tasks,
            "tasks_tuned": report.tasks_tuned,
            "database_reused": report.database_reused,
            "tuning_stop_reason": report.stop_reason,
        }

    @classmethod
    def load(cls, directory: Path, device: str) -> TvmEngine:
        """Read an engine written by :meth:`save` into a VirtualMachine (no tuning)."""
        import tvm

        directory = Path(directory)
        manifest = json.loads((directory / MANIFEST_FILE).read_text())
        if manifest.get("format") != ENGINE_FORMAT:
            raise CompileFailed(f"{directory} is not a TVM engine ({manifest.get('format')})")
        library = tvm.runtime.load_module(str(directory / LIBRARY_FILE))
        loaded = tvm.runtime.load_param_dict((directory / PARAMS_FILE).read_bytes())
        params = [loaded[f"p{i}"] for i in range(int(manifest["params"]))]
        report = _report_from_manifest(manifest, directory)
        target = tvm.target.Target(manifest["target"]) if manifest.get("target") else None
        build = BuildResult(
            executable=library,
            target=target,
            report=report,
            transform_params=bool(manifest["transform_params"]),
            opt_level=int(manifest.get("opt_level", 3)),
            library_file=directory / LIBRARY_FILE,
        )
        return cls(build, params, device, tuple(manifest["input_shape"]))


def _report_from_manifest(manifest: dict[str, Any], directory: Path) -> TuningReport:
    database = directory / DATABASE_DIR
    return TuningReport(
        tuned=bool(manifest["tuned"]),
        trials_used=int(manifest["trials_used"]),
        tuning_seconds=float(manifest["tuning_seconds"]),
        tasks=int(manifest.get("tasks", 0)),
        tasks_tuned=int(manifest.get("tasks_tuned", 0)),
        database_reused=bool(manifest.get("database_reused", False)),
        stop_reason=str(manifest.get("tuning_stop_reason", "")),
        database_dir=database if has_database(database) else None,
    )


def _tvm_device(device: str) -> Any:
    import tvm

    return tvm.cuda(0) if device == "cuda" else tvm.cpu(0)


def _start_vm(executable: Any, params: list[Any], device: str, transform: bool) -> tuple[Any, list]:
    """A VirtualMachine on ``device`` and the weights it runs with (pre-packed once when the
    tuned kernels asked for another layout)."""
    import tvm
    from tvm import relax

    dev = _tvm_device(device)
    vm = relax.VirtualMachine(executable, dev)
    weights = [tvm.runtime.tensor(p.numpy(), dev) for p in params]
    if transform:
        weights = list(vm["main_transform_params"](weights))
    return vm, weights


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    # TVM errors end with the one-line message after a long traceback
    return (lines[-1] if lines else repr(exc))[:500]


def _tensors(out: Any) -> list[np.ndarray]:
    """Every tensor of what the VM's ``main`` returned (one tensor, or a tuple of them,
    nested as the model's outputs were), in order, as float32 arrays."""
    if hasattr(out, "numpy"):
        return [np.asarray(out.numpy(), dtype=np.float32)]
    found: list[np.ndarray] = []
    for item in out:
        found.extend(_tensors(item))
    return found
