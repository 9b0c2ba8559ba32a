"""Kill the benchmark at N random points, resume each time, and count what the store holds.

Kill points (``--faults``):

- ``process``: ``kill -9`` of the benchmark process (and its children) at a random moment;
- ``store``: the tracking store vanishes for one invocation (the sqlite file is moved away
  and back while the benchmark runs), then the same command and ``mlflow-ngraph sync``.

After the N faults the same command runs to the end once more. Printed: kill points tried,
results expected (cells x batch sizes), present (cells with the metric), duplicated (a cell
with more than one run, or a metric logged more than once at one batch size) and lost.

    python bench/bench_faults.py --n 10
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

MODEL = "conv_block:width=8,depth=1,image_size=32"
COMPILERS = ["identity", "onnxruntime", "torchscript"]
BATCH_SIZES = [1, 2, 4]


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


def count(uri: str) -> tuple[int, int, int]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("faults")
    cells = client.search_runs([exp.experiment_id], "tags.`ngraph.role` = 'cell'") if exp else []
    keys = Counter(r.data.tags["ngraph.cell_key"] for r in cells)
    duplicated = sum(n - 1 for n in keys.values())
    present = 0
    for run in cells:
        for b in BATCH_SIZES:
            history = client.get_metric_history(run.info.run_id, f"throughput.bs{b}")
            present += bool(history)
            duplicated += max(len(history) - 1, 0)
    return present, duplicated, len(keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10, help="Kill points (>= 10 for the report).")
    parser.add_argument("--faults", default="process,store", help="Kinds of fault to draw from.")
    parser.add_argument("--max-delay", type=float, default=25.0, help="Latest kill, seconds.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    kinds = args.faults.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="ngraph-faults-"))
    db = tmp / "mlflow.db"
    uri = f"sqlite:///{db}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_NGRAPH_HOME": str(tmp / "home")}
    tried = Counter()
    for _ in range(args.n):
        kind = rng.choice(kinds)
        tried[kind] += 1
        delay = rng.uniform(1.0, args.max_delay)
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
    present, duplicated, cells = count(uri)
    expected = len(COMPILERS) * len(BATCH_SIZES)
    print(f"kill points tried: {sum(tried.values())} ({dict(tried)}); final run exit {final}")
    print(f"cells expected {len(COMPILERS)}, present {cells}")
    print(f"results expected {expected}, present {present}, duplicated {duplicated}, "
          f"lost {expected - present}")  # fmt: skip
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
