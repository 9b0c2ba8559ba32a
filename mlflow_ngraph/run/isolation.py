"""Each cell in its own process, the cells of a model measured together.

A worker process runs :func:`~mlflow_ngraph.run.worker.measure_cell` for one cell and streams
its events back through a pipe. The worker shares nothing with the runner or with other
cells (thread pools, allocator state, peak RSS). A worker that dies (a segfault, an abort,
the kernel's OOM killer) or runs past its time limit ends with a reason naming the signal or
the limit; what it had already sent (batch sizes measured before the crash) is kept. Its
stdout and stderr (third-party chatter) go to a log file, and the package's log records are
forwarded to the runner.

:func:`run_group` keeps the workers of one model's cells alive at once, each holding its
engine warm, so that their engines can be measured interleaved, window by window
(:mod:`mlflow_ngraph.measure.rounds`): the group's coordinator (this module, in the runner's
process) lets every worker prepare a batch size at the same time, then, with all of them
idle, has each warm up and run its windows in turn. Nothing runs beside a window but the
window's own engine.

A worker is forked from a template process that imported PyTorch, NumPy, SciPy and the
measuring modules once per run (:mod:`mlflow_ngraph.run.template`; a spawned interpreter took
2-8 s of a core for them, at every cell). What a cell still costs before its task, its
compiler's runtime and its model library, is done ahead: the next model's workers are
started while the current model's run, as spares that import their cell's compiler modules
and model library and build its model (:class:`Ahead`); then they wait for their task. Their
work must never compete with a measurement: the spares are stopped (SIGSTOP) while the group
measures and continued (SIGCONT) after. A worker that has sent its cell's last event is
killed with its children rather than left to exit: the teardown of PyTorch and the runtimes
takes seconds on a loaded host and has nothing left to give.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlflow_ngraph.console import DETAIL
from mlflow_ngraph.measure.memory import keep_freed_memory
from mlflow_ngraph.run import template
from mlflow_ngraph.run.template import PRELOAD
from mlflow_ngraph.run.worker import CellTask, baseline_move
from mlflow_ngraph.tracking import schema as S

log = logging.getLogger("mlflow_ngraph.run.worker")


@dataclass
class Ahead:
    """The cell a spare will most likely get: it imports the compiler's modules and builds
    the model (what the cell's own first steps would do) before the task comes. A task for
    another cell only finds that work unused."""

    model_name: str
    compiler: str
    model_params: dict[str, Any] = field(default_factory=dict)


#: warning categories and words that bear on the validity of a result (counted per cell)
VALIDITY_WORDS = ("precision", "fallback", "fall back", "tracer", "fp16", "bf16")


class _Spare:
    """A worker forked from the template (:mod:`mlflow_ngraph.run.template`), which imported
    :data:`PRELOAD`, or spawned and importing it; then it waits on its pipe for one task."""

    def __init__(self, ahead: Ahead | None = None) -> None:
        self._start(_spare_main, (ahead,), "ngraph spare worker")

    def _start(self, target, extra: tuple, name: str) -> None:
        """Fork ``target(pipe end, *extra, the environment, the workers' parent)``."""
        ctx = template.context()
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(
            target=target,
            args=(child, *extra, dict(os.environ), template.parent_of_workers(ctx)),
            name=name,
        )
        self.proc.start()
        child.close()
        self.paused = False

    def alive(self) -> bool:
        return self.proc.is_alive()

    def pause(self) -> None:
        """Stop the worker (a spare's imports, an idle group member's spinning threads)
        while another measures: no CPU until resumed."""
        if not self.paused and self.alive():
            stop_process(self.proc.pid)
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            continue_process(self.proc.pid)
            self.paused = False

    def kill(self) -> None:
        self.resume()
        _kill_tree(self.proc.pid)
        self.proc.join()
        self.conn.close()


#: how long a pause waits for the kernel to stop the spare (signals land asynchronously;
#: the worker is in its warm-up meanwhile, outside the measured window)
STOP_WAIT_S = 0.5


def stop_process(pid: int) -> None:
    """SIGSTOP ``pid`` (gone already: nothing to do) and wait until it has stopped."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)
    _await_stopped(pid)


def continue_process(pid: int) -> None:
    """SIGCONT ``pid`` (gone already: nothing to do)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def _await_stopped(pid: int) -> None:
    import psutil

    deadline = time.monotonic() + STOP_WAIT_S
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        while process.status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.001)


def shutdown() -> None:
    """Kill the spare workers, if any wait, and end the workers' template (the end of a
    run, and at exit)."""
    global _reader
    while _spares:
        _, spare = _spares.pop()
        spare.kill()
    if _reader is not None:
        _reader.kill()
        _reader = None
    template.stop()


atexit.register(shutdown)


def _death_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory?)" if name == "SIGKILL" else ""
        return f"worker died with {name}{hint}"
    return f"worker exited with status {code} before finishing its cell"


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process it started (TVM's builders, compile workers)."""
    import psutil

    try:
        parent = psutil.Process(pid)
        procs = [*parent.children(recursive=True), parent]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=10)


# --- in the worker ------------------------------------------------------------------------
class _Forward(logging.Handler):
    """The worker's records to the runner, the machinery's (:data:`DETAIL`) included: the
    runner logs each under its own logger (:func:`~mlflow_ngraph.run.worker.relog`), to the
    run's log file and, as its level says, the terminal."""

    def __init__(self, send: Callable[[str, Any], None]) -> None:
        super().__init__(DETAIL)
        self.send = send

    def emit(self, record: logging.LogRecord) -> None:
        self.send("log", (record.levelno, record.getMessage(), record.name))


def _spare_main(
    conn, ahead: Ahead | None = None, environment: dict | None = None, parent: int | None = None
) -> None:
    """The worker: import what every cell needs (a forked one has it from the template),
    prepare the cell ``ahead``, wait for the task, measure the cell, send every event, then
    ``done``."""
    _become_worker(environment if environment is not None else dict(os.environ), parent)
    keep_freed_memory()  # before the imports and the model: every buffer on the kept heap
    saved = os.dup(1), os.dup(2)
    counted = None
    with tempfile.TemporaryFile() as early:
        os.dup2(early.fileno(), 1)  # import chatter stays out of the runner's terminal
        os.dup2(early.fileno(), 2)
        template.preload(PRELOAD)  # a forked worker has them: nothing to do
        if ahead is not None:
            counted = _prepare(ahead)
        try:
            task = conn.recv()
            conn.send(("started", None))  # the cell's clock starts now, not at the imports
        except (EOFError, OSError):  # the run ended before this spare got a cell
            return
        prepared = ahead and (ahead.model_name, ahead.model_params)
        if counted and prepared != (task.model_name, task.model_params):
            counted[0] = 0  # warnings of a model this cell does not measure
        if task.log_file:
            _redirect_output(task.log_file, early)
        else:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
    _worker_main(task, conn, counted)


def _become_worker(environment: dict, parent: int | None) -> None:
    """A forked process's start: it ends with the runner (or the template), runs in the
    runner's environment, and leaves Ctrl-C to the runner."""
    template.die_with_parent(parent)
    template.in_worker(environment)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _prepare(ahead: Ahead) -> list[int]:
    """Import the compiler's modules and build the model of the cell ``ahead`` (kept for
    the task if it is that cell's); any failure is left for the cell itself to meet and
    report. Returns the validity-warning counter, counting from the build on."""
    from mlflow_ngraph.compilers.registry import get_compiler
    from mlflow_ngraph.run.worker import load_cell_model

    with contextlib.suppress(Exception):
        compiler = get_compiler(ahead.compiler)
        template.preload((*compiler.packages, *compiler.preload))
    counted = _count_warnings()
    with contextlib.suppress(Exception):
        load_cell_model(ahead.model_name, ahead.model_params)
    return counted


def _worker_main(task: CellTask, conn, counted: list[int] | None = None) -> None:
    """Measure the cell, send every event, then ``done``."""

    def send(kind: str, payload: Any) -> None:
        conn.send((kind, payload))

    root = logging.getLogger("mlflow_ngraph")
    root.handlers[:] = [_Forward(send)]
    root.setLevel(DETAIL)
    root.propagate = False
    for noisy in ("mlflow", "alembic", "torch", "onnxscript", "onnx_ir", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    if counted is None:
        counted = _count_warnings()
    from mlflow_ngraph.run.worker import measure_cell

    def emit(kind: str, payload: Any) -> None:
        if kind == "record":  # warnings so far: compile and check of this cell
            payload[1]["metrics"][S.M_VALIDITY_WARNINGS] = float(counted[0])
        send(kind, payload)

    gate, measurer = _group_hooks(conn, task)
    measure_cell(task, emit, measurer, gate)
    sys.stdout.flush()  # the log file is whole before the runner kills this process
    sys.stderr.flush()
    send("done", None)
    conn.close()


def _group_hooks(conn, task: CellTask):
    """The gate and measurer of a worker in an interleaved group: it prepares a batch size
    when the coordinator says so, then warms up, runs windows and judges its figures on
    command (:func:`run_group`)."""
    gpu = task.device_kind == "cuda"

    def gate(b: int) -> bool:
        conn.send(("gate", b))
        command, _ = conn.recv()
        return command == "prepare"

    def measurer(task_: CellTask, engine, b: int):
        return _measure_on_command(conn, task_, engine, b, gpu)

    return gate, measurer


def _measure_on_command(conn, task: CellTask, engine, b: int, gpu: bool):
    """A group worker's batch size, measured as the coordinator commands: a warm-up, each
    window and the verdict on the figures (or the paper's protocol, all at once), until it
    says which attempt to keep. Returns (measurement, stability, attempts)."""
    from mlflow_ngraph.measure.harness import Meter, finish
    from mlflow_ngraph.measure.paper import measure_paper
    from mlflow_ngraph.run.worker import judge, one_line, remeasure_if_it_settles

    conn.send(("ready", b))
    meter = result = stability = None
    attempts = 0
    while True:
        command, arg = conn.recv()
        if command in ("warm", "window"):
            try:
                if command == "warm":
                    meter = Meter(engine, b, task.measure, gpu)
                    attempts += 1
                    conn.send(("warmed", b))
                else:
                    conn.send(("window", meter.window(arg)))
            except Exception as exc:  # the batch size fails; the coordinator drops it
                conn.send(("window_error", one_line(exc)))
                raise
        elif command in ("judge", "paper"):
            if command == "paper":  # warm-up and every timed request here, at once
                try:
                    result = measure_paper(engine, b, task.measure, gpu)
                except Exception as exc:  # the batch size fails; the coordinator drops it
                    conn.send(("window_error", one_line(exc)))
                    raise
                attempts, paired, baseline_moved, earlier = 1, False, arg, None
            else:
                figures, paired, baseline_moved, earlier = arg
                result = finish(meter, figures)
            stability = judge(task, result, paired, baseline_moved)
            stability = remeasure_if_it_settles(task, result, paired, stability, earlier)
            moved = (stability.history, stability.history_ratio) if stability.history else None
            conn.send(("judged", (stability.stable, stability.reason, stability.retry, moved)))
        elif command == "keep":
            return result, stability, attempts
        else:
            raise RuntimeError("the run stopped before this batch size was measured")


def _join_rate(read) -> float | None:
    """``read()``, None where it raises: a reading of the host never costs a measurement."""
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - any failure of the probe is only no reading
        log.log(DETAIL, "the host's join could not be read: %s", exc)
        return None


def _count_warnings() -> list[int]:
    """Write every warning to the log file; count the ones that bear on validity."""
    counter = [0]
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        text = f"{category.__name__}: {message}".lower()
        if any(word in text for word in VALIDITY_WORDS):
            counter[0] += 1
        original(message, category, filename, lineno, file, line)

    warnings.simplefilter("default")
    warnings.showwarning = show
    return counter


def _redirect_output(path: str, early=None) -> None:
    """stdout and stderr to the cell's log file, after what the imports wrote (``early``)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    if early is not None:
        early.seek(0)
        os.write(fd, early.read())
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


# --- an interleaved group: the engines of one model, each in its own worker ---------------
#: seconds between a group's UNSTABLE attempt and the next (a burst of other work may pass)
GROUP_RETRY_PAUSE_S = 2.0
#: the least time a worker has to answer one command of the coordinator (a warm-up of a slow
#: model, a window) before it is taken as hung
ASK_LIMIT_S = 300.0


@dataclass
class GroupCell:
    """One cell of a group: its task, where its events go and, after the run, why its
    worker ended early (``None``: it finished)."""

    name: str
    task: CellTask
    on_event: Callable[[str, Any], None]
    death: str | None = None
    # the coordinator's view of the worker
    worker: _Spare | None = None
    state: str = "starting"  # starting, busy, gate, ready, done, dead
    at: int | None = None  # the batch size of its gate or readiness
    deadline: float = 0.0
    #: a sitting of several (``--sittings N``): batch size -> the earlier sittings'
    #: records, whose figures a retry of this one is judged with; None: a single sitting
    earlier: dict[int, list[dict]] | None = None
    #: the sittings of this group still to come after this one
    to_come: int = 0

    @property
    def title(self) -> str:
        """What a person reads in a log line (``name`` is the cell's key)."""
        return f"{self.task.model_name} {self.task.compiler}"


#: "0" leaves a group's idle workers running between their windows (to measure what
#: stopping them gives: bench/bench_calibration.py)
FREEZE_ENV = "MLFLOW_NGRAPH_FREEZE_IDLE"


def _freeze_idle() -> bool:
    return os.environ.get(FREEZE_ENV, "1") != "0"


#: a file to which every group's windows are appended, one JSON line per attempt (the raw
#: data behind the figures, for studying the method: bench/bench_calibration.py)
WINDOWS_LOG_ENV = "MLFLOW_NGRAPH_WINDOWS_LOG"


_windows_log_failed: set[str] = set()  # paths already warned about: one warning per path


def _probe(policy):
    """The host probe the rounds read (measure/hostprobe.py): this process's, for engines
    the screen judges (a GPU engine's speed is the device's); None where it is off. The
    join is read in a process of its own (:class:`_Reader`): the runner never imports
    PyTorch, and a join read in a measured worker left its pool's threads spinning into
    that worker's next window (an A/A pair read 2-5% apart)."""
    from mlflow_ngraph.measure.hostprobe import JoinProbe, coordinator_probe

    probe = coordinator_probe() if policy.screen else None
    if isinstance(probe, JoinProbe) and probe.source is None:
        probe.through(_reader_read)
    return probe


class _Reader(_Spare):
    """A process forked from the template (PyTorch imported) that reads the host's join on
    command (:func:`~mlflow_ngraph.measure.hostprobe.join_rate`) and is stopped between
    readings: its pool's threads spin after each, never into a measured window."""

    def __init__(self) -> None:  # noqa: D107 - _Spare's, with the reader's own loop
        self._start(_reader_main, (), "ngraph host reader")

    def read(self) -> float | None:
        """One reading (None where the reader is gone or slow past :data:`READ_LIMIT_S`)."""
        if not self.alive():
            return None
        self.resume()
        try:
            self.conn.send("join")
            return self.conn.recv() if self.conn.poll(READ_LIMIT_S) else None
        except (EOFError, OSError):
            return None
        finally:
            self.pause()


#: seconds a reading of the host may take (a reading is ~2 ms; the first forks the reader)
READ_LIMIT_S = 30.0
_reader: _Reader | None = None


def _reader_read() -> float | None:
    global _reader
    if _reader is None or not _reader.alive():
        if _reader is not None:
            _reader.kill()
        _reader = _Reader()
    return _reader.read()


def _reader_main(conn, environment: dict, parent: int | None) -> None:
    """The host reader: the template's imports (PyTorch), then a join rate per command."""
    from mlflow_ngraph.measure.hostprobe import join_rate

    _become_worker(environment, parent)
    with open(os.devnull, "w") as quiet:
        os.dup2(quiet.fileno(), 1)  # import chatter stays out of the runner's terminal
        os.dup2(quiet.fileno(), 2)
    template.preload(("torch",))  # a forked reader has it: nothing to do
    while True:
        try:
            conn.recv()
        except (EOFError, OSError):  # the run ended
            return
        conn.send(_join_rate(join_rate))


def _readings(figures: dict) -> tuple[str | None, list | None]:
    """The group's probe and its reading of each round (every engine's figures hold the
    same), (None, None) where none was read."""
    read = next((f for f in figures.values() if f.state_readings), None)
    return (read.state_kind, read.state_readings) if read is not None else (None, None)


def _log_windows(
    proxies: dict[str, _Proxy], b: int, baseline: str | None, attempt: int, probe=(None, None)
) -> None:
    """Append the group's windows to the file :data:`WINDOWS_LOG_ENV` names, if any, with
    the host ``probe``'s kind and reading of each round; a file that cannot be written
    costs a warning, never the measurement."""
    path = os.environ.get(WINDOWS_LOG_ENV)
    if not path or not proxies or path in _windows_log_failed:
        return
    import json

    task = next(iter(proxies.values())).cell.task
    line = {
        "time": time.time(),
        "model": task.model_name,
        "model_params": task.model_params,
        "batch_size": b,
        "attempt": attempt,
        "baseline": baseline,
        "host_probe": probe[0],
        "host_readings": probe[1],
        "engines": {
            name: {
                "compiler": p.cell.task.compiler,
                "flags": p.cell.task.flags,
                "windows": [
                    [w.requests, w.samples, w.seconds, w.cpu_s, w.wait_s, w.other_s, w.began]
                    for w in p.taken
                ],
            }
            for name, p in proxies.items()
        },
    }
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, default=str) + "\n")
    except OSError as exc:
        _windows_log_failed.add(path)
        log.warning(
            "cannot write the windows log %s (%s): point %s at a writable file or unset it; "
            "measuring goes on without it",
            path,
            exc.strerror or exc,
            WINDOWS_LOG_ENV,
        )


class _Proxy:
    """A group member's worker as the rounds see it: one window on command."""

    def __init__(self, group: _Group, cell: GroupCell) -> None:
        self.group, self.cell = group, cell
        self.taken: list = []  # the windows it gave, in order

    def window(self, seconds: float):
        """One window of this worker, the others of the group stopped meanwhile: a runtime's
        thread pool spins for a while after its last request (ONNX Runtime, OpenMP, TBB),
        and on a small host that spin takes the next engine's cores."""
        freeze = _freeze_idle()
        if freeze:
            self.cell.worker.resume()
        kind, payload = self.group.ask(self.cell, ("window", seconds), ("window", "window_error"))
        if freeze and kind == "window":
            self.cell.worker.pause()
        if kind != "window":
            raise RuntimeError(payload or self.cell.death or "the worker is gone")
        self.taken.append(payload)
        return payload


class _Group:
    def __init__(self, cells: list[GroupCell], timeout_s: float) -> None:
        self.cells = cells
        self.timeout_s = timeout_s

    # --- the workers --------------------------------------------------------------------
    def start(self) -> None:
        """A worker for each cell (a spare where one waits), sent the cell's task."""
        for cell in self.cells:
            cell.worker = _take_spare(cell.task)
            cell.deadline = time.monotonic() + self.timeout_s
            try:
                cell.worker.conn.send(cell.task)
            except OSError:
                self._died(cell)

    def end_done(self) -> None:
        """Kill the workers that sent their cell's last event (with their children): their
        teardown has nothing left to give."""
        for cell in self.cells:
            if cell.state == "done":
                _kill_tree(cell.worker.proc.pid)
                cell.worker.proc.join()

    def kill(self) -> None:
        """Kill every worker started, with its children (a group that failed or was
        stopped)."""
        for cell in self.cells:
            if cell.worker is not None:
                _kill_tree(cell.worker.proc.pid)
                cell.worker.proc.join()

    def close(self) -> None:
        for cell in self.cells:
            if cell.worker is not None:
                cell.worker.conn.close()

    # --- messages -----------------------------------------------------------------------
    def _receive(self, cell: GroupCell) -> tuple[str, Any] | None:
        """One message of ``cell``'s worker, handled; the message if the coordinator waits
        for its kind, else ``None`` (events go to the cell's runner)."""
        try:
            kind, payload = cell.worker.conn.recv()
        except (EOFError, OSError):
            self._died(cell)
            return None
        if kind == "started":
            cell.deadline = time.monotonic() + self.timeout_s
        elif kind in ("gate", "ready"):
            cell.state, cell.at = kind, payload
        elif kind == "done":
            cell.state = "done"
        elif kind in ("warmed", "window", "window_error", "judged"):
            return kind, payload
        else:
            cell.on_event(kind, payload)
        return None

    def _died(self, cell: GroupCell, reason: str | None = None) -> None:
        proc = cell.worker.proc
        if reason is None:
            proc.join(5.0)
            if proc.exitcode is None:
                _kill_tree(proc.pid)
                proc.join()
            reason = _death_reason(proc.exitcode)
        else:
            _kill_tree(proc.pid)
            proc.join()
        cell.state, cell.death = "dead", reason
        log.log(DETAIL, "%s: %s", cell.title, reason)  # the cell's line says it: FAILED

    def settle(self, cells: list[GroupCell], states: tuple[str, ...]) -> None:
        """Handle messages until every cell of ``cells`` is in one of ``states``, done or
        dead; a worker past its time limit is killed."""
        from multiprocessing.connection import wait

        while True:
            waiting = [c for c in cells if c.state not in (*states, "done", "dead")]
            if not waiting:
                return
            now = time.monotonic()
            for cell in waiting:
                if cell.state != "starting" and now > cell.deadline:
                    self._died(
                        cell,
                        f"cell timed out after {self.timeout_s:g} s "
                        "(raise --cell-timeout to allow more)",
                    )
            by_conn = {c.worker.conn: c for c in waiting if c.state != "dead"}
            for conn in wait(list(by_conn), timeout=1.0):
                self._receive(by_conn[conn])

    def ask(self, cell: GroupCell, command: tuple[str, Any], kinds: tuple[str, ...]):
        """Send ``command`` to ``cell``'s worker and wait for a reply of one of ``kinds``
        (``(None, reason)`` when the worker dies first)."""
        if cell.state == "dead":
            return None, cell.death
        try:
            cell.worker.conn.send(command)
        except OSError:
            self._died(cell)
            return None, cell.death
        # a warm-up, window or verdict that does not come back is a hang: the cell's time
        # limit, and never less than ASK_LIMIT_S for this one reply
        deadline = max(cell.deadline, time.monotonic() + ASK_LIMIT_S)
        while cell.state != "dead":
            if not cell.worker.conn.poll(1.0):
                if time.monotonic() > deadline:
                    self._died(cell, f"{command[0]} did not return: cell timed out")
                continue
            got = self._receive(cell)
            if got is not None and got[0] in kinds:
                return got
        return None, cell.death

    def send(self, cell: GroupCell, command: tuple[str, Any]) -> None:
        try:
            cell.worker.conn.send(command)
        except OSError:
            self._died(cell)

    def extend(self, seconds: float) -> None:
        """Time a worker spends waiting on the others is not its cell's time."""
        for cell in self.cells:
            cell.deadline += seconds


def run_group(
    cells: list[GroupCell],
    order: list[int],
    baseline: str | None,
    settings,
    policy,
    retries: int,
    timeout_s: float,
    ahead: list[Ahead] | None = None,
) -> None:
    """Measure the cells of one model interleaved: each cell in its own worker, all alive
    at once. At each batch size (in ``order``) every worker that has it pending prepares
    (builds its engine, checks its outputs) at the same time; then, with every worker idle,
    each warms up in turn and the engines are measured in rounds
    (:func:`mlflow_ngraph.measure.rounds.run_rounds`), speedups paired with ``baseline``
    (a cell name) when it is among them. A group with an UNSTABLE figure is measured again,
    all of it, up to ``retries`` times after a pause: every speedup of the kept attempt
    comes from the same rounds as its baseline. The last attempt is kept.

    Workers for the cells ``ahead`` (the next model's) start as spares, stopped while
    this group measures. Each cell's ``death`` says why its worker ended early, if it did.
    """
    from mlflow_ngraph.measure.rounds import run_rounds

    names = [cell.name for cell in cells]
    if len(set(names)) != len(names):  # the coordinator would wait on one forever
        raise ValueError(f"a group measures each cell once; given twice: {names}")
    group = _Group(cells, timeout_s)
    try:
        group.start()
        _start_spares(ahead or [])
        for ready, b in _gates(group, order):
            _measure_group(group, ready, b, baseline, settings, policy, retries, run_rounds)
        group.end_done()
    except BaseException:
        group.kill()
        shutdown()
        raise
    finally:
        _resume_spares()
        group.close()


def _gates(group: _Group, order: list[int]):
    """Each batch size as the group's workers reach it, as (the workers ready, the batch
    size): those at the gate of the earliest batch size in ``order`` prepare it together.
    The time the caller takes to measure them extends every cell's time limit
    (:meth:`_Group.extend`)."""
    while True:
        group.settle(group.cells, ("gate",))
        gated = [c for c in group.cells if c.state == "gate"]
        if not gated:
            return
        b = min((c.at for c in gated), key=lambda v: order.index(v) if v in order else v)
        members = [c for c in gated if c.at == b]
        for cell in members:
            cell.state = "busy"
            group.send(cell, ("prepare", b))
        group.settle(members, ("ready", "gate"))
        ready = [c for c in members if c.state == "ready" and c.at == b]
        if ready:
            began = time.monotonic()
            yield ready, b
            group.extend(time.monotonic() - began)


def _measure_group(group, ready, b, baseline, settings, policy, retries, run_rounds) -> None:
    """Batch size ``b`` of the workers ``ready``: warmed up, measured in rounds and judged,
    all of them again while a figure is UNSTABLE and retries are left; then each keeps its
    last attempt."""
    if settings.protocol == "paper":
        _measure_paper_group(group, ready, baseline)
        return
    attempt = 0
    while True:
        attempt += 1
        _pause_spares()
        warmed = _warm(group, ready)
        names = {cell.name: cell for cell in warmed}
        base = baseline if baseline in names else None
        if _freeze_idle():
            for cell in warmed:  # each runs only for its own windows (_Proxy.window)
                cell.worker.pause()
        proxies = {n: _Proxy(group, c) for n, c in names.items()}
        try:
            figures = run_rounds(proxies, settings, base, policy, probe=_probe(policy))
        finally:
            for cell in warmed:
                cell.worker.resume()
        _log_windows(proxies, b, base, attempt, _readings(figures))
        _resume_spares()
        ready, unstable = _judge(group, names, figures, base, b)
        if not any(retry for _, _, retry in unstable) or attempt > retries:
            break
        log.log(
            DETAIL,
            "%s bs%d: %s UNSTABLE (%s): measuring the group again, attempt %d of %d",
            unstable[0][0].task.model_name,
            b,
            ", ".join(_compiler_labels([c.task for c, _, _ in unstable])),
            unstable[0][1].split(":")[0],
            attempt + 1,
            retries + 1,
        )
        time.sleep(GROUP_RETRY_PAUSE_S)
    for cell in ready:
        cell.state = "busy"
        group.send(cell, ("keep", None))


def _warm(group: _Group, ready: list[GroupCell]) -> list[GroupCell]:
    """Each of ``ready`` warmed up in turn; returns those that did (a failed one goes on to
    its next gate)."""
    warmed = []
    for cell in ready:
        kind, _ = group.ask(cell, ("warm", None), ("warmed", "window_error"))
        if kind == "warmed":
            warmed.append(cell)
        else:
            cell.state = "busy"  # its batch size failed: it goes on to its next gate
    return warmed


def _judge(group: _Group, names: dict[str, GroupCell], figures: dict, base: str | None, b: int):
    """Each worker's verdict on its figures of the rounds at batch size ``b`` (paired with
    ``base``'s where it is not ``base``; in a sitting of several, with the earlier
    sittings' figures and the number still to come). Returns the cells judged, and (cell,
    reason, whether a retry may help) of each UNSTABLE one."""
    from mlflow_ngraph.measure.sittings import earlier_sittings

    judged, unstable, baseline_moved = [], [], None
    # the baseline first: a gross move of its figure marks the speedups paired with it
    for name, cell in sorted(names.items(), key=lambda item: item[0] != base):
        if name not in figures:  # its window failed: the worker reports the batch size
            cell.state = "busy"
            continue
        paired = base is not None and name != base
        earlier = (
            None
            if cell.earlier is None
            else earlier_sittings(cell.earlier.get(b, []), cell.to_come)
        )
        asked = (figures[name], paired, baseline_moved, earlier)
        kind, verdict = group.ask(cell, ("judge", asked), ("judged",))
        if kind != "judged":
            continue
        judged.append(cell)
        if not verdict[0]:
            unstable.append((cell, verdict[1], verdict[2]))
        if name == base and verdict[3]:
            baseline_moved = baseline_move(_compiler_labels([cell.task])[0], *verdict[3])
    return judged, unstable


def _measure_paper_group(group: _Group, ready: list[GroupCell], base: str | None = None) -> None:
    """The paper's protocol (:mod:`mlflow_ngraph.measure.paper`): each engine of the group
    in turn, alone (the others and the spares stopped), measured once: its warm-up and its
    timed requests back to back, no rounds and no second attempt. The baseline ``base``
    first: a gross move of its figure marks the speedups divided by it (unpaired)."""
    judged, baseline_moved = [], None
    _pause_spares()
    try:
        for cell in sorted(ready, key=lambda c: c.name != base):
            others = [c for c in ready if c is not cell] if _freeze_idle() else []
            for other in others:
                other.worker.pause()
            try:
                asked = ("paper", baseline_moved)  # the baseline first: no move known yet
                kind, verdict = group.ask(cell, asked, ("judged", "window_error"))
            finally:
                for other in others:
                    other.worker.resume()
            cell.state = "busy"  # judged, or its batch size failed: on to its next gate
            if kind == "judged":
                judged.append(cell)
                if cell.name == base and verdict[3]:
                    baseline_moved = baseline_move(_compiler_labels([cell.task])[0], *verdict[3])
    finally:
        _resume_spares()
    for cell in judged:
        group.send(cell, ("keep", None))


def _compiler_labels(tasks: list[CellTask]) -> list[str]:
    """The compilers of ``tasks`` as a person reads them in a log line (a cell's key says
    nothing to them): the name, with the flags where two share it."""
    names = [t.compiler for t in tasks]
    return [
        t.compiler
        if names.count(t.compiler) == 1
        else f"{t.compiler}[{','.join(f'{k}={v}' for k, v in sorted(t.flags.items()))}]"
        for t in tasks
    ]


# --- spares for a group: one per cell of the next model -----------------------------------
_spares: list[tuple[Ahead | None, _Spare]] = []


def _take_spare(task: CellTask) -> _Spare:
    """The spare prepared for ``task``'s cell, else any spare, else a fresh worker."""
    for i, (ahead, spare) in enumerate(_spares):
        if ahead and (ahead.model_name, ahead.compiler, ahead.model_params) == (
            task.model_name,
            task.compiler,
            task.model_params,
        ):
            _spares.pop(i)
            if spare.alive():
                spare.resume()
                return spare
            spare.kill()
    while _spares:
        _, spare = _spares.pop(0)
        if spare.alive():
            spare.resume()
            return spare
        spare.kill()
    return _Spare()


def _start_spares(ahead: list[Ahead]) -> None:
    if os.environ.get("MLFLOW_NGRAPH_SPARE_WORKER", "1") == "0":
        return
    for item in ahead:
        _spares.append((item, _Spare(item)))


def _pause_spares() -> None:
    for _, spare in _spares:
        spare.pause()


def _resume_spares() -> None:
    for _, spare in _spares:
        spare.resume()
