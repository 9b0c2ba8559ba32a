"""One model x compiler cell under LoadGen, in the cell's own worker process: the model
built, the engine from the engine supply (the one ``benchmark`` builds and caches, for the
scenario's compile profile), its outputs checked against eager's, then each scenario run by
the real LoadGen. Events go back to the command over a pipe; nothing here writes MLflow."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow_ngraph.loadgen.search import ServerSearch
from mlflow_ngraph.loadgen.settings import QSL_SAMPLES, SCENARIOS, LoadgenSettings
from mlflow_ngraph.loadgen.summary import ScenarioResult

log = logging.getLogger(__name__)

Emit = Callable[[str, Any], None]

#: the Server search starts at this share of the rate the engine kept with every slot busy
#: (a Poisson arrival at its full capacity queues without bound)
SERVER_START = 0.8
#: the Server search goes no lower than the rate that keeps one request slot busy this share
#: of the time (queries then rarely queue: the p99 is the engine's own latency)
IDLE_SHARE = 0.1


@dataclass
class LoadgenTask:
    """What a cell's worker needs: plain, picklable data."""

    name: str
    model_name: str
    model_params: dict[str, Any]
    compiler: str
    flags: dict[str, Any]
    device: str
    device_kind: str
    home: str
    settings: LoadgenSettings
    scenarios: list[str]  # the pending ones, in order
    outdir: str  # LoadGen's logs, one folder per scenario
    tolerance: float = 1e-3
    math: str = "fp32"
    extra: dict[str, Any] = field(default_factory=dict)


def batch_of(scenario: str, settings: LoadgenSettings) -> int:
    """The engine's batch size for a scenario: SingleStream's queries are one sample."""
    return 1 if scenario == "singlestream" else settings.max_batch


def run_cell(task: LoadgenTask, emit: Emit) -> None:
    """Every pending scenario of ``task``; a scenario that fails is a ``failed`` event and
    the others go on."""
    from mlflow_ngraph.run.worker import load_cell_model, model_info, one_line

    try:
        model = load_cell_model(task.model_name, task.model_params)
        emit("model", model_info(model))
    except Exception as exc:  # the model cannot be had: every scenario fails with it
        for scenario in task.scenarios:
            emit("failed", (scenario, one_line(exc)))
        return
    runners: dict[tuple[str, int], Any] = {}
    for scenario in task.scenarios:
        try:
            key = (SCENARIOS[scenario][1], batch_of(scenario, task.settings))
            if key not in runners:
                runners.clear()  # one engine at a time in memory
                runners[key] = _runner(task, model, *key, emit)
            runner, pace = runners[key]
            result = _run(task, scenario, runner, pace, emit)
        except Exception as exc:  # noqa: BLE001 - one scenario's failure is its reason
            emit("failed", (scenario, one_line(exc)))
            continue
        emit("result", (scenario, result.to_dict()))


def _runner(task: LoadgenTask, model, profile: str, batch: int, emit: Emit):
    """(the runner, its pace) for a compile profile and batch size: the served model over
    HTTP, or the engine from the supply with its output check."""
    from mlflow_ngraph.loadgen.runners import EngineRunner, HttpRunner
    from mlflow_ngraph.loadgen.sut import calibrate

    if task.settings.url:
        runner = HttpRunner(task.settings.url, model.random_input(QSL_SAMPLES), batch)
        runner.check()
        emit("engine", {"batch": batch, "profile": "served", "metrics": {}, "runtime": {}})
    else:
        runner = EngineRunner(
            _engine(task, model, profile, batch, emit), model.random_input(batch), batch
        )
    pace = calibrate(runner)
    log.info("%s %s bs%d: %.2f ms a batch alone, %.1f samples/s with %d slot(s)",
             task.name, profile, batch, 1000 * pace[0], pace[1], runner.slots)  # fmt: skip
    return runner, pace


def _engine(task: LoadgenTask, model, profile: str, batch: int, emit: Emit):
    """The cached (or compiled) engine, checked against the reference outputs."""
    from mlflow_ngraph.compilers.registry import get_compiler
    from mlflow_ngraph.errors import NgraphError
    from mlflow_ngraph.run.supply import EngineSupply
    from mlflow_ngraph.run.worker import compare_outputs, reference_outputs

    compiler = get_compiler(task.compiler)
    supply = EngineSupply(task.home, task.device, task.device_kind, profile, task.math)
    got = supply.get(compiler, task.flags, model, batch, task.name)
    x_ref, y_ref, _ = reference_outputs(model, supply, batch)
    check = compare_outputs(got.engine.outputs(x_ref), y_ref, task.tolerance)
    metrics = {"compile_s": got.compile_s, "cache_hit": float(got.cache_hit), **check.metrics()}
    runtime = {k: str(v) for k, v in got.engine.runtime_settings().items()}
    runtime["parallel_requests"] = str(got.engine.parallel_requests)
    emit("engine", {"batch": batch, "profile": profile, "metrics": metrics, "runtime": runtime})
    if not check.valid:
        got.engine.close()
        raise NgraphError(f"the engine's outputs fail the check: {check.reason}")
    return got.engine


def _run(task: LoadgenTask, scenario: str, runner, pace, emit: Emit) -> ScenarioResult:
    from mlflow_ngraph.loadgen.sut import run_scenario

    outdir = Path(task.outdir) / scenario
    if scenario == "server":
        return server_search(task, runner, pace, outdir)
    result = run_scenario(runner, scenario, task.settings, outdir, pace)
    result.details["logs"] = str(outdir)
    return result


def server_search(task: LoadgenTask, runner, pace, outdir: Path) -> ScenarioResult:
    """The Server scenario: LoadGen runs at rising and bisected target rates
    (:class:`ServerSearch`); the result is the highest rate that held, its logs the run's."""
    from mlflow_ngraph.loadgen.sut import run_scenario

    # below IDLE_SHARE / latency, queries rarely queue: p99 is the engine's own
    floor = IDLE_SHARE / max(pace[0], 1e-6) * runner.batch
    search = ServerSearch(
        max(pace[1] * SERVER_START, 1.0), task.settings.server_steps, floor_qps=floor
    )
    best, best_qps, last, steps = None, 0.0, None, []
    while (qps := search.next_qps()) is not None:
        step_dir = outdir / f"step{len(search.done) + 1}"
        result = run_scenario(runner, "server", task.settings, step_dir, pace, qps)
        result.details["logs"] = str(step_dir)
        search.report(qps, result.valid, too_short(result))
        p99 = result.figures.get("server.p99_ms")
        steps.append({"qps": round(qps, 3), "valid": result.valid, "p99_ms": p99,
                      "reason": result.reason})  # fmt: skip
        log.info("%s server at %.1f QPS: %s, p99 %.2f ms", task.name, qps, result.validity,
                 result.figures.get("server.p99_ms", float("nan")))  # fmt: skip
        last = result
        if result.valid and qps > best_qps:
            best, best_qps = result, qps
            best.figures["server.target_qps"] = qps
    chosen = best or last
    chosen.figures["server.search_steps"] = float(len(steps))
    chosen.details["search"] = steps
    chosen.details["search_stop"] = search.stop_reason
    if best is None and search.done[-1].too_short:
        chosen.reason = search.stop_reason  # the one thing to change: the duration
    elif best is None:
        chosen.reason = f"no target rate held ({chosen.reason}); {search.stop_reason}"
    return chosen


def too_short(result: ScenarioResult) -> int | None:
    """The queries LoadGen's early stopping asked for when a Server run held its latency
    bound but was INVALID for too few queries (a longer run, not a lower rate, is needed)."""
    from mlflow_ngraph.loadgen.summary import queries_needed

    d = result.details
    if result.valid or d.get("result_perf_constraints_met") is not True:
        return None
    return queries_needed(d)


# --- the worker process -------------------------------------------------------------------
class _Forward(logging.Handler):
    def __init__(self, conn) -> None:
        super().__init__(logging.INFO)
        self.conn = conn

    def emit(self, record: logging.LogRecord) -> None:
        self.conn.send(("log", (record.levelno, record.getMessage(), record.name)))


def worker_main(task: LoadgenTask, conn) -> None:
    """The cell's worker: its log records and events to the command, then ``done``."""
    from mlflow_ngraph.run.template import die_with_parent

    die_with_parent(task.extra.get("parent"))  # a killed command takes its worker along
    _output_to(worker_log(task))  # the runtimes' native warnings, a crash's traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the command's to handle
    root = logging.getLogger("mlflow_ngraph")
    root.handlers[:] = [_Forward(conn)]
    root.setLevel(logging.INFO)
    root.propagate = False

    def emit(kind: str, payload: Any) -> None:
        conn.send((kind, payload))

    run_cell(task, emit)
    conn.send(("done", None))
    conn.close()


def worker_log(task: LoadgenTask) -> str:
    """The file the cell's worker writes its stdout and stderr to (beside LoadGen's logs)."""
    return os.path.join(task.outdir, "worker.log")


def _output_to(path: str) -> None:
    """This process's stdout and stderr (file descriptors 1 and 2) appended to ``path``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def in_worker(task: LoadgenTask, on_event: Emit) -> str | None:
    """Run ``task`` in a spawned worker process, every event to ``on_event``. Returns why
    the worker ended before ``done`` (killed, crashed), else None."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    process = ctx.Process(target=worker_main, args=(task, theirs), daemon=True)
    process.start()
    theirs.close()
    try:
        while True:
            try:
                kind, payload = ours.recv()
            except (EOFError, OSError):
                process.join(timeout=10)
                return (
                    f"the worker ended (exit code {process.exitcode}) before finishing; "
                    f"its output: {worker_log(task)}"
                )
            if kind == "done":
                process.join(timeout=30)
                return None
            on_event(kind, payload)
    finally:
        if process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
            process.join(timeout=10)
