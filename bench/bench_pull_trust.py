"""The cost of issue 23's checks on ``pull``: the same pull of one engine with the code of
another checkout (``--before``, e.g. ``git archive`` of the commit before) and with this one,
interleaved, as fresh processes; then the same split in-process (selection, then download
and verification), median of ``--repeat`` each.

Usage (a store holding a resnet18 ONNX Runtime cell, its run with the manifest hash param)::

    .venv/bin/python bench/bench_pull_trust.py --before /tmp/before \\
        --tracking-uri sqlite:///store/mlflow.db -e pullcost --model resnet18
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def one_pull(code: Path, args: argparse.Namespace, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "mlflow_ngraph", "pull", "-e", args.experiment,
               "--device", args.device, "--model", args.model, "-o", str(out),
               "--tracking-uri", args.tracking_uri]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(code)}
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"pull with {code} failed: {done.stderr[-2000:]}")
    return took


#: in a process of the given checkout: the candidate chosen once, then the part of a pull
#: that issue 23 changed (the check of the record against its run where it exists, the
#: download and the verification) timed ``repeat`` times; prints the median seconds
IN_PROCESS = """
import json, shutil, statistics, sys, tempfile, time
from pathlib import Path
from mlflow_ngraph.deploy import pull, select
from mlflow_ngraph.tracking.mlflow_log import connect
uri, experiment, device, model, repeat = sys.argv[1:6]
client = connect(uri)
found = select.candidates(client, uri, experiment, device, model)
chosen = select.best(select.rank(found), model)[0]
confirm = getattr(select, "confirm", None)
times = []
for _ in range(int(repeat) + 1):
    tmp = Path(tempfile.mkdtemp())
    t = time.perf_counter()
    if confirm is not None:
        c, run = confirm(client, [chosen], set(), lambda line: None, set())
        local = pull.download_verified(client, c, tmp, None, run)
    else:
        local = pull.download_verified(client, chosen, tmp)
    times.append(time.perf_counter() - t)
    shutil.rmtree(tmp)
print(json.dumps(statistics.median(times[1:])))
"""


def in_process(code: Path, args: argparse.Namespace) -> float:
    command = [sys.executable, "-c", IN_PROCESS, args.tracking_uri, args.experiment,
               args.device, args.model, str(args.repeat)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(code), "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"in-process timing with {code} failed: {done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="Checkout of the old code.")
    parser.add_argument("--tracking-uri", required=True)
    parser.add_argument("-e", "--experiment", required=True)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            times["before"].append(one_pull(args.before, args, Path(tmp) / "before"))
            times["after"].append(one_pull(HERE, args, Path(tmp) / "after"))
    for name, values in times.items():
        print(
            f"{name:6s} pull (fresh process): median {statistics.median(values):.2f} s "
            f"(min {min(values):.2f}, max {max(values):.2f}, n={len(values)})"
        )
    ratio = statistics.median(times["after"]) / statistics.median(times["before"])
    print(f"after / before: {ratio:.3f}")
    before, after = in_process(args.before, args), in_process(HERE, args)
    print(
        f"in-process record check + download + verification: before {1000 * before:.0f} ms, "
        f"after {1000 * after:.0f} ms (median of {args.repeat}; +{1000 * (after - before):.0f} ms)"
    )


if __name__ == "__main__":
    main()
