"""The driver of an ``ngraph-ray`` project run: a process of its own that runs the sweep
(:func:`~mlflow_ngraph.cluster.sweep.run_sweep`) and ends the project's run.

It lives in ``<home>/projects/<sweep id>/``: ``job.json`` (what to run, written by the
backend), ``state.json`` (its phase: starting, running, done, failed, refused, cancelled;
its pid; its last line), ``driver.log`` (its output: the sweep's live view) and ``lock``,
which it holds while it lives: one driver per sweep, and a client knows whether it runs
(even one started by a client since killed). SIGTERM cancels it: every device's benchmark
stops as Ctrl-C stops it, and the project's run ends KILLED.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.redaction import redact_text

#: seconds between two looks at a driver's state and output
POLL_S = 0.5
#: seconds a driver tries to take its lock (a client testing it holds it for an instant)
LOCK_TRIES_S = 5.0
#: seconds the reaper gives what a dead driver left between SIGTERM and SIGKILL
REAP_GRACE_S = 3.0
#: the reaper (:func:`start_reaper`): a process of a session of its own that, while the
#: driver lives, notes every session the driver's descendants are in (the driver's own, a
#: local cluster head's, Ray's task workers'); at the end of its stdin (the driver's end,
#: however it ended, ``kill -9`` included) and once the driver is gone (a zombie counts), it
#: stops every process left in those sessions: SIGTERM, then SIGKILL. Linux hands out no pid
#: still in use as a session's id, so a session is the driver's own for as long as any of its
#: processes lives.
REAPER = r"""
import os, select, signal, sys, time
driver, grace, me = int(sys.argv[1]), float(sys.argv[2]), os.getpid()
def table():
    out = {}
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as stat:
                rest = stat.read().rpartition(")")[2].split()
            out[int(name)] = (rest[0], int(rest[1]), int(rest[3]))  # state, ppid, session
        except (OSError, ValueError, IndexError):
            continue
    return out
def gone(procs):
    return driver not in procs or procs[driver][0] in ("Z", "X")
sessions = {driver}
while True:
    ready, _, _ = select.select([sys.stdin], [], [], 1.0)
    procs = table()
    family, grew = {driver}, True
    while grew:
        more = {p for p, (_, ppid, _) in procs.items() if ppid in family} - family - {me}
        family |= more
        grew = bool(more)
    sessions |= {procs[p][2] for p in family if p in procs} - {procs.get(me, ("", 0, me))[2]}
    if ready and not os.read(sys.stdin.fileno(), 4096):
        break
while not gone(table()):
    time.sleep(0.2)
for sig in (signal.SIGTERM, signal.SIGKILL):
    left = [p for p, (state, _, sid) in table().items()
            if sid in sessions and p != me and state not in ("Z", "X")]
    if not left:
        break
    for p in left:
        try:
            os.kill(p, sig)
        except OSError:
            pass
    time.sleep(grace)
"""


class Driver:
    """One sweep's driver, seen from a client (launch, follow, cancel) or from itself."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.job_path = self.dir / "job.json"
        self.state_path = self.dir / "state.json"
        self.log_path = self.dir / "driver.log"
        self.lock_path = self.dir / "lock"

    # --- the client's side -----------------------------------------------------------------
    def launch(self, job: dict[str, Any]) -> str:
        """Start the driver of ``job`` (or follow the one already running it); the project
        run's id once every device's task is submitted.

        Raises:
            NgraphError: the driver refused the job (the cluster does not answer, a device
                has no node) or died starting: its one line.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.alive():
            return self._started(None)
        job = {**job, "run_id": project_run(job)}
        self._write(self.job_path, job)
        self._write(self.state_path, {"phase": "starting", "run_id": job["run_id"]})
        with open(self.log_path, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mlflow_ngraph.cluster.driver", str(self.dir)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # a client killed, even by its process group: it lives
            )  # fmt: skip
        return self._started(proc)

    def _started(self, proc: subprocess.Popen | None) -> str:
        """Wait until the driver (``proc``, or the running one) is past starting."""
        while True:
            state = self.state()
            mine = proc is None or state.get("pid") == proc.pid
            if mine and state.get("phase") != "starting":
                break
            if (proc is not None and proc.poll() is not None) or (mine and not self.alive()):
                break
            time.sleep(POLL_S / 5)
        if self.phase() in ("refused", "starting"):
            raise NgraphError(self.last_line())
        return self.state()["run_id"]

    def alive(self) -> bool:
        """Whether a driver holds the lock."""
        try:
            with open(self.lock_path, "a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(handle, fcntl.LOCK_UN)
            return False
        except BlockingIOError:
            return True

    def state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}

    def phase(self) -> str:
        return self.state().get("phase", "")

    def last_line(self) -> str:
        """The driver's last word: its final line, else the last line of its output."""
        line = self.state().get("line")
        if line:
            return line
        try:
            lines = [ln for ln in self.log_path.read_text().splitlines() if ln.strip()]
        except OSError:
            lines = []
        return lines[-1] if lines else "the driver ended without a word (see its log)"

    def wait(self) -> None:
        while self.alive():
            time.sleep(POLL_S)

    def died(self) -> bool:
        """Whether the driver ended without saying how (``kill -9``, the host's OOM killer):
        its phase is still starting or running and nothing holds its lock."""
        return self.phase() in ("starting", "running") and not self.alive()

    def death_line(self) -> str:
        """The one line for a driver that :meth:`died`."""
        state = self.state()
        return (
            f"the driver of run {state.get('run_id')} (pid {state.get('pid')}) died before it "
            "finished (killed?); what the devices measured is kept: run the same command "
            f"again to resume (its output: {self.log_path})"
        )

    def cancel(self) -> None:
        """SIGTERM to the driver (it stops every device), then wait for its end."""
        pid = self.state().get("pid")
        if pid and self.alive():
            os.kill(pid, signal.SIGTERM)
        self.wait()

    def follow(self, echo) -> None:
        """``echo`` the driver's output, from its start, until it ends."""
        offset, rest = 0, b""
        while True:
            alive = self.alive()
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                chunk = log.read()
                offset = log.tell()
            *lines, rest = (rest + chunk).split(b"\n")
            for line in lines:
                echo(line.decode(errors="replace"))
            if not alive:
                if rest:
                    echo(rest.decode(errors="replace"))
                return
            time.sleep(POLL_S)

    def how_to_follow(self) -> str:
        state = self.state()
        return (
            f"run {state.get('run_id')} goes on in the background (driver pid "
            f"{state.get('pid')}); its output: tail -f {self.log_path}\n"
            'the same command without "synchronous": false follows it (Ctrl-C there '
            f"cancels it), as does kill {state.get('pid')}"
        )

    @staticmethod
    def _write(path: Path, data: dict[str, Any]) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, default=str))
        os.replace(tmp, path)

    # --- the driver's side -----------------------------------------------------------------
    def hold_lock(self):
        """The lock's open file, held, or None when another driver holds it."""
        handle = open(self.lock_path, "a")
        deadline = time.time() + LOCK_TRIES_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return handle
            except BlockingIOError:
                if time.time() >= deadline:
                    handle.close()
                    return None
                time.sleep(0.1)

    def set_state(self, phase: str, line: str = "") -> None:
        state = {**self.state(), "phase": phase, "pid": os.getpid(), "line": line}
        self._write(self.state_path, state)


def project_run(job: dict[str, Any]) -> str:
    """The project's run: the one of this sweep if an earlier command made it (the same
    command resumes into it), else a new one made as MLflow's local backend makes it
    (source, entry point, git commit, params), tagged with the sweep."""
    from mlflow.projects.utils import get_or_create_run
    from mlflow.tracking import MlflowClient
    from mlflow.utils.mlflow_tags import MLFLOW_PROJECT_BACKEND

    from mlflow_ngraph.tracking import mlflow_log as ml
    from mlflow_ngraph.tracking import schema as S

    client = MlflowClient(job["tracking_uri"])
    project = job["project"]
    tags = {S.T_ROLE: "project", S.T_SWEEP: job["sweep_id"]}
    found = ml._find_run(client, project["experiment_id"], tags)
    if found:
        return found
    # the run's `device` param names every device (not the entry point's default)
    devices = ",".join(d["name"] for d in job["sweep"]["devices"])
    run = get_or_create_run(
        None, project["uri"], project["experiment_id"], project["work_dir"],
        project["version"], project["entry_point"], {**project["params"], "device": devices},
    )  # fmt: skip
    ml.log_batch(client, run.info.run_id, tags={**tags, MLFLOW_PROJECT_BACKEND: "ngraph-ray"})
    return run.info.run_id


def _interrupt(signum, frame) -> None:
    """SIGTERM cancels, once: a second one does not cut the cancel short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def drive(driver: Driver) -> int:
    """Run the job's sweep to its end; the exit status."""
    import click
    from mlflow.tracking import MlflowClient

    from mlflow_ngraph.cluster.spec import parse_sweep
    from mlflow_ngraph.cluster.sweep import check_outcome, run_sweep
    from mlflow_ngraph.console import default_home, setup_logging

    setup_logging(0)
    job = json.loads(driver.job_path.read_text())
    run_id, uri = job["run_id"], job["tracking_uri"]
    driver.set_state("starting")
    client = MlflowClient(uri)
    client.update_run(run_id, status="RUNNING")
    started = []

    def on_started(outcome) -> None:
        started.append(outcome)
        # Ray took SIGTERM when it started (it exits there): a cancel again from here on
        signal.signal(signal.SIGTERM, _interrupt)
        driver.set_state("running")

    def end(phase: str, line: str, status: str, code: int) -> int:
        client.set_terminated(run_id, status)
        click.echo(line)
        driver.set_state(phase, line)
        return code

    try:
        sweep = parse_sweep(job["sweep"], "backend config")
        outcome = run_sweep(
            sweep, uri, local=job["local"], address=job["address"], wait_s=job["wait_s"],
            node_homes=default_home() / "nodes" if job["local"] else None,
            echo=lambda text: click.echo(text), parent_run=run_id, every_device=True,
            on_started=on_started,
        )  # fmt: skip
        check_outcome(outcome)
    except NgraphError as exc:
        return end("failed" if started else "refused", redact_text(exc), "FAILED", exc.exit_code)
    except (KeyboardInterrupt, SystemExit):  # SystemExit: Ray's SIGTERM, while it starts
        return end("cancelled", f"run {run_id} cancelled: run the same command to resume",
                   "KILLED", 130)  # fmt: skip
    done = (f"run {run_id}: every device done; mlflow-ngraph compare -e {sweep.experiment} "
            f"--sweep {outcome.sweep_id}")  # fmt: skip
    return end("done", done, "FINISHED", 0)


def start_reaper() -> subprocess.Popen:
    """The :data:`REAPER` of this process: what it starts does not outlive it."""
    return subprocess.Popen(
        [sys.executable, "-c", REAPER, str(os.getpid()), str(REAP_GRACE_S)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # out of the group it stops
    )  # fmt: skip


def main(argv: list[str]) -> int:
    driver = Driver(Path(argv[0]))
    lock = driver.hold_lock()
    if lock is None:  # another driver runs this sweep
        return 0
    if os.getsid(0) == os.getpid():  # launched as a session of its own (Driver.launch)
        start_reaper()  # its pipe ends with this process: it stops what this one left
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return drive(driver)
    except Exception as exc:  # the client shows this line
        driver.set_state("failed", redact_text(f"the driver failed: {exc!r}"))
        raise
    finally:
        lock.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
