"""tvm: Apache TVM (Relax) from the ONNX export, tuned with MetaSchedule.

The model is imported with ``relax.frontend.onnx.from_onnx`` at a static batch shape, its
operators are fused into TIR functions, and MetaSchedule tunes those functions within a trial
budget. The tuning database (MetaSchedule's JSON workload and record files) is part of the
engine: it is saved next to the built library and reused, so a second compile of the same model,
target and batch size spends no trials.

Where tuning time went, and what this module does instead (numbers in ``docs/tvm.md``):

- TVM's ``LocalBuilder`` starts a fresh pool of worker processes for every round of
  candidates, and every worker imports ``tvm`` (~4 s) and then ``tvm.s_tir.tensor_intrin``
  (~28 s: it parses every CUDA, ROCm, Hexagon and Arm tensor intrinsic) before its first build;
  with its 30 s timeout every build on a 2-core host timed out. Here one pool of build workers
  lives for the whole process, starts in the background while the model is exported, never
  imports the intrinsics (candidates reach the builder already scheduled and tensorized), and
  links each candidate in the parallel builder instead of the serial runner.
- ``TuneContext`` imports the same intrinsics once in the main process; only the target's own
  intrinsic module is registered here (~1 s).
- The XGBoost cost model scores nothing until it has 100 measurements, yet TVM retrains it after
  every round; it is not trained before then, and budgets below that count use a plain random
  search instead of evolving a population on random scores.
- TVM's thread pool, left to itself on this VM, runs one thread and pins the process to core 0:
  ``TVM_NUM_THREADS`` is set to the physical core count before it starts.

Versions: apache-tvm 0.27.0.post1 with apache-tvm-ffi pinned to 0.1.14.post0, because 0.1.15.post2
(the version pip pairs with TVM 0.27) segfaults in every JSON serialization (``tvm.ir.save_json``),
which MetaSchedule uses to ship every candidate to the builder and to write its database.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlflow_ngraph.compilers.base import CompileContext, Compiler, Engine, EngineFiles, Flag
from mlflow_ngraph.errors import CompileFailed, NgraphError

log = logging.getLogger(__name__)

ENGINE_FORMAT = "tvm-relax-vm"
LIBRARY_FILE = "model.so"
PARAMS_FILE = "params.bin"
MANIFEST_FILE = "tvm_engine.json"
DATABASE_DIR = "database"
WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"

#: Default total trial budget. A judgement call on cost: MetaSchedule needs hundreds of trials
#: per task to converge (the paper used up to 1500), but a trial still costs 1-4 s of search,
#: build and measurement on a shared 2-core host after the overhead cuts here, so 64 keeps a
#: compile to minutes; it took a 64-channel conv block from 24x slower than PyTorch eager
#: (untuned) to about its speed, still ~3x behind ONNX Runtime (docs/tvm.md).
DEFAULT_TRIALS = 64
#: MetaSchedule's own batch size per search round; smaller budgets use smaller rounds so that the
#: first round-robin pass reaches every task (with 64 a 64-trial budget would all go to task 0).
MAX_TRIALS_PER_ROUND = 64
#: Evolutionary-search population once the cost model is trained. MetaSchedule's default is 512;
#: each round samples, mutates and scores the whole population, which costs seconds per round on
#: 2 cores. We use 8 of population per trial of a task's budget, clamped to [64, 512] (a judgement
#: call: small budgets cannot exploit a big population, and 64 still keeps the search diverse).
POPULATION_PER_TRIAL = 8
MIN_POPULATION, MAX_POPULATION = 64, 512
#: Random-search population per candidate of a round, for budgets the cost model never sees
#: trained (see ``_search_settings``): twice what a round measures leaves room for duplicates.
RANDOM_POPULATION_PER_CANDIDATE, MIN_RANDOM_POPULATION = 2, 16
#: Seconds a single candidate may take to build. TVM's default (30 s) included the ~30 s of
#: imports in every fresh worker and so killed every build on a 2-core host; with warm workers a
#: build takes about a second, and 60 s leaves room for a heavily unrolled candidate.
BUILD_TIMEOUT_S = 60.0
#: Seconds a single candidate may take to run its measurement (3 runs, at least 100 ms).
RUN_TIMEOUT_S = 60.0
#: Builds a worker process serves before it is replaced: TVM restarts its pool after every batch
#: because of a memory leak in long-lived workers; recycling every 64 builds bounds the leak
#: while paying the worker start-up (~4 s) once per 64 candidates instead of per batch.
WORKER_MAX_USES = 64
#: Seed of the search, so that two tunings with the same budget explore the same candidates.
SEARCH_SEED = 0
#: Bump when the cached-database key or layout changes.
CACHE_VERSION = 1

#: x86 ISA extensions that matter for generated kernels: LLVM's name -> the /proc/cpuinfo flag.
#: LLVM derives the features from the CPU name (``-mcpu``); a hypervisor may hide some of them,
#: so those missing from /proc/cpuinfo are switched off to avoid illegal instructions.
_X86_ISA_FLAGS = {
    "sse3": "pni",
    "ssse3": "ssse3",
    "sse4.1": "sse4_1",
    "sse4.2": "sse4_2",
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "bmi": "bmi1",
    "bmi2": "bmi2",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512cd": "avx512cd",
    "avx512dq": "avx512dq",
    "avx512vl": "avx512vl",
    "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2",
    "avx512vnni": "avx512_vnni",
    "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "avxvnni": "avx_vnni",
    "amx-tile": "amx_tile",
    "amx-int8": "amx_int8",
    "amx-bf16": "amx_bf16",
    "gfni": "gfni",
    "vaes": "vaes",
    "vpclmulqdq": "vpclmulqdq",
}


class TvmCompiler(Compiler):
    """Apache TVM with MetaSchedule tuning (``llvm`` on the CPU, ``cuda`` on NVIDIA GPUs)."""

    name = "tvm"
    uses_onnx = True
    packages = ("tvm", "onnx")
    distribution = "apache-tvm"
    extra = "tvm"
    devices = ("cpu", "cuda")
    flags = {
        "trials": Flag(
            int,
            DEFAULT_TRIALS,
            minimum=0,
            help="total MetaSchedule trial budget over all tasks; 0 builds untuned",
        ),
        "trials_per_task": Flag(
            int, None, minimum=1, help="trial cap per tuning task (default: no cap)"
        ),
        "early_stopping": Flag(
            int,
            None,
            minimum=1,
            help="stop tuning a task after this many trials without improvement (paper: 150)",
        ),
        "timeout": Flag(float, None, minimum=1, help="wall-clock budget of the tuning, seconds"),
        "database": Flag(
            str, None, help="directory of an existing tuning database (JSON) to reuse"
        ),
        "opt_level": Flag(int, 3, choices=(0, 1, 2, 3), help="TVM PassContext opt_level"),
    }

    def availability(self, device: str = "cpu") -> tuple[bool, str]:
        ok, reason = super().availability(device)
        if ok and device == "cuda":
            import tvm

            if not tvm.runtime.enabled("cuda"):
                return False, "this TVM build has no CUDA support (tvm.runtime.enabled('cuda'))"
        return ok, reason

    def compile(self, model: Any, flags: dict[str, Any], ctx: CompileContext) -> Engine:
        """Import the ONNX export, tune (unless ``trials`` is 0 or a database covers it), build.

        Raises:
            CompileFailed: the import, the tuning or the build failed.
            NgraphError: the ``database`` flag names a directory without a tuning database.
        """
        from mlflow_ngraph.compilers._export import export_onnx

        configure_threads()
        database_source(flags.get("database"))  # user errors first, before the slow steps
        target = make_target(ctx.device)
        if flags["trials"]:
            prestart_measurers()
        onnx_path = export_onnx(model, ctx.cache_dir)
        try:
            mod, params = _import_onnx(
                onnx_path, model.input_name, model.input_shape(ctx.batch_size)
            )
            build = _tune_and_build(model, mod, target, flags, ctx)
        except (CompileFailed, NgraphError):
            raise
        except Exception as exc:  # TVM raises many kinds (TVMError, ValueError, InternalError)
            raise CompileFailed(f"TVM failed on {model.label}: {_first_line(exc)}") from exc
        return TvmEngine(build, params, ctx.device, model.input_shape(ctx.batch_size))

    def load(
        self, model: Any, flags: dict[str, Any], ctx: CompileContext, directory: Path
    ) -> Engine | None:
        """Read back an engine written by :meth:`TvmEngine.save` (no tuning, no build)."""
        directory = Path(directory)
        if not (directory / MANIFEST_FILE).is_file():
            return None
        configure_threads()
        return TvmEngine.load(directory, ctx.device)


# --------------------------------------------------------------------------- targets


def make_target(device: str) -> Any:
    """The TVM target for ``device`` ("cpu" or "cuda") on this host.

    Raises:
        CompileFailed: ``cuda`` was asked for but TVM has no CUDA support or sees no GPU.
    """
    import tvm

    host = tvm.target.Target(host_cpu_target_spec())
    if device != "cuda":
        return host
    return tvm.target.Target(cuda_target_spec(), host=host)


def host_cpu_target_spec() -> dict[str, Any]:
    """An ``llvm`` target dict for this CPU: its LLVM name, features and physical core count.

    ``mcpu=native`` is rejected by the LLVM 22 inside TVM 0.27, so the CPU name comes from
    LLVM's host detection and the features LLVM would assume for it are checked against
    /proc/cpuinfo.
    """
    from tvm.target import codegen

    spec: dict[str, Any] = {"kind": "llvm", "num-cores": physical_cores()}
    cpu = str(codegen.llvm_get_system_cpu())
    triple = str(codegen.llvm_get_system_triple())
    if cpu and cpu != "generic" and codegen.llvm_is_valid_cpu(cpu, triple):
        spec["mcpu"] = cpu
        hidden = _features_missing_on_host(spec)
        if hidden:
            spec["mattr"] = [f"-{feature}" for feature in hidden]
    return spec


def _features_missing_on_host(spec: dict[str, Any]) -> list[str]:
    """x86 ISA features implied by ``spec["mcpu"]`` that /proc/cpuinfo does not list."""
    import tvm
    from tvm.target import codegen

    flags = _cpuinfo_flags()
    if not flags or "avx" not in flags and "sse2" not in flags:
        return []  # not x86, or no /proc/cpuinfo: trust LLVM's host detection
    implied = codegen.llvm_get_cpu_features(tvm.target.Target(spec))
    return sorted(f for f, flag in _X86_ISA_FLAGS.items() if f in implied and flag not in flags)


def _cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def configure_threads() -> None:
    """Give TVM's thread pool one thread per physical core, unless ``TVM_NUM_THREADS`` is set.

    Left to itself, TVM 0.27 on a VM without cpufreq data starts ONE thread and pins the
    calling thread, and with it every later runtime in the process (PyTorch, ONNX Runtime),
    to core 0. The variable is read when the pool starts and inherited by the tuning workers,
    so it must be set before the first TVM kernel runs.
    """
    os.environ.setdefault("TVM_NUM_THREADS", str(physical_cores()))


def physical_cores() -> int:
    """Physical cores this process may use (TVM's thread pool uses one thread per core)."""
    import psutil

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    physical = psutil.cpu_count(logical=False) or usable or 1
    return max(1, min(physical, usable or physical))


def cuda_target_spec() -> dict[str, Any]:
    """A ``cuda`` target dict from the properties of GPU 0.

    Raises:
        CompileFailed: TVM was built without CUDA or sees no CUDA device.
    """
    import tvm

    if not tvm.runtime.enabled("cuda"):
        raise CompileFailed(
            "TVM target cuda: this TVM build has no CUDA support (tvm.runtime.enabled('cuda') "
            "is False); install a CUDA-enabled apache-tvm build"
        )
    dev = tvm.cuda(0)
    if not dev.exist:
        raise CompileFailed("TVM target cuda: no CUDA device visible (tvm.cuda(0).exist is False)")
    major, minor = str(dev.compute_version).split(".")[:2]
    return {
        "kind": "cuda",
        "arch": f"sm_{major}{minor}",
        "max_threads_per_block": int(dev.max_threads_per_block),
        "max_shared_memory_per_block": int(dev.max_shared_memory_per_block),
        "thread_warp_size": int(dev.warp_size),
    }


def _is_gpu(target: Any) -> bool:
    return target.kind.name == "cuda"


# --------------------------------------------------------------------------- import


def _import_onnx(path: Path, input_name: str, shape: tuple[int, ...]) -> tuple[Any, list[Any]]:
    """The Relax module at a static ``shape`` and its weights, kept as separate inputs."""
    import onnx
    from tvm.relax.frontend import detach_params
    from tvm.relax.frontend.onnx import from_onnx

    proto = onnx.load(str(path))
    graph_inputs = [i.name for i in proto.graph.input]
    name = input_name if input_name in graph_inputs else graph_inputs[0]
    mod = from_onnx(proto, shape_dict={name: list(shape)}, keep_params_in_input=True)
    mod, params = detach_params(mod)
    return mod, list(params.get("main", []))


# --------------------------------------------------------------------------- tune and build


@dataclass
class TuningReport:
    """What the tuning did; the engine exposes it as runtime settings."""

    tuned: bool = False
    trials_used: int = 0
    tuning_seconds: float = 0.0
    tasks: int = 0
    tasks_tuned: int = 0
    database_reused: bool = False
    stop_reason: str = "untuned"
    database_dir: Path | None = None


@dataclass
class BuildResult:
    executable: Any
    target: Any
    report: TuningReport
    transform_params: bool
    opt_level: int
    #: the linked ``model.so`` the executable was loaded from
    library_file: Path | None = None


def _tune_and_build(
    model: Any, mod: Any, target: Any, flags: dict[str, Any], ctx: CompileContext
) -> BuildResult:
    import tvm

    work = Path(tempfile.mkdtemp(prefix="tvm-", dir=_ensure_dir(ctx.workdir)))
    database_dir = work / DATABASE_DIR
    cache_dir = _cache_dir_for(model, target, flags, ctx)
    reused = _seed_database(database_dir, flags.get("database"), cache_dir)
    with tvm.transform.PassContext(opt_level=flags["opt_level"]):
        fused = _fuse(mod, target)
        report = _tune(fused, target, flags, work, database_dir, reused)
        lowered, applied = _apply_database(fused, target, database_dir)
        report.tuned = applied > 0
        executable = tvm.compile(lowered, target=target)
    # link once: the VM would link a temporary copy itself, and save() a second one
    library_file = work / LIBRARY_FILE
    executable.export_library(str(library_file))
    if report.trials_used and cache_dir is not None:
        _store_in_cache(database_dir, cache_dir)
    report.database_dir = database_dir
    return BuildResult(
        executable=tvm.runtime.load_module(str(library_file)),
        target=target,
        report=report,
        transform_params=not _is_gpu(target),
        opt_level=flags["opt_level"],
        library_file=library_file,
    )


def _ensure_dir(path: Path) -> str:
    Path(path).mkdir(parents=True, exist_ok=True)
    return str(path)


def _fuse(mod: Any, target: Any) -> Any:
    """Legalize and fuse the graph into the TIR functions MetaSchedule tunes (the first half of
    ``relax.pipeline.static_shape_tuning_pipeline``)."""
    import tvm
    from tvm import relax

    passes = [
        relax.transform.DecomposeOpsForInference(),
        relax.transform.CanonicalizeBindings(),
        relax.pipeline.zero_pipeline(),
    ]
    if not _is_gpu(target):
        # weights are marked layout-free so tuned kernels may pre-pack them (done once at load)
        passes.append(relax.transform.AttachAttrLayoutFreeBuffers())
    with target:
        return tvm.transform.Sequential(passes)(mod)


def _apply_database(mod: Any, target: Any, database_dir: Path) -> tuple[Any, int]:
    """Apply the tuned schedules; the rest keeps TVM's default lowering. Returns the module
    and the number of TIR functions that got a tuned schedule."""
    import tvm
    from tvm import relax

    database = _open_database(database_dir)
    with target, database:
        mod = relax.transform.MetaScheduleApplyDatabase()(mod)
    applied = sum(
        1
        for func in mod.functions.values()
        if func.attrs is not None and bool(func.attrs.get("tirx.is_scheduled", False))
    )
    with target:
        if _is_gpu(target):
            from tvm.s_tir import dlight as dl

            # GPU kernels must bind threads: dlight schedules whatever tuning did not cover
            mod = dl.ApplyDefaultSchedule(
                dl.gpu.Matmul(),
                dl.gpu.GEMV(),
                dl.gpu.Reduction(),
                dl.gpu.GeneralReduction(),
                dl.gpu.Fallback(),
            )(mod)
        else:
            mod = tvm.transform.Sequential(
                [
                    relax.transform.SplitLayoutRewritePreproc(),
                    relax.transform.LiftTransformParams(),
                    relax.transform.FoldConstant(),
                ]
            )(mod)
    return mod, applied


def _open_database(database_dir: Path) -> Any:
    from tvm.s_tir import meta_schedule as ms

    database_dir.mkdir(parents=True, exist_ok=True)
    return ms.database.JSONDatabase(
        path_workload=str(database_dir / WORKLOAD_FILE),
        path_tuning_record=str(database_dir / RECORD_FILE),
        allow_missing=True,
    )


# --------------------------------------------------------------------------- database reuse


def _has_database(directory: Path) -> bool:
    return (directory / WORKLOAD_FILE).is_file() and (directory / RECORD_FILE).is_file()


def database_source(given: str | None) -> Path | None:
    """The database directory the ``database`` flag names (a saved engine directory works too).

    Raises:
        NgraphError: the directory holds no MetaSchedule JSON database.
    """
    if not given:
        return None
    source = Path(given).expanduser()
    if (source / DATABASE_DIR).is_dir() and not _has_database(source):
        source = source / DATABASE_DIR
    if not _has_database(source):
        raise NgraphError(
            f"compiler 'tvm': database={given!r} has no {WORKLOAD_FILE} and {RECORD_FILE}"
        )
    return source


def _seed_database(database_dir: Path, given: str | None, cache_dir: Path | None) -> str:
    """Copy an existing database into the work dir. Returns "flag", "cache" or ""."""
    database_dir.mkdir(parents=True, exist_ok=True)
    source = database_source(given)
    if source is not None:
        _copy_database(source, database_dir)
        log.info("TVM: reusing the tuning database %s", source)
        return "flag"
    if cache_dir is not None and _has_database(cache_dir):
        _copy_database(cache_dir, database_dir)
        log.info("TVM: tuning database cache hit %s", cache_dir)
        return "cache"
    return ""


def _copy_database(source: Path, destination: Path) -> None:
    for name in (WORKLOAD_FILE, RECORD_FILE):
        shutil.copyfile(source / name, destination / name)


def _cache_dir_for(
    model: Any, target: Any, flags: dict[str, Any], ctx: CompileContext
) -> Path | None:
    """Where the database of exactly this tuning (model, target, batch, budget) is cached."""
    if not flags["trials"] or not getattr(model, "content_hash", ""):
        return None
    import tvm

    key = {
        "version": CACHE_VERSION,
        "tvm": tvm.__version__,
        "model": model.content_hash,
        "target": str(target),
        "batch": ctx.batch_size,
        **{k: flags[k] for k in ("trials", "trials_per_task", "early_stopping", "timeout")},
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return Path(ctx.cache_dir) / "tvm-tuning" / digest


def _store_in_cache(database_dir: Path, cache_dir: Path) -> None:
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache_dir.parent, prefix=".tmp-"))
    try:
        _copy_database(database_dir, tmp)
        if cache_dir.exists():
            shutil.rmtree(cache_dir, ignore_errors=True)
        os.replace(tmp, cache_dir)
    except OSError as exc:  # a cache that cannot be written only costs a re-tune later
        log.warning("TVM: could not cache the tuning database in %s: %s", cache_dir, exc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- tuning


def _tune(
    mod: Any,
    target: Any,
    flags: dict[str, Any],
    work: Path,
    database_dir: Path,
    reused: str,
) -> TuningReport:
    """Tune the tasks of ``mod`` the database does not cover yet, within the budget."""
    from tvm.s_tir import meta_schedule as ms

    start = time.perf_counter()
    database = _open_database(database_dir)
    tasks = ms.relax_integration.extract_tasks(mod, target)
    todo = [t for t in tasks if not _covered(database, t, target)]
    report = TuningReport(tasks=len(tasks), database_reused=bool(reused))
    if reused == "cache":
        todo = []  # the cached database is the result of exactly this budget: never re-tune
    if not flags["trials"] or not todo:
        report.stop_reason = "database" if reused else "untuned"
        report.tuning_seconds = time.perf_counter() - start
        log.info(
            "TVM: %d of %d tasks to tune; tuning skipped (%s)",
            len(todo),
            len(tasks),
            report.stop_reason,
        )
        return report
    monitor = _run_tuning(todo, target, flags, work, database, start)
    report.trials_used = monitor.trials
    report.tasks_tuned = monitor.tasks_measured()
    report.stop_reason = monitor.stop_reason()
    report.tuning_seconds = time.perf_counter() - start
    return report


def _covered(database: Any, task: Any, target: Any) -> bool:
    mod = task.dispatched[0]
    if not database.has_workload(mod):
        return False
    return database.query_tuning_record(mod, target, task.task_name) is not None


def _run_tuning(
    tasks: list[Any], target: Any, flags: dict[str, Any], work: Path, database: Any, start: float
) -> _TuningMonitor:
    from tvm.s_tir import meta_schedule as ms

    builder, runner = shared_measurers()  # first: the build workers boot during the search
    budget = flags["trials"]
    per_task = flags["trials_per_task"] or budget
    per_round = max(1, min(MAX_TRIALS_PER_ROUND, per_task, budget // len(tasks)))
    cost_model = _make_cost_model()
    search = _search_settings(budget, per_task, per_round, cost_model.num_warmup_samples)
    deadline = start + flags["timeout"] if flags["timeout"] else None
    monitor = _TuningMonitor(budget, len(tasks), flags["early_stopping"], deadline, start)
    strategy = _make_stopping_strategy(ms.search_strategy.EvolutionarySearch(**search), monitor)
    _register_tensor_intrinsics(target)
    _quiet_metaschedule_logs()
    contexts, weights = _tune_contexts(tasks, strategy, work)
    log.info(
        "TVM: tuning %d tasks on %s: %d trials (%d per task, %d per round, search %s)",
        len(tasks),
        target.kind.name,
        budget,
        per_task,
        per_round,
        search,
    )
    try:
        ms.tune_tasks(
            tasks=contexts,
            task_weights=weights,
            work_dir=str(work),
            max_trials_global=budget,
            max_trials_per_task=per_task,
            num_trials_per_iter=per_round,
            builder=builder,
            runner=runner,
            database=database,
            cost_model=cost_model,
            measure_callbacks="default",
            task_scheduler="gradient",
        )
    finally:
        for index in range(len(contexts)):  # close the per-task log files
            for handler in logging.getLogger(f"{__name__}.task{index}").handlers:
                handler.close()
    return monitor


def _tune_contexts(tasks: list[Any], strategy: Any, work: Path) -> tuple[list[Any], list[float]]:
    """One TuneContext per task, as ``relax_integration.extracted_tasks_to_tune_contexts``
    builds them, but logging to files under ``work/logs`` through our own loggers: TVM's
    helper reconfigures the process's logging with ``dictConfig`` (closing every handler) and
    fails on its second call in a process when a handler has no name."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.utils import fork_seed

    contexts, weights = [], []
    seeds = fork_seed(SEARCH_SEED, n=len(tasks))
    for index, (task, seed) in enumerate(zip(tasks, seeds, strict=True)):
        context = ms.TuneContext(
            mod=task.dispatched[0],
            target=task.target,
            space_generator="post-order-apply",
            search_strategy=strategy,
            task_name=task.task_name,
            logger=_task_logger(work, index, task.task_name),
            rand_state=seed,
            num_threads="physical",
        )
        contexts.append(context.clone())
        weights.append(float(task.weight))
    return contexts, weights


def _task_logger(work: Path, index: int, name: str) -> logging.Logger:
    """A DEBUG file logger for MetaSchedule's per-task log (design spaces, failed builds)."""
    (work / "logs").mkdir(parents=True, exist_ok=True)
    task_log = logging.getLogger(f"{__name__}.task{index}")
    for handler in list(task_log.handlers):  # the previous compile's file
        task_log.removeHandler(handler)
        handler.close()
    handler = logging.FileHandler(work / "logs" / f"task_{index}_{name}.log", delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s"))
    task_log.addHandler(handler)
    task_log.setLevel(logging.DEBUG)
    task_log.propagate = False
    return task_log


def _search_settings(
    budget: int, per_task: int, per_round: int, warmup_samples: int
) -> dict[str, int]:
    """Evolutionary-search settings for a budget.

    MetaSchedule's XGBoost model scores candidates only once it has seen ``warmup_samples``
    measurements (100); before that its scores are random numbers, so the genetic iterations
    (mutate the population 4 times, rescore, keep the best) only reshuffle random picks. A budget
    below that count never reaches a trained model, so it gets a plain random search: sample
    about twice what a round measures and skip the genetic iterations. Larger budgets keep
    MetaSchedule's evolutionary search with a population sized to the per-task budget.
    """
    if budget < warmup_samples:
        population = max(MIN_RANDOM_POPULATION, RANDOM_POPULATION_PER_CANDIDATE * per_round)
        return {
            "population_size": population,
            "init_min_unmeasured": min(population, per_round),
            "genetic_num_iters": 0,
        }
    population = min(MAX_POPULATION, max(MIN_POPULATION, POPULATION_PER_TRIAL * per_task))
    return {"population_size": population}


def _make_cost_model() -> Any:
    """MetaSchedule's XGBoost cost model, minus its training before the warm-up count.

    TVM retrains the model after every round, but ``predict`` returns random scores until the
    model has ``num_warmup_samples`` measurements, so those trainings (seconds each on 2 cores)
    are wasted: this subclass only stores the measurements until then.
    """
    import sys

    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.cost_model import XGBModel

    @derived_object
    class WarmupAwareXGBModel(XGBModel._cls):  # the class under TVM's decorator
        def update(self, context: Any, candidates: list[Any], results: list[Any]) -> None:
            if self.data_size + len(candidates) >= self.num_warmup_samples:
                super().update(context, candidates, results)
                return
            saved = self.adaptive_training, self.last_train_size
            # XGBModel.update stores the data, then skips training while the data has grown
            # less than a fifth since the last training: make that skip certain
            self.adaptive_training, self.last_train_size = True, sys.maxsize
            try:
                super().update(context, candidates, results)
            finally:
                self.adaptive_training, self.last_train_size = saved

    return WarmupAwareXGBModel(num_tuning_cores=physical_cores())


def _register_tensor_intrinsics(target: Any) -> None:
    """Register the tensor intrinsics the target's schedule rules can use.

    ``TuneContext`` imports ``tvm.s_tir.tensor_intrin``, whose ``__init__`` parses every CUDA,
    ROCm, Hexagon, Arm and x86 intrinsic: ~28 s on an idle 2-core host, once per process. The
    package is registered here without running that ``__init__`` and only the target's own
    intrinsic modules are imported (~1 s); any other submodule still imports normally.
    """
    import importlib
    import importlib.util
    import platform
    import sys

    name = "tvm.s_tir.tensor_intrin"
    if name not in sys.modules:
        import tvm.s_tir

        package = importlib.util.module_from_spec(importlib.util.find_spec(name))
        sys.modules[name] = package
        tvm.s_tir.tensor_intrin = package
    machine = platform.machine().lower()
    modules = ["x86"] if machine in ("x86_64", "amd64", "i686") else []
    modules += ["arm_cpu"] if machine in ("aarch64", "arm64") else []
    modules += ["riscv_cpu"] if machine.startswith("riscv") else []
    modules += ["cuda"] if _is_gpu(target) else []
    for module in modules:
        importlib.import_module(f"{name}.{module}")


def _quiet_metaschedule_logs() -> None:
    """MetaSchedule's task scheduler logs a full task table at INFO after every round; our
    monitor logs one line per round instead (the per-task logs go to files under the work
    dir). A level set by the user is left alone."""
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    if ms_logger.level == logging.NOTSET:
        ms_logger.setLevel(logging.WARNING)


class _TuningMonitor:
    """Shared by the search strategies of all tasks: counts trials, logs progress, and says
    when a task should stop (early stopping, wall-clock timeout)."""

    def __init__(
        self,
        budget: int,
        n_tasks: int,
        early_stopping: int | None,
        deadline: float | None,
        start: float,
    ) -> None:
        self.budget = budget
        self.n_tasks = n_tasks
        self.early_stopping = early_stopping
        self.deadline = deadline
        self.start = start
        self.trials = 0
        self.issued = 0
        self.best_s: dict[str, float] = {}
        self.since_best: dict[str, int] = {}
        self.measured: dict[str, int] = {}
        self.early_stopped: set[str] = set()
        self.timed_out = False
        self._lock = threading.Lock()

    def take(self, task: str, candidates: list[Any]) -> list[Any] | None:
        """The part of a round that fits the budget (MetaSchedule checks its global budget
        only between rounds, so its last round can overshoot); ``None`` ends the task."""
        with self._lock:
            room = self.budget - self.issued
            if room <= 0:
                return None
            taken = list(candidates)[:room]
            self.issued += len(taken)
        log.info(
            "TVM tuning: %s: building and measuring %d candidates (%d/%d trials issued)",
            task,
            len(taken),
            self.issued,
            self.budget,
        )
        return taken

    def should_stop(self, task: str) -> bool:
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            if not self.timed_out:
                log.info("TVM: tuning timeout reached after %d trials", self.trials)
            self.timed_out = True
            return True
        if self.early_stopping and self.since_best.get(task, 0) >= self.early_stopping:
            if task not in self.early_stopped:
                log.info(
                    "TVM: %s: no improvement in %d trials, stopping it", task, self.since_best[task]
                )
            self.early_stopped.add(task)
            return True
        return False

    def record(self, task: str, results: list[Any]) -> None:
        with self._lock:
            for result in results:
                self.trials += 1
                self.measured[task] = self.measured.get(task, 0) + 1
                seconds = _median_seconds(result)
                if seconds is not None and seconds < self.best_s.get(task, math.inf):
                    self.best_s[task] = seconds
                    self.since_best[task] = 0
                else:
                    self.since_best[task] = self.since_best.get(task, 0) + 1
        best = self.best_s.get(task)
        log.info(
            "TVM tuning: %s: %d trials, best %s; total %d/%d trials, %d/%d tasks, %.0f s",
            task,
            self.measured[task],
            f"{best * 1e6:.1f} us" if best else "n/a",
            self.trials,
            self.budget,
            len(self.measured),
            self.n_tasks,
            time.perf_counter() - self.start,
        )

    def tasks_measured(self) -> int:
        return len(self.measured)

    def stop_reason(self) -> str:
        if self.timed_out:
            return "timeout"
        if self.early_stopped:
            return "early_stopping" if len(self.early_stopped) == self.n_tasks else "budget"
        return "budget"


def _median_seconds(result: Any) -> float | None:
    if result.error_msg is not None or not result.run_secs:
        return None
    return float(np.median([float(s) for s in result.run_secs]))


def _make_stopping_strategy(inner: Any, monitor: _TuningMonitor) -> Any:
    """An evolutionary search that stops generating candidates when the monitor says so: the
    task scheduler then ends the task itself (terminating a task from a measure callback can
    trip the scheduler's own end-of-tuning checks)."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.search_strategy import PySearchStrategy

    @derived_object
    class StoppingSearch(PySearchStrategy):
        def __init__(self, inner: Any, monitor: _TuningMonitor) -> None:
            self.inner = inner
            self.monitor = monitor
            self.task = "?"

        def _initialize_with_tune_context(self, context: Any) -> None:
            self.task = str(context.task_name)
            self.inner._initialize_with_tune_context(context)

        def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None,
                       cost_model=None) -> None:  # fmt: skip
            self.inner.pre_tuning(
                max_trials, num_trials_per_iter, design_spaces, database, cost_model
            )

        def post_tuning(self) -> None:
            self.inner.post_tuning()

        def generate_measure_candidates(self) -> Any:
            if self.monitor.should_stop(self.task):
                return None
            candidates = self.inner.generate_measure_candidates()
            return None if candidates is None else self.monitor.take(self.task, candidates)

        def notify_runner_results(self, measure_candidates: Any, results: Any) -> None:
            self.inner.notify_runner_results(measure_candidates, results)
            self.monitor.record(self.task, list(results))

        def clone(self) -> Any:
            return StoppingSearch(self.inner.clone(), self.monitor)

    return StoppingSearch(inner, monitor)


# --------------------------------------------------------------------------- measurers


_MEASURERS: Future | None = None
_MEASURERS_LOCK = threading.Lock()


def prestart_measurers() -> None:
    """Start the shared builder and runner in the background (see :func:`shared_measurers`),
    so that their workers import TVM while the model is exported, imported and fused."""
    global _MEASURERS
    with _MEASURERS_LOCK:
        if _MEASURERS is None:
            starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tvm-measurers")
            _MEASURERS = starter.submit(_start_measurers)
            starter.shutdown(wait=False)
            atexit.register(_shutdown_measurers)


def shared_measurers() -> tuple[Any, Any]:
    """The builder and runner shared by every tuning in this process.

    Their worker processes start once (each imports TVM: seconds) and stay warm between
    rounds and between compiles; they are shut down at exit.
    """
    prestart_measurers()
    assert _MEASURERS is not None
    return _MEASURERS.result()


def _start_measurers() -> tuple[Any, Any]:
    from tvm.s_tir import meta_schedule as ms

    _quiet_metaschedule_logs()
    builder = _make_pooled_builder()
    # TVM's LocalRunner already keeps one warm worker; it measures one candidate at a time
    runner = ms.runner.LocalRunner(timeout_sec=RUN_TIMEOUT_S)
    return builder, runner


def _shutdown_measurers() -> None:
    global _MEASURERS
    if _MEASURERS is None:
        return
    try:
        builder, runner = _MEASURERS.result()
    except Exception:  # noqa: BLE001 - they never started; nothing to stop
        return
    finally:
        _MEASURERS = None
    for pool in (getattr(builder, "pool", None), getattr(runner, "pool", None)):
        if pool is not None:
            try:
                pool.shutdown(wait=False)
            except Exception:  # noqa: BLE001 - shutting down at exit, nothing left to do
                pass


def _make_pooled_builder() -> Any:
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

    @derived_object
    class PooledBuilder(PyBuilder):
        """Builds candidates in a pool of worker processes that lives as long as the builder
        (TVM's ``LocalBuilder`` starts a new pool for every batch of candidates)."""

        def __init__(self) -> None:
            super().__init__()
            workers = os.cpu_count() or 1  # building is CPU-bound: one per logical CPU
            self.pool = PopenPoolExecutor(
                max_workers=workers,
                timeout=BUILD_TIMEOUT_S,
                initializer=_warm_build_worker,
                maximum_process_uses=WORKER_MAX_USES,
            )
            # start the workers now (not awaited): they import TVM while the search runs
            for _ in range(workers):
                self.pool.submit(_warm_build_worker)

        def build(self, build_inputs: list[Any]) -> list[Any]:
            jobs = [(inp.mod, inp.target) for inp in build_inputs]
            results = []
            for outcome in self.pool.map_with_error_catching(_build_in_worker, jobs):
                if outcome.status == StatusKind.COMPLETE:
                    results.append(BuilderResult(outcome.value, None))
                elif outcome.status == StatusKind.TIMEOUT:
                    message = f"build timed out after {BUILD_TIMEOUT_S} s"
                    results.append(BuilderResult(None, message))
                else:
                    results.append(BuilderResult(None, f"build failed: {outcome.value}"))
            return results

    return PooledBuilder()


def _warm_build_worker() -> None:
    """Runs once in every build worker: the imports a build needs, outside the build timeout."""
    import tvm.driver  # noqa: F401
    import tvm.s_tir.transform  # noqa: F401


def _build_in_worker(job: tuple[Any, Any]) -> str:
    """Build one scheduled candidate into a shared library in its own temporary directory.

    Same as MetaSchedule's ``default_build`` + ``default_export`` minus their
    ``import tvm.s_tir.tensor_intrin`` (~28 s in every fresh worker), and linked here rather
    than in the runner so that linking runs in parallel.
    """
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod, target = job
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    library = tvm_build(mod, target=target)
    path = os.path.join(tempfile.mkdtemp(prefix="tvm-candidate-"), "candidate.so")
    library.export_library(path)
    return path


# --------------------------------------------------------------------------- engine


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
        while not hasattr(out, "numpy"):
            out = out[0]
        return np.asarray(out.numpy(), dtype=np.float32)

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
        if source is not None and _has_database(source):
            (directory / DATABASE_DIR).mkdir(exist_ok=True)
            if source.resolve() != (directory / DATABASE_DIR).resolve():
                _copy_database(source, directory / DATABASE_DIR)
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
        database_dir=database if _has_database(database) else None,
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    # TVM errors end with the one-line message after a long traceback
    return (lines[-1] if lines else repr(exc))[:500]
