"""One side of a gate in its own process, possibly under another Python environment.

The coordinator (:mod:`mlflow_ngraph.gate.rounds`) starts ``python -m
mlflow_ngraph.gate.worker FD`` with the side's interpreter (``--champion-python`` /
``--challenger-python``; this one by default) and talks to it over the socket ``FD`` with
:mod:`multiprocessing.connection`'s messages, the vocabulary of the benchmark's group
workers (:mod:`mlflow_ngraph.run.isolation`): the task, then ``outputs`` (the output check's
input), ``warm`` and ``window`` (one :class:`~mlflow_ngraph.measure.harness.Meter` window)
until ``close``. A spawned interpreter rather than a fork: another environment's runtime
(OpenVINO 2025 beside 2026) can only be imported by another interpreter, and both sides
start alike.

The worker runs this checkout's package (the coordinator puts it first on ``PYTHONPATH``);
the environment supplies the runtimes and their dependencies.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from typing import Any

#: the messages a worker answers, each with its reply's kind
COMMANDS = {"outputs": "outputs", "warm": "warmed", "window": "window"}


class Delayed:
    """An engine whose every stretch of calls, from the first call after a
    ``synchronize()`` to the next ``synchronize()`` (a harness window, requests in flight
    included), is drawn out to ``1 + fraction`` times its own measured time by a busy wait
    inside that ``synchronize()``: the same engine, ``fraction`` slower by construction, for
    one-slot and queued engines alike (the planted slowdown of bench/bench_gate.py; never set
    by a real gate, see :data:`mlflow_ngraph.variables.ENV_GATE_PLANTED_DELAY`).

    Once per window rather than after each call: a wait after each 1 ms call overshoots by
    the scheduler's wake-up latency (a sleep: tens of microseconds, so a planted 10% read
    20%) or by any preemption that lands in it (a busy host), each time; once per window the
    overshoot is at most one such delay in a window of 100 ms or more."""

    def __init__(self, engine, fraction: float, clock=time.perf_counter) -> None:
        self.engine = engine
        self.fraction = fraction
        self.clock = clock
        self.began: float | None = None
        for name in ("infer", "run_many", "start_many"):
            if hasattr(engine, name):
                setattr(self, name, self._timed(getattr(engine, name)))

    def _timed(self, call):
        def run(*args, **kwargs):
            if self.began is None:
                self.began = self.clock()
            return call(*args, **kwargs)

        return run

    def synchronize(self) -> None:
        self.engine.synchronize()
        if self.began is None:
            return
        clock, began = self.clock, self.began
        until = began + (1 + self.fraction) * (clock() - began)
        while clock() < until:
            pass
        self.began = None

    def __getattr__(self, name: str):
        return getattr(self.engine, name)


def versions(compiler_name: str) -> dict[str, str]:
    """What this environment runs: Python, the interpreter, the compiler's runtime and the
    libraries the record names (:func:`mlflow_ngraph.env.library_versions`)."""
    from mlflow_ngraph.compilers.registry import get_compiler
    from mlflow_ngraph.env import library_versions

    out = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "prefix": sys.prefix,
    }
    with contextlib.suppress(Exception):
        out["runtime"] = f"{compiler_name} {get_compiler(compiler_name).version()}"
    out.update(library_versions())
    return out


def _spec_engine(task: dict[str, Any]):
    """The engine of a model x compiler spec, from the home's engine cache or compiled here
    (:class:`~mlflow_ngraph.run.supply.EngineSupply`)."""
    from mlflow_ngraph.compilers.registry import get_compiler
    from mlflow_ngraph.models.registry import load_model
    from mlflow_ngraph.run.supply import EngineSupply

    model = load_model(task["model"], task["model_params"])
    compiler = get_compiler(task["compiler"])
    flags = compiler.resolve_flags(task["flags"])
    b = task["batch_size"]
    supply = EngineSupply(task["home"], task["device"], task["device_kind"], task["scenario"])
    engine = supply.get(compiler, flags, model, b, f"{task['model']} {task['compiler']}").engine
    shape = tuple(model.input_shape(b))
    return engine, shape, str(getattr(model, "dtype", "float32"))


def _folder_engine(task: dict[str, Any]):
    """The engine of a pulled (or registered) folder, through ``load_engine``'s checks."""
    from mlflow_ngraph.deploy.engine import load_engine

    deployed = load_engine(
        task["folder"],
        trust_code=task.get("trust_code"),
        trusted_keys=task.get("trusted_keys"),
        allow_unsigned=task.get("allow_unsigned"),
        check_signature=task.get("check_signature", True),
    )
    return deployed.runtime_engine, deployed.input_shape, str(deployed.dtype)


def load(task: dict[str, Any]):
    """(engine, input shape, dtype, what the record says of this side)."""
    if task["kind"] == "spec":
        engine, shape, dtype = _spec_engine(task)
    else:
        engine, shape, dtype = _folder_engine(task)
    info = {"input_shape": list(shape), "dtype": dtype, "versions": versions(task["compiler"])}
    with contextlib.suppress(Exception):
        info["runtime_settings"] = {k: str(v) for k, v in engine.runtime_settings().items()}
    return engine, shape, dtype, info


def serve(conn) -> None:
    """Load the task's engine, then answer the coordinator's commands until ``close``."""
    import numpy as np

    from mlflow_ngraph.measure.harness import Meter
    from mlflow_ngraph.measure.settings import MeasureSettings
    from mlflow_ngraph.run.worker import one_line

    task = conn.recv()
    try:
        engine, shape, dtype, info = load(task)
        engine.prepare(np.random.default_rng(0).standard_normal(shape).astype(dtype))
        if task.get("delay"):
            engine = Delayed(engine, float(task["delay"]))
    except Exception as exc:  # the side cannot be had: the coordinator says why, in one line
        conn.send(("error", one_line(exc)))
        return
    conn.send(("ready", info))
    settings = MeasureSettings(scenario=task["scenario"], warmup=task["warmup"])
    meter = None
    while True:
        command, arg = conn.recv()
        try:
            if command == "outputs":
                out = engine.outputs(np.asarray(arg, dtype=dtype))
                reply = [np.asarray(o) for o in out] if isinstance(out, (tuple, list)) else out
            elif command == "warm":
                meter, reply = Meter(engine, task["batch_size"], settings), None
            elif command == "window":
                reply = meter.window(arg)
            else:
                break
        except Exception as exc:  # the coordinator reports it and ends the gate
            conn.send(("error", one_line(exc)))
            break
        conn.send((COMMANDS[command], reply))
    engine.close()


def main(argv: list[str]) -> None:
    import signal
    from multiprocessing.connection import Connection

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the coordinator's
    conn = Connection(int(argv[0]))
    log = argv[1] if len(argv) > 1 else os.devnull
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)  # the runtimes' chatter stays out of the gate's output
    os.dup2(fd, 2)
    try:
        serve(conn)
    except (EOFError, OSError):  # the coordinator went away
        pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the runtimes' teardown has nothing left to give


if __name__ == "__main__":
    main(sys.argv[1:])
