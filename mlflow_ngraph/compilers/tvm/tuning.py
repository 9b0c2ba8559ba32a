"""MetaSchedule tuning within a trial budget: the task contexts, the search, the cost model,
the stopping rule and what TVM is patched with."""

from __future__ import annotations

import functools
import importlib
import logging
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlflow_ngraph.compilers.tvm.database import open_database
from mlflow_ngraph.compilers.tvm.measurers import quiet_metaschedule_logs, shared_measurers
from mlflow_ngraph.compilers.tvm.settings import (
    MAX_POPULATION,
    MAX_TRIALS_PER_ROUND,
    MIN_POPULATION,
    MIN_RANDOM_POPULATION,
    POPULATION_PER_TRIAL,
    RANDOM_POPULATION_PER_CANDIDATE,
    SEARCH_SEED,
)
from mlflow_ngraph.compilers.tvm.target import is_gpu, physical_cores
from mlflow_ngraph.errors import CompileFailed

log = logging.getLogger(__name__)


#: TVM releases whose internals the tuning reaches into: the tensor-intrinsic package
#: registered without its ``__init__``, a search strategy wrapping MetaSchedule's (through
#: its private ``_initialize_with_tune_context``) and a build that replicates
#: ``default_build`` without its intrinsic import. Written against apache-tvm 0.27.0.post1.
TESTED_TVM = ("0.27",)
#: (module, attribute) each of those relies on
TVM_INTERNALS = (
    ("tvm.s_tir.meta_schedule.search_strategy", "PySearchStrategy"),
    ("tvm.s_tir.meta_schedule.search_strategy", "EvolutionarySearch"),
    ("tvm.ir.utils", "derived_object"),
    ("tvm.driver", "build"),
    ("tvm.s_tir.transform", "RemoveWeightLayoutRewriteBlock"),
)


@functools.cache
def check_tvm_internals() -> None:
    """Warn once on an untested TVM release; fail with one line when an internal the tuning
    patches or wraps is gone (an untuned build, ``trials=0``, needs none of them)."""
    import tvm

    version = str(tvm.__version__)
    if not version.startswith(TESTED_TVM):
        log.warning(
            "TVM %s is untested here (tested: %s): the tuning reaches into TVM internals; "
            "if tuning fails, pin apache-tvm %s or build untuned with trials=0",
            version,
            ", ".join(TESTED_TVM),
            TESTED_TVM[0],
        )
    for module, attribute in TVM_INTERNALS:
        try:
            present = hasattr(importlib.import_module(module), attribute)
        except ImportError:
            present = False
        if not present:
            raise CompileFailed(
                f"TVM {version} has no {module}.{attribute}, which the tuning relies on "
                f"(tested with TVM {', '.join(TESTED_TVM)}): pin apache-tvm "
                f"{TESTED_TVM[0]} or build untuned with trials=0"
            )
    strategy = importlib.import_module(TVM_INTERNALS[0][0]).EvolutionarySearch
    if not hasattr(strategy, "_initialize_with_tune_context"):
        raise CompileFailed(
            f"TVM {version}'s search strategies have no _initialize_with_tune_context, which "
            "the tuning's stopping rule wraps: pin apache-tvm "
            f"{TESTED_TVM[0]} or build untuned with trials=0"
        )


def run_tuning(
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
    database = open_database(database_dir)
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
    check_tvm_internals()
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
    quiet_metaschedule_logs()
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
    modules += ["cuda"] if is_gpu(target) else []
    for module in modules:
        importlib.import_module(f"{name}.{module}")


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
