"""The gate's two workers, measured in the same interleaved rounds until the verdict is
known or the budget is spent.

Each side runs in its own worker (:mod:`mlflow_ngraph.gate.worker`), started with that
side's interpreter. The rounds are the benchmark's (:func:`~mlflow_ngraph.measure.rounds.
run_rounds`: one window each per round, the order rotating, disturbed windows screened out,
the stop rule), with the champion as the baseline: the ratio is the paired estimate of the
per-round log ratios and its signed-rank interval (:func:`~mlflow_ngraph.measure.rounds.
paired_figures`). While one worker takes its window the other is stopped (SIGSTOP), as a
benchmark group's idle workers are: a runtime's pool spinning after its last request would
take the other's cores. The rounds go in chunks; after each the ratio is judged on every
window so far, and while the verdict is ``unsure`` and budget is left, another chunk runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.gate.verdict import UNSURE, Interval, decide, widened
from mlflow_ngraph.measure.rounds import (
    RoundPolicy,
    paired_figures,
    run_rounds,
    screened,
    throughput_figures,
)
from mlflow_ngraph.measure.settings import MeasureSettings
from mlflow_ngraph.run.isolation import ASK_LIMIT_S, continue_process, stop_process

#: the most seconds one side may take to load or build its engine (a compile of a large
#: model on a busy host; the benchmark's default cell limit is of this order)
LOAD_LIMIT_S = 1800.0
#: seconds of windows per engine in one chunk of rounds: long enough for the stop rule's
#: floors and a few dozen rounds, short enough that an early verdict ends the gate early
CHUNK_S = 8.0
#: the chunk's stop rule ends it once the ratio's interval is this share of the tolerance
#: wide on each side (then the verdict is known whatever the ratio's side of the band)
PRECISION_SHARE = 0.5
CHAMPION, CHALLENGER = "champion", "challenger"


def package_root() -> str:
    """The folder holding this package: first on a worker's ``PYTHONPATH``, so that another
    environment's interpreter runs this very code."""
    return str(Path(__file__).resolve().parent.parent.parent)


class Worker:
    """One side's worker process and the socket to it."""

    def __init__(self, role: str, task: dict[str, Any], python: str | None, log_file: Path):
        from multiprocessing.connection import Connection

        self.role = role
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root(), env.get("PYTHONPATH")]))
        command = [python or sys.executable, "-m", "mlflow_ngraph.gate.worker"]
        try:
            self.proc = subprocess.Popen(
                [*command, str(theirs.fileno()), str(log_file)],
                pass_fds=[theirs.fileno()],
                env=env,
                stdin=subprocess.DEVNULL,
            )
        except OSError as exc:
            raise NgraphError(
                f"--{role}-python {python}: cannot start it ({exc.strerror or exc}): give the "
                "path of a Python interpreter (e.g. /path/to/venv/bin/python)"
            ) from None
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send(task)
        self.paused = False

    def reply(self, limit_s: float, waiting=None) -> tuple[str, Any]:
        """The worker's next message; a worker that died or is silent past ``limit_s`` is
        an error naming the side. ``waiting(seconds)`` is called each second without one."""
        began = time.monotonic()
        deadline = began + limit_s
        while not self.conn.poll(1.0):
            if waiting is not None:
                waiting(time.monotonic() - began)
            if self.proc.poll() is not None:
                raise NgraphError(f"the {self.role}'s worker exited ({self._ended()})")
            if time.monotonic() > deadline:
                raise NgraphError(f"the {self.role}'s worker did not answer in {limit_s:g} s")
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            raise NgraphError(f"the {self.role}'s worker exited ({self._ended()})") from None

    def _ended(self) -> str:
        code = self.proc.wait()
        if code < 0:
            return f"signal {signal.Signals(-code).name}"
        return f"status {code}; its log says more"

    def ask(self, command: str, arg: Any = None, limit_s: float = ASK_LIMIT_S) -> Any:
        self.conn.send((command, arg))
        kind, payload = self.reply(limit_s)
        if kind == "error":
            raise NgraphError(f"the {self.role}: {payload}")
        return payload

    def pause(self) -> None:
        if not self.paused:
            stop_process(self.proc.pid)
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            continue_process(self.proc.pid)
            self.paused = False

    def close(self) -> None:
        self.resume()
        with contextlib.suppress(OSError):
            self.conn.send(("close", None))
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()


#: seconds between the lines that say a side is still being built or loaded
PROGRESS_S = 30.0


class Progress:
    """``gate: still building or loading the champion's engine (60 s)``, every
    :data:`PROGRESS_S` seconds while a side is not ready (a spec compiled here: minutes for
    a large model)."""

    def __init__(self, say, role: str, task: dict, began: float) -> None:
        self.say, self.role, self.began, self.next = say, role, began, PROGRESS_S
        self.what = "building or loading" if task.get("kind") == "spec" else "loading"

    def __call__(self, _: float) -> None:
        spent = time.monotonic() - self.began
        if spent >= self.next:
            self.say(f"gate: still {self.what} the {self.role}'s engine ({spent:.0f} s)")
            self.next += PROGRESS_S


def start(
    tasks: dict[str, dict], pythons: dict[str, str | None], logs: Path, say=None
) -> dict[str, Worker]:
    """Both workers started at once (their imports and loads overlap), each ready, with what
    it said of itself in ``worker.info``; ``say`` hears how long each took, and every
    :data:`PROGRESS_S` seconds, which is not ready yet.

    Raises:
        NgraphError: a side could not be had (its reason, in one line)."""
    workers: dict[str, Worker] = {}
    say = say or (lambda _: None)
    began = time.monotonic()
    try:
        for role, task in tasks.items():
            workers[role] = Worker(role, task, pythons.get(role), logs / f"gate-{role}.log")
        for role, worker in workers.items():
            kind, payload = worker.reply(LOAD_LIMIT_S, Progress(say, role, tasks[role], began))
            if kind == "error":
                raise NgraphError(f"the {role} ({tasks[role]['label']}): {payload}")
            worker.info = payload
            runtime = (payload.get("versions") or {}).get("runtime", "")
            say(f"gate: the {role} is ready ({runtime}; {time.monotonic() - began:.0f} s)")
    except BaseException:
        for worker in workers.values():
            worker.proc.kill()
            worker.close()
        raise
    return workers


@dataclass
class Outcome:
    """The ratio challenger / champion over every round, and its verdict."""

    ratio: float | None
    sitting: tuple[float, float] | None
    interval: Interval | None
    verdict: str
    rounds: int
    seconds: float
    chunks: int
    throughput: dict[str, float] = field(default_factory=dict)
    disturbed: int = 0


class _Proxy:
    """A worker as the rounds see it: one window on command, the other worker stopped."""

    def __init__(self, worker: Worker, other: Worker, taken: dict[int, Any], clock: list[int]):
        self.worker, self.other = worker, other
        self.taken, self.clock = taken, clock

    def window(self, seconds: float):
        self.other.pause()
        self.worker.resume()
        got = self.worker.ask("window", seconds)
        self.taken[self.clock[0]] = got
        return got


def aligned(taken: dict[int, Any], rounds: int) -> list:
    """An engine's windows by round, ``None`` where it took none."""
    return [taken.get(r) for r in range(rounds)]


def judge(windows: dict[str, list], tolerance: float, spread) -> tuple:
    """(ratio, sitting interval, interval, verdict) from every round's windows; ``spread``
    (sd, degrees of freedom, source) widens the interval where the host measured one."""
    mine, base = screened(windows[CHALLENGER]), screened(windows[CHAMPION])
    ratio, sitting, _ = paired_figures(mine, base)
    if ratio is None or sitting is None:
        return ratio, None, None, UNSURE
    if spread is not None:
        low, high = widened(ratio, sitting, spread.sd, spread.df)
        interval = Interval(low, high, "sitting + spread", spread.source)
    else:
        interval = Interval(sitting[0], sitting[1], "sitting", "this gate's rounds")
    return ratio, sitting, interval, decide(interval.low, interval.high, tolerance)


def measure(
    workers: dict[str, Worker], tolerance: float, budget_s: float, spread=None, on_chunk=None
) -> Outcome:
    """Both engines warmed up, then rounds in chunks until the verdict is known or
    ``budget_s`` seconds of rounds are spent (the first chunk always runs)."""
    champion, challenger = workers[CHAMPION], workers[CHALLENGER]
    for worker in (champion, challenger):
        worker.resume()
        worker.ask("warm")
        worker.pause()
    taken: dict[str, dict[int, Any]] = {CHAMPION: {}, CHALLENGER: {}}
    clock = [0]
    proxies = {
        CHAMPION: _Proxy(champion, challenger, taken[CHAMPION], clock),
        CHALLENGER: _Proxy(challenger, champion, taken[CHALLENGER], clock),
    }
    began, chunks = time.monotonic(), 0
    while True:
        left = budget_s - (time.monotonic() - began)
        cap = max(1.0, min(CHUNK_S, left / 2))
        settings = MeasureSettings(min_duration_s=min(1.0, cap), max_duration_s=cap)
        policy = RoundPolicy(precision=PRECISION_SHARE * tolerance, max_s=cap)

        def tick(r: int, offset=clock[0]) -> None:
            clock[0] = offset + r

        run_rounds(proxies, settings, CHAMPION, policy, on_round=tick)
        chunks += 1
        windows = {role: aligned(taken[role], clock[0]) for role in taken}
        ratio, sitting, interval, verdict = judge(windows, tolerance, spread)
        spent = time.monotonic() - began
        if on_chunk is not None:
            on_chunk(chunks, ratio, interval, verdict, spent)
        if verdict != UNSURE or spent >= budget_s:
            break
    for worker in (champion, challenger):
        worker.resume()
    return Outcome(
        ratio, sitting, interval, verdict, clock[0], spent, chunks,
        {role: throughput_figures([x for x in screened(w) if x])[0] for role, w in windows.items()},
        sum(1 for role in windows for a, b in zip(windows[role], screened(windows[role]))
            if a is not None and b is None),
    )  # fmt: skip
