"""The gate's error rates and time, measured: ``python bench/bench_gate.py`` (alone on the
host; ``--count`` fewer gates for a quick look).

1. A/A: the same engine as champion and challenger, ``--count`` gates: "slower" at most 1
   of 20 is the bar;
2. planted slowdown: the challenger the same engine with a fixed extra delay of 10% of its
   time (a busy wait of 10% of each window's own time, the test-only
   ``MLFLOW_NGRAPH_GATE_PLANTED_DELAY``): "slower" at least 19 of 20;
3. a real upgrade: the champion's worker on this environment's runtime, the challenger's
   on another environment's (``--other-python``, e.g. a venv with another OpenVINO and a .pth
   to this one's packages), on resnet18 at batch 1 and 8: the verdict, the ratio and its
   interval, and the gate's time (the bar: under 3 minutes a batch size).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

SMALL = "conv_block:width=32,depth=2,image_size=64@onnxruntime:intra_op_num_threads=1"


def gate(root: str, champion: str, challenger: str, *extra: str, env=None) -> tuple[dict, float]:
    command = [sys.executable, "-m", "mlflow_ngraph", "gate", "--champion", champion,
               "--challenger", challenger, "--format", "json",
               "--tracking-uri", f"sqlite:///{root}/mlflow.db", *extra]  # fmt: skip
    began = time.monotonic()
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    took = time.monotonic() - began
    try:
        return json.loads(done.stdout), took
    except ValueError:
        return {"verdict": f"error ({done.stderr.strip().splitlines()[-1:]})"}, took


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def series(root: str, name: str, count: int, challenger: str, env=None) -> None:
    counts: collections.Counter = collections.Counter()
    ratios = []
    for i in range(count):
        result, took = gate(root, SMALL, challenger, "--budget", "30s", env=env)
        counts[result["verdict"]] += 1
        ratios.append(result.get("ratio"))
        where = f"[{result.get('low')}, {result.get('high')}] {took:.0f} s ({load()})"
        print(f"  {name} {i + 1}/{count}: {result['verdict']} {result.get('ratio')} {where}")
    print(f"{name}: {dict(counts)} of {count}", flush=True)
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--other-python", help="The upgrade's challenger environment.")
    parser.add_argument("--compiler", default="openvino")
    parser.add_argument("--skip", default="", help="aa,planted,upgrade to leave out")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench-gate-")
    os.environ.setdefault("MLFLOW_NGRAPH_HOME", os.path.join(root, "home"))
    print(f"bench_gate: {SMALL}, {args.count} gates each ({load()})", flush=True)
    if "aa" not in args.skip:
        series(root, "A/A", args.count, SMALL)
    if "planted" not in args.skip:
        planted = {"MLFLOW_NGRAPH_GATE_PLANTED_DELAY": "0.1"}
        series(root, "planted 10% slowdown", args.count, SMALL, env=planted)
    if "upgrade" not in args.skip and args.other_python:
        for b in (1, 8):
            spec = f"resnet18@{args.compiler}"
            result, took = gate(root, spec, spec, "--batch-size", str(b), "--budget", "90s",
                                "--challenger-python", args.other_python)  # fmt: skip
            print(f"upgrade bs{b}: {result['verdict']} ratio {result.get('ratio')} "
                  f"[{result.get('low')}, {result.get('high')}] "
                  f"{result.get('champion', {}).get('runtime')} -> "
                  f"{result.get('challenger', {}).get('runtime')}; the gate took {took:.0f} s "
                  f"({load()})", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
