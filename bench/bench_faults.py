"""Kill a sweep (or a single benchmark) at N random points, resume, and count what the store
holds: expected, present, duplicated and lost.

``--target sweep`` (the default): a sweep over two devices on a Ray cluster this script
starts on 127.0.0.1 (one node per device, each node its own home), logging to a real
``mlflow server`` on 127.0.0.1 (sqlite or PostgreSQL backend). Each round sweeps a fresh
experiment and hits it with ``--per-round`` faults at random moments, each of a kind drawn
from ``--faults``:

- ``process``: ``kill -9`` of a device's benchmark process tree while it runs (Ray retries
  the task on the same node, which resumes from its journal);
- ``node``: the node hosting a device is removed, and a few seconds later a replacement
  node offering the same device joins with an empty home (the retry lands there: no
  journal, the tracking server is the record of what is done);
- ``server``: the tracking server is stopped and started again some seconds later
  (measurement goes on into the journals; the results are sent when it is back).

After the faults, ``mlflow-ngraph sync`` runs on every node's home and the same sweep runs
to the end. ``--target benchmark``: the single-device benchmark, killed (``process``) or
with its sqlite store moved away for a while (``store``), then re-run.

``--target named``: the single-device benchmark stopped at every named fault point
(:mod:`mlflow_ngraph.faultpoint`, ``kill -9`` of itself there), a 400 KB home (a real full
disk, then enlarged), a home that fills up mid-run, a home made read-only mid-run (both on a
tmpfs: needs root, else left out), and two copies of the same command at once. After each
fault the same command runs again until it exits 0 (3 tries at most). Printed per fault:
tries, results lost, duplicated runs, duplicated metric values, runs left RUNNING, unusable
stores (an sqlite store failing ``PRAGMA integrity_check``, or a command that did not end
well: the final run's exit, a fault's error that was not one line) -- 0 is the target in
every column.

Printed: kill points tried (per kind), cells expected, present, duplicated (a cell key with
more than one run, or a metric with more than one value at one step) and lost.

    python bench/bench_faults.py --n 10
    python bench/bench_faults.py --n 10 --backend postgresql
    python bench/bench_faults.py --target named
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
MODEL = "conv_block:width=8,depth=1,image_size=32"
TINY = {"name": "conv_block", "params": {"width": 8, "depth": 1, "image_size": 32}}
COMPILERS = ["identity", "onnxruntime", "torchscript"]
BATCH_SIZES = [1, 2]
DEVICES = [{"name": "xeon-a", "profile": "xeon"}, {"name": "cpu-b", "profile": "cpu"}]
PG = "postgresql://postgres@127.0.0.1:5432"


# --- what the store holds -----------------------------------------------------------------
@dataclass
class Count:
    cells_expected: int = 0
    cells_present: int = 0
    runs_duplicated: int = 0  # cell runs beyond the first of one cell key
    results_expected: int = 0  # cells x batch sizes
    results_present: int = 0
    values_duplicated: int = 0  # metric values beyond the first at one step
    untagged: int = 0  # cell runs without their role tag
    notes: list[str] = field(default_factory=list)

    def add(self, other: Count) -> None:
        for name in self.__dataclass_fields__:
            if name != "notes":
                setattr(self, name, getattr(self, name) + getattr(other, name))
        self.notes += other.notes


def count(uri: str, experiment: str, expected: dict[tuple[str, str], list[int]]) -> Count:
    """What ``experiment`` holds against ``expected`` ((device, compiler) -> batch sizes)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], "tags.`ngraph.cell_key` != ''") if exp else []
    out = Count(len(expected), results_expected=sum(map(len, expected.values())))
    keys = Counter(r.data.tags["ngraph.cell_key"] for r in runs)
    out.runs_duplicated = sum(n - 1 for n in keys.values())
    out.untagged = sum(r.data.tags.get("ngraph.role") != "cell" for r in runs)
    found: dict[tuple[str, str], list] = {}
    for run in runs:
        cell = (run.data.params.get("device", "?"), run.data.params.get("compiler", "?"))
        found.setdefault(cell, []).append(run)
        twice = []
        for key in run.data.metrics:
            steps = Counter(m.step for m in client.get_metric_history(run.info.run_id, key))
            extra = sum(n - 1 for n in steps.values())
            out.values_duplicated += extra
            twice += [key] * bool(extra)
        if twice:
            out.notes.append(f"{experiment} {cell}: {len(twice)} metric(s) with more than one "
                             f"value at a step ({', '.join(twice[:3])}, ...)")  # fmt: skip
    for cell, batch_sizes in expected.items():
        mine = found.get(cell, [])
        out.cells_present += bool(mine)
        for b in batch_sizes:
            if any(f"throughput.bs{b}" in r.data.metrics for r in mine):
                out.results_present += 1
            else:
                out.notes.append(f"{experiment} {cell}: bs{b} lost")
    return out


def report(tried: Counter, missed: int, total: Count, extra: str = "") -> None:
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(tried.items()))
    print(f"kill points tried: {sum(tried.values())} ({kinds})" + (
        f"; {missed} drawn after a sweep had ended, drawn again" if missed else ""))  # fmt: skip
    print(
        f"cells expected {total.cells_expected}, present {total.cells_present}, "
        f"duplicated {total.runs_duplicated}, lost {total.cells_expected - total.cells_present}"
    )
    print(f"results (cell x batch size) expected {total.results_expected}, present "
          f"{total.results_present}, duplicated metric values {total.values_duplicated}, "
          f"lost {total.results_expected - total.results_present}")  # fmt: skip
    if total.untagged:
        print(f"cell runs without their role tag: {total.untagged}")
    for note in total.notes[:20]:
        print("  " + note)
    if extra:
        print(extra)


# --- processes ----------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _descendants(pid: int) -> set[int]:
    import psutil

    try:
        return {pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def _kill_tree(pid: int) -> None:
    for p in _descendants(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def benchmark_pid(device: str) -> int | None:
    """The sweep's benchmark process of ``device`` among this script's descendants."""
    for pid in _descendants(os.getpid()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"benchmark" in cmdline and f"MLFLOW_NGRAPH_DEVICE_NAME={device}".encode() in environ:
            return pid
    return None


class Server:
    """A real ``mlflow server`` on 127.0.0.1 that can be stopped and started again."""

    def __init__(self, tmp: Path, backend: str) -> None:
        self.tmp, self.port, self.proc = tmp, _free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = None
        if backend == "postgresql":
            self.db = f"ngraph_faults_{uuid.uuid4().hex[:8]}"
            _pg(f"CREATE DATABASE {self.db}")
            self.store = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{self.db}"
        else:
            self.store = f"sqlite:///{tmp / 'server.db'}"
        self.log = open(tmp / "server.log", "a")

    def start(self) -> None:
        import requests

        mlflow = str(Path(sys.executable).with_name("mlflow"))
        self.proc = subprocess.Popen(
            [mlflow, "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", self.store, "--artifacts-destination",
             str(self.tmp / "artifacts")],
            cwd=self.tmp, stdout=self.log, stderr=self.log, start_new_session=True,
        )  # fmt: skip
        deadline = time.time() + 120
        while time.time() < deadline:
            with contextlib.suppress(requests.RequestException):
                if requests.get(self.url + "/health", timeout=1).ok:
                    return
            time.sleep(0.3)
        raise RuntimeError(f"mlflow server did not start; see {self.tmp / 'server.log'}")

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def close(self) -> None:
        self.stop()
        self.log.close()
        if self.db:
            _pg(f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)")


def _pg(sql: str) -> None:
    import psycopg2

    conn = psycopg2.connect(f"{PG}/postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(sql)
    conn.close()


# --- the sweep under faults ---------------------------------------------------------------
class Bench:
    """The cluster, the server and the homes of one fault run."""

    def __init__(self, tmp: Path, backend: str, rng: random.Random) -> None:
        from mlflow_ngraph.cluster.spec import parse_sweep
        from mlflow_ngraph.cluster.sweep import start_local_cluster

        self.tmp, self.rng = tmp, rng
        self.server = Server(tmp, backend)
        self.server.start()
        os.environ["PYTHONPATH"] = str(REPO)  # the nodes' workers run this checkout
        self.devices = parse_sweep(self.spec("probe")).devices
        self.cluster = start_local_cluster(self.devices, tmp / "homes")
        self.homes = {d.name: tmp / "homes" / d.name for d in self.devices}
        self.replaced = 0

    def spec(self, experiment: str) -> dict:
        return {"experiment": experiment, "devices": DEVICES, "models": [TINY],
                "compilers": COMPILERS, "batch_sizes": BATCH_SIZES, "warmup": 1,
                "repetitions": 3, "min_duration": 0.05}  # fmt: skip

    def expected(self) -> dict[tuple[str, str], list[int]]:
        return {(d["name"], c): BATCH_SIZES for d in DEVICES for c in COMPILERS}

    def sweep(self, experiment: str, log: Path) -> subprocess.Popen:
        path = self.tmp / f"{experiment}.yaml"
        path.write_text(yaml.safe_dump(self.spec(experiment)))
        env = {**os.environ, "MLFLOW_TRACKING_URI": self.server.url,
               "MLFLOW_NGRAPH_HOME": str(self.tmp / "driver-home")}  # fmt: skip
        command = [sys.executable, "-m", "mlflow_ngraph", "sweep", str(path),
                   "--address", self.cluster.address]  # fmt: skip
        return subprocess.Popen(command, env=env, stdout=open(log, "a"), stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip

    def fault(self, kind: str) -> str:
        """Inject one fault; what was done, in words."""
        device = self.rng.choice(self.devices)
        if kind == "process":
            deadline = time.time() + 10
            while (pid := benchmark_pid(device.name)) is None and time.time() < deadline:
                time.sleep(0.2)  # between a death and Ray's retry
            if pid is None:
                return f"process: no benchmark of {device.name} running"
            _kill_tree(pid)
            return f"process: killed the benchmark of {device.name} (pid {pid})"
        if kind == "node":
            from mlflow_ngraph.cluster.sweep import add_device_node

            node = next(n for n in self.cluster.worker_nodes
                        if device.resource in n._ray_params.resources)  # fmt: skip
            self.cluster.remove_node(node, allow_graceful=False)
            down = self.rng.uniform(2.0, 8.0)
            time.sleep(down)
            self.replaced += 1
            home = self.tmp / "homes" / f"{device.name}-r{self.replaced}"
            add_device_node(self.cluster, device, home)
            self.homes[device.name] = home
            return f"node: removed {device.name}'s node, a fresh one joined {down:.1f} s later"
        down = self.rng.uniform(3.0, 12.0)
        self.server.stop()
        time.sleep(down)
        self.server.start()
        return f"server: stopped for {down:.1f} s"

    def sync(self) -> list[str]:
        """``mlflow-ngraph sync`` on the home of every device's current node."""
        lines: list[str] = []
        for home in self.homes.values():
            done = subprocess.run(
                [sys.executable, "-m", "mlflow_ngraph", "sync", "--home", str(home),
                 "--tracking-uri", self.server.url], capture_output=True, text=True,
            )  # fmt: skip
            lines += (done.stdout or done.stderr).strip().splitlines()[-1:]
        return [line.split(": ", 1)[-1] for line in lines]

    def close(self) -> None:
        self.cluster.shutdown()
        self.server.close()


def run_sweep_faults(args, rng: random.Random) -> None:
    kinds = args.faults.split(",")
    # every kind about as often, in a random order
    draws = [kinds[i % len(kinds)] for i in range(args.n)]
    rng.shuffle(draws)
    tmp = Path(tempfile.mkdtemp(prefix="ngraph-faults-"))
    bench = Bench(tmp, args.backend, rng)
    tried: Counter = Counter()
    missed, total, exits = 0, Count(), []
    started = time.time()
    try:
        round_ = 0
        while draws:
            round_ += 1
            experiment = f"faults-{round_}"
            log = tmp / f"{experiment}.log"
            proc = bench.sweep(experiment, log)
            t0 = time.time()
            moments = sorted(
                rng.uniform(args.min_delay, args.max_delay)
                for _ in range(min(args.per_round, len(draws)))
            )
            for moment in moments:
                time.sleep(max(moment - (time.time() - t0), 0))
                if proc.poll() is not None:  # drawn again in the next round
                    missed += 1
                    continue
                kind = draws.pop()
                tried[kind] += 1
                print(f"round {round_} at {time.time() - t0:.0f} s: {bench.fault(kind)}",
                      flush=True)  # fmt: skip
            try:
                faulted = proc.wait(args.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                faulted = "killed after timeout"
            synced = bench.sync()
            final = bench.sweep(experiment, log).wait(args.timeout)
            exits.append((faulted, final))
            counted = count(bench.server.url, experiment, bench.expected())
            total.add(counted)
            print(f"round {round_}: faulted sweep exit {faulted}, final sweep exit {final}; "
                  f"{counted.cells_present}/{counted.cells_expected} cells, duplicated "
                  f"{counted.runs_duplicated} runs and {counted.values_duplicated} values; "
                  f"sync: {' | '.join(synced)}", flush=True)  # fmt: skip
    finally:
        bench.close()
    report(tried, missed, total, f"rounds {len(exits)}, {time.time() - started:.0f} s in all, "
           f"backend {args.backend}, logs in {tmp}")  # fmt: skip


# --- the single benchmark under faults ----------------------------------------------------
def command() -> list[str]:
    args = [sys.executable, "-m", "mlflow_ngraph", "benchmark", "--model", MODEL,
            "--batch-sizes", ",".join(map(str, BATCH_SIZES)), "--warmup", "1",
            "--repetitions", "3", "--min-duration", "0.05", "--experiment", "faults",
            "-q"]  # fmt: skip
    for name in COMPILERS:
        args += ["--compiler", name]
    return args


def run_until(env: dict, seconds: float | None) -> int | None:
    proc = subprocess.Popen(command(), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        return proc.wait(seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def run_benchmark_faults(args, rng: random.Random) -> None:
    kinds = args.faults.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="ngraph-faults-"))
    db = tmp / "mlflow.db"
    uri = f"sqlite:///{db}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_NGRAPH_HOME": str(tmp / "home"),
           "PYTHONPATH": str(REPO)}  # fmt: skip
    tried: Counter = Counter()
    for _ in range(args.n):
        kind = rng.choice(kinds)
        tried[kind] += 1
        delay = rng.uniform(args.min_delay, args.max_delay)
        if kind == "process":
            run_until(env, delay)
        else:  # the store is gone for a while, then back: the journal keeps the results
            proc = subprocess.Popen(command(), env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
            time.sleep(delay)
            if db.exists():
                shutil.move(db, tmp / "away.db")
                time.sleep(2)
                shutil.move(tmp / "away.db", db)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            subprocess.run([sys.executable, "-m", "mlflow_ngraph", "sync"], env=env,
                           capture_output=True)  # fmt: skip
    final = run_until(env, 600)
    expected = {("cpu", c): BATCH_SIZES for c in COMPILERS}
    report(tried, 0, count(uri, "faults", expected), f"final run exit {final}")
    shutil.rmtree(tmp, ignore_errors=True)


# --- named faults, one at a time -----------------------------------------------------------
@dataclass
class Trial:
    """What one fault did, once the same command ran to its end after it."""

    tries: int = 0
    lost: int = 0
    dup_runs: int = 0
    dup_values: int = 0
    stuck: int = 0
    unusable: int = 0
    notes: list[str] = field(default_factory=list)

    def add(self, other: Trial) -> None:
        for name in ("tries", "lost", "dup_runs", "dup_values", "stuck", "unusable"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.notes += other.notes


class Home:
    """A fresh store and home for one fault; the home on a tmpfs of ``size`` when asked."""

    def __init__(self, size: str | None = None) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="ngraph-named-"))
        self.home = self.tmp / "home"
        self.home.mkdir()
        self.mounted = False
        if size:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                   str(self.home)], capture_output=True)  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError("cannot mount a tmpfs (needs root)")
            self.mounted = True
        self.uri = f"sqlite:///{self.tmp / 'mlflow.db'}"
        self.env = {**os.environ, "MLFLOW_TRACKING_URI": self.uri, "PYTHONPATH": str(REPO),
                    "MLFLOW_NGRAPH_HOME": str(self.home)}  # fmt: skip
        self.env.pop("MLFLOW_NGRAPH_FAULT_POINT", None)

    def remount(self, options: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{options}", str(self.home)], check=True)

    def start(self, point: str = "") -> subprocess.Popen:
        env = {**self.env, "MLFLOW_NGRAPH_FAULT_POINT": point} if point else self.env
        return subprocess.Popen(command(), env=env, cwd=self.tmp, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip

    def run(self, point: str = "") -> tuple[int, str]:
        proc = self.start(point)
        try:
            _, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            err = "timed out"
        with contextlib.suppress(ProcessLookupError):  # a killed run's worker, if any
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return proc.returncode, err

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.home)], check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _error_is_one_line(code: int, err: str) -> bool:
    """A run that ended with an error said it in one line, without a traceback."""
    if code in (0, -signal.SIGKILL):
        return True
    return (
        "Traceback" not in err and sum(line.startswith("error:") for line in err.splitlines()) == 1
    )


def judge(home: Home, fault_ok: bool, name: str) -> Trial:
    """Run the same command to its end (3 tries at most) and count what the store holds."""
    import sqlite3

    from mlflow.tracking import MlflowClient

    trial = Trial(tries=1)
    final = None
    for _ in range(3):
        final, err = home.run()
        if final == 0:
            break
    expected = {("cpu", c): BATCH_SIZES for c in COMPILERS}
    counted = count(home.uri, "faults", expected)
    trial.lost = counted.results_expected - counted.results_present
    trial.dup_runs, trial.dup_values = counted.runs_duplicated, counted.values_duplicated
    client = MlflowClient(home.uri)
    exp = client.get_experiment_by_name("faults")
    runs = client.search_runs([exp.experiment_id]) if exp else []
    trial.stuck = sum(r.info.status == "RUNNING" for r in runs)
    # a cell run the views cannot see (no role or parent tag) loses its results
    tags = [r.data.tags for r in runs if "ngraph.cell_key" in r.data.tags]
    hidden = [t for t in tags if t.get("ngraph.role") != "cell" or "mlflow.parentRunId" not in t]
    trial.lost += sum(len(BATCH_SIZES) for _ in hidden)
    with sqlite3.connect(home.uri[len("sqlite:///") :]) as db:
        healthy = db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    trial.unusable = int(not healthy or final != 0 or not fault_ok)
    if trial.unusable:
        trial.notes.append(f"{name}: integrity {healthy}, final exit {final}, fault said in one "
                           f"line {fault_ok}: {err.strip().splitlines()[-1:]}")  # fmt: skip
    trial.notes += [f"{name}: {n}" for n in counted.notes]
    return trial


def named_faults(args) -> list[tuple[str, str]]:
    """(fault, how) for every fault of ``--target named``."""
    from mlflow_ngraph.faultpoint import POINTS

    faults = [(f"kill at {p}", p) for p in POINTS]
    # the same points later in the run: the second cell, the last result
    faults += [(f"kill at {p}@{n}", f"{p}@{n}") for p, n in
               (("cell_run_created", 2), ("journal_measured", 4), ("record_sent", 3),
                ("journal_append", 12))]  # fmt: skip
    faults += [
        ("full disk (400 KB home)", "disk"),
        ("disk fills mid-run", "fill"),
        ("home read-only mid-run", "readonly"),
        ("two copies at once", "copies"),
    ]
    # the newer commands: tune, register, cache --prune, pull, the ngraph-ray backend
    from mlflow_ngraph.faultpoint import REGISTER_POINTS

    faults += [("two copies of one tune, 1 s apart", "tune-copies")]
    faults += [(f"register killed at {p}", f"register:{p}") for p in REGISTER_POINTS]
    faults += [
        ("register run again when done", "register:again"),
        ("cache --prune loop beside a benchmark", "prune-loop"),
        ("pull killed mid-download", "pull-kill"),
        ("sqlite:/x.db (one slash)", "bad-uri"),
        ("ngraph-ray driver killed (kill -9)", "driver-kill"),
    ]
    return [f for f in faults if not args.only or any(o in f[0] for o in args.only.split(","))]


# --- the newer commands' faults -----------------------------------------------------------
def _cli(home: Home, *args: str, point: str = "", env: dict | None = None, timeout=900):
    env = {**home.env, **(env or {}), "MLFLOW_NGRAPH_FAULT_POINT": point}
    return subprocess.run([sys.executable, "-m", "mlflow_ngraph", *args], env=env,
                          cwd=home.tmp, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def _tune_args() -> list[str]:
    return ["tune", "--model", MODEL, "--batch-sizes", "1", "--experiment", "faults",
            "--compiler", "onnxruntime", "--trials", "3", "--finalists", "2",
            "--precision", "0.5", "--max-duration", "1", "--final-precision", "0.5",
            "--final-max-duration", "2"]  # fmt: skip


def _winner(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("winner: ")]


def tune_copies(home: Home) -> Trial:
    """Two copies of one tune 1 s apart, then a third run: trials journaled once, cells
    measured once, one winner named by all three, the resume count the real one."""
    import json

    from mlflow.tracking import MlflowClient

    MlflowClient(home.uri).create_experiment("faults")
    env = {**home.env, "MLFLOW_NGRAPH_FAULT_POINT": ""}
    args = [sys.executable, "-m", "mlflow_ngraph", *_tune_args()]
    first = subprocess.Popen(args, env=env, cwd=home.tmp, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(1.0)
    second = _cli(home, *_tune_args())
    out, err = first.communicate(timeout=900)
    third = _cli(home, *_tune_args())
    trial = Trial(tries=3)
    lines = [json.loads(x) for p in (home.home / "tunes").glob("*.jsonl")
             for x in p.read_text().splitlines()]  # fmt: skip
    numbers = [r["number"] for r in lines if r["kind"] == "trial"]
    measured = [(json.loads(x)["cell"], json.loads(x)["batch_size"])
                for p in (home.home / "journals").glob("*.jsonl")
                for x in p.read_text().splitlines() if '"measured"' in x]  # fmt: skip
    trial.dup_runs = len(numbers) - len(set(numbers)) + len(measured) - len(set(measured))
    winners = {tuple(_winner(t)) for t in (out, second.stdout, third.stdout)}
    resumed = f"resuming: {len(set(numbers))} trial(s)" in third.stdout
    ok = (first.returncode, second.returncode, third.returncode) == (0, 0, 0)
    trial.unusable = int(not ok or len(winners) != 1 or not resumed)
    waited = "another copy of this tune is running" in second.stdout
    trial.notes.append(f"tune copies: exits {first.returncode}/{second.returncode}/"
                       f"{third.returncode}, second said it waited {waited}, winners agree "
                       f"{len(winners) == 1}, third resumed the {len(set(numbers))} real "
                       f"trials {resumed}")  # fmt: skip
    return trial


def _registered_state(home: Home, name: str) -> tuple[int, int, bool]:
    """(versions of ``name``, logged models not READY, alias on the only version)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(home.uri)
    versions = client.search_model_versions(f"name = '{name}'")
    exp = client.get_experiment_by_name("faults")
    models = client.search_logged_models([exp.experiment_id]) if exp else []
    pending = sum(str(m.status) != "READY" for m in models)
    try:
        alias = client.get_model_version_by_alias(name, "cpu").version
    except Exception:
        alias = None
    return len(versions), pending, len(versions) == 1 and str(alias) == str(versions[0].version)


def register_fault(home: Home, how: str) -> Trial:
    """A benchmark, then ``register`` killed at a step (or run to its end), then run again:
    one version, the alias on it, nothing PENDING, no copy left in the temp folder."""
    temp = home.tmp / "temp"
    temp.mkdir()
    code, err = home.run()
    register = ["register", "-e", "faults", "--device", "cpu", "--model", "conv_block",
                "--compiler", "onnxruntime", "--batch-size", "1", "--name", "faults",
                "--allow-unstable"]  # fmt: skip
    env = {"TMPDIR": str(temp)}
    point = "" if how == "again" else f"{how}:kill"
    first = _cli(home, *register, point=point, env=env)
    left = len(list(temp.glob("ngraph-register-*")))
    again = _cli(home, *register, env=env)
    versions, pending, aliased = _registered_state(home, "faults")
    trial = Trial(tries=2, dup_runs=max(0, versions - 1), stuck=pending)
    after = len(list(temp.glob("ngraph-register-*")))
    trial.unusable = int(code != 0 or again.returncode != 0 or not aliased or after != 0)
    trial.notes.append(f"register {how}: first exit {first.returncode} (left {left} temp "
                       f"copies), again exit {again.returncode}; {versions} version(s), alias "
                       f"on it {aliased}, {pending} PENDING, {after} temp copies left")  # fmt: skip
    for name, done in (("benchmark", (code, err)), ("again", (again.returncode, again.stderr))):
        if done[0] != 0:
            trial.notes.append(f"register {how}: {name} said {done[1].strip().splitlines()[-1:]}")
    return trial


def prune_loop(home: Home, name: str) -> Trial:
    """``cache --prune`` every 50 ms while the benchmark runs on the same home."""
    sys.path.insert(0, str(REPO))
    from mlflow_ngraph.cache import prune

    proc = home.start()
    pruned = kept = 0
    while proc.poll() is None:
        done = prune(home.home)
        pruned += len(done.removed)
        kept += len(done.held)
        time.sleep(0.05)
    _, err = proc.communicate()
    failed = sum('"kind": "failed"' in x or '"kind":"failed"' in x
                 for p in (home.home / "journals").glob("*.jsonl")
                 for x in p.read_text().splitlines())  # fmt: skip
    trial = judge(home, proc.returncode == 0, name)
    trial.lost += failed
    trial.notes.append(f"prune loop: benchmark exit {proc.returncode}, {failed} FAILED "
                       f"results, {pruned} entries pruned, {kept} kept as in use")  # fmt: skip
    return trial


def pull_kill(home: Home) -> Trial:
    """``pull`` killed while it downloads, then pulled again: no ``.pull-*`` folder left."""
    code, _ = home.run()
    target = home.tmp / "out" / "engine"
    args = [sys.executable, "-m", "mlflow_ngraph", "pull", "-e", "faults", "--device", "cpu",
            "--model", "conv_block", "--compiler", "onnxruntime", "-o", str(target)]  # fmt: skip
    proc = subprocess.Popen(args, env=home.env, cwd=home.tmp, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline:
        if list(target.parent.glob(".pull-*")):
            break
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    left = len(list(target.parent.glob(".pull-*")))
    again = _cli(home, *args[3:])
    after = len(list(target.parent.glob(".pull-*")))
    trial = Trial(tries=2)
    trial.unusable = int(code != 0 or again.returncode != 0 or after != 0)
    trial.notes.append(f"pull killed: {left} work folder(s) left by the kill, the next pull "
                       f"exit {again.returncode}, {after} left after it")  # fmt: skip
    return trial


def bad_uri(home: Home) -> Trial:
    """``MLFLOW_TRACKING_URI=sqlite:/x.db``: one line, for every command that opens a store."""
    trial = Trial(tries=1)
    for args in (["benchmark", "--model", MODEL, "--compiler", "onnxruntime"], ["compare"],
                 ["tune", "--model", MODEL, "--compiler", "onnxruntime"]):  # fmt: skip
        done = _cli(home, *args, env={"MLFLOW_TRACKING_URI": "sqlite:/x.db"})
        # compare's errors are click's (``Error:``), the others' the CLI's own (``error:``)
        said = done.stderr.replace("Error: ", "error: ")
        if not (done.returncode == 2 and _error_is_one_line(done.returncode, said)):
            trial.unusable += 1
            trial.notes.append(f"{args[0]} with sqlite:/x.db: exit {done.returncode}, "
                               f"{done.stderr.strip().splitlines()[-1:]}")  # fmt: skip
    return trial


def driver_kill(home: Home) -> Trial:
    """The ``ngraph-ray`` backend's driver killed with ``kill -9`` while its client follows:
    the client says so in one line, nothing it started runs on, the same command resumes."""
    import json

    mlflow = str(Path(sys.executable).parent / "mlflow")
    config = json.dumps({"local": True, "devices": [DEVICES[0]]})
    args = [mlflow, "run", str(REPO), "-e", "benchmark", "--experiment-name", "faults",
            "--backend", "ngraph-ray", "--backend-config", config, "-P", f"models={MODEL}",
            "-P", f"compilers={' '.join(COMPILERS)}", "-P", "batch_sizes=1,2"]  # fmt: skip
    from mlflow.tracking import MlflowClient

    MlflowClient(home.uri).create_experiment("faults")
    gate = home.tmp / "gate"
    gate.touch()
    env = {**home.env, "MLFLOW_NGRAPH_FAULT_POINT": f"record_logged:hold={gate}"}
    client = subprocess.Popen(args, env=env, cwd=home.tmp, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)  # fmt: skip
    state_files = []
    deadline = time.time() + 600
    while time.time() < deadline and client.poll() is None:
        state_files = list((home.home / "projects").glob("*/state.json"))
        if state_files and json.loads(state_files[0].read_text()).get("phase") == "running":
            break
        time.sleep(0.5)
    time.sleep(20)  # its device's benchmark is under way (held after its first result)
    trial = Trial(tries=2)
    if not state_files:
        trial.unusable = 1
        trial.notes.append("driver kill: the driver never ran")
        return trial
    pid = json.loads(state_files[0].read_text())["pid"]
    started = _descendants(pid) - {pid}
    os.kill(pid, signal.SIGKILL)
    out, _ = client.communicate(timeout=120)
    said = [line for line in out.splitlines() if "died before it finished" in line]
    t0 = time.time()
    while time.time() - t0 < 60 and any(_running(p) for p in started):
        time.sleep(0.5)
    stopped_s = time.time() - t0
    left = sum(_running(p) for p in started)
    gate.unlink()
    again = subprocess.run(args, env=home.env, cwd=home.tmp, capture_output=True, text=True,
                           timeout=900)  # fmt: skip
    counted = count(home.uri, "faults", {("xeon-a", c): BATCH_SIZES for c in COMPILERS})
    trial.lost = counted.results_expected - counted.results_present
    trial.dup_runs, trial.dup_values = counted.runs_duplicated, counted.values_duplicated
    trial.stuck = left
    trial.unusable = int(again.returncode != 0 or len(said) != 1)
    trial.notes.append(f"driver killed: the client said it in one line {len(said) == 1}, "
                       f"{len(started)} processes it had started, {left} still running 60 s "
                       f"later (the last stopped {stopped_s:.0f} s after the client's end), "
                       f"the same command's exit {again.returncode}")  # fmt: skip
    return trial


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def one_fault(how: str, name: str) -> Trial:
    newer = {"tune-copies": tune_copies, "pull-kill": pull_kill, "bad-uri": bad_uri,
             "driver-kill": driver_kill}  # fmt: skip
    if how in newer or how.startswith("register:") or how == "prune-loop":
        home = Home()
        try:
            if how.startswith("register:"):
                return register_fault(home, how.partition(":")[2])
            if how == "prune-loop":
                return prune_loop(home, name)
            return newer[how](home)
        finally:
            home.close()
    if how in ("disk", "fill", "readonly"):
        try:
            home = Home("400k" if how == "disk" else "64m")
        except RuntimeError as exc:
            return Trial(notes=[f"{name}: left out ({exc})"])
    else:
        home = Home()
    try:
        ok = True
        if how == "disk":  # as in the trial: the whole run on 400 KB, then the disk enlarged
            code, err = home.run()
            ok = _error_is_one_line(code, err)
            home.remount("size=64m")
        elif how == "fill":
            code, err = home.run("journal_measured@2:fill")
            ok = _error_is_one_line(code, err) and code != 0
            (home.home / ".ballast").unlink(missing_ok=True)
        elif how == "readonly":
            home.run("cell_begun@2")  # killed half-way, then the home turns read-only
            home.remount("ro")
            code, err = home.run()
            ok = _error_is_one_line(code, err) and code != 0
            home.remount("rw")
        elif how == "copies":
            procs = [home.start(), home.start()]
            outs = [p.communicate(timeout=600) for p in procs]
            ok = all(p.returncode == 0 for p in procs)
            waited = sum("another copy" in err for _, err in outs)
            print(f"  two copies: exits {[p.returncode for p in procs]}, {waited} said it waited",
                  flush=True)  # fmt: skip
        else:
            code, err = home.run(how)
            ok = code == -signal.SIGKILL  # the point was reached
        return judge(home, ok, name)
    finally:
        home.close()


def run_named_faults(args) -> None:
    rows, total = [], Trial()
    started = time.time()
    for name, how in named_faults(args):
        t0 = time.time()
        trial = one_fault(how, name)
        total.add(trial)
        rows.append((name, trial))
        print(f"{name}: {trial.tries} tries, lost {trial.lost}, dup runs {trial.dup_runs}, dup "
              f"values {trial.dup_values}, stuck {trial.stuck}, unusable {trial.unusable} "
              f"({time.time() - t0:.0f} s)", flush=True)  # fmt: skip
    from mlflow_ngraph.table import format_table

    headers = ["fault", "tries", "lost", "dup runs", "dup values", "stuck RUNNING", "unusable"]
    table = [[n, t.tries, t.lost, t.dup_runs, t.dup_values, t.stuck, t.unusable] for n, t in rows]
    table.append(["all", total.tries, total.lost, total.dup_runs, total.dup_values, total.stuck,
                  total.unusable])  # fmt: skip
    print(format_table(headers, table))
    for note in total.notes[:30]:
        print("  " + note)
    print(
        f"{len(rows)} faults, {time.time() - started:.0f} s in all; each try: "
        f"{len(COMPILERS)} compilers x batch sizes {BATCH_SIZES} on a fresh sqlite store"
    )


def main() -> None:
    sys.path.insert(0, str(REPO))  # this checkout's mlflow_ngraph, as in the nodes' workers
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10, help="Kill points (>= 10 for the report).")
    parser.add_argument("--target", choices=("sweep", "benchmark", "named"), default="sweep")
    parser.add_argument("--only", help="named: run only the faults whose name holds one of "
                        "these comma-separated words.")  # fmt: skip
    parser.add_argument("--faults", help="Kinds of fault to draw from (default: process,node,"
                        "server for a sweep; process,store for a benchmark).")  # fmt: skip
    parser.add_argument("--per-round", type=int, default=2, help="Faults in one sweep.")
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite",
                        help="The tracking server's backend store (sweep).")  # fmt: skip
    parser.add_argument("--min-delay", type=float, default=3.0, help="Earliest fault, seconds.")
    parser.add_argument("--max-delay", type=float, default=40.0, help="Latest fault, seconds.")
    parser.add_argument("--timeout", type=float, default=600.0, help="Longest sweep, seconds.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    if args.target == "named":
        run_named_faults(args)
    elif args.target == "sweep":
        args.faults = args.faults or "process,node,server"
        run_sweep_faults(args, rng)
    else:
        args.faults = args.faults or "process,store"
        run_benchmark_faults(args, rng)


if __name__ == "__main__":
    main()
