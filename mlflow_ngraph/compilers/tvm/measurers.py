"""The builder and runner pools MetaSchedule measures candidates with, started once per
process (in the background while the model is exported)."""

from __future__ import annotations

import atexit
import logging
import os
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from mlflow_ngraph.compilers.tvm.settings import BUILD_TIMEOUT_S, RUN_TIMEOUT_S, WORKER_MAX_USES

log = logging.getLogger(__name__)

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

    quiet_metaschedule_logs()
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
    except Exception as exc:  # noqa: BLE001 - they never started; nothing to stop
        log.debug("TVM's measurers never started (%s): nothing to stop", exc)
        return
    finally:
        _MEASURERS = None
    for pool in (getattr(builder, "pool", None), getattr(runner, "pool", None)):
        if pool is not None:
            try:
                pool.shutdown(wait=False)
            except Exception as exc:  # noqa: BLE001 - shutting down at exit, nothing left to do
                log.debug("a TVM measurer pool did not shut down: %s", exc)


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


def quiet_metaschedule_logs() -> None:
    """MetaSchedule's task scheduler logs a full task table at INFO after every round; our
    monitor logs one line per round instead (the per-task logs go to files under the work
    dir). A level set by the user is left alone."""
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    if ms_logger.level == logging.NOTSET:
        ms_logger.setLevel(logging.WARNING)
