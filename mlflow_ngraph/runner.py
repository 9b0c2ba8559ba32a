"""The per-device loop: models x compilers x batch sizes, each cell durable once measured.

For each model: build it, compute identity's reference outputs, then for each compiler and
batch size get an engine (cache or compile), check its outputs, measure it, write the result
to the journal and to MLflow. A compiler that fails on one model marks that cell FAILED with
the reason and the loop goes on.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mlflow_ngraph import metrics as M
from mlflow_ngraph.compilers.base import CompileContext, Compiler, Engine
from mlflow_ngraph.compilers.registry import get_compiler, require_available
from mlflow_ngraph.config import CompilerSpec, ModelSpec, Spec
from mlflow_ngraph.devices import DeviceProfile, check_profile_runs_here, get_profile
from mlflow_ngraph.errors import CompileFailed, NgraphError
from mlflow_ngraph.estimate import Timings, describe, estimate, timing_key
from mlflow_ngraph.measure.harness import measure
from mlflow_ngraph.models.base import LoadedModel
from mlflow_ngraph.models.registry import load_model, validate_model_spec
from mlflow_ngraph.summary import cell_run_name, differing_flags
from mlflow_ngraph.tracking import index
from mlflow_ngraph.tracking import mlflow_log as ml
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tracking.engines import EngineCache, cache_key, engine_bytes, write_manifest
from mlflow_ngraph.tracking.journal import Journal

log = logging.getLogger(__name__)

#: seed of the output-check input, distinct from the measured input (seed 0) so the check
#: runs on a fresh random batch the engine has not seen.
CHECK_SEED = 1234


@dataclass
class Cell:
    """One device x model x compiler x flags combination, measured at every batch size."""

    model: ModelSpec
    compiler: Compiler
    flags: dict[str, Any]
    key: str
    #: the short name of its MLflow run (model, compiler, the flags that tell it apart)
    run_name: str = ""

    @property
    def name(self) -> str:
        flags = ",".join(f"{k}={v}" for k, v in sorted(self.flags.items()) if v is not None)
        return f"{self.model.label}/{self.compiler.name}" + (f"[{flags}]" if flags else "")


@dataclass
class Row:
    """One line of the summary: a cell at one batch size."""

    model: str
    compiler: str
    batch_size: int
    status: str
    throughput: float | None = None
    throughput_std: float | None = None
    latency_p50_ms: float | None = None
    cpu_percent: float | None = None
    compile_s: float | None = None
    speedup: float | None = None
    max_rel_error: float | None = None
    note: str = ""
    skipped: bool = False
    #: the cell's resolved compiler flags: two settings of one compiler are two rows
    flags: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    spec: Spec
    profile: DeviceProfile
    cells: list[Cell] = field(default_factory=list)


def plan(spec: Spec, home: Path | None = None) -> Plan:
    """Validate everything that can be validated before any work starts.

    ``home`` (the cache directory) lets model names be checked against cached lists
    instead of importing the libraries that define them.

    Raises:
        NgraphError: unknown model, compiler, flag or profile; a compiler unavailable here.
    """
    profile = get_profile(spec.device)
    check_profile_runs_here(profile)
    for model in spec.models:
        validate_model_spec(model.name, model.params, home)
    compilers: list[tuple[Compiler, dict]] = []
    for cspec in _identity_first(spec.compilers):
        compiler = get_compiler(cspec.name)
        defaults = profile.compiler_flags.get(cspec.name, {})
        given = {**{k: v for k, v in defaults.items() if k in compiler.flags}, **cspec.flags}
        flags = compiler.resolve_flags(given)
        require_available(compiler, profile.kind)
        compilers.append((compiler, flags))
    differing = differing_flags((compiler.name, flags) for compiler, flags in compilers)
    cells = [
        Cell(
            model,
            compiler,
            flags,
            _cell_key(spec, profile, model, compiler, flags),
            cell_run_name(model.label, compiler.name, flags, differing[compiler.name]),
        )
        for model in spec.models
        for compiler, flags in compilers
    ]
    return Plan(spec, profile, cells)


def _identity_first(compilers: list[CompilerSpec]) -> list[CompilerSpec]:
    return sorted(compilers, key=lambda c: c.name != "identity")


def _cell_key(
    spec: Spec, profile: DeviceProfile, model: ModelSpec, compiler: Compiler, flags
) -> str:
    parts = {
        "device": profile.name,
        "model": model.name,
        "params": model.params,
        "compiler": compiler.name,
        "flags": flags,
        "measure": spec.measure.__dict__,
        "tolerance": spec.tolerance,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


class Runner:
    """Runs a :class:`Plan` into one tracking store, resuming from the journal."""

    def __init__(
        self,
        plan_: Plan,
        tracking_uri: str,
        home: Path,
        retry_failed: bool = False,
        on_row: Callable[[Row], None] | None = None,
        experiment_explicit: bool = False,
    ) -> None:
        self.plan = plan_
        self.spec = plan_.spec
        self.profile = plan_.profile
        self.tracking_uri = tracking_uri
        self.home = Path(home)
        self.retry_failed = retry_failed
        self.on_row = on_row or (lambda row: None)
        self.cache = EngineCache(self.home)
        self.rows: list[Row] = []
        #: where the results went (under ``mlflow run``: the project run's experiment)
        self.experiment_name = plan_.spec.experiment
        #: the experiment was named on the command line (not taken from the spec file)
        self.experiment_explicit = experiment_explicit

    def run(self) -> list[Row]:
        from mlflow_ngraph.env import environment

        self.journal = Journal.for_target(
            self.home, self.tracking_uri, self.spec.experiment, self.profile.name
        )
        if self._finished_before():
            return self.rows
        self.client = ml.connect(self.tracking_uri)
        self.experiment_id, self.experiment_name = ml.run_experiment(
            self.client, self.spec.experiment, self.experiment_explicit
        )
        self.timings = Timings(self.home)
        todo = [
            (cell.model.label, cell.compiler.name, cell.flags, b)
            for cell in self.plan.cells
            for b in self._pending(cell)
        ]
        if todo:
            log.info(describe(*estimate(todo, self.spec.measure, self.timings)))
        env = self.env = environment(self.profile.name, self.profile.kind, self.home)
        self.parent_id = ml.parent_run(
            self.client, self.experiment_id, self.spec, self.profile, env, {S.T_HOST: env["host"]}
        )
        status = "FINISHED"
        try:
            for model_spec in self.spec.models:
                self._run_model(model_spec, [c for c in self.plan.cells if c.model is model_spec])
        except BaseException as exc:
            try:  # best effort: the store itself may be what failed
                ml.finish(self.client, self.parent_id, "KILLED")
            except Exception as finish_exc:
                log.debug("could not mark the parent run KILLED: %s", finish_exc)
            if ml.is_store_error(exc):  # the journal holds every measured result
                raise NgraphError(
                    f"tracking store {ml.redact(self.tracking_uri)} failed ({_one_line(exc)}); "
                    "every measured result is kept in the journal: run the same command again once "
                    "the store is back to send them and finish the rest"
                ) from None
            raise
        self._write_index()
        self.journal.indexed(self.spec.spec_hash, self.parent_id)
        ml.finish(self.client, self.parent_id, status, announce=True)
        return self.rows

    def _finished_before(self) -> bool:
        """A re-run of an invocation that finished and indexed every cell, with nothing
        recorded in the journal since: its rows come from the journal, MLflow is not opened
        (the store already holds everything, relative metrics included). Not under
        ``mlflow run``, which created a run for this invocation that must be filled."""
        if os.environ.get("MLFLOW_RUN_ID"):  # `mlflow run` made a run for this invocation
            return False
        if not self.journal.up_to_date(self.spec.spec_hash):
            return False
        if any(self._pending(cell) for cell in self.plan.cells):
            return False
        log.info("every cell was measured and logged by an earlier run: nothing to do")
        for cell in self.plan.cells:
            self._rows_from_journal(cell)
            self._set_row_speedups(cell)
        return True

    def _write_index(self) -> None:
        """The parent's results index: every cell run of the spec, as the store holds it."""
        run_ids = [r for r in (self.journal.cell(c.key).run_id for c in self.plan.cells) if r]
        index.write(self.client, self.parent_id, index.snapshot(self.client, run_ids))

    # --- one model ------------------------------------------------------------------------
    def _pending(self, cell: Cell) -> list[int]:
        return [
            b
            for b in self.spec.batch_sizes
            if not self.journal.done(cell.key, b, self.retry_failed)
        ]

    def _run_model(self, model_spec: ModelSpec, cells: list[Cell]) -> None:
        self._flush_unlogged(cells)
        if not any(self._pending(c) for c in cells):
            log.info("%s: every cell already measured; skipping", model_spec.label)
            for cell in cells:
                self._rows_from_journal(cell)
                run_id = self.journal.cell(cell.key).run_id
                if run_id:  # a baseline measured since may now exist
                    self._log_relative(cell, run_id)
            return
        # the runtimes of the cells about to be compiled, imported here: a package's first
        # import in a process (openvino, ~0.2 s) is not the compile time of whichever cell
        # happens to come first. Nothing imports them when every cell is already done.
        _import_runtimes(c.compiler for c in cells if self._pending(c))
        log.info("building %s", model_spec.label)
        model = load_model(model_spec.name, model_spec.params)
        references = self._references(model)
        for cell in cells:
            self._run_cell(cell, model, references)

    def _references(self, model: LoadedModel) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Identity's outputs on a fresh random input per batch size (the output check)."""
        refs = {}
        engine = None
        for b in self.spec.batch_sizes:
            if engine is None or not model.is_torch:  # ONNX references are per batch size
                engine = _reference_engine(model, self.profile.kind, self.home, b)
            x = model.random_input(b, seed=CHECK_SEED + b)
            refs[b] = (x, engine.outputs(x))
            if not model.is_torch:
                engine.close()
        return refs

    # --- one cell -------------------------------------------------------------------------
    def _run_cell(self, cell: Cell, model: LoadedModel, references) -> None:
        pending = self._pending(cell)
        state = self.journal.cell(cell.key)
        run_id = ml.cell_run(
            self.client,
            self.experiment_id,
            self.parent_id,
            cell.key,
            cell.run_name or cell.name,
            state.run_id,
        )
        self.journal.set_run(cell.key, run_id)
        ml.log_params_once(self.client, run_id, self._cell_params(cell, model))
        ml.log_batch(self.client, run_id, tags=self._cell_tags())
        engine = None
        for b in self.spec.batch_sizes:
            if b not in pending:
                self._rows_from_journal(cell, only=b)
                continue
            if engine is None or not cell.compiler.batch_agnostic:
                if engine is not None:
                    engine.close()
                engine = None
            engine = self._measure_batch(cell, model, references, run_id, b, engine)
        if engine is not None:
            engine.close()
        self._log_relative(cell, run_id)
        self._finish_cell(cell, run_id)

    def _measure_batch(self, cell, model, references, run_id, b, engine):
        started = time.perf_counter()
        try:
            engine, record = self._measure(cell, model, references, b, engine)
            self.timings.record(
                timing_key(cell.model.label, cell.compiler.name, cell.flags, b),
                time.perf_counter() - started,
            )
        except Exception as exc:  # one failing cell never stops the run
            if isinstance(exc, NgraphError) or ml.is_store_error(exc):
                raise
            reason = _one_line(exc)
            log.warning("%s bs%d FAILED: %s", cell.name, b, reason)
            self.journal.failed(cell.key, b, reason)
            ml.log_batch(
                self.client,
                run_id,
                tags={f"{S.T_STATUS}.bs{b}": S.STATUS_FAILED, f"{S.T_ERROR}.bs{b}": reason[:5000]},
            )
            self._emit(
                Row(
                    cell.model.label,
                    cell.compiler.name,
                    b,
                    S.STATUS_FAILED,
                    note=reason,
                    flags=dict(cell.flags),
                )
            )
            return None
        self.journal.measured(cell.key, b, record)
        self._log_record(cell, run_id, b, record)
        return engine

    def _measure(self, cell: Cell, model: LoadedModel, references, b: int, engine: Engine | None):
        compile_s, cache_hit = 0.0, False
        if engine is None:
            engine, compile_s, cache_hit, engine_dir = self._engine(cell, model, b)
        else:  # a batch-agnostic engine (eager) serves this batch too: its own manifest
            engine_dir = self._save_engine(
                cell, model, engine, self._engine_key(cell, model, b), b, 0.0
            )
        x_ref, y_ref = references[b]
        check = compare_outputs(engine.outputs(x_ref), y_ref, self.spec.tolerance)
        engine.prepare(model.random_input(b))
        t0 = time.perf_counter()
        engine.infer()
        first_ms = 1000 * (time.perf_counter() - t0)
        result = measure(engine, b, self.spec.measure, gpu=self.profile.kind == "cuda")
        record = {
            "metrics": {
                **_measurement_metrics(result),
                S.M_COMPILE: compile_s,
                S.M_CACHE_HIT: float(cache_hit),
                S.M_FIRST_INFERENCE: first_ms,
                **check.metrics(),
                "parallel_requests": float(engine.parallel_requests),
                **_engine_extras(engine),
            },
            "status": S.STATUS_OK if check.valid else S.STATUS_INVALID,
            "note": check.reason,
            "stop_reason": result.stop_reason,
            "runtime": {k: str(v) for k, v in engine.runtime_settings().items()},
            "engine_dir": str(engine_dir) if engine_dir else None,
        }
        if engine_dir is not None:
            manifest = json.loads((Path(engine_dir) / "manifest.json").read_text())
            record["metrics"][S.M_ENGINE_SIZE] = engine_bytes(manifest) / 2**20
        return engine, record

    def _engine(self, cell: Cell, model: LoadedModel, b: int):
        """The engine for ``b``: from the cache when a verified copy exists, else compiled
        (and stored). Returns (engine, seconds spent, cache hit, engine directory)."""
        key = self._engine_key(cell, model, b)
        ctx = CompileContext(
            workdir=self.home / "work",
            device=self.profile.kind,
            batch_size=b,
            cache_dir=self.home,
            scenario=self.spec.measure.scenario,
        )
        ctx.workdir.mkdir(parents=True, exist_ok=True)
        cached = self.cache.lookup(key)
        if cell.compiler.uses_onnx and model.is_torch and cached is None:
            from mlflow_ngraph.compilers._export import export_onnx

            export_onnx(model, self.home)  # cached: the compile clock below excludes it
        t0 = time.perf_counter()
        if cached is not None:
            engine = cell.compiler.load(model, cell.flags, ctx, cached)
            if engine is not None:
                log.info("%s bs%d: engine cache hit (%s), compilation skipped", cell.name, b, key)
                return engine, time.perf_counter() - t0, True, cached
        log.info("%s bs%d: compiling", cell.name, b)
        engine = cell.compiler.compile(model, cell.flags, ctx)
        compile_s = time.perf_counter() - t0
        return engine, compile_s, False, self._save_engine(cell, model, engine, key, b, compile_s)

    def _engine_key(self, cell: Cell, model: LoadedModel, b: int) -> str:
        return cache_key(
            {
                "model": model.content_hash,
                "compiler": cell.compiler.name,
                "version": cell.compiler.version(),
                "flags": cell.flags,
                "batch": b,
                "device": self.profile.name,
                "scenario": self.spec.measure.scenario,
                "host_cpu": _host_fingerprint(),
            }
        )

    def _save_engine(self, cell, model, engine: Engine, key: str, b: int, compile_s: float):
        with tempfile.TemporaryDirectory(dir=self.home / "work") as tmp:
            files = engine.save(Path(tmp))
            info = {
                "compiler": cell.compiler.name,
                "compiler_version": cell.compiler.version(),
                "flags": cell.flags,
                "model": model.label,
                "model_sha256": model.content_hash,
                "family": model.family,
                "batch_size": b,
                "input_name": model.input_name,
                "input_shape": list(model.input_shape(b)),
                "dtype": model.dtype,
                "device": self.profile.name,
                "device_kind": self.profile.kind,
                "format": files.format,
                "compile_s": compile_s,
                "cache_key": key,
                "host_cpu": _host_fingerprint(),
                "cpu_flags": _cpu_flags(),
                "versions": _versions(),
            }
            write_manifest(Path(tmp), files.files, info)
            if not files.files:  # nothing serializable (eager, torch.compile JIT)
                target = self.home / "work" / f"manifest-{key}"
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(tmp, target)
                return target
            return self.cache.store(key, Path(tmp))

    # --- logging --------------------------------------------------------------------------
    def _cell_params(self, cell: Cell, model: LoadedModel) -> dict[str, Any]:
        m = self.spec.measure
        params = {
            S.P_DEVICE: self.profile.name,
            S.P_MODEL: model.name,
            S.P_COMPILER: cell.compiler.name,
            S.P_FAMILY: model.family,
            S.P_PARAMETER_COUNT: model.parameter_count,
            S.P_SCENARIO: m.scenario,
            "warmup": m.warmup,
            "repetitions": m.repetitions,
            "min_duration_s": m.min_duration_s,
            "max_duration_s": m.max_duration_s,
            "tolerance": self.spec.tolerance,
            "compiler_version": cell.compiler.version(),
            "device_kind": self.profile.kind,
            "model_sha256": model.content_hash,
        }
        params.update({f"{S.P_MODEL_PARAM_PREFIX}{k}": v for k, v in model.params.items()})
        params.update({f"{S.P_FLAG_PREFIX}{k}": v for k, v in cell.flags.items()})
        return params

    def _cell_tags(self) -> dict[str, str]:
        """Where and with what a cell was measured (the latest invocation's values)."""
        tags = {
            S.T_LAST_PARENT: self.parent_id,
            S.T_DEVICE: self.profile.name,
            S.T_DEVICE_KIND: self.profile.kind,
            S.T_HOST: self.env["host"],
            "ngraph.device_fingerprint": _host_fingerprint(),
            S.T_SPEC_HASH: self.spec.spec_hash,
        }
        versions = {k: v for k, v in self.env.items() if k.startswith("version.")}
        tags.update({f"ngraph.{k}": str(v) for k, v in versions.items()})
        return tags

    def _log_record(self, cell: Cell, run_id: str, b: int, record: dict) -> None:
        tags = {f"{S.T_STATUS}.bs{b}": record["status"], S.T_LAST_PARENT: self.parent_id}
        if record.get("note"):
            tags[f"ngraph.note.bs{b}"] = record["note"]
        ml.log_batch(self.client, run_id, metrics=ml.batch_metrics(record["metrics"], b), tags=tags)
        ml.log_params_once(
            self.client, run_id, {f"runtime.{k}": v for k, v in record.get("runtime", {}).items()}
        )
        if record.get("engine_dir") and self.spec.log_engines:
            ml.log_engine(self.client, run_id, Path(record["engine_dir"]), b)
            if self.spec.log_models and record["status"] == S.STATUS_OK:
                self._log_model(cell, run_id, b, record)
        self.journal.logged(cell.key, b)
        self._emit(_row(cell, b, record))

    def _log_model(self, cell: Cell, run_id: str, b: int, record: dict) -> None:
        """The engine as an MLflow logged model of its cell run (``--log-models``), so
        ``mlflow.search_logged_models`` ranks engines by their metrics."""
        from mlflow_ngraph.deploy.register import log_engine_model
        from mlflow_ngraph.deploy.select import Candidate

        manifest = json.loads((Path(record["engine_dir"]) / "manifest.json").read_text())
        if not manifest.get("files"):
            return  # runs in-process only (eager, torch.compile JIT): nothing to deploy
        candidate = Candidate(
            run_id=run_id,
            experiment_id=self.experiment_id,
            device=self.profile.name,
            model=cell.model.label,
            compiler=cell.compiler.name,
            flags="",
            batch_size=b,
            metrics={k: float(v) for k, v in record["metrics"].items() if v is not None},
        )
        try:
            log_engine_model(Path(record["engine_dir"]), candidate, self.tracking_uri)
        except NgraphError as exc:  # the result stands; only its model is missing
            log.warning("%s bs%d: not logged as a model: %s", cell.name, b, exc)

    def _flush_unlogged(self, cells: list[Cell]) -> None:
        """Send measured-but-unlogged journal records to MLflow (e.g. the server was down)."""
        for cell in cells:
            state = self.journal.cell(cell.key)
            for b, record in sorted(state.measured.items()):
                if b in state.logged or state.run_id is None:
                    continue
                log.info("%s bs%d: logging a result measured before the interruption", cell.name, b)
                self._log_record(cell, state.run_id, b, record)

    def _log_relative(self, cell: Cell, run_id: str) -> None:
        """speedup, RTR, ASE and BSR once this cell's and identity's throughputs exist."""
        own = self._throughputs(cell.key)
        identity = self._identity_throughputs(cell)
        values: list[ml.MetricValue] = []
        for b, rel in M.relative_metrics(own, identity).items():
            values += ml.batch_metrics(rel, b)
        logged = self.client.get_run(run_id).data.metrics
        changed = [  # a resume re-logs nothing that the run already holds (all are flat)
            (key, value, step)
            for key, value, step in values
            if logged.get(S.flat_key(key.split(".bs")[0], step)) != value
        ]
        note = (
            "identity baseline of this device and model"
            if identity
            else "no identity baseline for this device and model: speedup and BSR not logged"
        )
        ml.log_batch(self.client, run_id, metrics=changed, tags={"ngraph.relative": note})
        self._set_row_speedups(cell)

    def _set_row_speedups(self, cell: Cell) -> None:
        own, identity = self._throughputs(cell.key), self._identity_throughputs(cell) or {}
        for row in self.rows:
            if (
                row.model == cell.model.label
                and row.compiler == cell.compiler.name
                and row.flags == cell.flags
            ):
                row.speedup = M.speedup(own.get(row.batch_size), identity.get(row.batch_size))

    def _throughputs(self, key: str) -> dict[int, float]:
        state = self.journal.cell(key)
        return {
            b: r["metrics"][S.M_THROUGHPUT]
            for b, r in state.measured.items()
            if r["status"] != S.STATUS_FAILED
        }

    def _identity_throughputs(self, cell: Cell) -> dict[int, float] | None:
        """Identity's throughputs for this device and model, from this run or an earlier one
        with the same measurement settings (its cell key is the same)."""
        identity = get_compiler("identity")
        key = _cell_key(self.spec, self.profile, cell.model, identity, {})
        return self._throughputs(key) or None

    def _finish_cell(self, cell: Cell, run_id: str) -> None:
        state = self.journal.cell(cell.key)
        statuses = [r["status"] for r in state.measured.values()]
        if state.failed:
            status, error = S.STATUS_FAILED, next(iter(state.failed.values()))
        elif S.STATUS_INVALID in statuses:
            status, error = S.STATUS_INVALID, "output check failed at some batch size"
        else:
            status, error = S.STATUS_OK, ""
        tags = {S.T_STATUS: status}
        if error:
            tags[S.T_ERROR] = error[:5000]
        ml.log_batch(self.client, run_id, tags=tags)
        ml.finish(
            self.client,
            run_id,
            "FAILED" if status == S.STATUS_FAILED and not statuses else "FINISHED",
        )

    def _rows_from_journal(self, cell: Cell, only: int | None = None) -> None:
        state = self.journal.cell(cell.key)
        for b in self.spec.batch_sizes:
            if only is not None and b != only:
                continue
            if b in state.measured:
                row = _row(cell, b, state.measured[b])
            elif b in state.failed:
                row = Row(
                    cell.model.label,
                    cell.compiler.name,
                    b,
                    S.STATUS_FAILED,
                    note=state.failed[b],
                    flags=dict(cell.flags),
                )
            else:
                continue
            row.skipped = True
            self._emit(row)

    def _emit(self, row: Row) -> None:
        self.rows.append(row)
        self.on_row(row)


# --- helpers ------------------------------------------------------------------------------
@dataclass
class OutputCheck:
    max_abs_error: float
    max_rel_error: float
    cosine: float
    valid: bool
    reason: str = ""

    def metrics(self) -> dict[str, float]:
        return {
            S.M_MAX_ABS_ERROR: self.max_abs_error,
            S.M_MAX_REL_ERROR: self.max_rel_error,
            S.M_COSINE: self.cosine,
            S.M_VALID: float(self.valid),
        }


def compare_outputs(output: np.ndarray, reference: np.ndarray, tolerance: float) -> OutputCheck:
    """Compare an engine's output with identity's.

    ``max_rel_error`` is the largest absolute difference divided by the reference's largest
    magnitude (element-wise relative error explodes on outputs near zero). Valid when it is at
    most ``tolerance`` and the cosine similarity is at least ``1 - tolerance``.
    """
    if output.size != reference.size:
        return OutputCheck(
            float("inf"),
            float("inf"),
            0.0,
            False,
            f"output shape {output.shape} != reference {reference.shape}",
        )
    out = output.astype(np.float64).ravel()
    ref = reference.astype(np.float64).ravel()
    if not np.all(np.isfinite(out)):
        return OutputCheck(float("inf"), float("inf"), 0.0, False, "output has NaN or Inf")
    max_abs = float(np.max(np.abs(out - ref))) if out.size else 0.0
    max_rel = max_abs / max(float(np.max(np.abs(ref))), 1e-12)
    norms = float(np.linalg.norm(out) * np.linalg.norm(ref))
    cosine = float(np.dot(out, ref) / norms) if norms > 0 else float(max_abs == 0)
    valid = max_rel <= tolerance and cosine >= 1 - tolerance
    reason = (
        ""
        if valid
        else (
            f"output differs from identity: max rel error {max_rel:.2e}, cosine {cosine:.6f} "
            f"(tolerance {tolerance:g})"
        )
    )
    return OutputCheck(max_abs, max_rel, cosine, valid, reason)


def _reference_engine(model: LoadedModel, device_kind: str, home: Path, batch: int) -> Engine:
    """Eager PyTorch for torch models; ONNX Runtime with every optimization off for ONNX files."""
    ctx = CompileContext(
        workdir=home / "work", device=device_kind, batch_size=batch, cache_dir=home
    )
    if model.is_torch:
        return get_compiler("identity").compile(model, {}, ctx)
    ort = get_compiler("onnxruntime")
    require_available(ort, "cpu")
    return ort.compile(model, ort.resolve_flags({"graph_optimization_level": "disable"}), ctx)


def _measurement_metrics(result) -> dict[str, float]:
    keys = (
        S.M_THROUGHPUT,
        S.M_THROUGHPUT_STD,
        S.M_LATENCY_MEAN,
        S.M_LATENCY_STD,
        S.M_LATENCY_P50,
        S.M_LATENCY_P90,
        S.M_LATENCY_P99,
        S.M_CV,
        S.M_REPETITIONS,
        S.M_DURATION,
        S.M_CPU,
        S.M_RSS,
        "throughput_overall",
        "requests_per_repetition",
    )
    data = result.to_dict()
    out = {k: float(data[k]) for k in keys}
    out.update({k: float(v) for k, v in (result.gpu or {}).items()})
    return out


def _engine_extras(engine: Engine) -> dict[str, float]:
    """Compile-side numbers some engines expose (TVM's tuning time and trial count)."""
    extras = {}
    for attr, name in (
        ("tuning_seconds", "tuning_s"),
        ("trials_used", "trials"),
        ("tuned", "tuned"),
    ):
        value = getattr(engine, attr, None)
        if value is not None:
            extras[name] = float(value)
    return extras


def _row(cell: Cell, b: int, record: dict) -> Row:
    m = record["metrics"]
    return Row(
        cell.model.label,
        cell.compiler.name,
        b,
        record["status"],
        throughput=m.get(S.M_THROUGHPUT),
        throughput_std=m.get(S.M_THROUGHPUT_STD),
        latency_p50_ms=m.get(S.M_LATENCY_P50),
        cpu_percent=m.get(S.M_CPU),
        compile_s=m.get(S.M_COMPILE),
        max_rel_error=m.get(S.M_MAX_REL_ERROR),
        note=record.get("note") or ("untuned" if m.get("tuned") == 0.0 else ""),
        flags=dict(cell.flags),
    )


def _import_runtimes(compilers) -> None:
    """Import each compiler's Python packages; one that fails to import is left to fail
    its own cells when they compile, as before."""
    for compiler in compilers:
        for package in compiler.packages:
            try:
                importlib.import_module(package)
            except Exception as exc:
                log.debug("importing %s for %s failed: %s", package, compiler.name, exc)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:1000] if not isinstance(exc, CompileFailed) else first


def _host_fingerprint() -> str:
    from mlflow_ngraph.env import cpu_model

    return f"{cpu_model()}|{os.cpu_count()}"


def _cpu_flags() -> list[str]:
    from mlflow_ngraph.env import cpu_flags

    return cpu_flags()


def _versions() -> dict[str, str]:
    from mlflow_ngraph.env import library_versions

    return library_versions()
